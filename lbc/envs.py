"""Vectorised environments with one interface: Atari through ale-py's AtariVectorEnv (DESIGN §5
protocol); Catch, a small built-in game for learning checks that take minutes, not days; any Gymnasium
environment with discrete actions (env.kind=gymnasium, env.id); and MinAtar's five games (env.kind=minatar).

All reset finished episodes in the same step: the observation returned with done=True is already
the first one of the next episode. Observations are uint8 images [C, H, W] (a Gymnasium image is moved
to channels first) or float32 vectors [N].
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from lbc.config import MINATAR_CHANNELS, EnvConfig

ATARI_FULL_ACTIONS = 18


MINATAR_ACTIONS = 6   # MinAtar's full action set, as Young & Tian (2019) train with


@dataclass(frozen=True)
class EnvSpec:
    obs_shape: tuple[int, ...]
    num_actions: int
    obs_dtype: str = "uint8"     # or "float32" for vector observations
    # > 1: obs_shape's first axis stacks the last frames, zeros before a game's first (ALE's vector env); sequences
    # then carry each observation's newest frame alone (lbc.sequences)
    frame_stack: int = 1


def env_spec(cfg: EnvConfig) -> EnvSpec:
    """Shapes from the configuration alone (for Gymnasium, from the environment's spaces), so the learner
    needs no emulator."""
    if cfg.kind == "catch":
        return EnvSpec((1, cfg.catch_rows, cfg.catch_columns), 3)
    if cfg.kind == "gymnasium":
        return gymnasium_spec(cfg.id)
    if cfg.kind == "minatar":
        return EnvSpec((minatar_channels(cfg.game), 10, 10), MINATAR_ACTIONS)
    if not cfg.full_action_space:
        raise ValueError("env.full_action_space=false is not supported: the protocol uses the full set")
    return EnvSpec((cfg.stack, cfg.image_size, cfg.image_size), ATARI_FULL_ACTIONS, frame_stack=cfg.stack)


@dataclass
class StepResult:
    obs: np.ndarray         # [E, *obs_shape] uint8
    reward: np.ndarray      # [E] float32, raw game score change
    done: np.ndarray        # [E] bool, episode ended (terminal or frame cap)
    truncated: np.ndarray   # [E] bool, ended by the frame cap
    life_lost: np.ndarray   # [E] bool, a life was lost and the game goes on (always False without lives)
    # [E, *obs_shape]: where `truncated`, the cut episode's last observation (obs holds the next episode's
    # first); None when no episode was cut in this step. The learner bootstraps from its value.
    final_obs: np.ndarray | None = None


ATARI_SCREEN = (210, 160)


def resizes_natively(cfg: EnvConfig) -> bool:
    """Whether Atari games of `cfg` have their screens resized by lbc.native (decision 94): asked to
    (env.native_resize), at a size where it reproduces ALE's resize, and the library loads here."""
    from lbc.screens import AreaResize  # torch's, which replay and the bandit do not import

    size = (cfg.image_size, cfg.image_size)
    return cfg.native_resize and AreaResize.supported(ATARI_SCREEN, size) and AreaResize.available()


class AtariEnvs:
    """ALE games: full action set, no sticky actions, up to 30 no-ops, skip 4 with max-pool,
    84x84 grey, 4-frame stack, no life-loss termination, 108,000-frame cap, raw rewards. Life losses
    are reported (`life_lost`) for the learners that treat them as ends (env.episodic_life).

    With env.native_resize where lbc.native loads (decision 94), ALE hands over its max-pooled grey screens
    unresized and this class resizes them (lbc.screens, cv::resize's INTER_AREA to the bit) and stacks them as
    ALE does (older slots blank at a start): the same observations for 3-19% less of the games' CPU
    (docs/speed.md, session 65)."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int) -> None:
        from ale_py.vector_env import AtariVectorEnv  # heavy import, only where Atari runs

        from lbc.screens import AreaResize  # torch's, which replay and the bandit do not import

        self.spec = env_spec(cfg)
        self.num_envs = num_envs
        self._seed = seed
        size = (cfg.image_size, cfg.image_size)
        native = resizes_natively(cfg)
        self._resize: AreaResize | None = AreaResize(ATARI_SCREEN, size) if native else None
        self._stack: np.ndarray | None = None   # the last observation, where this class stacks the frames
        screen = ATARI_SCREEN if native else size
        self._env = AtariVectorEnv(
            cfg.game, num_envs, num_threads=cfg.num_threads,
            max_num_frames_per_episode=cfg.max_episode_frames,
            repeat_action_probability=cfg.repeat_action_probability,
            full_action_space=True, autoreset_mode="SameStep",
            img_height=screen[0], img_width=screen[1], grayscale=True,
            stack_num=1 if native else cfg.stack, frameskip=cfg.frameskip, maxpool=True, noop_max=cfg.noop_max,
            episodic_life=False, reward_clipping=False, use_fire_reset=False,
        )

    @property
    def resized_by(self) -> str:
        """Who resizes the screens: "lbc.native" or "ALE" (for logs)."""
        return "ALE" if self._resize is None else "lbc.native"

    def _stacked(self, screens: np.ndarray, before: np.ndarray | None, started: np.ndarray | None) -> np.ndarray:
        """The observations ALE would stack: before's newer frames, then each game's screen ([E, 1, 210, 160])
        resized; all older frames blank where a game `started` (None: all of them)."""
        assert self._resize is not None
        out = np.empty((self.num_envs, *self.spec.obs_shape), np.uint8)
        if before is None:
            out[:, :-1] = 0
        else:
            out[:, :-1] = before[:, 1:]
            if started is not None and started.any():
                out[started, :-1] = 0
        self._resize(screens.reshape(self.num_envs, *ATARI_SCREEN), out[:, -1])
        return out

    def reset(self, seed: int | None = None) -> np.ndarray:
        # ALE seeds game i with seed + i as a C int: fold larger seeds (an actor's seed mixes in a CRC-32 of
        # its name) into that range rather than fail with pybind's "incompatible function arguments".
        base = (self._seed if seed is None else seed) % (2**31 - self.num_envs)
        return self._started(*self._env.reset(seed=base))

    def restart(self) -> np.ndarray:
        """New episodes in every game, each game's random numbers going on from where they are: ALE reloads a
        game's ROM to seed it (about 0.1 s of CPU a game), and a reset without a seed does not (5 ms)."""
        return self._started(*self._env.reset(seed=None))

    def _started(self, obs: np.ndarray, info: dict) -> np.ndarray:
        self._lives = info["lives"]
        if self._resize is not None:
            obs = self._stack = self._stacked(obs, None, None)
        return obs

    def step(self, actions: np.ndarray) -> StepResult:
        self.send(actions)
        return self.recv()

    def send(self, actions: np.ndarray) -> None:
        """The first half of step: the games start on ALE's threads and the call returns (recv waits for them)."""
        # AtariVectorEnv hangs without an error on an action outside the set: check first.
        if actions.shape != (self.num_envs,) or actions.min() < 0 or actions.max() >= self.spec.num_actions:
            raise ValueError(f"actions out of range [0, {self.spec.num_actions}): {actions}")
        self._env.send(actions.astype(np.int64))

    def recv(self) -> StepResult:
        """The second half of step: waits for the games `send` started."""
        obs, reward, term, trunc, info = self._env.recv()
        done = term | trunc
        life_lost = (info["lives"] < self._lives) & ~done
        self._lives = info["lives"]
        cut = trunc & ~term
        final_obs = info["final_obs"] if cut.any() else None
        if self._resize is not None:
            before = self._stack
            if final_obs is not None:
                final_obs = self._stacked(final_obs, before, None)
            obs = self._stack = self._stacked(obs, before, done)
        return StepResult(obs, reward.astype(np.float32), done, cut, life_lost, final_obs)

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

    def restart(self) -> np.ndarray:
        return self.reset()   # without a seed its generator goes on

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


@functools.cache
def gymnasium_spec(env_id: str) -> EnvSpec:
    """What lbc makes of a Gymnasium environment's spaces; ValueError naming what it cannot train."""
    import gymnasium as gym

    try:
        env = gym.make(env_id)
    except gym.error.Error as e:
        raise ValueError(f"env.id={env_id!r}: Gymnasium cannot make it ({e})") from None
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Discrete):
        raise ValueError(f"env.id={env_id}: lbc trains discrete actions; this action space is {act_space} "
                         f"(continuous or structured actions are not supported)")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"env.id={env_id}: lbc reads one array per observation; this observation space is "
                         f"{type(obs_space).__name__} (wrap it, e.g. gymnasium.wrappers.FlattenObservation)")
    shape = obs_space.shape
    if obs_space.dtype == np.uint8 and len(shape) in (2, 3):
        return EnvSpec((1, *shape) if len(shape) == 2 else (shape[2], shape[0], shape[1]), int(act_space.n))
    return EnvSpec((int(np.prod(shape)),), int(act_space.n), "float32")


