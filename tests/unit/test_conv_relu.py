"""A torso's convolution and its ReLU as one oneDNN operation in passes without a gradient (lbc.conv_relu,
decision 98): the same values as the two operations, the fused one used only where it may be."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lbc import conv_relu
from lbc.conv_relu import conv2d_relu, fuses, run_layers
from lbc.frame_ring import FrameRing
from lbc.nets import LBCNet

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _used_ops(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


FUSED = "mkldnn::_convolution_pointwise"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize(("channels", "out", "kernel", "stride", "padding", "bias"),
                         [(64, 16, 2, 1, 0, True), (16, 32, 4, 2, 0, True), (4, 16, 3, 1, 1, False),
                          (4, 16, 8, 4, 0, True)])
def test_the_fused_operation_is_the_convolution_then_its_relu(dtype, layout, channels, out, kernel, stride, padding,
                                                               bias):
    """max(conv(x), 0) at the same layout; negative sums exactly zero. Compared within the dtype's rounding
    (bit for bit on the hosts measured; oneDNN may pick another kernel for a post-op elsewhere)."""
    torch.manual_seed(0)
    x = torch.randn(6, channels, 21, 21).to(dtype).contiguous(memory_format=layout)
    w = torch.randn(out, channels, kernel, kernel).to(dtype) / kernel
    b = torch.randn(out).to(dtype) if bias else None
    with torch.no_grad():
        ref = torch.relu(F.conv2d(x, w, b, stride, padding))
        got = conv2d_relu(x, w, b, (stride, stride), (padding, padding), (1, 1), 1)
        assert FUSED in _used_ops(lambda: conv2d_relu(x, w, b, (stride, stride), (padding, padding), (1, 1), 1))
    assert got.dtype == dtype and got.shape == ref.shape
    assert got.is_contiguous(memory_format=layout)
    torch.testing.assert_close(got, ref)
    assert (got >= 0).all() and (ref > 0).float().mean() > 0.2


def test_under_bf16_autocast_it_computes_what_autocasts_convolution_does():
    """Float32 weights (a learner's target network) under bf16 autocast: cast as autocast's conv2d casts them."""
    torch.manual_seed(1)
    x = torch.randn(5, 16, 20, 20).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(32, 16, 4, 4) / 4, torch.randn(32)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        ref = torch.relu(F.conv2d(x, w, b, 2))
        got = conv2d_relu(x, w, b, (2, 2), (0, 0), (1, 1), 1)
    assert got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got, ref)


def test_it_is_fused_only_without_a_gradient_on_a_cpu():
    """With a gradient recorded the two operations run (the fused one has no backward), and the gradient is
    the convolution's; fp16 autocast and integer inputs are not fused."""
    x = torch.randn(2, 4, 10, 10, requires_grad=True)
    w = torch.randn(8, 4, 3, 3, requires_grad=True)
    assert not fuses(x)
    y = conv2d_relu(x, w, None, (1, 1), (1, 1), (1, 1), 1)
    y.sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    torch.relu(F.conv2d(x, w, None, 1, 1)).sum().backward()
    assert torch.equal(gx, x.grad) and torch.equal(gw, w.grad)
    with torch.no_grad():
        assert fuses(x) and not fuses(x[0]) and not fuses(x.to(torch.int32))
        with torch.autocast("cpu", torch.float16):
            assert not fuses(x)


class _Counting(nn.ReLU):
    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return super().forward(x)


def test_run_layers_fuses_a_convolution_and_the_relu_after_it_unless_hooked():
    """Only a layer with forward_relu followed by an nn.ReLU is fused; a hook on either (dead_units, ReDo) or a
    global one keeps the layers called one by one, so the hook sees what it would."""
    from lbc.blocked_conv import StridedConv2d
    torch.manual_seed(2)
    layers = nn.Sequential(StridedConv2d(4, 8, 4, stride=2), _Counting(), nn.Conv2d(8, 8, 3), _Counting(),
                           nn.Flatten())
    x = torch.randn(3, 4, 20, 20)
    with torch.no_grad():
        _Counting.calls = 0
        fused = run_layers(layers, x)
        assert _Counting.calls == 1   # the plain nn.Conv2d has no forward_relu
        torch.testing.assert_close(fused, layers(x))
        seen = []
        handle = layers[1].register_forward_hook(lambda m, i, o: seen.append(o))
        _Counting.calls = 0
        run_layers(layers, x)
        assert _Counting.calls == 2 and len(seen) == 1
        handle.remove()
        handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
        _Counting.calls = 0
        run_layers(layers, x)
        assert _Counting.calls == 2
        handle.remove()


@pytest.mark.parametrize("bf16", [False, True])
def test_an_acting_pass_through_the_ring_is_the_same_fused_or_not(bf16, monkeypatch):
    """The small torso's acting pass from a frame ring (bfloat16 weights, as an actor holds them, or float32)
    and its features without a gradient over plain stacks: the same with and without the fused operation,
    which the pass uses for both convolutions."""
    torch.manual_seed(3)
    net = LBCNet("small", (4, 84, 84), 6, 2, hidden=64, lstm=32)
    dtype = torch.bfloat16 if bf16 else torch.float32
    if bf16:
        net = net.to(torch.bfloat16)
    net.torso.convs.to(memory_format=torch.channels_last)
    ring = FrameRing(5, (4, 84, 84), 4, centre=True, dtype=dtype)
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8).numpy()
    frames = ring.push(obs)
    plain = torch.from_numpy(obs)

    def passes() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            return net.torso(frames), net.torso(net.torso_input(plain))

    assert FUSED in _used_ops(passes)
    fused = passes()
    monkeypatch.setattr(conv_relu, "fuses", lambda x: False)
    apart = passes()
    assert FUSED not in _used_ops(passes)
    for a, b in zip(fused, apart, strict=True):
        torch.testing.assert_close(a, b)
