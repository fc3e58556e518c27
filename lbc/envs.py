"""Vectorised environments with one interface: Atari through ale-py's AtariVectorEnv (DESIGN §5
protocol) and Catch, a small built-in game for learning checks that take minutes, not days.

Both reset finished episodes in the same step: the observation returned with done=True is already
the first one of the next episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from lbc.config import EnvConfig

ATARI_FULL_ACTIONS = 18


@dataclass(frozen=True)
class EnvSpec:
    obs_shape: tuple[int, ...]
    num_actions: int


def env_spec(cfg: EnvConfig) -> EnvSpec:
    """Shapes from the configuration alone, so the learner needs no emulator."""
    if cfg.kind == "catch":
        return EnvSpec((1, cfg.catch_rows, cfg.catch_columns), 3)
    if not cfg.full_action_space:
        raise ValueError("env.full_action_space=false is not supported: the protocol uses the full set")
    return EnvSpec((cfg.stack, cfg.image_size, cfg.image_size), ATARI_FULL_ACTIONS)


@dataclass
class StepResult:
    obs: np.ndarray         # [E, *obs_shape] uint8
    reward: np.ndarray      # [E] float32, raw game score change
    done: np.ndarray        # [E] bool, episode ended (terminal or frame cap)
    truncated: np.ndarray   # [E] bool, ended by the frame cap
    life_lost: np.ndarray   # [E] bool, a life was lost and the game goes on (always False without lives)


class AtariEnvs:
    """ALE games: full action set, no sticky actions, up to 30 no-ops, skip 4 with max-pool,
    84x84 grey, 4-frame stack, no life-loss termination, 108,000-frame cap, raw rewards. Life losses
    are reported (`life_lost`) for the learners that treat them as ends (env.episodic_life)."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int) -> None:
        from ale_py.vector_env import AtariVectorEnv  # heavy import, only where Atari runs

        self.spec = env_spec(cfg)
        self.num_envs = num_envs
        self._seed = seed
        self._env = AtariVectorEnv(
            cfg.game, num_envs, num_threads=cfg.num_threads,
            max_num_frames_per_episode=cfg.max_episode_frames,
            repeat_action_probability=cfg.repeat_action_probability,
            full_action_space=True, autoreset_mode="SameStep",
            img_height=cfg.image_size, img_width=cfg.image_size, grayscale=True,
            stack_num=cfg.stack, frameskip=cfg.frameskip, maxpool=True, noop_max=cfg.noop_max,
            episodic_life=False, reward_clipping=False, use_fire_reset=False,
        )

    def reset(self, seed: int | None = None) -> np.ndarray:
        obs, info = self._env.reset(seed=self._seed if seed is None else seed)
        self._lives = info["lives"]
        return obs

    def step(self, actions: np.ndarray) -> StepResult:
        # AtariVectorEnv hangs without an error on an action outside the set: check first.
        if actions.shape != (self.num_envs,) or actions.min() < 0 or actions.max() >= self.spec.num_actions:
            raise ValueError(f"actions out of range [0, {self.spec.num_actions}): {actions}")
        obs, reward, term, trunc, info = self._env.step(actions.astype(np.int64))
        done = term | trunc
        life_lost = (info["lives"] < self._lives) & ~done
        self._lives = info["lives"]
        return StepResult(obs, reward.astype(np.float32), done, trunc, life_lost)

    def close(self) -> None:
        self._env.close()


class CatchEnvs:
    """Catch (bsuite): a ball falls one row per step from a random column of the top row; the paddle
    on the bottom row moves left, stays or moves right. +1 when the ball lands on the paddle, -1
    otherwise; an episode lasts rows - 1 steps. The best policy scores +1 every episode."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int) -> None:
        self.spec = env_spec(cfg)
        self.num_envs = num_envs
        self.rows, self.cols = cfg.catch_rows, cfg.catch_columns
        self._rng = np.random.default_rng(seed)
        self._ball_row = np.zeros(num_envs, np.int64)
        self._ball_col = np.zeros(num_envs, np.int64)
        self._paddle = np.zeros(num_envs, np.int64)

    def _reset_where(self, mask: np.ndarray) -> None:
        n = int(mask.sum())
        self._ball_row[mask] = 0
        self._ball_col[mask] = self._rng.integers(0, self.cols, n)
        self._paddle[mask] = self.cols // 2

    def _observe(self) -> np.ndarray:
        obs = np.zeros((self.num_envs, 1, self.rows, self.cols), np.uint8)
        idx = np.arange(self.num_envs)
        obs[idx, 0, self._ball_row, self._ball_col] = 255
        obs[idx, 0, self.rows - 1, self._paddle] = 255
        return obs

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._reset_where(np.ones(self.num_envs, bool))
        return self._observe()

    def step(self, actions: np.ndarray) -> StepResult:
        if actions.shape != (self.num_envs,) or actions.min() < 0 or actions.max() >= 3:
            raise ValueError(f"actions out of range [0, 3): {actions}")
        self._paddle = np.clip(self._paddle + actions - 1, 0, self.cols - 1)
        self._ball_row += 1
        done = self._ball_row == self.rows - 1
        reward = np.where(done, np.where(self._ball_col == self._paddle, 1.0, -1.0), 0.0).astype(np.float32)
        self._reset_where(done)
        no = np.zeros(self.num_envs, bool)
        return StepResult(self._observe(), reward, done, no, no.copy())

    def close(self) -> None:
        pass


class VectorEnvs(Protocol):
    """What actors, the evaluator and `lbc play` step: E games that reset in the same step they end."""

    spec: EnvSpec
    num_envs: int

    def reset(self, seed: int | None = None) -> np.ndarray: ...
    def step(self, actions: np.ndarray) -> StepResult: ...
    def close(self) -> None: ...


def make_envs(cfg: EnvConfig, num_envs: int, seed: int) -> AtariEnvs | CatchEnvs:
    if cfg.kind == "catch":
        return CatchEnvs(cfg, num_envs, seed)
    return AtariEnvs(cfg, num_envs, seed)