class GymnasiumEnvs:
    """A Gymnasium environment, E copies stepped by gymnasium's SyncVectorEnv with same-step resets. Images
    (uint8, [H, W, C] or [H, W]) become [C, H, W]; anything else a flat float32 vector. Whatever the
    environment's own time limit truncates counts as the frame cap."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int) -> None:
        import gymnasium as gym

        self.spec = env_spec(cfg)
        self.num_envs = num_envs
        self._seed = seed
        self._env = gym.vector.SyncVectorEnv([lambda: gym.make(cfg.id) for _ in range(num_envs)],
                                             autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        if self.spec.obs_dtype == "float32":
            return obs.reshape(self.num_envs, -1).astype(np.float32)
        return obs[:, None] if obs.ndim == 3 else np.ascontiguousarray(obs.transpose(0, 3, 1, 2))

    def reset(self, seed: int | None = None) -> np.ndarray:
        obs, _ = self._env.reset(seed=self._seed if seed is None else seed)
        return self._obs(obs)

    def restart(self) -> np.ndarray:
        obs, _ = self._env.reset(seed=None)   # gymnasium's generators go on
        return self._obs(obs)

    def step(self, actions: np.ndarray) -> StepResult:
        if actions.shape != (self.num_envs,) or actions.min() < 0 or actions.max() >= self.spec.num_actions:
            raise ValueError(f"actions out of range [0, {self.spec.num_actions}): {actions}")
        obs, reward, term, trunc, info = self._env.step(actions.astype(np.int64))
        done = term | trunc
        cut = trunc & ~term
        final = None
        if cut.any():   # gymnasium gives the last observation of every ended episode, None elsewhere
            final = self._obs(np.stack([info["final_obs"][e] if cut[e] else obs[e] for e in range(self.num_envs)]))
        return StepResult(self._obs(obs), reward.astype(np.float32), done, cut, np.zeros_like(done), final)

    def close(self) -> None:
        self._env.close()


def minatar_channels(game: str) -> int:
    """The channels of a MinAtar game's 10x10 board (each a boolean layer: paddle, ball, trail, ...)."""
    return MINATAR_CHANNELS[game]


