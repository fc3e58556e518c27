"""The sequence record actors stream to replay, and the batch replay serves to the learner.

A sequence covers L = burn_in + length steps and L + 1 observations (the last one bootstraps).
Arrays indexed by observation (length L + 1): obs, prev_action, prev_reward, reset.
Arrays indexed by step (length L): action, reward (raw), done, truncated (the frame cap cut the episode),
bootstrap (each policy's value of the cut episode's last observation), behaviour_prob (mu(a_t|x_t)), psi.
h0, c0: the LSTM state before obs[0]. Consecutive sequences of one environment overlap by burn_in.
NGU adds, per observation: mixture (j) and prev_intrinsic (r^i of arriving at x_t, 0 at a reset).

Where an observation stacks the last S frames (Atari: S = 4, EnvSpec.frame_stack), a sequence carries each
observation's newest frame instead of its stack, a quarter of the bytes from actor to replay to learner:
frames (L + S frames: obs[0]'s whole stack, then each later observation's newest frame) and stack_start (per
observation: its stack starts afresh, the older frames zeros, as at a game's first observation). The learner
rebuilds obs from them (lbc.frame_stacks).

Without torch: replay validates and batches sequences in a process that never imports it (decision 71).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from lbc.codec import CodecError, Layout, check_layout, layout_bytes
from lbc.config import Config
from lbc.envs import env_spec
from lbc.family import family_traits
from lbc.psi import psi_problem, psi_width, split_psi
from lbc.rewards import REWARD_SHAPING


def sequence_fields(steps: int, obs_shape: tuple[int, ...], lstm: int, psi_dim: int,
                    extras: Mapping[str, str] | None = None, obs_dtype: str = "uint8", policies: int = 1,
                    frame_stack: int = 1) -> Layout:
    """The one definition of a sequence's fields: name -> (dtype, shape), for `steps` steps. The actor's
    SequenceBuilder is laid out from it, replay and the learner check against it. `truncated` marks steps
    after which the frame cap cut the episode (a subset of `done`), `bootstrap` holds each policy's value of
    the cut episode's last observation there (0 elsewhere), as the actor computed it. With frame_stack > 1
    the observations are `frames` and `stack_start` (the module's docstring), not `obs`."""
    if frame_stack > 1:
        observations = {"frames": (obs_dtype, (steps + frame_stack, *obs_shape[1:])),
                        "stack_start": ("bool", (steps + 1,))}
    else:
        observations = {"obs": (obs_dtype, (steps + 1, *obs_shape))}
    return {
        **observations,
        "prev_action": ("int32", (steps + 1,)),
        "prev_reward": ("float32", (steps + 1,)),
        "reset": ("bool", (steps + 1,)),
        "action": ("int32", (steps,)),
        "reward": ("float32", (steps,)),
        "done": ("bool", (steps,)),
        "truncated": ("bool", (steps,)),
        "bootstrap": ("float32", (steps, policies)),
        "behaviour_prob": ("float32", (steps,)),
        "psi": ("float32", (steps, psi_dim)),
        "h0": ("float32", (lstm,)),
        "c0": ("float32", (lstm,)),
        **{name: (dtype, (steps + 1,)) for name, dtype in (extras or {}).items()},
    }


def sequence_layout(cfg: Config) -> Layout:
    """The sequence layout of a configuration."""
    spec = env_spec(cfg.env)
    return sequence_fields(cfg.sequence.total, spec.obs_shape, cfg.net.lstm, psi_width(cfg.num_components),
                           family_traits(cfg).fields, spec.obs_dtype, cfg.num_policies, spec.frame_stack)


# Kernel buffers each side of an actor's connection to replay hold this many sequences (at least 64 KiB).
SEQUENCES_IN_SOCKET_BUFFERS = 2


def socket_buffer_bytes(cfg: Config) -> int:
    """SO_SNDBUF of an actor's sequence socket and SO_RCVBUF of replay's: room for
    SEQUENCES_IN_SOCKET_BUFFERS sequences, at least 64 KiB. ZeroMQ's high-water marks count messages in its own
    queues, but TCP's buffers hold bytes, and Linux grows them to megabytes (tcp_rmem to 32 MiB on the 2-core
    VM): while replay's rate limiter held an actor, 1.6 KB Catch sequences queued there by the thousand and
    reached the learner 11-27 versions old, where replay alone makes them 5-9 (docs/decisions.md 79)."""
    return max(SEQUENCES_IN_SOCKET_BUFFERS * layout_bytes(sequence_layout(cfg)), 1 << 16)


def batch_layout(cfg: Config) -> Layout:
    """Per sequence of a batch from replay: the sequence, plus the parameter version that produced
    it, its key in replay (for priority updates) and its importance weight (1 unless prioritised)."""
    return {**sequence_layout(cfg), "param_version": ("int64", ()), "key": ("int64", ()),
            "weight": ("float32", ())}


def validate_sequence(arrays: Mapping[str, np.ndarray], cfg: Config) -> None:
    """The layout, then every value against what it can be. Raises
    CodecError with the reason. Nothing a learner trains on may be merely finite: absurd rewards or
    recurrent states poison the model as surely as NaN does.

    - actions and previous actions in the action set; behaviour probabilities in (0, 1];
    - rewards within env.max_abs_reward;
    - psi: tau in [0, tau_max], omega in [0, 1] summing to 1 (lbc.psi.psi_problem);
    - truncated only where done; bootstrap values within value_bound(cfg);
    - h0 in [-1, 1] (h = sigmoid(o) tanh(.)); |c0| at most one per step of an episode (|c_t| <=
      |c_{t-1}| + 1), so at most env.max_episode_frames.
    """
    check_layout(arrays, sequence_layout(cfg))
    _check_values(arrays, cfg)


def validate_batch(arrays: Mapping[str, np.ndarray], cfg: Config, batch_size: int) -> None:
    """A batch from replay: its layout, every sequence's values as validate_sequence, and finite,
    non-negative weights."""
    check_layout(arrays, batch_layout(cfg), (batch_size,))
    _check_values(arrays, cfg)
    if not np.all(np.isfinite(arrays["weight"]) & (arrays["weight"] >= 0.0)):
        raise CodecError("importance weights must be finite and non-negative", "value")


def _check_values(arrays: Mapping[str, np.ndarray], cfg: Config) -> None:
    """The checks by meaning of validate_sequence, on arrays whose layout is already checked."""
    num_actions = env_spec(cfg.env).num_actions
    for name in ("action", "prev_action"):
        if arrays[name].min() < 0 or arrays[name].max() >= num_actions:
            raise CodecError(f"{name} outside [0, {num_actions})", "value")
    prob = arrays["behaviour_prob"]
    if not np.all((prob > 0.0) & (prob <= 1.0 + 1e-5)):
        raise CodecError("behaviour_prob outside (0, 1]", "value")
    bound = cfg.env.max_abs_reward
    for name in ("reward", "prev_reward"):
        if not np.all(np.abs(arrays[name]) <= bound):   # False for NaN too
            raise CodecError(f"{name} not finite or beyond env.max_abs_reward={bound:g}", "value")
    problem = psi_problem(*split_psi(arrays["psi"], cfg.num_components), cfg.tau_max)
    if problem:
        raise CodecError(f"psi: {problem}", "value")
    if np.any(arrays["truncated"] & ~arrays["done"]):
        raise CodecError("truncated where the episode did not end (done)", "value")
    bound = value_bound(cfg)
    if not np.all(np.abs(arrays["bootstrap"]) <= bound):
        raise CodecError(f"bootstrap not finite or beyond {bound:g}, the largest value any policy can have", "value")
    if not np.all(np.abs(arrays["h0"]) <= 1.0 + 1e-5):
        raise CodecError("h0 outside [-1, 1], which no LSTM produces", "value")
    if not np.all(np.abs(arrays["c0"]) <= cfg.env.max_episode_frames):
        raise CodecError(f"c0 not finite or beyond {cfg.env.max_episode_frames} (one per step)", "value")
    problem = family_traits(cfg).check_fields(arrays, cfg)
    if problem:
        raise CodecError(problem, "value")


def value_bound(cfg: Config) -> float:
    """The largest |V_i| any policy can have: its shaped reward at env.max_abs_reward, every step, forever:
    max_i max |RS_i(+-max_abs_reward)| / (1 - gamma_i)."""
    return _value_bound(cfg.env.max_abs_reward, tuple((p.reward_shaping, p.gamma) for p in cfg.policies))


@functools.cache
def _value_bound(max_abs_reward: float, policies: tuple[tuple[str, float], ...]) -> float:
    # once per configuration: replay checks every sequence against it (65 us a call on two cores)
    largest = np.array([max_abs_reward, -max_abs_reward], np.float64)
    return max(float(np.abs(REWARD_SHAPING[shaping](largest)).max()) / (1.0 - gamma) for shaping, gamma in policies)


def stack(sequences: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Batch sequences along a new leading axis."""
    return {name: np.stack([s[name] for s in sequences]) for name in sequences[0]}
