"""Reward shaping functions RS_1..RS_3 of LBC Table 3 (DESIGN §5.2: exactly as printed), and GDI's.

Each policy i learns from RS_i(r) under its own discount gamma_i; the bandit always sees the raw
episode return.

Each function takes a torch tensor (the learner's rewards, on its device) or a numpy array and answers in
kind: replay bounds the values actors send by them (lbc.sequences.value_bound) in a process that never
imports torch (docs/decisions.md 71).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

Array = Any   # a torch.Tensor or a numpy array
RewardFn = Callable[[Array], Array]


def _ops(x: Array) -> ModuleType:
    """The module whose functions apply to x: numpy for numpy values, torch for tensors (already imported
    wherever a tensor exists)."""
    if isinstance(x, np.ndarray | np.generic):
        return np
    import torch
    return torch


def value_rescale(z: Array, eps: float = 1e-3) -> Array:
    """h(z) = sign(z) (sqrt(|z| + 1) - 1) + eps z (Pohlen et al. 2018; NGU App. E, eps of Table 6)."""
    xp = _ops(z)
    return xp.sign(z) * (xp.sqrt(abs(z) + 1.0) - 1.0) + eps * z


def rs1(r: Array) -> Array:
    """RS_1(x) = sign(x) * (sqrt(|x| + 1) - 1) + 0.001 * x: R2D2's h with its epsilon of 1e-3."""
    return value_rescale(r, 1e-3)


def rs2(r: Array) -> Array:
    """RS_2(x) = log(|x| + 1) * (2 * 1[x >= 0] - 1[x <= 0]), the printed asymmetric log scaling.

    Positive rewards are doubled, negative ones kept; at x = 0 both indicators fire but log(1) = 0, so the
    factor is 2 for x > 0 and -1 otherwise.
    """
    xp = _ops(r)
    scaled = xp.log(abs(r) + 1.0)
    return xp.where(r > 0, 2.0 * scaled, -scaled)


def rs3(r: Array) -> Array:
    """RS_3(x) = 0.3 * min(tanh x, 0) + 5 * max(tanh x, 0)."""
    xp = _ops(r)
    t = xp.tanh(r)
    return 0.3 * xp.clip(t, None, 0.0) + 5.0 * xp.clip(t, 0.0, None)


def quarter_root(r: Array) -> Array:
    """GDI-H3's second shape (GDI Table 6): sign(x) * ((|x| + 1)^0.25 - 1) + 0.001 * x."""
    return _ops(r).sign(r) * ((abs(r) + 1.0) ** 0.25 - 1.0) + 0.001 * r


def identity(r: Array) -> Array:
    return r


def clip(r: Array) -> Array:
    """IMPALA's Atari reward clipping to [-1, 1]."""
    return _ops(r).clip(r, -1.0, 1.0)


REWARD_SHAPING: dict[str, RewardFn] = {
    "rs1": rs1, "rs2": rs2, "rs3": rs3, "quarter_root": quarter_root, "identity": identity, "clip": clip,
}
