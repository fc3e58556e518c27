"""Networks: IMPALA small and deep torsos, an LSTM core and N dueling heads (A_i, V_i).

One forward pass yields every policy's head at once: the torso and core are shared, the heads are
one linear layer of N * (|A| + 1) outputs (see docs/decisions.md: shared torso).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from lbc import native
from lbc.blocked_conv import StridedConv2d, block_size
from lbc.family import family_traits
from lbc.frame_stacks import observations, stack_keep
from lbc.lstm_bptt import EPS as LN_EPS
from lbc.lstm_bptt import GraphCache, forward_by_graphs, ln_lstm_steps_bptt
from lbc.ngu_nets import NguAgent, NguAux
from lbc.recycling import Link, dormant_scores, recycle, unit_activity
from lbc.torsos import resolve_torso, torso_problem


def frame_medians(frames: torch.Tensor, by_sort: bool = False) -> torch.Tensor:
    """[M, C]: the lower median of each frame of uint8 frames [M, C, H, W], the background's grey, read from every
    4th pixel each way (16x faster than all of them, and the same on Atari)."""
    return lower_median(frames[..., ::4, ::4].flatten(2), by_sort)


def pixels_to_input(frames: torch.Tensor, centre: bool, by_sort: bool = False) -> torch.Tensor:
    """uint8 frames [M, C, H, W] as a torso's float input: x / 255 in [0, 1], or with `centre` each frame less
    its median, (x - m) / 255 in [-1, 1] (docs/decisions.md 34). The meaning of every torso's input;
    FrameConv2d computes a convolution of it without materialising it."""
    x = frames.float()
    if centre:
        x = x - frame_medians(frames, by_sort).float()[..., None, None]
    return x / 255.0


def gather_rows(x: torch.Tensor, index: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """x.index_select(dim, index), each pick copied as one row: the axes after `dim` are flattened first. On a
    CPU, index_select over the second axis of a float32 [T, B, H, W, C] batch of frames copies element by
    element (20-50 ms for a `cpu` batch's 9 sequences, against 5 ms as rows: docs/speed.md, session 37)."""
    picked = x.reshape(*x.shape[:dim + 1], -1).index_select(dim, index)
    return picked.view(*x.shape[:dim], len(index), *x.shape[dim + 1:])


@dataclass(frozen=True)
class Frames:
    """uint8 frames as a convolutional torso reads them: their pixel values [..., C, H, W] in the dtype the
    first convolution computes them in (float32, or bfloat16 under bf16 autocast: pixel_dtype), laid out in the
    torso's memory format, and each frame's median [..., C] when frames are centred in float32 (else None: in
    bfloat16 the pixels are the centred x - m themselves, exact there, and the convolution is a plain one).

    Reading them is the torso's costliest pass after its convolutions (docs/speed.md). The learner reads a
    batch's frames once and gives them to every network that convolves them (online and target) and to
    both the burn-in and the learning steps. Indexing slices the leading (time) axes of both.

    With `blocks` k > 1 the pixels are the frames in k x k blocks (space-to-depth, decision 83): [..., C k k, H / k,
    W / k], channel c k k + dy k + dx at (i, j) holding pixel (k i + dy, k j + dx) of channel c; a first
    convolution of stride k convolves them as a stride-1 convolution of its weight in blocks alike (FrameConv2d).
    Only frames without medians come in blocks. Frames in blocks may hold a stack's frames rotated (`rotation` r:
    lbc.frame_ring's slots): channel group g (its k k channels) holds the stack's frame (g - r) mod C, and the
    convolution rotates its weight's groups alike."""

    pixels: torch.Tensor
    medians: torch.Tensor | None
    blocks: int = 1
    rotation: int = 0

    @property
    def shape(self) -> torch.Size:
        return self.pixels.shape

    def __getitem__(self, index: slice) -> Frames:
        return replace(self, pixels=self.pixels[index], medians=None if self.medians is None else self.medians[index])

    def take(self, index: torch.Tensor) -> Frames:
        """The sequences `index` of frames [T, B, C, H, W], each frame kept in its memory layout (index_select
        would give the default layout, which the torso would copy back into its own). One gather, not a copy
        per sequence: on a GPU each copy is a launch, and reading the index on the host waits for the device."""
        pixels = self.pixels
        if pixels[0].is_contiguous(memory_format=torch.channels_last):
            # a channels-last frame is [H, W, C] in memory: gather whole frames there
            pixels = gather_rows(pixels.permute(0, 1, 3, 4, 2), index).permute(0, 1, 4, 2, 3)
        else:
            pixels = gather_rows(pixels, index)
        medians = None if self.medians is None else self.medians.index_select(1, index)
        return replace(self, pixels=pixels, medians=medians)

    def reshape(self, *shape: int) -> Frames:
        """The frames with the leading axes reshaped, e.g. [T, B, C, H, W] -> [T * B, C, H, W]."""
        lead = shape[:-3]
        return replace(self, pixels=self.pixels.reshape(*shape),
                       medians=None if self.medians is None else self.medians.reshape(*lead, self.medians.shape[-1]))


def pixel_dtype(device_type: str) -> torch.dtype:
    """The dtype a torso's first convolution computes pixels in: bfloat16 under bf16 autocast, where the
    convolution would cast float32 pixels to it anyway, else float32. Pixel values 0..255, and a centred frame's
    x - m in -255..255, are integers that bfloat16's 8 significant bits hold exactly, so reading uint8 straight
    into it gives the values the cast would: one pass over the frames instead of two (decision 65)."""
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16:
        return torch.bfloat16
    return torch.float32


def read_frames(frames: torch.Tensor, centre: bool, by_sort: bool = False,
                memory_format: torch.memory_format = torch.contiguous_format) -> Frames:
    """uint8 frames [..., C, H, W] as Frames, their pixels in pixel_dtype; the layout is changed on the uint8
    frames, a quarter of the float's bytes. Centred frames in bfloat16 come centred already (x - m, exact)."""
    lead = frames.shape[:-3]
    flat = frames.reshape(-1, *frames.shape[-3:]).contiguous(memory_format=memory_format)
    pixels, medians = _pixels(flat, frame_medians(flat, by_sort) if centre else None)
    return Frames(pixels.view(frames.shape), None if medians is None else medians.view(*lead, -1).float())


def _pixels(frames: torch.Tensor, medians: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """uint8 frames [..., H, W] in pixel_dtype, and the medians [...] the first convolution still has to fold in:
    in bfloat16 centred frames come as x - m (exact there) and no medians are left."""
    dtype = pixel_dtype(frames.device.type)
    if not _centred_in_bfloat16(medians, dtype):
        return frames.to(dtype), medians
    centred = frames.to(torch.int16)   # in int16: a broadcast subtraction in bfloat16 is 3x slower
    centred.sub_(medians.to(torch.int16)[..., None, None])
    return centred.to(dtype), None


def _centred_in_bfloat16(medians: torch.Tensor | None, dtype: torch.dtype) -> bool:
    """Whether _pixels centres the frames itself (x - m in bfloat16) rather than converting them as they are."""
    return medians is not None and dtype == torch.bfloat16


def read_frame_sequences(frames: torch.Tensor, stack_start: torch.Tensor, centre: bool, by_sort: bool = False,
                         memory_format: torch.memory_format = torch.contiguous_format, blocks: int = 1,
                         native_stacks: bool = False) -> Frames:
    """A time-major batch's single frames (lbc.sequences: frames [T + S - 1, B, H, W] uint8, stack_start [T, B])
    read as Frames [T, B, S, H, W] of the stacks they stand for, the same values and layout as
    read_frames(stacked_frames(...)) gives:

        pixels[t, b, k] = read(frames[t + k, b])   where stack_keep, else 0   (medians likewise)

    Each frame is read (converted, its median taken, centred) once rather than in each of the S stacks that hold
    it, and the stacks are written once, straight into `memory_format`: on a 2-core CPU the stacked path's passes
    over S times the frames (a channels-last copy of the uint8 stacks, per-stack medians and a subtraction in
    that layout) cost 20-47 ms a batch of 496-672 observations on one core (docs/speed.md, decision 66).

    With `blocks` k > 1, Frames in k x k blocks (channels-last whatever `memory_format`; _blocked_stacks), written by
    lbc.native's one pass where `native_stacks` and it can (native_blocked_stacks)."""
    steps = stack_start.shape[0]
    stack = frames.shape[0] - steps + 1
    keep = stack_keep(stack_start.transpose(0, 1), stack).transpose(0, 1)   # [T, B, S]
    # each frame's median [T + S - 1, B]
    medians = frame_medians(frames, by_sort) if centre else None
    dtype = pixel_dtype(frames.device.type)
    if blocks > 1:
        natively = native_stacks and _native_stacks_can(frames, blocks, dtype)
        writer = native_blocked_stacks if natively else _blocked_stacks
        return Frames(writer(frames, keep, medians, blocks, dtype), None, blocks)
    if frames.device.type == "cpu" and not _centred_in_bfloat16(medians, dtype):
        return Frames(_uint8_stacks(frames, keep, memory_format).to(dtype), _stacked_medians(medians, keep))
    pixels, medians = _pixels(frames, medians)
    batch, height, width = frames.shape[1:]
    if memory_format == torch.channels_last:
        out = torch.empty((steps, batch, height, width, stack), dtype=dtype, device=frames.device)
        out = out.permute(0, 1, 4, 2, 3)
    else:
        out = torch.empty((steps, batch, stack, height, width), dtype=dtype, device=frames.device)
    if frames.device.type == "cpu":
        # one copy from the frames' windows (a view), written in the output's own order: a copy per stacked
        # channel writes every cache line of a channels-last output S times (float32 on a 2-core AVX2 host: 40-48
        # ms against 31.5 for a `cpu` batch; session 37). Then zeros where a stack started afresh (a few
        # observations a batch): on a CPU a multiply by the mask in the strided layout costs 3x the copy; on a
        # GPU, reading where (nonzero) would wait for it
        out.copy_(pixels.unfold(0, stack, 1).permute(0, 1, 4, 2, 3))
        t, b, k = keep.logical_not().nonzero(as_tuple=True)
        out[t, b, k] = 0
    else:
        mask = keep.to(dtype)[..., None, None]
        for k in range(stack):
            torch.mul(pixels[k:k + steps], mask[:, :, k], out=out[:, :, k])
    return Frames(out, _stacked_medians(medians, keep))


def _uint8_stacks(frames: torch.Tensor, keep: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    """uint8 frames [T + S - 1, B, H, W] as the stacks [T, B, S, H, W] in `memory_format`, 0 where keep is False.
    On a CPU, where the pixels are the frames converted, the stacks are built in uint8 (a quarter of float32's
    bytes) and converted in one pass over contiguous memory: stacking float32 pixels into a channels-last layout
    took a third longer (46 against 34 ms for an `impala` batch on a 2-core AVX2 host)."""
    steps, stack = keep.shape[0], keep.shape[-1]
    channels_last = memory_format == torch.channels_last
    stacks = torch.stack([frames[k:k + steps] for k in range(stack)], dim=-1 if channels_last else 2)
    if channels_last:
        stacks = stacks.permute(0, 1, 4, 2, 3)
    t, b, k = keep.logical_not().nonzero(as_tuple=True)
    stacks[t, b, k] = 0
    return stacks


def _blocked_stacks(frames: torch.Tensor, keep: torch.Tensor, medians: torch.Tensor | None, blocks: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """uint8 frames [T + S - 1, B, H, W] as the stacks [T, B, S k k, H / k, W / k] in k x k blocks (Frames), laid out
    channels-last, in `dtype`, each frame less its median where `medians` [T + S - 1, B] are given (x - m: exact in
    bfloat16 and float32), 0 where keep [T, B, S] is False. Each frame is put in blocks and converted once, and the
    stacks are written once from those: a block's 16 channels of a frame are one run of memory in both, where the
    plain channels-last stacks interleave four frames element by element (decision 83)."""
    steps, stack = keep.shape[0], keep.shape[-1]
    n, batch, height, width = frames.shape
    if height % blocks or width % blocks:
        raise ValueError(f"frames of {height}x{width} do not split into {blocks}x{blocks} blocks")
    h, w, area = height // blocks, width // blocks, blocks * blocks
    # the output first: allocated after the frames' smaller copies, it took the heap's fresh pages and page-faulted
    # 30 times a `cpu` step (the copy into it 12.0 against 7.1 ms; session 52)
    out = torch.empty((steps, batch, h, w, stack, area), dtype=dtype, device=frames.device)
    tiles = centred_blocks(frames, medians, blocks).to(dtype)   # [n, B, h, w, k k]
    # as a stack into `out` (torch's concatenation kernel), not a copy from the frames' unfolded, permuted view (its
    # generic strided copy): a `cpu` batch's stacks 2.2 against 4.9 ms on one Zen 4 core, the same values
    torch.stack([tiles[k:k + steps] for k in range(stack)], dim=4, out=out)
    t, b, k = keep.logical_not().nonzero(as_tuple=True)
    out[t, b, :, :, k] = 0
    return out.view(steps, batch, h, w, stack * area).permute(0, 1, 4, 2, 3)


def _native_stacks_can(frames: torch.Tensor, blocks: int, dtype: torch.dtype) -> bool:
    """Whether native_blocked_stacks writes these stacks: 4 x 4 blocks of frames on a CPU, in float32 or bfloat16,
    and lbc.native loads here."""
    return (blocks == native.STACK_BLOCK and frames.device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and native.blocked_stacks_op() is not None)


def native_blocked_stacks(frames: torch.Tensor, keep: torch.Tensor, medians: torch.Tensor | None, blocks: int,
                          dtype: torch.dtype) -> torch.Tensor:
    """_blocked_stacks's stacks, the same values and layout, written by lbc.native (lbc/csrc/frame_stacks.cpp,
    decision 96) in one pass from the frames: each block read, centred, converted and stored from registers, where
    torch's passes write the frames in blocks, centred, converted and then stacked (a `cpu` batch 9-18 against 3-5 ms
    on one core of the AMX host)."""
    op = native.blocked_stacks_op()
    if op is None or blocks != native.STACK_BLOCK:
        raise RuntimeError("lbc.native's frame stacks cannot run here (_native_stacks_can)")
    steps, batch, stack = keep.shape
    n, _, height, width = frames.shape
    out = torch.empty((steps, batch, height // blocks, width // blocks, stack, blocks * blocks), dtype=dtype)
    centre = (torch.zeros((n, batch), dtype=torch.int32) if medians is None else medians.to(torch.int32)).contiguous()
    # the frames as the batch holds them (a time-major view: the kernel reads each frame where it lies)
    frames = frames if frames.stride(-1) == 1 and frames.stride(-2) == width else frames.contiguous()
    op(frames, centre, keep.contiguous(), out)
    return out.view(steps, batch, height // blocks, width // blocks, stack * blocks * blocks).permute(0, 1, 4, 2, 3)


def centred_blocks(frames: torch.Tensor, medians: torch.Tensor | None, k: int) -> torch.Tensor:
    """uint8 frames [..., H, W] in k x k blocks [..., H / k, W / k, k k] (frame_blocks), each less its median where
    `medians` [...] are given (then int16: a broadcast subtraction in bfloat16 is 3x slower; else uint8)."""
    tiles = frame_blocks(frames, k)
    if medians is None:
        return tiles
    return tiles.to(torch.int16).sub_(medians.to(torch.int16)[..., None, None, None])


_WORDS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def frame_blocks(frames: torch.Tensor, k: int) -> torch.Tensor:
    """uint8 frames [..., H, W] as their k x k blocks [..., H / k, W / k, k k] (pixel (dy, dx) of a block at dy k + dx),
    in one copy. A block's row of k pixels is moved as one k-byte word where k is 2, 4 or 8: byte by byte the copy
    took 9-14 ms of an `impala` or `cpu` batch's frames on one core, in words of 4 bytes 0.9-1.3 (decision 83)."""
    *lead, height, width = frames.shape
    h, w = height // k, width // k
    word = _WORDS.get(k)
    if word is None:
        tiles = frames.unflatten(-1, (w, k)).unflatten(-3, (h, k)).movedim(-3, -2)     # [..., h, w, dy, dx]
        return tiles.reshape(*lead, h, w, k * k)
    if not _viewable_as(frames, k):
        frames = frames.contiguous()
    rows = frames.view(word).unflatten(-2, (h, k))                                     # [..., h, dy, w]
    return rows.movedim(-2, -1).contiguous().view(torch.uint8).view(*lead, h, w, k * k)


def _viewable_as(x: torch.Tensor, size: int) -> bool:
    """Whether x.view(dtype) works for a dtype of `size` bytes on a uint8 tensor: the last axis a run of memory whose
    length, like every other stride and the offset, is a multiple of it."""
    return (x.stride(-1) == 1 and x.shape[-1] % size == 0 and x.storage_offset() % size == 0
            and all(s % size == 0 for s in x.stride()[:-1]))


def _stacked_medians(medians: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor | None:
    """Single frames' medians [T + S - 1, B] as the stacks' [T, B, S] (0 where keep is False)."""
    if medians is None:
        return None
    return medians.unfold(0, keep.shape[-1], 1).float() * keep


class FrameConv2d(nn.Conv2d):
    """A torso's first convolution, reading uint8 frames: conv(W, pixels_to_input(x)) + b, computed as

        conv(W / 255, x) + b - sum_c m_c conv(W_c / 255, 1)

    (convolution is linear; conv(W_c, 1) is W_c's sum where there is no padding). The frames are read into
    float once (Frames), and no pass over them scales or centres them: on a 2-core CPU the centred input's two
    broadcast passes cost the learner more than the convolution's forward pass (docs/speed.md). Under bf16
    autocast the frames come centred already (x - m, exact in bfloat16; read_frames) and the convolution is a
    plain one in bfloat16, where the form above would lose the frame's detail. Float input (the shape probe,
    vectors) is convolved as it comes. `centre` and `median_by_sort` are set by the network that owns the
    layer (LBCNet)."""

    centre = False
    median_by_sort = False   # lbc.export sets it: ONNX has no median

    def forward(self, x: torch.Tensor | Frames) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            if x.dtype != torch.uint8:
                return super().forward(x)
            x = read_frames(x, self.centre, self.median_by_sort)
        if x.blocks > 1:
            frame = tuple(n * x.blocks for n in x.shape[-2:])
            if self.block_size(frame) != x.blocks:
                raise ValueError(f"a {tuple(self.kernel_size)} convolution of stride {tuple(self.stride)} cannot read "
                                 f"{frame[0]}x{frame[1]} frames in {x.blocks}x{x.blocks} blocks")
            return F.conv2d(x.pixels, self._weight_in_blocks(x.blocks, x.rotation) * (1.0 / 255.0), self.bias)
        if x.medians is None:
            return self._conv_forward(x.pixels, self.weight * (1.0 / 255.0), self.bias)
        with torch.autocast(x.pixels.device.type, enabled=False):   # Frames read outside bf16 autocast
            w = self.weight.float() * (1.0 / 255.0)
            out = self._conv_forward(x.pixels, w, None if self.bias is None else self.bias.float())
            return out - torch.einsum("nc,cohw->nohw", x.medians, self._response_to_ones(w, x.shape[-2:]))

    def block_size(self, frame: tuple[int, ...]) -> int:
        """The side k of the blocks in which this convolution can read frames [H, W] (Frames.blocks; 1: none,
        lbc.blocked_conv.block_size). In blocks it is a stride-1 convolution of a kernel k times smaller over k * k
        times the channels: the same sums, which oneDNN computes in fewer passes (decision 83)."""
        return block_size(self, frame)

    def _weight_in_blocks(self, k: int, rotation: int = 0) -> torch.Tensor:
        """The weight [O, C, kh, kw] as [O, C k k, kh / k, kw / k]: w_b[o, c k k + dy k + dx, p, q] = w[o, c, k p + dy,
        k q + dx], so that conv(w_b, frames in blocks) at (i, j) sums w[o, c, a, b] x[c, k i + a, k j + b]; with a
        `rotation` r (Frames) channel c's weights go to group (c + r) mod C, where such frames hold channel c."""
        out, channels, kh, kw = self.weight.shape
        blocked = self.weight.reshape(out, channels, kh // k, k, kw // k, k).permute(0, 1, 3, 5, 2, 4)
        if rotation:
            blocked = blocked.roll(rotation, dims=1)
        return blocked.reshape(out, channels * k * k, kh // k, kw // k)

    def _response_to_ones(self, w: torch.Tensor, size: torch.Size) -> torch.Tensor:
        """[C, O, H', W']: conv(w, e_c) with no bias for a frame of ones in channel c alone; [C, O, 1, 1]
        without padding, where it is the same at every position."""
        channels = w.shape[1]
        if all(p == 0 for p in self.padding):
            return w.sum((2, 3)).T[..., None, None]
        ones = torch.eye(channels, dtype=w.dtype, device=w.device)[:, :, None, None].expand(channels, channels, *size)
        return self._conv_forward(ones, w, None)


class _FlattenChannelsLast(torch.autograd.Function):
    """x [N, C, H, W] laid out channels-last, flattened in the default (C, H, W) order, with the gradient given
    back in x's own layout."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.shape = x.shape
        return x.reshape(x.shape[0], -1)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        return grad.reshape(ctx.shape).contiguous(memory_format=torch.channels_last)


class Flatten(nn.Flatten):
    """nn.Flatten (the same values) whose gradient keeps a channels-last input's layout. nn.Flatten's would come
    back in the default layout, so the ReLU before it would compare a gradient and an output laid out apart: on
    one CPU core that strided ReLU backward cost 5.8 ms a `cpu` learner step against 1-2 laid out alike, and the
    convolution's backward would then convert it (docs/speed.md, session 46)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # _FlattenChannelsLast flattens all but the batch axis: nn.Flatten's defaults, the torsos' use
        if (self.start_dim == 1 and self.end_dim == -1 and x.dim() == 4 and x.requires_grad
                and torch.is_grad_enabled() and not x.is_contiguous()
                and x.is_contiguous(memory_format=torch.channels_last)):
            return _FlattenChannelsLast.apply(x)
        return super().forward(x)


class _ConvTorso(nn.Module):
    """Convolutions, then fc `hidden` + ReLU. The first convolution is a FrameConv2d: the torso reads uint8
    frames as they are stored.

    With channels_last the convolutions run in oneDNN's NHWC layout: measured on a 2-core CPU, the
    small torso's training step is ~10-20% faster, but batch-16 inference is ~40% slower, so the
    learner turns it on and actors do not (see set_channels_last)."""

    def __init__(self, convs: nn.Sequential, obs_shape: tuple[int, ...], hidden: int) -> None:
        super().__init__()
        self.convs = convs
        with torch.no_grad():
            n = self.convs(torch.zeros(1, *obs_shape)).shape[-1]
        self.fc = nn.Sequential(nn.Linear(n, hidden), nn.ReLU())
        self.memory_format = torch.contiguous_format

    def forward(self, x: torch.Tensor | Frames) -> torch.Tensor:
        # uint8 frames are laid out before FrameConv2d reads them, so its float copy is the only big one
        if isinstance(x, torch.Tensor):
            x = x.contiguous(memory_format=self.memory_format)
        return self.fc(self.convs(x))


class SmallTorso(_ConvTorso):
    """IMPALA shallow net: conv 16@8x8/4, conv 32@4x4/2, fc 256 (about 1.2M params with the LSTM)."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: int) -> None:
        convs = nn.Sequential(FrameConv2d(obs_shape[0], 16, 8, stride=4), nn.ReLU(),
                              StridedConv2d(16, 32, 4, stride=2), nn.ReLU(), Flatten())
        super().__init__(convs, obs_shape, hidden)


class MinAtarTorso(_ConvTorso):
    """For small boards (MinAtar's 10x10): conv 16@3x3/1, fc `hidden`; the network of Young & Tian (2019)
    without its output layer."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: int) -> None:
        super().__init__(nn.Sequential(FrameConv2d(obs_shape[0], 16, 3), nn.ReLU(), Flatten()), obs_shape, hidden)


class _ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class DeepTorso(_ConvTorso):
    """IMPALA deep ResNet: per (channels, blocks) in (16,2),(32,2),(32,2): conv 3x3, max-pool 3x3/2,
    two residual blocks; then ReLU, fc 256. 15 conv layers."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: int) -> None:
        layers: list[nn.Module] = []
        c_in = obs_shape[0]
        for c_out in (16, 32, 32):
            conv = nn.Conv2d if layers else FrameConv2d
            layers += [conv(c_in, c_out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       _ResBlock(c_out), _ResBlock(c_out)]
            c_in = c_out
        super().__init__(nn.Sequential(*layers, nn.ReLU(), Flatten()), obs_shape, hidden)


def init_relu_layers(module: nn.Module) -> nn.Module:
    """Orthogonal weights with the ReLU gain sqrt(2) and zero biases for every convolution and linear layer
    in `module` (the torso), so that each layer keeps its input's scale (Saxe et al. 2014). torch's default
    shrinks it about 2.5x per layer: the small torso's features start ~20x smaller (docs/decisions.md 34)."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(layer.weight, gain=2 ** 0.5)
            nn.init.zeros_(layer.bias)
    return module


def init_sonnet_layers(module: nn.Module) -> nn.Module:
    """Sonnet 1's defaults, which IMPALA's code built its networks with, for every convolution and linear layer in
    `module`: weights from a normal of std 1 / sqrt(fan_in) truncated at two std (fan_in = kernel area x input
    channels for a convolution), zero biases. torch's default draws U(-1, 1) / sqrt(fan_in) (std 0.58 / sqrt(fan_in))
    and random biases too."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            std = layer.weight[0].numel() ** -0.5   # one output's weights: fan_in
            nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.zeros_(layer.bias)
    return module


# net.init: how the torso's layers are drawn besides torch's default (their reset_parameters)
TORSO_INITS = {"orthogonal": init_relu_layers, "sonnet": init_sonnet_layers}


def dead_units(module: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """For each nn.ReLU in `module` (by its name there), the fraction of its units that are not positive
    on any of the inputs `x`: a convolution's unit is a channel (at any position), a linear layer's a
    feature. A unit dead on every input gets no gradient and stays dead; a torso whose units all die
    sees nothing (Sokar et al. 2023 call them dormant). Runs `module` once under no_grad."""
    relus = {name: layer for name, layer in module.named_modules() if isinstance(layer, nn.ReLU)}
    activity = unit_activity(module, x, list(relus.values()))   # ReLU outputs: mean 0 exactly when never > 0
    return {name: float((a == 0).float().mean()) for name, a in zip(relus, activity, strict=True)}


def lower_median(x: torch.Tensor, by_sort: bool = False) -> torch.Tensor:
    """The lower median over the last axis (element (n - 1) // 2 in sorted order), as torch.median gives.
    by_sort reads it off a full sort, which ONNX can express (it has no median); torch.median is ~3x faster, and
    for 64 rows or more of uint8 values on a CPU, counting them (_uint8_lower_median) is faster still (4x at a `cpu`
    batch's 544 frames; below about 48 rows the counts' fixed cost loses: 38 against 21 us at an actor's 16)."""
    if by_sort:
        return x.sort(dim=-1).values[..., (x.shape[-1] - 1) // 2]
    if x.dtype == torch.uint8 and x.device.type == "cpu" and math.prod(x.shape[:-1]) >= _COUNTED_MEDIAN_ROWS:
        return _uint8_lower_median(x)
    return x.median(dim=-1).values


_COUNTED_MEDIAN_ROWS = 64


def _uint8_lower_median(x: torch.Tensor) -> torch.Tensor:
    """lower_median of uint8 values [..., n]: the least value v with more than (n - 1) // 2 values <= v, read off each
    row's counts of the 256 values. A `cpu` batch's 544 frame medians 0.5 against 2.0 ms for torch.median's
    selection, row by row, on one Zen 4 core."""
    rows = x.reshape(-1, x.shape[-1]).to(torch.int64)
    counts = torch.zeros(rows.shape[0], 256, dtype=torch.int32)
    counts.scatter_add_(1, rows, torch.ones(rows.shape, dtype=torch.int32))
    beyond = counts.cumsum(1) > (x.shape[-1] - 1) // 2
    return beyond.to(torch.uint8).argmax(1).to(torch.uint8).view(x.shape[:-1])


class MlpTorso(nn.Module):
    """For vector observations and small boards (Catch): two fully connected layers on the flattened input."""

    def __init__(self, obs_shape: tuple[int, ...], hidden: int) -> None:
        super().__init__()
        n = 1
        for d in obs_shape:
            n *= d
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(n, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


TORSOS = {"small": SmallTorso, "deep": DeepTorso, "minatar": MinAtarTorso, "mlp": MlpTorso}


class LayerNormLSTM(nn.Module):
    """LSTM with layer normalisation (Ba et al. 2016, sec. 3.1, eq. 20-22):

        (f, i, o, g) = LN(W_x x_t; a_x, b_x) + LN(W_h h_{t-1}; a_h, b_h) + b
        c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
        h_t = sigmoid(o) * tanh(LN(c_t; a_c, b_c))

    Normalising the gates' pre-activations keeps them off the flat ends of the sigmoid whatever the
    input's scale, and the LN on c_t keeps h_t responsive when c_t drifts: a plain LSTM trained on
    short windows saturates when the actors unroll it over a whole episode (docs/decisions.md 24).
    The input projection of every step is one matrix product before the recurrence.
    Gate order i, f, g, o as torch.nn.LSTMCell. An unroll that trains (gradients wanted), and any under autocast
    with float32 weights (the learner's), runs lbc.lstm_bptt's forward and written-out backward; any other the
    plain steps below.
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.input_proj = nn.Linear(input_size, 4 * hidden_size, bias=False)
        self.hidden_proj = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        self.input_norm = nn.LayerNorm(4 * hidden_size)
        self.hidden_norm = nn.LayerNorm(4 * hidden_size, bias=False)
        self.cell_norm = nn.LayerNorm(hidden_size)
        with torch.no_grad():   # forget-gate bias 1, as the usual LSTM initialisation (Jozefowicz et al. 2015)
            self.input_norm.bias[hidden_size:2 * hidden_size].fill_(1.0)

        self.compiled = False   # compile_unroll: the recurrence as torch.compile's fused kernels, in chunks of steps
        self.graphs: GraphCache | None = None   # graph_unroll: on a GPU, the unroll as CUDA graphs
        self.native = False   # native_unroll: on a CPU, the unroll that trains by lbc.native's C++

    def compile_unroll(self) -> None:
        """Unroll the recurrence through torch.compile's kernels for ln_lstm_steps, COMPILED_STEPS steps per
        call (the same function; a GPU learner's step is otherwise bound by launching its many small kernels
        forward and backward, docs/speed.md). Copies made after (the target network) unroll compiled too."""
        self.compiled = True

    def graph_unroll(self) -> None:
        """On a GPU, replay the unroll (lbc.lstm_bptt's forward and written-out backward, and the forward alone
        where nothing trains) as CUDA graphs captured at each input shape's first call: two launches where
        eager launches about 22 per step. Copies made after (the target network) share the graphs."""
        self.graphs = GraphCache()

    def native_unroll(self) -> None:
        """On a CPU, run the unroll that lbc.lstm_bptt runs (its forward and written-out backward) by lbc.native's
        C++ where that is built and loads, else by TorchScript as before (decision 90). Copies made after (the target
        network) too."""
        self.native = True

    def forward(self, x: torch.Tensor, keep: torch.Tensor,
                state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x [T, B, in]; keep [T, B, 1] zero where the state resets before step t. Returns h [T, B, H], (h, c)."""
        xs = self.input_norm(self.input_proj(x))
        weights = (self.hidden_proj.weight, self.hidden_norm.weight, self.cell_norm.weight, self.cell_norm.bias)
        h, c = state
        if not self.compiled:
            trains = torch.is_grad_enabled() and any(t.requires_grad for t in (xs, h, c, *weights))
            graphs = self.graphs if xs.is_cuda else None
            device = xs.device.type
            low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
            if low is not None and (trains or weights[0].dtype != low):
                out, h, c = self._mixed_unroll(xs, keep, h, c, weights, low, self.native)
            elif trains or (self.native and not xs.is_cuda):   # a float32 learner's burn-in and target network too
                out, h, c = ln_lstm_steps_bptt(xs, keep, h, c, *weights, graphs=graphs, native_unroll=self.native)
            elif graphs and low is None:
                out, h, c = forward_by_graphs(graphs, xs, keep, h, c, *weights)
            else:
                out, h, c = ln_lstm_steps(xs, keep, h, c, *weights)
            return out, (h, c)
        # whole chunks through the one graph (the chunk's length is part of it), the remainder eagerly
        whole = x.shape[0] - x.shape[0] % COMPILED_STEPS
        chunks = []
        for start in range(0, x.shape[0], COMPILED_STEPS):
            steps = compiled_ln_lstm_steps() if start < whole else ln_lstm_steps
            out, h, c = steps(xs[start:start + COMPILED_STEPS], keep[start:start + COMPILED_STEPS], h, c, *weights)
            chunks.append(out)
        return torch.cat(chunks), (h, c)

    @staticmethod
    def _mixed_unroll(xs: torch.Tensor, keep: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                      weights: tuple[torch.Tensor, ...], low: torch.dtype, native_unroll: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The unroll under autocast (the learner's; an actor's network keeps its weights in `low` already):
        lbc.lstm_bptt's forward and written-out backward with the recurrent products in autocast's dtype `low`
        and the hidden weight cast once an unroll, where autocast without its cache (as the learner runs it)
        casts it forward and its gradient back at every step (52 casts in a `cpu` learner step); the rest in
        the state's float32, where autocast ran the gates in bfloat16 (decision 82). Eagerly: CUDA graphs
        replay the float32 unroll only."""
        with torch.autocast(xs.device.type, enabled=False):
            return ln_lstm_steps_bptt(xs.to(h.dtype), keep.to(h.dtype), h, c, weights[0].to(low), *weights[1:],
                                      native_unroll=native_unroll)

    @property
    def input_weight(self) -> nn.Parameter:
        """The weight [4H, in] that reads the step's input."""
        return self.input_proj.weight


def ln_lstm_step(x_t: torch.Tensor, keep_t: torch.Tensor, h: torch.Tensor, c: torch.Tensor, hidden_weight: torch.Tensor,
                 hidden_gain: torch.Tensor, cell_gain: torch.Tensor, cell_bias: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of LayerNormLSTM from the step's normalised input projection x_t [B, 4H] (eq. 20-22 above):
    the state reset where keep_t [B, 1] is 0, the hidden projection normalised (gain, no bias), the gates, and
    the new (h, c). LayerNorm's epsilon is nn.LayerNorm's default, as the module's norms have."""
    h, c = h * keep_t, c * keep_t
    gates = x_t + F.layer_norm(F.linear(h, hidden_weight), hidden_gain.shape, hidden_gain, None, LN_EPS)
    # one sigmoid over all four gates (g's is not used): three fewer launches a step where launching bounds
    i, f, _, o = torch.sigmoid(gates).chunk(4, dim=-1)
    g = torch.tanh(gates.chunk(4, dim=-1)[2])
    c = torch.addcmul(f * c, i, g)
    h = o * torch.tanh(F.layer_norm(c, cell_gain.shape, cell_gain, cell_bias, LN_EPS))
    return h, c


def ln_lstm_steps(xs: torch.Tensor, keep: torch.Tensor, h: torch.Tensor, c: torch.Tensor, *weights: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ln_lstm_step over the steps of xs [T, B, 4H] and keep [T, B, 1] from (h, c): every step's h [T, B, H] and
    the last (h, c). `weights` as ln_lstm_step's (hidden_weight, hidden_gain, cell_gain, cell_bias)."""
    outs = []
    # unbind, not xs[t]: each step's slice would hand back a gradient the size of all of xs, and T of them summed
    # cost an `impala` learner step 5 ms on one core; unbind's gradient is one stack of the steps'
    for x_t, keep_t in zip(xs.unbind(0), keep.unbind(0), strict=True):
        h, c = ln_lstm_step(x_t, keep_t, h, c, *weights)
        outs.append(h)
    return torch.stack(outs), h, c


# Steps per compiled call (decision 57). Compiling unrolls them into one graph, forward and backward, so a GPU
# launches a few fused kernels per step and the autograd engine sees one node per chunk instead of about 26 per
# step; compile time grows with the chunk (on the 2-core VM about 30 s for 1 or 4 steps, 53 s for 8, 163 s for 31).
COMPILED_STEPS = 8


@functools.cache
def compiled_ln_lstm_steps() -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """ln_lstm_steps under torch.compile, made once per process. The batch axis is dynamic from the start: the
    target network unrolls only the sequences whose outputs it does not keep, a count that varies from step to
    step, and a graph per count recompiled for minutes (docs/speed.md). The number of steps is fixed
    (COMPILED_STEPS). Each grad mode, device and hidden size is still a graph of its own (a learner has three or
    four); past torch's recompile limit a call runs eagerly, the same function, rather than failing."""
    return torch.compile(ln_lstm_steps, dynamic=True)


class PlainLSTM(nn.Module):
    """torch.nn.LSTMCell stepped over time, with the same interface as LayerNormLSTM."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden_size)

    def forward(self, x: torch.Tensor, keep: torch.Tensor,
                state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, c = state
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h * keep[t], c * keep[t]))
            outs.append(h)
        return torch.stack(outs), (h, c)

    @property
    def input_weight(self) -> nn.Parameter:
        return self.cell.weight_ih


class FeedForwardCore(nn.Module):
    """No recurrence: IMPALA's feed-forward Atari network (its App. G table is for it), where the 4-frame
    stack is the only memory. The heads read the torso's features alone: the previous action and reward
    are not used, and the state passes through untouched, so that the sequence layout (h0, c0) and every
    caller stay those of the recurrent cores (docs/decisions.md 35)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.features = features

    def forward(self, x: torch.Tensor, keep: torch.Tensor,
                state: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        return x[..., :self.features], state


CORES = {"lstm": PlainLSTM, "layernorm_lstm": LayerNormLSTM}


@dataclass
class NetOutput:
    adv: torch.Tensor    # [T, B, N, A] dueling advantages A_i (mean over actions removed)
    value: torch.Tensor  # [T, B, N]
    state: tuple[torch.Tensor, torch.Tensor]  # LSTM (h, c) after the last step, [B, H] each


class LBCNet(nn.Module):
    """Torso -> LSTM core (input: features, one-hot previous action, clipped previous reward, and
    `extra_inputs` more per step, e.g. NGU's one-hot j and intrinsic reward) -> N heads."""

    def __init__(self, torso: str, obs_shape: tuple[int, ...], num_actions: int, num_policies: int,
                 hidden: int = 256, lstm: int = 256, core: str = "layernorm_lstm", extra_inputs: int = 0,
                 init: str = "torch", centre_frames: bool = False) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.obs_shape = obs_shape
        self.extra_inputs = extra_inputs
        self.num_policies = num_policies
        self.lstm_size = lstm
        problem = torso_problem(torso, obs_shape)
        if problem:
            raise ValueError(problem)
        self.torso: nn.Module = TORSOS[resolve_torso(torso, obs_shape)](obs_shape, hidden)
        if init != "torch" and init not in TORSO_INITS:
            raise ValueError(f"unknown init {init!r}")
        self.init = init
        self.centre_frames = centre_frames
        self.median_by_sort = False   # lbc.export sets it (set_median_by_sort): ONNX has no median
        self.frame_blocks = 1   # the learner sets it (set_frame_blocks)
        self.native_stacks = False   # and whether lbc.native writes the blocks' stacks
        if isinstance(self.torso, _ConvTorso):
            self.torso.convs[0].centre = centre_frames
        if init in TORSO_INITS:
            TORSO_INITS[init](self.torso)
        if core == "feedforward":
            self.core: nn.Module = FeedForwardCore(hidden)
            core_out = hidden
        else:
            self.core = CORES[core](hidden + num_actions + 1 + extra_inputs, lstm)
            core_out = lstm
        self.heads = nn.Linear(core_out, num_policies * (num_actions + 1))

    def set_channels_last(self, enabled: bool) -> LBCNet:
        """Run the convolutional torso in NHWC layout (faster training, slower small-batch inference)."""
        if isinstance(self.torso, _ConvTorso):
            self.torso.memory_format = torch.channels_last if enabled else torch.contiguous_format
            self.torso.convs.to(memory_format=self.torso.memory_format)
        return self

    def set_frame_blocks(self, enabled: bool, native_stacks: bool = False) -> LBCNet:
        """Read a batch's frames (sequence_input) in blocks of the first convolution's stride where that convolution
        can (FrameConv2d.block_size) and runs on a CPU: in bfloat16 (decision 83) the first convolution's weight
        gradient in half the CPU; in float32 on an AVX2 host (decision 92) its forwards in 0.7 of it. With
        `native_stacks`, their stacks written by lbc.native where it can (decision 96: the same values)."""
        self.frame_blocks = self.input_blocks() if enabled else 1
        self.native_stacks = native_stacks
        return self

    def writes_stacks_natively(self, device: str) -> bool:
        """Whether sequence_input's stacks on `device` (a device type) are written by lbc.native (set_frame_blocks'
        native_stacks, 4x4 blocks, the library loaded), for what the learner logs and bench.throughput's levers."""
        return (self.native_stacks and self.blocks_on(device) == native.STACK_BLOCK
                and native.blocked_stacks_op() is not None)

    def blocks_on(self, device: str) -> int:
        """The side of the blocks sequence_input reads a batch's frames in on `device` (a device type): the learner's
        setting (set_frame_blocks) on a CPU, 1 (frames as they are) elsewhere."""
        return self.frame_blocks if device == "cpu" else 1

    def input_blocks(self) -> int:
        """The side of the blocks in which the first convolution can read frames (FrameConv2d.block_size), 1 where
        it cannot or the torso does not convolve."""
        return self.torso.convs[0].block_size(self.obs_shape) if isinstance(self.torso, _ConvTorso) else 1

    def set_median_by_sort(self, enabled: bool) -> None:
        """Frame centring reads the median off a full sort (ONNX has no median; lbc.export) or torch.median."""
        self.median_by_sort = enabled
        if isinstance(self.torso, _ConvTorso):
            self.torso.convs[0].median_by_sort = enabled

    def torso_input(self, obs: torch.Tensor | Frames) -> torch.Tensor | Frames:
        """What the torso is given for observations [..., *obs_shape]: a convolutional torso's Frames read from
        uint8 frames, other torsos pixels_to_input's floats; vector observations go in as they come. Input
        read already passes through, so the learner reads a batch once for all its networks and steps."""
        if isinstance(obs, Frames):
            return obs
        if obs.dtype != torch.uint8:
            return obs.float()
        if isinstance(self.torso, _ConvTorso):
            return read_frames(obs, self.centre_frames, self.median_by_sort, self.torso.memory_format)
        flat = obs.reshape(-1, *self.obs_shape)
        return pixels_to_input(flat, self.centre_frames, self.median_by_sort).view(obs.shape)

    def sequence_input(self, b: Mapping[str, torch.Tensor]) -> torch.Tensor | Frames:
        """What the torso is given for a time-major batch's observations: torso_input's, read straight from the
        batch's single frames where it carries them and the torso convolves (read_frame_sequences)."""
        if "frames" in b and isinstance(self.torso, _ConvTorso):
            return read_frame_sequences(b["frames"], b["stack_start"], self.centre_frames, self.median_by_sort,
                                        self.torso.memory_format, self.blocks_on(b["frames"].device.type),
                                        self.native_stacks)
        return self.torso_input(observations(b))

    def torso_dead_units(self, frames: torch.Tensor) -> dict[str, float]:
        """dead_units of the torso on uint8 frames [M, *obs_shape]."""
        return dead_units(self.torso, self.torso_input(frames))

    def _reinit(self, layer: nn.Module) -> None:
        """Draw a torso layer's weights as at construction (net.init)."""
        if self.init in TORSO_INITS:
            TORSO_INITS[self.init](layer)
        else:
            layer.reset_parameters()

    def recycling_links(self) -> list[Link]:
        """The torso's ReLU layers and what reads each (ReDo, lbc.recycling); the deep torso's residual
        blocks are not covered."""
        # the torso's features are the core input's first columns, or the heads' whole input without a core
        feats_reader = self.heads.weight if isinstance(self.core, FeedForwardCore) else self.core.input_weight
        if isinstance(self.torso, SmallTorso):
            conv0, relu0, conv1, relu1 = list(self.torso.convs)[:4]
            fc, fc_relu = self.torso.fc
            return [Link(conv0, relu0, conv1.weight),
                    Link(conv1, relu1, fc.weight, span=fc.in_features // conv1.out_channels),   # flattened C, H, W
                    Link(fc, fc_relu, feats_reader)]
        if isinstance(self.torso, MlpTorso):
            _, fc0, relu0, fc1, relu1 = list(self.torso.net)
            return [Link(fc0, relu0, fc1.weight), Link(fc1, relu1, feats_reader)]
        raise ValueError(f"recycling covers the small and mlp torsos, not {type(self.torso).__name__}")

    def recycle_dormant(self, frames: torch.Tensor, tau: float,
                        optimiser: torch.optim.Optimizer | None) -> dict[str, int]:
        """ReDo on the torso with the dormant scores on uint8 frames [M, *obs_shape]: units recycled per
        ReLU layer, named as in torso_dead_units."""
        links = self.recycling_links()
        scores = dormant_scores(self.torso, self.torso_input(frames), links)
        counts = recycle(links, scores, tau, optimiser, self._reinit)
        names = {id(m): name for name, m in self.torso.named_modules()}
        return {names[id(link.relu)]: n for link, n in zip(links, counts, strict=True)}

    def initial_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The zero state (h, c), [batch, H] each, on the network's device."""
        z = torch.zeros(batch, self.lstm_size, device=self.heads.weight.device)
        return z, z.clone()

    def forward(
        self,
        obs: torch.Tensor | Frames,
        prev_action: torch.Tensor,
        prev_reward: torch.Tensor,
        reset: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        extra: torch.Tensor | None = None,
        last_step_grad: bool = True,
    ) -> NetOutput:
        """obs [T, B, *obs_shape] uint8 (or as torso_input read them); prev_action [T, B] int64; prev_reward
        [T, B] raw reward; reset [T, B] bool, True where x_t starts an episode (the state is zeroed before the
        step); extra [T, B, extra_inputs] when the net has extra inputs. last_step_grad=False: the torso reads
        the last step's frames without a gradient (the same outputs; for a loss that reads that step's outputs
        only detached, its bootstrap state, whose torso backward would compute nothing the loss uses)."""
        if (extra is None) != (self.extra_inputs == 0):
            raise ValueError(f"this net takes {self.extra_inputs} extra inputs per step")
        steps, batch = obs.shape[:2]
        feats = self._features(self.torso_input(obs), last_step_grad)
        one_hot = nn.functional.one_hot(prev_action, self.num_actions).to(feats.dtype)
        parts = [feats, one_hot, prev_reward.clamp(-1.0, 1.0).unsqueeze(-1).to(feats.dtype)]
        core_in = torch.cat(parts if extra is None else [*parts, extra.to(feats.dtype)], -1)
        keep = (~reset).to(feats.dtype).unsqueeze(-1)
        core_out, (h, c) = self.core(core_in, keep, state)
        # float(): under bf16 autocast (learner.precision) the losses still read fp32 values
        heads = self.heads(core_out).float().view(steps, batch, self.num_policies, self.num_actions + 1)
        raw_adv, value = heads[..., :-1], heads[..., -1]
        adv = raw_adv - raw_adv.mean(-1, keepdim=True)
        return NetOutput(adv=adv, value=value, state=(h, c))

    def _features(self, x: torch.Tensor | Frames, last_step_grad: bool) -> torch.Tensor:
        """The torso's features [T, B, F] of x [T, B, ...] (torso_input's), the last step's without a gradient
        unless last_step_grad (forward)."""
        steps, batch = x.shape[:2]
        if last_step_grad or steps == 1 or not torch.is_grad_enabled():
            return self.torso(x.reshape(steps * batch, *x.shape[2:])).view(steps, batch, -1)
        learnt = self.torso(x[:-1].reshape((steps - 1) * batch, *x.shape[2:]))
        with torch.no_grad():
            last = self.torso(x[-1:].reshape(batch, *x.shape[2:]))
        return torch.cat([learnt, last]).view(steps, batch, -1)


def unroll_after_burn_in(net: LBCNet, frames: torch.Tensor | Frames, b: dict[str, torch.Tensor], burn: int,
                         grad: bool, extra: torch.Tensor | None = None, bootstrap_grad: bool = True) -> NetOutput:
    """The network's outputs over a stored sequence's learning steps [burn:], after `burn` burn-in steps from
    its stored LSTM state (b["h0"], b["c0"]) with no gradient (R2D2's burn-in). frames: the batch's observations
    [T, B, ...], or as the net's sequence_input read them (the learner reads a batch once for its online and target
    networks). bootstrap_grad=False (with grad): the last step, the bootstrap state, has its frames read without a
    gradient (LBCNet.forward's last_step_grad), for a loss that reads its outputs only detached."""
    inputs = (frames, b["prev_action"].long(), b["prev_reward"], b["reset"])
    state = (b["h0"], b["c0"])
    if burn > 0:
        with torch.no_grad():
            state = net(*(x[:burn] for x in inputs), state, None if extra is None else extra[:burn]).state
    with torch.set_grad_enabled(grad):
        return net(*(x[burn:] for x in inputs), state, None if extra is None else extra[burn:],
                   last_step_grad=bootstrap_grad)


def build_net(cfg, obs_shape: tuple[int, ...], num_actions: int) -> LBCNet:
    """The network the configuration describes (cfg: lbc.config.Config). NGU's is conditioned on the
    one-hot mixture index j and the intrinsic reward (lbc.ngu.core_inputs)."""
    return LBCNet(cfg.net.torso, obs_shape, num_actions, cfg.num_policies, cfg.net.hidden, cfg.net.lstm,
                  cfg.net.core, extra_inputs=family_traits(cfg).extra_inputs, init=cfg.net.init,
                  centre_frames=cfg.net.centre_frames)


def build_agent(cfg, obs_shape: tuple[int, ...], num_actions: int) -> nn.Module:
    """What the learner publishes and checkpoints and an actor loads: the net, or for NGU an NguAgent
    (the net with the embedding and RND networks, whose random RND target travels with it)."""
    net = build_net(cfg, obs_shape, num_actions)
    if not family_traits(cfg).aux_networks:
        return net
    return NguAgent(net, NguAux(obs_shape, num_actions, cfg.ngu.embedding_dim, cfg.ngu.rnd_dim))


def policy_net(agent: nn.Module) -> LBCNet:
    """The network that acts and that the RL loss trains, within what build_agent made."""
    return agent.net if isinstance(agent, NguAgent) else agent
