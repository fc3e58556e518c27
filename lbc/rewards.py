"""Reward shaping functions RS_1..RS_3 of LBC Table 3 (DESIGN §5.2: exactly as printed), and GDI's.

Each policy i learns from RS_i(r) under its own discount gamma_i; the bandit always sees the raw
episode return.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lbc.losses import value_rescale

RewardFn = Callable[[torch.Tensor], torch.Tensor]


def rs1(r: torch.Tensor) -> torch.Tensor:
    """RS_1(x) = sign(x) * (sqrt(|x| + 1) - 1) + 0.001 * x: R2D2's h with its epsilon of 1e-3."""
    return value_rescale(r, 1e-3)


def rs2(r: torch.Tensor) -> torch.Tensor:
    """RS_2(x) = log(|x| + 1) * (2 * 1[x >= 0] - 1[x <= 0]), the printed asymmetric log scaling.

    Positive rewards are doubled, negative ones kept; at x = 0 both indicators fire but log(1) = 0.
    """
    sign = 2.0 * (r >= 0).to(r.dtype) - (r <= 0).to(r.dtype)
    return torch.log(r.abs() + 1.0) * sign


def rs3(r: torch.Tensor) -> torch.Tensor:
    """RS_3(x) = 0.3 * min(tanh x, 0) + 5 * max(tanh x, 0)."""
    t = torch.tanh(r)
    return 0.3 * torch.clamp(t, max=0.0) + 5.0 * torch.clamp(t, min=0.0)


def quarter_root(r: torch.Tensor) -> torch.Tensor:
    """GDI-H3's second shape (GDI Table 6): sign(x) * ((|x| + 1)^0.25 - 1) + 0.001 * x."""
    return torch.sign(r) * ((r.abs() + 1.0).pow(0.25) - 1.0) + 0.001 * r


def identity(r: torch.Tensor) -> torch.Tensor:
    return r


def clip(r: torch.Tensor) -> torch.Tensor:
    """IMPALA's Atari reward clipping to [-1, 1]."""
    return torch.clamp(r, -1.0, 1.0)


REWARD_SHAPING: dict[str, RewardFn] = {
    "rs1": rs1, "rs2": rs2, "rs3": rs3, "quarter_root": quarter_root, "identity": identity, "clip": clip,
}
