"""Linear layers whose bfloat16 weight oneDNN lays out for its matrix engine once, not at every call (decision 98).

A bfloat16 product on a CPU (F.linear under bf16 autocast, or on an actor's bf16 weights) has oneDNN copy the weight
into the blocked layout its AMX or AVX-512 kernels read, at every call: on one core of the AMX host an `impala`
acting pass's torso layer (64 x 2592 by 2592 x 256) took 466 us that way and 320 with the weight laid out beforehand
(`torch.ops.mkldnn._reorder_linear_weight`, the layout torch's inductor packs weights in), the LSTM's products
211-290 against 153-214, the learner's 16-row recurrent product 132 against 71. The same sums in the same order: the
same bits (tests/unit/test_packed_linear.py).

The laid-out copy is kept per weight and made again when the weight changes: a tensor's version counter moves at
every in-place write (an actor's pull, an optimiser's step, a target network's copy), its storage at a `.to()`. Only
passes without a gradient use it (the laid-out weight has no backward): an actor's and the evaluator's, a
learner's burn-in, bootstrap step and target network, whose weights change every `target_update_every` steps.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F
from torch import nn

# (id(weight), transposed) -> ((storage, version, dtype) when laid out, the laid-out bfloat16 weight); an entry
# leaves with its weight
_LAID_OUT: dict[tuple[int, bool], tuple[tuple[int, int, torch.dtype], torch.Tensor]] = {}


@functools.cache
def available() -> bool:
    """Whether this torch has oneDNN and the two operations (torch's own, used by its inductor)."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise"))


def packs(x: torch.Tensor) -> bool:
    """Whether a product of `x` runs on a laid-out weight: on a CPU, in bfloat16 (x's dtype, or bf16 autocast's),
    no gradient recorded, not compiled, traced or exported."""
    if torch.is_grad_enabled() or x.device.type != "cpu" or x.dim() < 2 or not available():
        return False
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return False
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu") == torch.bfloat16
    return x.dtype == torch.bfloat16


def laid_out(weight: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """`weight` [out, in] (its transpose where `transposed`) in bfloat16 as oneDNN's products read it, made once per
    value of the weight."""
    key = (id(weight), transposed)
    stamp = (weight.data_ptr(), weight._version, weight.dtype)
    kept = _LAID_OUT.get(key)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    if kept is None:
        weakref.finalize(weight, _LAID_OUT.pop, key, None)
    w = weight.detach().to(torch.bfloat16)
    out = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous() if transposed else w)
    _LAID_OUT[key] = (stamp, out)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) as autocast would compute it, on the laid-out weight where `packs(x)`."""
    if not packs(x):
        return F.linear(x, weight, bias)
    bias = None if bias is None else bias.to(torch.bfloat16)
    return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), laid_out(weight), bias, "none", [], "")


class Linear(nn.Linear):
    """nn.Linear (the same parameters and names) whose passes without a gradient read its weight laid out once
    (linear), where `packed` (LBCNet.set_packed_linears)."""

    packed = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias) if self.packed else F.linear(x, self.weight, self.bias)
