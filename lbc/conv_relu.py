"""A torso's convolution and the ReLU after it as one oneDNN operation, in passes without a gradient.

An actor's acting pass and a learner's passes without a gradient (burn-in, the target network, the bootstrap
step) ran each convolution of a torso and then its ReLU, a second pass over the maps. oneDNN can apply the ReLU to
each output as it is stored (a post-op, `torch.ops.mkldnn._convolution_pointwise`, the operation torch's own
inductor fuses to on CPUs): max(s, 0) of the same sums. Where a gradient is wanted the two stay apart (the fused
operation has no backward), and so do other devices, traced or exported passes and layers with hooks
(dead_units and ReDo read the ReLUs' outputs through hooks). docs/decisions.md 98.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module


def fuses(x: torch.Tensor) -> bool:
    """Whether a convolution of `x` and its ReLU can run as one oneDNN operation here: a 4-d CPU input in float32 or
    bfloat16 (or under bf16 autocast), no gradient recorded, oneDNN built, not traced or exported."""
    if torch.is_grad_enabled() or x.device.type != "cpu" or x.dim() != 4 or not torch.backends.mkldnn.is_available():
        return False
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return False
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu") == torch.bfloat16
    return x.dtype in (torch.float32, torch.bfloat16)


def conv2d_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: tuple[int, ...],
                padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> torch.Tensor:
    """relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups)), by one oneDNN operation where `fuses(x)`
    (under bf16 autocast in bfloat16, as autocast's conv2d casts), else by the two."""
    if not fuses(x):
        return torch.relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups))
    if torch.is_autocast_enabled("cpu"):
        x, weight = x.to(torch.bfloat16), weight.to(torch.bfloat16)
        bias = None if bias is None else bias.to(torch.bfloat16)
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return torch.relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups))
    return torch.ops.mkldnn._convolution_pointwise(x, weight, bias, list(padding), list(stride), list(dilation),
                                                   groups, "relu", [], "")


def _hooked(layer: nn.Module) -> bool:
    return bool(layer._forward_hooks or layer._forward_pre_hooks)


def _fused_pair(layer: nn.Module, after: nn.Module | None) -> bool:
    return isinstance(after, nn.ReLU) and hasattr(layer, "forward_relu")


def has_fused_pairs(layers: nn.Sequential) -> bool:
    """Whether run_layers would fuse any of `layers` (hooks aside)."""
    todo = list(layers)
    return any(_fused_pair(a, b) for a, b in zip(todo, todo[1:], strict=False))


def run_layers(layers: nn.Sequential, x: object) -> torch.Tensor:
    """layers(x), with each layer that has a `forward_relu(x)` (relu(layer(x))) and is followed by an nn.ReLU
    called once for the two, where neither has hooks."""
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return layers(x)
    todo = list(layers)
    i = 0
    while i < len(todo):
        layer = todo[i]
        after = todo[i + 1] if i + 1 < len(todo) else None
        if _fused_pair(layer, after) and not _hooked(layer) and not _hooked(after):
            x = layer.forward_relu(x)
            i += 2
        else:
            x = layer(x)
            i += 1
    return x
