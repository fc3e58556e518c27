"""The sequence record actors stream to replay, and the batch replay serves to the learner.

A sequence covers L = burn_in + length steps and L + 1 observations (the last one bootstraps).
Arrays indexed by observation (length L + 1): obs, prev_action, prev_reward, reset.
Arrays indexed by step (length L): action, reward (raw), done, behaviour_prob (mu(a_t|x_t)), psi.
h0, c0: the LSTM state before obs[0]. Consecutive sequences of one environment overlap by burn_in.
NGU adds, per observation: mixture (j) and prev_intrinsic (r^i of arriving at x_t, 0 at a reset).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from lbc.codec import CodecError, Layout, check_layout
from lbc.config import Config
from lbc.envs import env_spec


def observation_extras(cfg: Config) -> dict[str, str]:
    """Fields recorded per observation beyond the core ones: name -> dtype."""
    return {"mixture": "int32", "prev_intrinsic": "float32"} if cfg.ngu.enabled else {}


def sequence_layout(cfg: Config) -> Layout:
    steps = cfg.sequence.total
    obs_shape = env_spec(cfg.env).obs_shape
    return {
        "obs": ("uint8", (steps + 1, *obs_shape)),
        "prev_action": ("int32", (steps + 1,)),
        "prev_reward": ("float32", (steps + 1,)),
        "reset": ("bool", (steps + 1,)),
        "action": ("int32", (steps,)),
        "reward": ("float32", (steps,)),
        "done": ("bool", (steps,)),
        "behaviour_prob": ("float32", (steps,)),
        "psi": ("float32", (steps, 2 * cfg.num_components)),
        "h0": ("float32", (cfg.net.lstm,)),
        "c0": ("float32", (cfg.net.lstm,)),
        **{name: (dtype, (steps + 1,)) for name, dtype in observation_extras(cfg).items()},
    }


def batch_layout(cfg: Config) -> Layout:
    """Per sequence of a batch from replay: the sequence, plus the parameter version that produced
    it, its key in replay (for priority updates) and its importance weight (1 unless prioritised)."""
    return {**sequence_layout(cfg), "param_version": ("int64", ()), "key": ("int64", ()),
            "weight": ("float32", ())}


def validate_sequence(arrays: Mapping[str, np.ndarray], cfg: Config) -> None:
    """Layout plus the values a learner would choke on. Raises CodecError with the reason."""
    check_layout(arrays, sequence_layout(cfg))
    num_actions = env_spec(cfg.env).num_actions
    action = arrays["action"]
    if action.min() < 0 or action.max() >= num_actions:
        raise CodecError(f"action outside [0, {num_actions})")
    prob = arrays["behaviour_prob"]
    if not np.all((prob > 0.0) & (prob <= 1.0 + 1e-5)):
        raise CodecError("behaviour_prob outside (0, 1]")
    for name in ("reward", "prev_reward", "psi", "h0", "c0"):
        if not np.all(np.isfinite(arrays[name])):
            raise CodecError(f"{name} has non-finite values")
    if cfg.ngu.enabled:
        mixture, intrinsic = arrays["mixture"], arrays["prev_intrinsic"]
        if mixture.min() < 0 or mixture.max() >= cfg.ngu.num_mixtures:
            raise CodecError(f"mixture outside [0, {cfg.ngu.num_mixtures})")
        if not np.all(np.isfinite(intrinsic) & (intrinsic >= 0.0)):
            raise CodecError("prev_intrinsic must be finite and non-negative")


def stack(sequences: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Batch sequences along a new leading axis."""
    return {name: np.stack([s[name] for s in sequences]) for name in sequences[0]}
