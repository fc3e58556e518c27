"""Linear layers on a weight laid out once for oneDNN (lbc.packed_linear, decision 98): the same values as F.linear
under the same autocast, the laid-out weight made again whenever the weight changes, used only where it may be."""

import pytest
import torch
import torch.nn.functional as F

from lbc import packed_linear
from lbc.packed_linear import Linear, laid_out, linear, packs

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="torch built without oneDNN's operations")


def _used_ops(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


LAID_OUT = "mkldnn::_linear_pointwise"


@pytest.mark.parametrize("rows", [1, 9, 16, 64])
@pytest.mark.parametrize(("fan_in", "fan_out", "bias"), [(2592, 256, True), (275, 1024, False), (256, 1024, False),
                                                          (256, 19, True)])
def test_the_laid_out_product_is_autocasts_product(rows, fan_in, fan_out, bias):
    """Float32 weights under bf16 autocast (a learner's target network) and bfloat16 weights with or without it (an
    actor's): F.linear's values to the bit, in bfloat16, for 2-d and 3-d inputs."""
    torch.manual_seed(rows)
    w = torch.randn(fan_out, fan_in) / fan_in ** 0.5
    b = torch.randn(fan_out) if bias else None
    x = torch.randn(1, rows, fan_in)
    with torch.no_grad():
        with torch.autocast("cpu", torch.bfloat16):
            ref, got = F.linear(x, w, b), linear(x, w, b)
            assert LAID_OUT in _used_ops(lambda: linear(x[0], w, b))
        assert got.dtype == torch.bfloat16 and got.shape == ref.shape and torch.equal(got, ref)
        wb, bb, xb = w.bfloat16(), None if b is None else b.bfloat16(), x.bfloat16()
        for autocast in (False, True):
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                assert torch.equal(linear(xb[0], wb, bb), F.linear(xb[0], wb, bb))


def test_the_weight_is_laid_out_again_when_it_changes():
    """An in-place write (a pull, an optimiser's step, a target copy) or a new storage (.to) lays the weight out
    again; an unchanged weight is laid out once."""
    torch.manual_seed(1)
    layer = Linear(64, 32).bfloat16()
    x = torch.randn(5, 64).bfloat16()
    with torch.no_grad():
        first = laid_out(layer.weight)
        assert laid_out(layer.weight) is first
        layer.weight.copy_(torch.randn(32, 64))
        assert laid_out(layer.weight) is not first
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        layer.weight.mul_(-1.0)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        layer.float()   # a new storage, float32 now: laid out from its bfloat16 cast under autocast
        with torch.autocast("cpu", torch.bfloat16):
            assert torch.equal(layer(x.float()), F.linear(x.float(), layer.weight, layer.bias))
    key = (id(layer.weight), False)
    assert key in packed_linear._LAID_OUT
    del layer
    assert key not in packed_linear._LAID_OUT   # the laid-out copy leaves with its weight


def test_it_is_used_only_without_a_gradient_in_bfloat16_on_a_cpu():
    """With a gradient recorded F.linear runs (the laid-out weight has no backward) and the gradient is its own;
    float32 without autocast, fp16 autocast, tracing and layers set not to pack use F.linear too."""
    torch.manual_seed(2)
    layer = Linear(16, 8)
    x = torch.randn(3, 16, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16):
        assert not packs(x)
        layer(x).float().sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    with torch.no_grad():
        assert not packs(x) and not packs(x[0])
        with torch.autocast("cpu", torch.bfloat16):
            assert packs(x)
            layer.packed = False
            assert LAID_OUT not in _used_ops(lambda: layer(x))
            layer.packed = True
            assert LAID_OUT in _used_ops(lambda: layer(x))
        with torch.autocast("cpu", torch.float16):
            assert not packs(x)


def test_an_acting_pass_and_a_learners_passes_are_the_same_packed_or_not():
    """The `impala` network's acting pass on bfloat16 weights (set_precision, as an actor holds them) and a float32
    network's burn-in and target unroll under bf16 autocast: the same outputs and state with set_packed_linears on
    and off, the laid-out products used when on."""
    from lbc.acting import set_precision
    from lbc.config import load_config
    from lbc.envs import env_spec
    from lbc.nets import build_net
    cfg = load_config("impala", [])
    spec = env_spec(cfg.env)
    torch.manual_seed(3)
    net = build_net(cfg, spec.obs_shape, spec.num_actions).eval()
    actor = build_net(cfg, spec.obs_shape, spec.num_actions).eval()
    actor.load_state_dict(net.state_dict())
    set_precision(actor, "bf16")
    t, b = 3, 5
    obs = torch.randint(0, 256, (t, b, *spec.obs_shape), dtype=torch.uint8)
    inputs = (torch.randint(0, spec.num_actions, (t, b)), torch.randn(t, b), torch.zeros(t, b, dtype=torch.bool))

    def passes():
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            return net(obs, *inputs, net.initial_state(b)), actor(obs[:1], *(x[:1] for x in inputs),
                                                                  actor.initial_state(b))

    assert LAID_OUT in _used_ops(passes)
    packed = passes()
    net.set_packed_linears(False)
    actor.set_packed_linears(False)
    assert not actor.packs_linears()
    assert LAID_OUT not in _used_ops(passes)
    for a, b_ in zip(packed, passes(), strict=True):
        assert torch.equal(a.adv, b_.adv) and torch.equal(a.value, b_.value)
        assert all(torch.equal(x, y) for x, y in zip(a.state, b_.state, strict=True))


@pytest.mark.parametrize("steps, batch", [(1, 3), (21, 16), (31, 9)])
def test_the_native_unroll_on_the_laid_out_weight_gives_the_same_bits(steps, batch):
    """lbc.native's unroll with a bfloat16 hidden weight (a bf16 learner's), its products on W and W^T laid out once
    (decision 98) against at::mm's: every forward and backward result equal to the bit, a reset in the middle."""
    from lbc import native
    from lbc.lstm_bptt import EPS
    if native.ln_lstm_ops() is None:
        pytest.skip(f"lbc.native does not load here: {native.unavailable()}")
    forward, backward = native.ln_lstm_ops()
    g = torch.Generator().manual_seed(steps)
    size = 256
    xs, h, c = (torch.randn(*shape, generator=g) for shape in ((steps, batch, 4 * size), (batch, size), (batch, size)))
    keep = torch.ones(steps, batch, 1)
    keep[steps // 2, 0] = 0.0
    master = torch.randn(4 * size, size, generator=g) / size ** 0.5
    gains = (1 + 0.1 * torch.randn(4 * size, generator=g), 1 + 0.1 * torch.randn(size, generator=g),
             0.1 * torch.randn(size, generator=g))
    inputs = (xs, keep, h, c, master.bfloat16(), *gains)
    plain = forward(*inputs, EPS)
    laid = forward(*inputs, EPS, laid_out(master))
    assert all(torch.equal(a, b) for a, b in zip(plain, laid, strict=True))
    grads = tuple(torch.randn(*t.shape, generator=g) for t in (plain[0], h, c))
    back = (*grads, keep, master.bfloat16(), *gains, *plain[3:])
    assert all(torch.equal(a, b) for a, b in zip(backward(*back), backward(*back, laid_out(master, transposed=True)),
                                                 strict=True))
