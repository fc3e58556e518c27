"""An actor's frame stacks kept as its first convolution reads them (lbc.frame_ring, decision 85), pushed by torch's
passes or by lbc.native (decision 97)."""

import numpy as np
import pytest
import torch

from lbc import native
from lbc.config import load_config
from lbc.envs import make_envs
from lbc.frame_ring import FrameRing
from lbc.nets import TORSOS, read_frames


def _blocks_by_numpy(obs: np.ndarray, k: int, centre: bool) -> np.ndarray:
    """The stacks obs [E, S, H, W] as the first convolution reads them in k x k blocks, written from the definition:
    [E, H / k, W / k, S, k k], element (e, i, j, s, dy k + dx) pixel (k i + dy, k j + dx) of frame s, less the frame's
    lower median over every 4th pixel each way where `centre`."""
    num_envs, stack, height, width = obs.shape
    x = obs.astype(np.int16)
    if centre:
        sample = np.sort(obs[:, :, ::4, ::4].reshape(num_envs, stack, -1), axis=-1)
        x = x - sample[..., (sample.shape[-1] - 1) // 2][..., None, None]
    x = x.reshape(num_envs, stack, height // k, k, width // k, k).transpose(0, 2, 4, 1, 3, 5)
    return x.reshape(num_envs, height // k, width // k, stack, k * k)


def _slots_in_stack_order(ring_frames) -> np.ndarray:
    """A ring's Frames [E, S k k, h, w] (channels-last, groups rotated) as [E, h, w, S, k k] in the stack's order."""
    pixels = ring_frames.pixels
    num_envs, channels, h, w = pixels.shape
    assert pixels.is_contiguous(memory_format=torch.channels_last)
    area = ring_frames.blocks ** 2
    grouped = pixels.permute(0, 2, 3, 1).reshape(num_envs, h, w, channels // area, area)
    return grouped.roll(-ring_frames.rotation, dims=3).float().numpy()


NATIVE = pytest.mark.skipif(native.frame_ring_op() is None, reason="lbc.native is not built or does not load here")
PUSHED_BY = [pytest.param(False, id="torch"), pytest.param(True, id="native", marks=NATIVE)]


@pytest.mark.parametrize("native_push", PUSHED_BY)
@pytest.mark.parametrize("preset, game, frame_cap", [("cpu", "pong", 240), ("impala", "breakout", 108_000)])
def test_the_ring_holds_every_stack_the_games_give_across_game_starts(preset, game, frame_cap, native_push):
    """Real ALE games, each step's stacks pushed: the ring's Frames are, exactly, the stacks in 4 x 4 blocks (centred
    where the preset centres its frames, in bfloat16), written from their definition, across games cut by the frame
    cap (Pong) and ended (Breakout, whose life losses keep the stack). The groups' rotation walks the slots."""
    cfg = load_config(preset, [f"env.game={game}", f"env.max_episode_frames={frame_cap}"])
    num_envs = 3
    envs = make_envs(cfg.env, num_envs, seed=5)
    ring = FrameRing(num_envs, envs.spec.obs_shape, 4, cfg.net.centre_frames, torch.bfloat16, native_push)
    assert ring.pushed_by == ("lbc.native" if native_push else "torch")
    rng = np.random.default_rng(0)
    obs, ended, rotations = envs.reset(), 0, set()
    for _ in range(400):
        frames = ring.push(obs)
        assert frames.blocks == 4 and frames.medians is None and frames.pixels.dtype == torch.bfloat16
        rotations.add(frames.rotation)
        np.testing.assert_array_equal(_slots_in_stack_order(frames), _blocks_by_numpy(obs, 4, cfg.net.centre_frames))
        result = envs.step(rng.integers(0, envs.spec.num_actions, num_envs))
        ended += int(result.done.sum())
        obs = result.obs
    envs.close()
    assert ended >= 3, "the stream must cross game starts"
    assert rotations == {0, 1, 2, 3}


@pytest.mark.parametrize("native_push", PUSHED_BY)
@pytest.mark.parametrize("centre", [False, True])
def test_the_first_convolution_reads_the_ring_as_it_reads_the_stacks(centre, native_push):
    """FrameConv2d over the ring's Frames, its weight's groups rotated to the slots, equals its convolution of the
    same stacks read whole (read_frames), in float32 to 1e-5, at every rotation; the ring's first push takes a
    whole stack, later ones the newest frame, zeros where a stack starts afresh; slicing and reshaping keep the
    rotation."""
    torch.manual_seed(0)
    conv = TORSOS["small"]((4, 84, 84), 32).convs[0].to(memory_format=torch.channels_last)
    conv.centre = centre
    rng = np.random.default_rng(0)
    num_envs, stack = 3, 4
    frames = rng.integers(0, 256, (num_envs, 12, 84, 84), dtype=np.uint8)
    frames[:, :, ::3] = 87   # a background for the medians
    ring = FrameRing(num_envs, (stack, 84, 84), 4, centre, torch.float32, native_push)
    obs = frames[:, :stack].copy()
    for t in range(8):
        if t == 5:   # game 1 starts afresh
            obs[1, :-1] = 0
        got = ring.push(obs)
        with torch.no_grad():
            want = conv(read_frames(torch.from_numpy(obs), centre))
            read = conv(got)
            torch.testing.assert_close(read, want, rtol=1e-5, atol=1e-5)
            assert torch.equal(conv(got.reshape(num_envs, *got.shape[1:])[1:]), read[1:])
        assert got[1:].rotation == got.reshape(*got.shape).rotation == got.rotation == t % stack
        obs = np.concatenate([obs[:, 1:], frames[:, stack + t: stack + t + 1]], axis=1)
    with pytest.raises(ValueError, match="do not split"):
        FrameRing(num_envs, (stack, 82, 84), 4, centre, torch.float32)


@NATIVE
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("stack, height, width", [(4, 84, 84), (1, 84, 84), (2, 36, 20), (3, 12, 44)])
def test_the_native_push_writes_what_torchs_passes_write(dtype, stack, height, width):
    """lbc.native's push against torch's, to the bit, step after step: frames of every value 0-255 (medians from 0
    to 255 among them: a frame all one value, a frame whose corners are half 0 and half 255), stacks started afresh
    in some games and not others, centred and not; frame sizes whose pixels are not a multiple of the kernel's
    32-byte reads."""
    rng = np.random.default_rng(stack * 1000 + height)
    num_envs = 5
    for centre in (True, False):
        rings = [FrameRing(num_envs, (stack, height, width), 4, centre, dtype, native_push=by) for by in (False, True)]
        assert [r.pushed_by for r in rings] == ["torch", "lbc.native"]
        obs = rng.integers(0, 256, (num_envs, stack, height, width), dtype=np.uint8)
        for t in range(3 * stack + 2):
            got = [r.push(obs) for r in rings]
            assert torch.equal(got[0].pixels, got[1].pixels) and got[0].rotation == got[1].rotation, (centre, t)
            new = rng.integers(0, 256, (num_envs, height, width), dtype=np.uint8)
            new[0] = 255 if t % 2 else 0                            # medians at both ends
            new[1, ::4, ::4] = 0
            new[1, ::8, ::4] = 255                                  # half the corners each end
            obs = np.concatenate([obs[:, 1:], new[:, None]], axis=1)
            if t % 3 == 1:
                obs[2:4, :-1] = 0                                   # two games start afresh
            if t % 4 == 3:
                obs[4, :-1] = 0
                obs[4, 0, -1, -1] = 1                               # not afresh: one pixel of an older frame


@NATIVE
def test_the_native_push_refuses_what_it_cannot_write():
    op = native.frame_ring_op()
    obs = torch.zeros(2, 4, 84, 84, dtype=torch.uint8)
    slots = torch.zeros(2, 21, 21, 4, 16)
    op(obs, slots, 3, True)
    for bad_obs, bad_slots, slot, message in [
        (obs, slots, 4, "slot -1"),
        (obs, slots.to(torch.float16), 0, "float32 or bfloat16"),
        (obs, slots[:, :, :, :3], 0, "contiguous"),
        (obs[:, :, :, :82], torch.zeros(2, 21, 20, 4, 16), 0, "each frame contiguous"),
        (obs[:, :, :82, :].contiguous(), torch.zeros(2, 20, 21, 4, 16), 0, "multiple of 4"),
        (obs.float(), slots, 0, "uint8"),
    ]:
        with pytest.raises(RuntimeError, match=message):
            op(bad_obs, bad_slots, slot, True)


def test_the_ring_is_pushed_by_torch_where_lbc_native_cannot(monkeypatch):
    """Blocks other than 4x4, another dtype, or the library not loaded: torch's passes push, and say so."""
    assert FrameRing(2, (4, 84, 84), 2, True, torch.float32).pushed_by == "torch"
    assert FrameRing(2, (4, 84, 84), 4, True, torch.float16).pushed_by == "torch"
    monkeypatch.setattr(native, "frame_ring_op", lambda: None)
    ring = FrameRing(2, (4, 84, 84), 4, True, torch.float32)
    assert ring.pushed_by == "torch"
    obs = np.random.default_rng(0).integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
    np.testing.assert_array_equal(_slots_in_stack_order(ring.push(obs)), _blocks_by_numpy(obs, 4, True))
