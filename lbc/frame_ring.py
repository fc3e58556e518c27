"""An actor's frame stacks kept, from one step to the next, as its network's first convolution reads them
(decision 85).

The games give each step a stack of S frames per game, the last step's shifted by one frame with the newest
appended, or [0, ..., 0, f] at a game's first observation (lbc.frame_stacks.starts_afresh). Reading the whole
stack every step (lbc.nets.read_frames: each frame's median, its centring, its conversion, S times over) and
convolving it in the frames' own layout cost a bf16 CPU actor most of its acting pass. Here each game's S frames
live in S slots, in k x k blocks (lbc.nets.frame_blocks, decision 83), centred and converted once as they
arrive, laid out channels-last; a step writes its newest frame over the oldest's slot, and the first
convolution rotates its weight's groups to the slots (Frames.rotation) rather than the frames being moved. A
float32 actor reads through a ring too: on an AVX2 host its acting step took 9-11% less CPU (decision 92).

Where lbc.native loads and the blocks are 4x4, a push is one pass of its C++ (decision 97, actor.native_ring): each
game's median from its frame's counts, its blocks centred, converted and stored while in registers, a fresh stack's
older slots zeroed; torch's passes (the median, the blocks, their centring, the converting copy, the test for fresh
stacks) took 1.9-3.3 ms of 64 games a step on the AMX host, the kernel 0.4-0.5. The same values.
"""

from __future__ import annotations

import numpy as np
import torch

from lbc import native
from lbc.frame_stacks import starts_afresh
from lbc.nets import Frames, centred_blocks, frame_medians


class FrameRing:
    """The stacks [E, S, H, W] of E games as Frames in k x k blocks (channels-last [E, S k k, H / k, W / k]),
    each frame less its median where `centre` (x - m: exact in bfloat16 and float32), in `dtype`. `native_push`:
    pushed by lbc.native where it loads, the blocks are 4x4 and `dtype` float32 or bfloat16 (`pushed_by` says
    which)."""

    def __init__(self, num_envs: int, obs_shape: tuple[int, int, int], blocks: int, centre: bool,
                 dtype: torch.dtype, native_push: bool = True) -> None:
        stack, height, width = obs_shape
        if height % blocks or width % blocks:
            raise ValueError(f"frames of {height}x{width} do not split into {blocks}x{blocks} blocks")
        self.blocks, self.centre = blocks, centre
        # slot j of game e: slots[e, :, :, j] [H / k, W / k, k k]
        self.slots = torch.zeros(num_envs, height // blocks, width // blocks, stack, blocks * blocks, dtype=dtype)
        self.oldest = 0      # the slot that holds the stack's oldest frame
        self.filled = False  # the first push writes every slot from its stacks
        kernel_writes = blocks == native.STACK_BLOCK and dtype in (torch.float32, torch.bfloat16)
        self._op = native.frame_ring_op() if native_push and kernel_writes else None

    @property
    def pushed_by(self) -> str:
        """Who writes the ring: "lbc.native" or "torch" (for logs)."""
        return "torch" if self._op is None else "lbc.native"

    def _write(self, slot: int, frames: np.ndarray) -> None:
        """frames [E, H, W] uint8 (a view of the stacks: each frame a run of memory) into `slot`: in blocks, centred,
        converted (by the copy)."""
        new = torch.from_numpy(frames)
        medians = frame_medians(new[:, None])[:, 0] if self.centre else None
        self.slots[:, :, :, slot].copy_(centred_blocks(new, medians, self.blocks))

    def push(self, obs: np.ndarray) -> Frames:
        """This step's stacks obs [E, S, H, W] uint8, the last push's shifted by a frame or started afresh, as
        Frames: the values read_frames would give them in blocks, their frames' groups rotated. The Frames are a view
        of the ring, for this step's pass: the next push writes over them."""
        stack = self.slots.shape[3]
        slot = self.oldest if self.filled else -1   # -1: every slot from its frame (the first push)
        if self._op is not None:
            self._op(torch.from_numpy(obs), self.slots, slot, self.centre)
        elif slot < 0:
            for j in range(stack):
                self._write(j, obs[:, j])
        else:
            self._write(slot, obs[:, -1])
            fresh = np.flatnonzero(starts_afresh(obs))
            if len(fresh):   # the older frames of a game's first stack are zeros
                older = torch.tensor([j for j in range(stack) if j != slot], dtype=torch.long)
                self.slots[torch.from_numpy(fresh)[:, None], :, :, older[None, :]] = 0
        self.oldest, self.filled = (slot + 1) % stack if slot >= 0 else 0, True
        num_envs, h, w, _, area = self.slots.shape
        pixels = self.slots.view(num_envs, h, w, stack * area).permute(0, 3, 1, 2)
        return Frames(pixels, None, self.blocks, self.oldest)
