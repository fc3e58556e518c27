"""Convolutions of stride k read in k x k blocks (space-to-depth), and a convolution whose input gradient is
computed that way.

A convolution of stride k whose kernel and input are k-divisible sums the same products as a stride-1
convolution of a kernel k times smaller over the input in k x k blocks (k k times the channels). FrameConv2d
reads a stack of frames in blocks (decision 83). StridedConv2d keeps its forward pass as it is and computes the
gradient for its input in blocks (decision 87): that gradient is the transposed convolution of the output's
gradient with the weight, which oneDNN computes at stride 2 about 1.8 times slower (bf16, on the learner's shapes)
than as a transposed stride-1 convolution of the blocked weight followed by one copy back to pixels (docs/speed.md,
session 58).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def block_size(conv: nn.Conv2d, frame: tuple[int, ...]) -> int:
    """The side k of the blocks in which `conv` can read inputs of [H, W] = frame[-2:]: its stride, where that is
    the same both ways, divides the kernel and the input, and nothing pads or dilates or groups; else 1."""
    k = conv.stride[0]
    fits = (k > 1 and conv.stride == (k, k) and all(n % k == 0 for n in (*conv.kernel_size, *frame[-2:]))
            and all(p == 0 for p in conv.padding) and conv.dilation == (1, 1) and conv.groups == 1)
    return k if fits else 1


def input_grad_in_blocks(grad: torch.Tensor, weight: torch.Tensor, k: int) -> torch.Tensor:
    """The gradient of conv2d(x, weight, stride=k) for x [N, C, H, W] from the output's gradient grad [N, O, H', W'],
    for H and W and the kernel divisible by k and no padding:

        dx[n, c, k a + i, k b + j] = d[n, (i k + j) C + c, a, b],   d = conv_transpose2d(grad, w_b),
        w_b[o, (i k + j) C + c, p, q] = weight[o, c, k p + i, k q + j]

    (conv2d(x, weight, stride=k) = conv2d(x in blocks, w_b), and conv_transpose2d is its gradient for the input).
    The blocks' channels run (i, j, c) so that, in the channels-last layout, going back to pixels copies runs of
    C values. Returns dx channels-last."""
    out, channels, kh, kw = weight.shape
    blocked = weight.reshape(out, channels, kh // k, k, kw // k, k).permute(0, 3, 5, 1, 2, 4)
    d = F.conv_transpose2d(grad, blocked.reshape(out, k * k * channels, kh // k, kw // k)
                           .contiguous(memory_format=torch.channels_last))
    n, _, h, w = d.shape
    pixels = d.permute(0, 2, 3, 1).reshape(n, h, w, k, k, channels).permute(0, 1, 3, 2, 4, 5)   # [n, a, i, b, j, c]
    return pixels.reshape(n, h * k, w * k, channels).permute(0, 3, 1, 2)


class _InputGradInBlocks(torch.autograd.Function):
    """conv2d(x, weight, bias, stride=k) with x's gradient by input_grad_in_blocks; the weight's and the bias's as
    autograd computes them."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, k: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.k = k
        ctx.has_bias = bias is not None
        return F.conv2d(x, weight, bias, stride=k)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None]:
        x, weight = ctx.saved_tensors
        k = ctx.k
        grad = grad.contiguous(memory_format=torch.channels_last)
        grad_x = input_grad_in_blocks(grad, weight, k) if ctx.needs_input_grad[0] else None
        # a gradient the mask leaves out comes back as None
        _, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad, x, weight, [weight.shape[0]] if ctx.has_bias else None, [k, k], [0, 0], [1, 1], False, [0, 0], 1,
            [False, ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]])
        return grad_x, grad_w, grad_b, None


class StridedConv2d(nn.Conv2d):
    """nn.Conv2d whose gradient for its input is computed in blocks (input_grad_in_blocks) where that pays: on a
    CPU, channels-last, the stride dividing the kernel and the input (block_size). The forward pass and the
    weight's gradient are nn.Conv2d's; the input's gradient equals it up to float rounding (summed in another
    order). Elsewhere, and without a gradient for the input, it is nn.Conv2d."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = (block_size(self, x.shape) if x.requires_grad and torch.is_grad_enabled() and x.device.type == "cpu"
             and x.is_contiguous(memory_format=torch.channels_last) else 1)
        if k == 1:   # inference, another device or layout, or a shape that does not divide
            return super().forward(x)
        weight, bias = self.weight, self.bias
        device = x.device.type
        if torch.is_autocast_enabled(device):   # autocast does not reach into a Function's backward: cast here
            dtype = torch.get_autocast_dtype(device)
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        return _InputGradInBlocks.apply(x, weight, bias, k)
