"""Sequences of single frames (lbc.sequences): the learner rebuilds every frame stack the actor saw."""

import numpy as np
import pytest
import torch

from actor_svc.sequencer import SequenceBuilder
from lbc.config import load_config
from lbc.envs import make_envs
from lbc.frame_stacks import observations, observations_at, stacked_frames
from lbc.nets import build_net
from lbc.psi import psi_width
from lbc.sequences import sequence_fields, sequence_layout, stack
from learner_svc.training import to_time_major


def _stacks_by_loop(frames: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """stacked_frames written as its definition: channel k of observation t holds the frame of step
    t - (S - 1 - k), zero where a stack started afresh after that step."""
    batch, steps = starts.shape
    stack_size = frames.shape[1] - steps + 1
    out = np.zeros((batch, steps, stack_size, *frames.shape[2:]), frames.dtype)
    for b in range(batch):
        last = None   # no fresh stack yet: every frame of the window counts
        for t in range(steps):
            if starts[b, t]:
                last = t
            for k in range(stack_size):
                if last is None or t - (stack_size - 1 - k) >= last:
                    out[b, t, k] = frames[b, t + k]
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a visible GPU"))])
@pytest.mark.parametrize("stack_size", [2, 4])
def test_stacked_frames_is_its_definition(stack_size, device):
    rng = np.random.default_rng(stack_size)
    frames = rng.integers(1, 256, (3, 9 + stack_size - 1, 2, 3), dtype=np.uint8)
    starts = rng.random((3, 9)) < 0.25
    starts[1] = False
    starts[2, [0, 1, 5]] = True
    frames_t, starts_t = torch.from_numpy(frames).to(device), torch.from_numpy(starts).to(device)
    got = stacked_frames(frames_t, starts_t)
    assert got.dtype == torch.uint8 and got.shape == (3, 9, stack_size, 2, 3) and got.is_contiguous()
    np.testing.assert_array_equal(got.cpu().numpy(), _stacks_by_loop(frames, starts))
    time_major = stacked_frames(frames_t, starts_t, time_major=True)
    assert time_major.is_contiguous() and torch.equal(time_major, got.transpose(0, 1))


def test_stacked_frames_by_hand():
    # one sequence of 4 observations of 1-pixel frames 1..6, S = 3, a fresh stack at observation 2
    frames = torch.arange(1, 7, dtype=torch.uint8).view(1, 6, 1)
    starts = torch.tensor([[False, False, True, False]])
    got = stacked_frames(frames, starts)[0, :, :, 0].tolist()
    assert got == [[1, 2, 3], [2, 3, 4], [0, 0, 5], [0, 5, 6]]
    # the host's view of a batch (the learner's probes of its torso): the same stacks, or `obs` as it is
    on_host = observations_at({"frames": frames.numpy(), "stack_start": starts.numpy()}, np.zeros(4, np.int64),
                              np.arange(4))
    assert on_host[:, :, 0].tolist() == got
    plain = np.random.default_rng(0).integers(0, 256, (2, 4, 3, 1), dtype=np.uint8)
    np.testing.assert_array_equal(observations_at({"obs": plain}, np.array([1, 0]), np.array([2, 3])),
                                  plain[[1, 0], [2, 3]])


def test_atari_sequences_carry_single_frames_a_quarter_of_the_bytes():
    cfg = load_config("lbc-bm", ["env.game=breakout"])
    layout = sequence_layout(cfg)
    steps = cfg.sequence.total
    assert "obs" not in layout
    assert layout["frames"] == ("uint8", (steps + 4, 84, 84)) and layout["stack_start"] == ("bool", (steps + 1,))
    stacked = sequence_fields(steps, (4, 84, 84), cfg.net.lstm, 1)["obs"]
    assert np.prod(layout["frames"][1]) * 3.9 < np.prod(stacked[1])


@pytest.mark.parametrize("preset, game, frame_cap", [("cpu", "pong", 240), ("impala", "breakout", 108_000)])
def test_the_learner_rebuilds_every_stack_the_actor_saw_across_game_starts(preset, game, frame_cap):
    """Real ALE games through the actor's SequenceBuilder, the learner's batch path (to_time_major) and back:
    each observation's stack equals what the game gave, across games cut by the frame cap (Pong) and ended
    (Breakout, random play loses its five lives quickly); life losses (impala's episodic_life) keep the stack."""
    cfg = load_config(preset, [f"env.game={game}", f"env.max_episode_frames={frame_cap}"])
    num_envs, burn = 3, cfg.sequence.burn_in
    envs = make_envs(cfg.env, num_envs, seed=5)
    builder = SequenceBuilder(num_envs, burn, sequence_layout(cfg))
    rng = np.random.default_rng(0)
    obs, seen, sequences, ended = envs.reset(), [], [], 0
    zeros = np.zeros(num_envs, np.float32)
    for _ in range(400):
        seen.append(obs)
        for seq, _version in builder.observe(obs, np.zeros(num_envs, np.int32), zeros, np.zeros(num_envs, bool),
                                             np.zeros((num_envs, cfg.net.lstm), np.float32),
                                             np.zeros((num_envs, cfg.net.lstm), np.float32), 0):
            sequences.append(seq)
        actions = rng.integers(0, envs.spec.num_actions, num_envs).astype(np.int32)
        result = envs.step(actions)
        builder.act(actions, result.reward, result.done, np.full(num_envs, 0.5, np.float32),
                    np.zeros((num_envs, psi_width(cfg.num_components)), np.float32))
        ended += int(result.done.sum())
        obs = result.obs
    envs.close()
    assert ended >= 3, "the stream must cross game starts"
    b = to_time_major(stack(sequences))
    obs = observations(b)
    per_sequence = cfg.sequence.total + 1
    # sequence i of env e starts at observation (i // num_envs) * length
    for i in range(len(sequences)):
        start = (i // num_envs) * cfg.sequence.length
        want = np.stack([seen[start + t][i % num_envs] for t in range(per_sequence)])
        np.testing.assert_array_equal(obs[:, i].numpy(), want)
    # the network reads the same stacks straight from the frames (LBCNet.sequence_input)
    net = build_net(cfg, envs.spec.obs_shape, envs.spec.num_actions).set_channels_last(True)
    read, want = net.sequence_input(b), net.torso_input(obs)
    assert torch.equal(read.pixels, want.pixels) and read.pixels.stride() == want.pixels.stride()
