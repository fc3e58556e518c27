"""A sequence's single frames back into the frame stacks the actor saw (the layout: lbc.sequences): the
learner's and the evaluator's side, in torch."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch


def stacked_frames(frames: torch.Tensor, stack_start: torch.Tensor, time_major: bool = False) -> torch.Tensor:
    """The observations a sequence's frames stand for: frames [B, T + S - 1, ...] (the first observation's S
    frames, then each later one's newest), stack_start [B, T] -> obs [B, T, S, ...] ([T, B, S, ...] with
    time_major), contiguous:

        obs[b, t, k] = frames[b, t + k]   if t - (S - 1 - k) >= r(b, t),   else 0,

    r(b, t) the last t' <= t with stack_start[b, t'] (-infinity where none): channel k holds the frame of step
    t - (S - 1 - k), and a stack that started afresh at r holds zeros for the steps before r (ALE's vector
    environment at a game's first observation). A stack flagged where its older frames only happen to be zeros
    comes back the same."""
    windows, mask = _windows_and_mask(frames, stack_start)
    if time_major:
        windows, mask = windows.transpose(0, 1), mask.transpose(0, 1)
    # written in the result's own order: the frames' windows are a strided view, S innermost in memory
    return torch.mul(windows, mask, out=torch.empty(windows.shape, dtype=frames.dtype, device=frames.device))


def starts_afresh(obs: np.ndarray) -> np.ndarray:
    """[E] bool: which stacks obs [E, S, ...] start afresh, their older frames all zeros (a game's first observation
    from ALE's vector environment); the others are the last step's shifted by a frame (decision 61)."""
    return ~obs[:, :-1].reshape(len(obs), -1).any(axis=1)


def stack_keep(stack_start: torch.Tensor, stack: int) -> torch.Tensor:
    """[B, T, S] bool: which channels of each observation hold a frame of its own stack (stacked_frames' condition
    t - (S - 1 - k) >= r(b, t)); the others are the zeros before a stack that started afresh."""
    steps = stack_start.shape[1]
    t = torch.arange(steps, device=stack_start.device)
    last_start = torch.where(stack_start, t, -stack).cummax(dim=1).values                # [B, T]; -S: none
    frame_step = t[:, None] - (stack - 1) + torch.arange(stack, device=stack_start.device)  # [T, S]
    return frame_step >= last_start[..., None]


def _windows_and_mask(frames: torch.Tensor, stack_start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """stacked_frames' two factors: the frames' windows [B, T, S, ...] (a view) and the keep mask [B, T, S, 1...]
    in the frames' dtype."""
    stack = frames.shape[1] - stack_start.shape[1] + 1
    keep = stack_keep(stack_start, stack)                                                 # [B, T, S]
    windows = frames.unfold(1, stack, 1).movedim(-1, 2)                                   # [B, T, S, ...]
    return windows, keep.view(*keep.shape, *([1] * (frames.dim() - 2))).to(frames.dtype)


def observations(b: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """A time-major batch's observations [T, B, *obs_shape]: its obs, or rebuilt from its single frames
    (frames [T + S - 1, B, ...], stack_start [T, B]) by stacked_frames."""
    if "frames" not in b:
        return b["obs"]
    return stacked_frames(b["frames"].transpose(0, 1), b["stack_start"].transpose(0, 1), time_major=True)


def observations_at(batch: Mapping[str, np.ndarray], rows: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """The observations of sequence rows[i] at step steps[i], [n, *obs_shape], on the host: from `obs`, or
    those stacks alone rebuilt from single frames (the learner's probes of its torso take a few hundred)."""
    if "frames" not in batch:
        return batch["obs"][rows, steps]
    windows, mask = _windows_and_mask(*(torch.from_numpy(np.ascontiguousarray(batch[name]))
                                        for name in ("frames", "stack_start")))
    at = torch.from_numpy(rows), torch.from_numpy(steps)
    return (windows[at] * mask[at]).numpy()
