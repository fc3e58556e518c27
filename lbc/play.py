"""`lbc play RUN`: load a run's checkpoint, play its evaluation policy on the real game, print each
episode's score and write the game's frames as an mp4 (Atari: the emulator's colour frames; MinAtar: the
board, one colour per channel; other environments: scores only).

The game runs on ale-py's ALEInterface, so that every emulator frame is at hand in colour for the
video. The agent sees what actors and the evaluator see (DESIGN §5): frame skip 4 with the max of the
last two frames, greyscale, 84x84, a stack of 4 (blank before the first frame), up to 30 no-ops at the
start, the full action set and the frame cap. One approximation: the down-scaling is Pillow's bicubic,
which differs from the vector environment's by 0.5 grey levels per pixel on average (measured on
Breakout; Pillow's box filter differed by 1.6, its bilinear by 1.0). The episodes are played by the evaluator's own loop
(actor_svc.evaluator.play) with the run's evaluation policy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lbc.config import EnvConfig
from lbc.envs import ATARI_FULL_ACTIONS, StepResult, env_spec, make_envs
from lbc.run_folder import find_checkpoint, load_config_of


class RenderedGame:
    """One ALE game behind the vector-environment interface (num_envs = 1, same-step resets) that also
    keeps the colour frames of every emulator step in `frames` (when `record` is set)."""

    def __init__(self, cfg: EnvConfig, seed: int, max_frames: int | None = None, record: bool = False) -> None:
        import ale_py
        from ale_py import roms

        self.cfg = cfg
        self.spec = env_spec(cfg)
        self.num_envs = 1
        self.record = record
        self.frames: list[np.ndarray] = []
        self.episode_frames: list[int] = []   # emulator frames of each finished game, no-ops included
        self._rng = np.random.default_rng(seed)
        self.ale = ale_py.ALEInterface()
        self.ale.setLoggerMode(ale_py.LoggerMode.Error)
        self.ale.setInt("random_seed", seed)
        self.ale.setFloat("repeat_action_probability", cfg.repeat_action_probability)
        self.ale.setInt("max_num_frames_per_episode", max_frames or cfg.max_episode_frames)
        self.ale.loadROM(roms.get_rom_path(cfg.game))
        self.actions = self.ale.getLegalActionSet()
        assert len(self.actions) == ATARI_FULL_ACTIONS
        self._stack = np.zeros((cfg.stack, cfg.image_size, cfg.image_size), np.uint8)
        self._lives = 0

    def _frame(self, grey_pair: list[np.ndarray]) -> np.ndarray:
        pooled = np.maximum(grey_pair[0], grey_pair[-1])
        size = self.cfg.image_size
        return np.asarray(Image.fromarray(pooled).resize((size, size), Image.Resampling.BICUBIC), np.uint8)

    def _advance(self, action: int, repeat: int, record: bool = True) -> tuple[float, list[np.ndarray]]:
        reward, greys = 0.0, []
        for _ in range(repeat):
            reward += self.ale.act(self.actions[action])
            if self.record and record:
                self.frames.append(self.ale.getScreenRGB())
            greys = (greys + [self.ale.getScreenGrayscale()])[-2:]
            if self.ale.game_over():
                break
        return reward, greys

    def _start(self, record: bool) -> np.ndarray:
        """A new game after up to noop_max no-ops; `record` keeps their frames (not for the game that only
        starts because the last one ended, which nobody plays)."""
        self.ale.reset_game()
        greys = [self.ale.getScreenGrayscale()]
        for _ in range(int(self._rng.integers(0, self.cfg.noop_max + 1))):
            _, greys = self._advance(0, 1, record)
        self._stack[:] = 0                 # as the vector environment: older slots are blank at a start
        self._stack[-1] = self._frame(greys)
        self._lives = self.ale.lives()
        return self._stack.copy()[None]

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        return self._start(record=True)

    def restart(self) -> np.ndarray:
        return self.reset()   # without a seed its generator goes on

    def step(self, actions: np.ndarray) -> StepResult:
        reward, greys = self._advance(int(actions[0]), self.cfg.frameskip)
        done = self.ale.game_over()
        truncated = self.ale.game_truncated()
        life_lost = self.ale.lives() < self._lives and not done
        self._lives = self.ale.lives()
        if done:
            self.episode_frames.append(self.ale.getEpisodeFrameNumber())
            obs = self._start(record=False)
        else:
            self._stack = np.concatenate([self._stack[1:], self._frame(greys)[None]])
            obs = self._stack.copy()[None]
        return StepResult(obs, np.array([reward], np.float32), np.array([done]), np.array([truncated]),
                          np.array([life_lost]))

    def close(self) -> None:
        pass


def board_image(board: np.ndarray, scale: int = 16) -> np.ndarray:
    """A MinAtar board (C x 10 x 10, each channel 0 or 255) as an RGB picture: every channel in its own
    colour (matplotlib's tab10), later channels drawn over earlier ones, `scale` pixels per cell."""
    from matplotlib import colormaps

    palette = (np.asarray(colormaps["tab10"].colors) * 255).astype(np.uint8)
    image = np.zeros((*board.shape[1:], 3), np.uint8)
    for channel in range(board.shape[0]):
        image[board[channel] > 0] = palette[channel % len(palette)]
    return image.repeat(scale, axis=0).repeat(scale, axis=1)


def play_cli(args: argparse.Namespace) -> int:
    from actor_svc.evaluator import eval_env_config, play
    from lbc.acting import acting_agent, evaluation_policy
    from lbc.agents import make_acting
    from lbc.nets import policy_net

    run_dir = Path(args.run)
    cfg = load_config_of(run_dir, "play")
    kind = cfg.env.kind
    if args.video and kind not in ("atari", "minatar"):
        raise SystemExit(f"lbc play: --video is for Atari and MinAtar runs; this run plays env.kind={kind} "
                         "(scores are printed without it)")
    path, state = find_checkpoint(run_dir, args.version, "play")
    frames: list[np.ndarray] = []
    on_frame = None
    if kind == "atari":
        game = RenderedGame(eval_env_config(cfg), args.seed, args.max_frames, record=args.video is not None)
        frames = game.frames
    else:
        env_cfg = eval_env_config(cfg).model_copy(
            update={"max_episode_frames": args.max_frames or cfg.env.max_episode_frames})
        game = make_envs(env_cfg, 1, args.seed)
        if args.video:
            def on_frame(obs: np.ndarray, actions: np.ndarray) -> None:
                frames.append(board_image(obs[0]))
    agent = acting_agent(cfg, game.spec.obs_shape, game.spec.num_actions)
    agent.load_state_dict(state["model"])
    net = policy_net(agent)
    acting = make_acting(cfg, agent, 1)
    policy = args.policy or evaluation_policy(cfg)
    print(f"playing {cfg.env.name} with {path.name} (version {state['version']}, learner step {state['step']}), "
          f"policy {policy}", flush=True)
    scores = []
    # one generator for all games: reseeding it per game replays the same draws, and on a deterministic
    # emulator (no sticky actions) the same game
    generator = torch.Generator().manual_seed(args.seed)
    for episode in range(args.episodes):
        played = play(cfg, net, game, 1, args.seed + episode, policy, acting, generator, on_frame=on_frame)
        scores += played[0]
        print(f"episode {episode + 1}: score {played[0][0]:.0f} ({played[1]} agent steps)", flush=True)
    print(f"mean {np.mean(scores):.2f} +- {np.std(scores):.2f} over {len(scores)} episode(s)")
    if args.video:
        write_video(Path(args.video), frames, fps=60 if kind == "atari" else 10)
        print(f"wrote {args.video} ({len(frames)} frames)")
    game.close()
    return 0


def write_video(path: Path, frames: list[np.ndarray], fps: int = 60) -> None:
    """The emulator's frames (60 per second of game time) as H.264 mp4, via imageio's ffmpeg (the binary its
    PyPI package ships)."""
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    with imageio.get_writer(str(path), format="ffmpeg", fps=fps, codec="libx264", macro_block_size=2,
                            quality=7) as writer:
        for frame in frames:
            writer.append_data(frame)
