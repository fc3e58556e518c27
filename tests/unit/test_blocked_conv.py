"""lbc.blocked_conv: a strided convolution's input gradient computed in blocks, against a plain loop of the
convolution's definition and against nn.Conv2d's own gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import lbc.blocked_conv as blocked_conv
from lbc.blocked_conv import StridedConv2d, block_size, input_grad_in_blocks
from lbc.nets import LBCNet


def input_grad_by_loop(grad: np.ndarray, weight: np.ndarray, k: int, size: tuple[int, int]) -> np.ndarray:
    """d/dx of sum(grad * conv(x, weight, stride k)) from the definition out[n, o, a, b] = sum_{c, p, q}
    w[o, c, p, q] x[n, c, k a + p, k b + q]: every output position hands grad[n, o, a, b] w[o, c, p, q] back to the
    pixel it read."""
    n, _, rows, cols = grad.shape
    _, channels, kh, kw = weight.shape
    dx = np.zeros((n, channels, *size))
    for a in range(rows):
        for b in range(cols):
            for p in range(kh):
                for q in range(kw):
                    dx[:, :, k * a + p, k * b + q] += grad[:, :, a, b] @ weight[:, :, p, q]
    return dx


@pytest.mark.parametrize("channels, out, kernel, k, size", [(16, 32, 4, 2, 20), (3, 5, 2, 2, 8), (4, 6, 8, 4, 24),
                                                             (2, 3, 6, 3, 12)])
def test_input_gradient_in_blocks_is_the_convolutions(channels: int, out: int, kernel: int, k: int, size: int) -> None:
    rng = np.random.default_rng(0)
    rows = (size - kernel) // k + 1
    grad = rng.standard_normal((2, out, rows, rows))
    weight = rng.standard_normal((out, channels, kernel, kernel))
    dx = input_grad_in_blocks(torch.from_numpy(grad).contiguous(memory_format=torch.channels_last),
                              torch.from_numpy(weight), k)
    assert dx.shape == (2, channels, size, size) and dx.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_allclose(dx.numpy(), input_grad_by_loop(grad, weight, k, (size, size)), rtol=1e-10, atol=1e-10)


def _count_blocked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at every input gradient computed in blocks."""
    calls: list[int] = []

    def counted(*args: torch.Tensor | int) -> torch.Tensor:
        calls.append(1)
        return input_grad_in_blocks(*args)

    monkeypatch.setattr(blocked_conv, "input_grad_in_blocks", counted)
    return calls


def _gradients(conv: nn.Conv2d, x: torch.Tensor, upstream: torch.Tensor, bf16: bool) -> list[torch.Tensor]:
    conv.zero_grad()
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        y = conv(x)
    (y.double() * upstream).sum().backward()
    return [y.detach().double(), x.grad.double(), conv.weight.grad.double(), conv.bias.grad.double()]


@pytest.mark.parametrize("bf16", [False, True])
def test_strided_conv_computes_what_conv2d_does(bf16: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and all three gradients equal nn.Conv2d's (float64 to rounding; under bf16 autocast within its
    rounding), with the input's gradient taken in blocks: checked by counting, so that a StridedConv2d that fell
    back to nn.Conv2d would fail."""
    calls = _count_blocked(monkeypatch)
    torch.manual_seed(0)
    dtype = torch.float32 if bf16 else torch.float64
    strided = StridedConv2d(16, 32, 4, stride=2).to(dtype)
    plain = nn.Conv2d(16, 32, 4, stride=2).to(dtype)
    plain.load_state_dict(strided.state_dict())
    x = torch.randn(6, 16, 20, 20, dtype=dtype).contiguous(memory_format=torch.channels_last)
    upstream = torch.randn(6, 32, 9, 9, dtype=torch.float64)
    got, want = _gradients(strided, x, upstream, bf16), _gradients(plain, x, upstream, bf16)
    assert calls == [1]
    for g, w in zip(got, want, strict=True):
        tolerance = 2e-2 if bf16 else 1e-12
        assert float((g - w).norm() / w.norm()) < tolerance


def test_strided_conv_is_conv2d_where_blocks_do_not_pay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a gradient for the input, in the default layout, or on an input the stride does not divide, the
    input's gradient is nn.Conv2d's own."""
    calls = _count_blocked(monkeypatch)
    conv = StridedConv2d(4, 8, 4, stride=2)
    channels_last = torch.randn(2, 4, 20, 20).contiguous(memory_format=torch.channels_last)
    conv(channels_last).sum().backward()   # no gradient for the input: the weight's alone
    conv(torch.randn(2, 4, 20, 20, requires_grad=True)).sum().backward()
    conv(torch.randn(2, 4, 21, 21).contiguous(memory_format=torch.channels_last).requires_grad_()).sum().backward()
    assert calls == []
    assert block_size(conv, (20, 20)) == 2 and block_size(conv, (21, 20)) == 1
    assert block_size(nn.Conv2d(4, 8, 3, stride=2), (20, 20)) == 1
    assert block_size(nn.Conv2d(4, 8, 4, stride=2, padding=1), (20, 20)) == 1


def test_small_torso_network_learns_the_same_with_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The small torso's second convolution is a StridedConv2d: in the learner's layout (channels-last, bf16
    autocast) a network's loss and every parameter's gradient match those with nn.Conv2d in its place within
    bfloat16 rounding, the first computed in blocks."""
    calls = _count_blocked(monkeypatch)
    torch.manual_seed(0)
    net = LBCNet("small", (4, 84, 84), 6, 2, hidden=32, lstm=32).set_channels_last(True)
    conv = net.torso.convs[2]
    assert isinstance(conv, StridedConv2d)
    steps, batch = 3, 4
    obs = torch.randint(0, 256, (steps, batch, 4, 84, 84), dtype=torch.uint8)
    inputs = (obs, torch.randint(0, 6, (steps, batch)), torch.randn(steps, batch),
              torch.zeros(steps, batch, dtype=torch.bool), net.initial_state(batch))

    def loss_and_grads() -> list[torch.Tensor]:
        net.zero_grad()
        with torch.autocast("cpu", torch.bfloat16):
            out = net(*inputs)
        loss = out.adv.pow(2).mean() + out.value.pow(2).mean()
        loss.backward()
        return [loss.detach().double()] + [p.grad.double() for p in net.parameters()]

    blocked = loss_and_grads()
    assert calls == [1]
    conv.__class__ = nn.Conv2d
    plain = loss_and_grads()
    for g, w in zip(blocked, plain, strict=True):
        assert float((g - w).norm() / w.norm().clamp_min(1e-12)) < 2e-2