class MinAtarEnvs:
    """MinAtar (Young & Tian 2019): E games with the package's defaults as its paper trains them (sticky
    actions with probability env.repeat_action_probability, difficulty ramping), all 6 actions, the boolean
    10x10xC board as uint8 0/255 channels first, one frame per step, episodes cut at env.max_episode_frames."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int) -> None:
        try:
            from minatar import Environment
        except ImportError:
            raise ValueError("env.kind=minatar needs the minatar package: pip install 'lbc[minatar]'") from None
        self.spec = env_spec(cfg)
        self.num_envs = num_envs
        self._cap = cfg.max_episode_frames
        self._games = [Environment(cfg.game, sticky_action_prob=cfg.repeat_action_probability)
                       for _ in range(num_envs)]
        self._seed = seed
        self._steps = np.zeros(num_envs, np.int64)

    def _board(self, e: int) -> np.ndarray:
        return self._games[e].state().transpose(2, 0, 1).astype(np.uint8) * 255

    def reset(self, seed: int | None = None) -> np.ndarray:
        base = self._seed if seed is None else seed
        for e, game in enumerate(self._games):
            game.seed(int(np.random.SeedSequence([base, e]).generate_state(1)[0]))   # apart per environment
        return self.restart()

    def restart(self) -> np.ndarray:
        for game in self._games:
            game.reset()   # without a seed its generator goes on
        self._steps[:] = 0
        return np.stack([self._board(e) for e in range(self.num_envs)])

    def step(self, actions: np.ndarray) -> StepResult:
        if actions.shape != (self.num_envs,) or actions.min() < 0 or actions.max() >= MINATAR_ACTIONS:
            raise ValueError(f"actions out of range [0, {MINATAR_ACTIONS}): {actions}")
        reward = np.zeros(self.num_envs, np.float32)
        done = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        obs, final = [], None
        for e, game in enumerate(self._games):
            r, terminal = game.act(int(actions[e]))
            self._steps[e] += 1
            reward[e], done[e] = r, terminal or self._steps[e] >= self._cap
            truncated[e] = done[e] and not terminal
            if truncated[e]:
                final = np.zeros((self.num_envs, *self.spec.obs_shape), np.uint8) if final is None else final
                final[e] = self._board(e)
            if done[e]:
                game.reset()
                self._steps[e] = 0
            obs.append(self._board(e))
        return StepResult(np.stack(obs), reward, done, truncated, np.zeros(self.num_envs, bool), final)

    def close(self) -> None:
        pass


class VectorEnvs(Protocol):
    """What actors, the evaluator and `lbc play` step: E games that reset in the same step they end."""

    spec: EnvSpec
    num_envs: int

    def reset(self, seed: int | None = None) -> np.ndarray: ...   # None: the seed the games were made with
    def restart(self) -> np.ndarray: ...   # new episodes, each game's random numbers going on (no seed)
    def step(self, actions: np.ndarray) -> StepResult: ...
    def close(self) -> None: ...


ENV_KINDS = {"atari": AtariEnvs, "catch": CatchEnvs, "gymnasium": GymnasiumEnvs, "minatar": MinAtarEnvs}


def make_envs(cfg: EnvConfig, num_envs: int, seed: int) -> VectorEnvs:
    return ENV_KINDS[cfg.kind](cfg, num_envs, seed)


class IndependentEnvs:
    """E games made one by one (make_envs(cfg, 1, seed + i)), so that a step can leave some of them alone:
    the evaluator counts the first episodes of each game, and a vector, which steps every game, goes on
    playing the games whose count is complete until the longest counted episode ends, frames it throws away
    (docs/speed.md, decision 75). Game i is seeded as a vector's game i is (seed + i, for seeds below
    2**31 - E), so for the same actions it plays the same frames; ALE's games run on a thread each, all at once."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int) -> None:
        one = cfg.model_copy(update={"num_threads": 1}) if cfg.kind == "atari" else cfg
        self._games = [make_envs(one, 1, seed + i) for i in range(num_envs)]
        self.spec = self._games[0].spec
        self.num_envs = num_envs
        self._seed = seed
        self._obs: np.ndarray | None = None

    def reset(self, seed: int | None = None) -> np.ndarray:
        base = self._seed if seed is None else seed
        self._obs = np.concatenate([game.reset(base + i) for i, game in enumerate(self._games)])
        return self._obs

    def restart(self) -> np.ndarray:
        """New episodes in every game, each game's random numbers going on from where they are (its restart):
        what the evaluator starts every evaluation but its first with, as a seeded reset reloads each ALE game's
        ROM (0.7 s of CPU for 8 games, 13% of an early `impala` evaluation's CPU)."""
        self._obs = np.concatenate([game.restart() for game in self._games])
        return self._obs

    def step(self, actions: np.ndarray, playing: np.ndarray | None = None) -> StepResult:
        """Step the games where `playing` ([E] bool; all when None); the others keep their observation, with no
        reward and no episode end."""
        if self._obs is None:
            raise RuntimeError("reset before step")
        if actions.shape != (self.num_envs,):
            raise ValueError(f"expected {self.num_envs} actions, got shape {actions.shape}")
        rows = range(self.num_envs) if playing is None else np.flatnonzero(playing)
        results: dict[int, StepResult] = {}
        for i in rows:   # ALE's games start on their threads, then are collected
            game = self._games[i]
            if isinstance(game, AtariEnvs):
                game.send(actions[i:i + 1])
            else:
                results[i] = game.step(actions[i:i + 1])
        for i in rows:
            if i not in results:
                results[i] = self._games[i].recv()
        obs = self._obs.copy()
        reward = np.zeros(self.num_envs, np.float32)
        done, truncated, life_lost = (np.zeros(self.num_envs, bool) for _ in range(3))
        for i, r in results.items():
            obs[i], reward[i], done[i] = r.obs[0], r.reward[0], r.done[0]
            truncated[i], life_lost[i] = r.truncated[0], r.life_lost[0]
        cut = {i: r.final_obs[0] for i, r in results.items() if r.final_obs is not None}
        final_obs = None
        if cut:   # the contract's [E, ...], other rows as obs
            final_obs = obs.copy()
            for i, last in cut.items():
                final_obs[i] = last
        self._obs = obs
        return StepResult(obs, reward, done, truncated, life_lost, final_obs)

    def close(self) -> None:
        for game in self._games:
            game.close()
