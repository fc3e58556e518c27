"""Parameters on the wire and in the ParameterService: a safetensors blob (no code runs on load), streamed
in chunks (lbc.param_stream)."""

from __future__ import annotations

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save


def to_blob(model: torch.nn.Module) -> bytes:
    return st_save({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()})


def shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_blob(blob: bytes, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Parse a blob and check its tensors' names, shapes and finiteness; raises ValueError saying what is wrong."""
    try:
        state = st_load(blob)
    except Exception as exc:
        raise ValueError(f"parameter blob does not parse as safetensors: {exc}") from None
    if set(state) != set(expected):
        raise ValueError(f"parameter names differ: missing {sorted(set(expected) - set(state))[:5]}, "
                         f"unexpected {sorted(set(state) - set(expected))[:5]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(f"parameter {name}: shape {tuple(tensor.shape)}, model has {expected[name]}")
        if tensor.is_floating_point() and not all_finite(tensor):
            raise ValueError(f"parameter {name} has non-finite values")
    return state


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of a CPU tensor is finite. numpy's test where numpy holds the dtype: torch's took 2.8 ms
    over an `impala` blob's 1.2M float32 values, numpy's 0.14 (a pull checks every blob it receives)."""
    if tensor.dtype in (torch.float16, torch.float32, torch.float64):
        return bool(np.isfinite(tensor.numpy()).all())
    return bool(torch.isfinite(tensor).all())


def load_blob(model: torch.nn.Module, blob: bytes) -> None:
    """Load a blob into model; raises ValueError if its tensors don't match the model's."""
    model.load_state_dict(check_blob(blob, shapes(model)))
