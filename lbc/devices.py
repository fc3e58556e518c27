"""Where tensors live: the device a service's setting names, and host-to-device copies of batches."""

from __future__ import annotations

import numpy as np
import torch


def pick_device(setting: str, what: str) -> torch.device:
    """`setting` is auto, cpu or cuda (`what` names the setting in the error): auto takes the GPU when
    one is visible; cuda without one is refused with a clear message."""
    if setting == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{what}=cuda but no CUDA device is visible")
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(setting)


def to_device(array: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host array on `device`: as it is on the CPU (no copy for a contiguous numpy array), through
    pinned memory and a copy that does not block the host on a GPU."""
    t = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)
