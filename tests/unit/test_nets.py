import copy

import numpy as np
import pytest
import torch

from lbc import nets
from lbc.config import load_config
from lbc.envs import env_spec
from lbc.nets import (
    Frames,
    LayerNormLSTM,
    LBCNet,
    PlainLSTM,
    _uint8_lower_median,
    build_net,
    gather_rows,
    lower_median,
    pixels_to_input,
    unroll_after_burn_in,
)
from lbc.sequences import sequence_layout


def _count(model):
    return sum(p.numel() for p in model.parameters())


def test_small_net_shapes_and_size():
    cfg = load_config("cpu")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    # IMPALA's shallow net is ~1.2M parameters with its LSTM (paper Fig. 3)
    assert 1.0e6 < _count(net) < 1.6e6
    t, b = 3, 2
    out = net(torch.randint(0, 255, (t, b, *spec.obs_shape), dtype=torch.uint8), torch.zeros(t, b, dtype=torch.long),
              torch.zeros(t, b), torch.zeros(t, b, dtype=torch.bool), net.initial_state(b))
    assert out.adv.shape == (t, b, 3, 18) and out.value.shape == (t, b, 3)
    torch.testing.assert_close(out.adv.mean(-1), torch.zeros(t, b, 3), atol=1e-6, rtol=0)   # dueling: mean-zero A


@pytest.mark.slow
def test_deep_net_size():
    cfg = load_config("lbc-bm")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    assert 1.5e6 < _count(net) < 2.5e6


def test_all_heads_in_one_forward_match_per_policy_heads():
    cfg = load_config("catch")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    obs = torch.randint(0, 2, (1, 4, *spec.obs_shape), dtype=torch.uint8) * 255
    out = net(obs, torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4), torch.ones(1, 4, dtype=torch.bool),
              net.initial_state(4))
    w = net.heads.weight.view(cfg.num_policies, spec.num_actions + 1, -1)
    h = out.state[0]
    for i in range(cfg.num_policies):
        raw = h @ w[i].T + net.heads.bias.view(cfg.num_policies, -1)[i]
        torch.testing.assert_close(out.value[0, :, i], raw[:, -1])
        torch.testing.assert_close(out.adv[0, :, i], raw[:, :-1] - raw[:, :-1].mean(-1, keepdim=True))


def test_reset_zeroes_the_recurrent_state():
    cfg = load_config("catch")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    obs = torch.zeros(1, 1, *spec.obs_shape, dtype=torch.uint8)
    args = (obs, torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1))
    junk = (torch.randn(1, cfg.net.lstm), torch.randn(1, cfg.net.lstm))
    with_reset = net(*args, torch.ones(1, 1, dtype=torch.bool), junk)
    fresh = net(*args, torch.zeros(1, 1, dtype=torch.bool), net.initial_state(1))
    torch.testing.assert_close(with_reset.adv, fresh.adv)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _layer_norm(x, gain, bias, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * gain + bias


def test_layernorm_lstm_matches_ba_et_al_equations_in_numpy():
    """Ba et al. 2016 eq. (20)-(22), one plain numpy step at a time, with a reset in the middle."""
    torch.manual_seed(0)
    core = LayerNormLSTM(5, 4)
    with torch.no_grad():   # non-trivial gains and biases so every LN parameter matters
        for p in core.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(6, 3, 5)
    keep = torch.ones(6, 3, 1)
    keep[3, 1] = 0.0
    h0, c0 = torch.randn(3, 4), torch.randn(3, 4)
    out, (h_last, c_last) = core(x, keep, (h0, c0))

    p = {k: v.detach().numpy().astype(np.float64) for k, v in core.state_dict().items()}
    h, c = h0.numpy().astype(np.float64), c0.numpy().astype(np.float64)
    for t in range(6):
        h, c = h * keep[t].numpy(), c * keep[t].numpy()
        pre = (_layer_norm(x[t].numpy() @ p["input_proj.weight"].T, p["input_norm.weight"], p["input_norm.bias"])
               + _layer_norm(h @ p["hidden_proj.weight"].T, p["hidden_norm.weight"], 0.0))
        i, f, g, o = np.split(pre, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(_layer_norm(c, p["cell_norm.weight"], p["cell_norm.bias"]))
        np.testing.assert_allclose(out[t].detach().numpy(), h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c_last.detach().numpy(), c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h_last.detach().numpy(), h, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's kernels (Triton's) need a visible GPU")
def test_the_compiled_layernorm_lstm_unroll_keeps_the_outputs_and_gradients(monkeypatch):
    """learner.compile on a GPU: torch.compile's kernels for the recurrence, whole chunks of steps per graph and the
    remainder eager, give the eager module's outputs and gradients within float rounding (fused kernels sum in
    another order), and a copy (the target network) unrolls compiled too. Chunks of 2 steps rather than the
    learner's 8 keep compiling short. On a CPU, test_training's test_a_compiled_recurrence_trains_as_the_eager_one
    checks the same through a learner's step (each of the two compiled some 16-19 kernels at about 2 s each)."""
    device = "cuda"
    monkeypatch.setattr(nets, "COMPILED_STEPS", 2)
    torch._dynamo.reset()   # graphs compiled by other tests count against torch's recompile limit
    torch.manual_seed(0)
    eager = LayerNormLSTM(5, 8).to(device)
    with torch.no_grad():
        for p in eager.parameters():
            p.add_(0.3 * torch.randn_like(p))
    fused = copy.deepcopy(eager)
    fused.compile_unroll()
    assert copy.deepcopy(fused).compiled
    x = torch.randn(7, 3, 5, device=device)   # three chunks and a step
    keep = torch.ones(7, 3, 1, device=device)
    keep[2, 0] = keep[4, 1] = 0.0
    state = (torch.randn(3, 8, device=device), torch.randn(3, 8, device=device))
    results = []
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for core in (eager, fused):
        out, (h, c) = core(x, keep, state)
        (out.square().sum() + c.sum()).backward()
        results.append((out, c, [p.grad for p in core.parameters()]))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs   # it did compile
    (out_e, c_e, grads_e), (out_f, c_f, grads_f) = results
    torch.testing.assert_close(out_f, out_e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_f, c_e, rtol=1e-5, atol=1e-5)
    for g_f, g_e in zip(grads_f, grads_e, strict=True):
        torch.testing.assert_close(g_f, g_e, rtol=1e-4, atol=1e-5)
    # the target network unrolls a varying count of sequences: not a graph compiled for each
    assert graphs_compiled_unrolling(fused, (2, 4, 5, 6, 7), steps=3) <= 2


def graphs_compiled_unrolling(core: LayerNormLSTM, counts: tuple[int, ...], steps: int) -> int:
    """The graphs torch.compile makes while `core` unrolls `steps` steps of each count of sequences in `counts`
    without a gradient (as the target network does), from zero states."""
    device = core.input_proj.weight.device
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for count in counts:
            zeros = torch.zeros(count, core.hidden_size, device=device)
            core(torch.randn(steps, count, core.input_proj.in_features, device=device),
                 torch.ones(steps, count, 1, device=device), (zeros, zeros))
    return torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs


def test_plain_lstm_core_matches_torch_lstm():
    torch.manual_seed(0)
    core = PlainLSTM(5, 4)
    ref = torch.nn.LSTM(5, 4)
    ref.load_state_dict({"weight_ih_l0": core.cell.weight_ih, "weight_hh_l0": core.cell.weight_hh,
                         "bias_ih_l0": core.cell.bias_ih, "bias_hh_l0": core.cell.bias_hh})
    x, h0, c0 = torch.randn(6, 3, 5), torch.randn(3, 4), torch.randn(3, 4)
    out, (h, c) = core(x, torch.ones(6, 3, 1), (h0, c0))
    ref_out, (ref_h, ref_c) = ref(x, (h0[None], c0[None]))
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(c, ref_c[0])


def test_layernorm_core_keeps_its_output_unsaturated_whatever_the_cell_size():
    """The failure it replaces (docs/decisions.md 24): a cell of hundreds gives |h| = 1 and no gradient."""
    torch.manual_seed(0)
    core = LayerNormLSTM(5, 64)
    c_big = 300.0 * torch.randn(2, 64)
    x = torch.randn(1, 2, 5, requires_grad=True)
    out, _ = core(x, torch.ones(1, 2, 1), (torch.zeros(2, 64), c_big))
    assert out.abs().max() < 0.99
    out.sum().backward()
    assert x.grad.abs().mean() > 1e-3


def test_dead_units_hand_derived():
    from lbc.nets import dead_units
    linear = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    with torch.no_grad():
        linear[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]))
        linear[0].bias.zero_()
    # unit 0 fires on the first input; unit 1 is 0 on both (not positive); unit 2 is negative on both
    assert dead_units(linear, torch.tensor([[1.0, 0.0], [0.0, 0.0]])) == {"1": pytest.approx(2 / 3)}
    assert dead_units(linear, torch.tensor([[1.0, 0.0], [0.0, 1.0]])) == {"1": pytest.approx(1 / 3)}
    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.ReLU())
    with torch.no_grad():
        conv[0].weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
        conv[0].bias.zero_()
    x = torch.zeros(3, 1, 4, 4)
    x[2, 0, 3, 1] = 1.0   # channel 0 fires at one position of one input: alive; channel 1 never
    assert dead_units(conv, x) == {"1": 0.5}
    assert not linear[1]._forward_hooks and not conv[1]._forward_hooks   # the probe leaves no hook behind


def test_orthogonal_init_keeps_the_scale_of_relu_layers():
    cfg = load_config("cpu", ["net.init=orthogonal"])
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    for layer in net.torso.modules():
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            w = layer.weight.detach().flatten(1)
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            torch.testing.assert_close(gram, 2.0 * torch.eye(len(gram)), atol=1e-4, rtol=0)
            assert not layer.bias.any()
    torch_net = build_net(load_config("cpu", ["net.init=torch"]), spec.obs_shape, spec.num_actions)
    assert torch_net.torso.fc[0].bias.any()   # torch's own default is left alone
    frames = torch.randint(0, 256, (32, *spec.obs_shape), dtype=torch.uint8)
    with torch.no_grad():
        ours = net.torso(net.torso_input(frames)).std(0).mean()
        theirs = torch_net.torso(torch_net.torso_input(frames)).std(0).mean()
    assert ours > 5 * theirs   # torch's default shrinks the features' variation layer by layer


def test_sonnet_init_draws_a_normal_of_std_one_over_root_fan_in_cut_at_two_std():
    # Sonnet 1's default (truncated_normal(stddev=1/sqrt(fan_in)), zero biases): a normal cut at +-2 std keeps
    # std 0.8796 of the uncut one (1 - 2 * 2 phi(2) / (2 Phi(2) - 1), phi and Phi the standard normal's density
    # and distribution)
    torch.manual_seed(0)
    cfg = load_config("impala", ["net.init=sonnet"])
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    fan_ins = {"convs.0": 4 * 8 * 8, "convs.2": 16 * 4 * 4, "fc.0": 32 * 9 * 9}
    for name, layer in net.torso.named_modules():
        if name in fan_ins:
            w = layer.weight.detach()
            bound = 2 * fan_ins[name] ** -0.5
            assert w.abs().max() <= bound and not layer.bias.any()
            assert w.std().item() == pytest.approx(0.8796 * fan_ins[name] ** -0.5, rel=0.05)
    assert len(fan_ins) == sum(isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) for m in net.torso.modules())


def test_the_learner_counts_dead_units_on_the_batch():
    from learner_svc.training import Trainer
    cfg = load_config("cpu")
    trainer = Trainer(cfg)
    layout = sequence_layout(cfg)   # single frames, as replay sends them
    batch = {"frames": np.random.default_rng(0).integers(0, 256, (2, *layout["frames"][1]), dtype=np.uint8),
             "stack_start": np.zeros((2, *layout["stack_start"][1]), bool),
             "reset": np.zeros((2, *layout["reset"][1]), bool)}
    alive = trainer.torso_dead_units(batch)
    assert set(alive) == {"convs.1", "convs.3", "fc.1"} and max(alive.values()) < 0.5
    with torch.no_grad():
        trainer.model.torso.convs[0].bias.fill_(-1e3)   # every first-layer unit negative: the net is blind
    dead = trainer.torso_dead_units(batch)
    assert dead["convs.1"] == 1.0 and dead["convs.3"] > alive["convs.3"]


def test_centred_frames_put_the_background_at_zero():
    frames = torch.full((2, 4, 84, 84), 87, dtype=torch.uint8)   # Pong's brown, as grey
    frames[0, :, 10:12, 40] = 236                                # a ball
    frames[1, 3] = 0                                             # a black frame in the stack
    x = pixels_to_input(frames, centre=True)
    assert x.shape == frames.shape and x.dtype == torch.float32
    torch.testing.assert_close(x[0, :, 10, 40], torch.full((4,), (236 - 87) / 255))
    x[0, :, 10:12, 40] = 0.0
    assert not x.any()                                           # every background pixel is 0
    torch.testing.assert_close(pixels_to_input(frames, centre=False)[1, 0], torch.full((84, 84), 87 / 255))


@pytest.mark.parametrize("torso", ["small", "deep", "minatar"])
@pytest.mark.parametrize("centre", [False, True])
def test_the_first_convolution_of_uint8_frames_is_the_convolution_of_their_float_input(torso, centre):
    """FrameConv2d folds the 1/255 and the medians into the convolution; it must equal the convolution of
    pixels_to_input's floats, computed in float64, at every position (padding included: the deep torso's
    first layer pads by one) and in either memory layout, and so must its gradient in W."""
    from lbc.nets import TORSOS
    shape = (7, 10, 10) if torso == "minatar" else (4, 84, 84)
    torch.manual_seed(0)
    conv = TORSOS[torso](shape, 32).convs[0]
    conv.centre = centre
    frames = torch.randint(0, 256, (5, *shape), dtype=torch.uint8)
    frames[:2, :, ::3] = 87                                      # frames with a clear background, as Atari's
    ref_w = conv.weight.detach().double().requires_grad_()
    ref = torch.nn.functional.conv2d(pixels_to_input(frames, centre).double(), ref_w, conv.bias.double(),
                                     conv.stride, conv.padding)
    (grad,) = torch.autograd.grad(ref.pow(2).sum(), ref_w)
    for layout in (torch.contiguous_format, torch.channels_last):
        conv.zero_grad()
        out = conv(frames.contiguous(memory_format=layout))
        torch.testing.assert_close(out.double(), ref.detach(), atol=1e-4, rtol=1e-4)
        out.double().pow(2).sum().backward()
        # float32 sums of large terms that cancel: measured 4e-6 (small) and 2e-5 (deep) of the norm
        assert (conv.weight.grad.double() - grad).norm() < 1e-4 * grad.norm()
    # a frame that is all background is all zeros to the torso: the convolution gives the bias alone
    grey = torch.full((1, *shape), 87, dtype=torch.uint8)
    if centre:
        torch.testing.assert_close(conv(grey), conv.bias.detach().view(1, -1, 1, 1).expand_as(conv(grey)),
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("torso", ["small", "deep"])
@pytest.mark.parametrize("centre", [False, True])
def test_frames_read_under_bf16_autocast_are_the_exact_pixels_in_bfloat16(torso, centre):
    """Decision 65: under bf16 autocast read_frames gives the first convolution bfloat16 pixels, x or centred
    x - m, exactly (integers of at most 8 significant bits), in the torso's memory layout; outside autocast
    float32 pixels and the medians apart, as before. The convolution of them matches float64's to bfloat16's
    precision, also on a frame whose detail is a few grey levels off its background: the folded form
    conv(W, x) - m conv(W, 1) in bfloat16 (two large terms that cancel) measured 1.4% off on that frame."""
    from lbc.nets import TORSOS, frame_medians, read_frames
    torch.manual_seed(0)
    conv = TORSOS[torso]((4, 84, 84), 32).convs[0]
    conv.centre = centre
    frames = torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8)
    frames[:2, :, ::3] = 87
    frames[3] = 87 + torch.randint(-2, 3, (4, 84, 84), dtype=torch.int16).to(torch.uint8)   # faint detail
    exact = frames.to(torch.int16) - (frame_medians(frames)[..., None, None] if centre else 0)
    ref = torch.nn.functional.conv2d(pixels_to_input(frames, centre).double(), conv.weight.detach().double(),
                                     conv.bias.detach().double(), conv.stride, conv.padding)
    for layout in (torch.contiguous_format, torch.channels_last):
        with torch.autocast("cpu", torch.bfloat16):
            read = read_frames(frames[None], centre, memory_format=layout)
            out = conv(read.reshape(4, 4, 84, 84))
        assert read.pixels.dtype == torch.bfloat16 and read.medians is None
        assert torch.equal(read.pixels[0].to(torch.int16), exact)
        assert read.pixels[0].is_contiguous(memory_format=layout)
        for f in range(4):   # each frame within 0.5% (measured 0.22-0.24%, the faint one too)
            assert (out[f].double() - ref[f]).norm() < 5e-3 * ref[f].norm(), f
    plain = read_frames(frames[None], centre)
    assert plain.pixels.dtype == torch.float32 and (plain.medians is not None) == centre


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a visible GPU"))])
@pytest.mark.parametrize("centre", [False, True])
def test_single_frames_read_straight_into_stacks_are_the_stacks_read(centre, device):
    """read_frame_sequences gives what read_frames gives for the stacks stacked_frames rebuilds: the same pixels
    (bfloat16 under bf16 autocast, else float32) and medians, exactly, in the same memory layout, on sequences
    whose stacks start afresh at the first observation, in the middle and at the last one (their older channels
    zeros, the previous game's frames not leaking in), for the CPU's path and the GPU's."""
    from lbc.frame_stacks import stacked_frames
    from lbc.nets import frame_medians, read_frame_sequences, read_frames
    torch.manual_seed(0)
    steps, batch, stack = 9, 5, 4
    frames = torch.randint(0, 256, (batch, steps + stack - 1, 84, 84), dtype=torch.uint8)
    frames[:, :, ::3] = 87   # a background for the medians
    starts = torch.zeros(batch, steps, dtype=torch.bool)
    starts[0, 0] = starts[1, 4] = starts[2, steps - 1] = starts[3, 2] = starts[3, 3] = True
    frames_t, starts_t = frames.transpose(0, 1).to(device), starts.transpose(0, 1).to(device)   # time-major
    stacks = stacked_frames(frames.to(device), starts.to(device), time_major=True)
    assert (stacks[4, 1, :3] == 0).all() and (stacks[5, 1, :2] == 0).all() and (stacks[5, 1, 2:] != 0).any()
    for bf16 in (False, True):
        for layout in (torch.contiguous_format, torch.channels_last):
            with torch.autocast(device, torch.bfloat16, enabled=bf16):
                want = read_frames(stacks, centre, memory_format=layout)
                got = read_frame_sequences(frames_t, starts_t, centre, memory_format=layout)
            assert got.pixels.dtype == want.pixels.dtype == (torch.bfloat16 if bf16 else torch.float32)
            assert got.shape == want.shape == (steps, batch, stack, 84, 84)
            assert torch.equal(got.pixels, want.pixels), (bf16, layout)
            assert got.pixels[0].is_contiguous(memory_format=layout)
            assert (got.medians is None) == (want.medians is None) == (bf16 or not centre)
            if got.medians is not None:
                assert torch.equal(got.medians, want.medians)
                assert torch.equal(got.medians[0, 2], frame_medians(stacks[0, 2].cpu()[None]).to(device)[0])


@pytest.mark.parametrize("centre", [False, True])
def test_frames_read_in_blocks_are_the_stacks_read_rearranged(centre):
    """Decision 83: read_frame_sequences with `blocks` k gives the plain read's stacks [T, B, S, H, W] put in k x k
    blocks, exactly: channel s k k + dy k + dx at (i, j) is pixel (k i + dy, k j + dx) of stack channel s, the frames
    centred into the pixels (no medians left), laid out channels-last, zeros where a stack started afresh; for k = 4
    and 2 (moved in words of k bytes), 3 (byte by byte) and frames as the batch holds them (a transposed view) or
    not. Frames that do not split into blocks are refused."""
    from lbc.nets import read_frame_sequences
    torch.manual_seed(0)
    steps, batch, stack = 7, 3, 4
    frames = torch.randint(0, 256, (batch, steps + stack - 1, 84, 84), dtype=torch.uint8)
    frames[:, :, ::3] = 87   # a background for the medians
    starts = torch.zeros(steps, batch, dtype=torch.bool)
    starts[0, 0] = starts[4, 1] = starts[steps - 1, 2] = True
    for bf16 in (False, True):
        for k, time_major in ((4, frames.transpose(0, 1)), (2, frames.transpose(0, 1).contiguous()),
                              (3, frames.transpose(0, 1))):
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                plain = read_frame_sequences(time_major, starts, centre)
                got = read_frame_sequences(time_major, starts, centre, memory_format=torch.channels_last, blocks=k)
            pixels = plain.pixels if plain.medians is None else plain.pixels - plain.medians[..., None, None]
            h = 84 // k
            want = pixels.reshape(steps, batch, stack, h, k, h, k).permute(0, 1, 2, 4, 6, 3, 5)
            assert got.blocks == k and got.medians is None and got.shape == (steps, batch, stack * k * k, h, h)
            assert got.pixels.dtype == (torch.bfloat16 if bf16 else torch.float32)
            assert torch.equal(got.pixels, want.reshape(steps, batch, stack * k * k, h, h)), (bf16, k)
            assert got.pixels[0].is_contiguous(memory_format=torch.channels_last)
            assert (got.pixels[4, 1, :3 * k * k] == 0).all() and (got.pixels[4, 1, 3 * k * k:] != 0).any()
            taken = got.take(torch.tensor([2, 0]))
            assert taken.blocks == k and torch.equal(taken.pixels, got.pixels[:, [2, 0]])
            assert got[2:].blocks == got.reshape(steps * batch, stack * k * k, h, h).blocks == k
    with pytest.raises(ValueError, match="do not split"):
        read_frame_sequences(frames.transpose(0, 1)[..., :82, :82], starts, centre, blocks=4)


def _native_stacks_here() -> None:
    """make install builds lbc.native (decision 96): a test fails where it is missing, and is skipped only on a CPU
    the build does not target."""
    from lbc import native
    problem = native.unavailable()
    if problem is not None and "AVX2" in problem:
        pytest.skip(problem)
    assert problem is None and native.blocked_stacks_op() is not None, problem


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_native_blocked_stacks_are_torchs_to_the_bit(dtype):
    """Decision 96: lbc.native's one pass writes _blocked_stacks's stacks exactly, in the same layout: every centred
    value from -255 to 255 (frames of 0 and 255 against medians of 255 and 0), stacks of 1, 2 and 4 frames, stacks
    started afresh anywhere (their older frames zeros), frames as the batch holds them (a transposed view), sides
    other than 84; with the frames not centred too. Shapes it cannot take are refused with the reason."""
    from lbc.nets import _blocked_stacks, native_blocked_stacks
    _native_stacks_here()
    torch.manual_seed(0)
    for steps, batch, stack, height, width in ((7, 3, 4, 84, 84), (5, 2, 2, 12, 8), (4, 5, 1, 84, 84)):
        frames = torch.randint(0, 256, (batch, steps + stack - 1, height, width), dtype=torch.uint8)
        frames[0, :, :4] = 0
        frames[1, :, :4] = 255
        time_major = frames.transpose(0, 1)
        medians = torch.randint(0, 256, (steps + stack - 1, batch), dtype=torch.uint8)
        medians[:, 0], medians[:, 1] = 255, 0
        keep = torch.rand(steps, batch, stack) > 0.3
        for centre in (medians, None):
            want = _blocked_stacks(time_major, keep, centre, 4, dtype)
            got = native_blocked_stacks(time_major, keep, centre, 4, dtype)
            assert got.dtype == dtype and got.shape == want.shape == (steps, batch, stack * 16, height // 4, width // 4)
            assert got.stride() == want.stride()
            assert torch.equal(got, want), (steps, stack, centre is None)
    extremes = native_blocked_stacks(time_major, torch.ones_like(keep), medians, 4, dtype).float()
    assert extremes.min() == -255 and extremes.max() == 255
    with pytest.raises(RuntimeError, match="frames .T \\+ S - 1, B, H, W. for keep"):
        native_blocked_stacks(time_major[1:], keep, medians[1:], 4, dtype)
    with pytest.raises(RuntimeError, match="cannot run here"):
        native_blocked_stacks(time_major, keep, medians, 2, dtype)


def test_the_learners_read_by_native_stacks_is_torchs(monkeypatch):
    """read_frame_sequences with native_stacks (the learner's setting, learner.native_stacks) reads the same Frames
    as without, in bfloat16 and float32, by lbc.native's pass; where lbc.native cannot write them (blocks of 2, or
    the library not loaded) it reads them by torch's passes."""
    from lbc import native, nets
    _native_stacks_here()
    torch.manual_seed(0)
    frames = torch.randint(0, 256, (10, 3, 84, 84), dtype=torch.uint8)
    starts = torch.zeros(7, 3, dtype=torch.bool)
    starts[0, 0] = starts[4, 1] = True
    writers = []
    monkeypatch.setattr(nets, "native_blocked_stacks", _recorded(nets.native_blocked_stacks, writers, "native"))
    monkeypatch.setattr(nets, "_blocked_stacks", _recorded(nets._blocked_stacks, writers, "torch"))
    for bf16 in (False, True):
        for centre in (False, True):
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                plain = nets.read_frame_sequences(frames, starts, centre, blocks=4)
                got = nets.read_frame_sequences(frames, starts, centre, blocks=4, native_stacks=True)
            assert got.blocks == 4 and torch.equal(got.pixels, plain.pixels) and got.medians is plain.medians is None
    assert writers == ["torch", "native"] * 4
    writers.clear()
    nets.read_frame_sequences(frames, starts, True, blocks=2, native_stacks=True)
    monkeypatch.setattr(native, "blocked_stacks_op", lambda: None)
    fallback = nets.read_frame_sequences(frames, starts, True, blocks=4, native_stacks=True)
    assert writers == ["torch", "torch"] and torch.equal(fallback.pixels, got.pixels.float())


def _recorded(write, writers: list, name: str):
    def recorded(*args):
        writers.append(name)
        return write(*args)
    return recorded


@pytest.mark.parametrize("centre", [False, True])
def test_a_first_convolution_over_frames_in_blocks_is_the_strided_convolution(centre):
    """FrameConv2d over frames in blocks of its stride (decision 83) is a stride-1 convolution of its weight in
    blocks: its output and its weight's and bias's gradients equal the convolution of pixels_to_input's floats in
    float64 (float32 to 1e-4, as the plain read's; under bf16 autocast to bfloat16's precision, as close as the
    plain read's own). Only a convolution whose stride divides its kernel and the frame reads blocks."""
    from lbc.frame_stacks import stacked_frames
    from lbc.nets import TORSOS, FrameConv2d, read_frame_sequences
    torch.manual_seed(0)
    conv = TORSOS["small"]((4, 84, 84), 32).convs[0].to(memory_format=torch.channels_last)
    conv.centre = centre
    steps, batch = 3, 2
    frames = torch.randint(0, 256, (batch, steps + 3, 84, 84), dtype=torch.uint8)
    frames[:, :, ::3] = 87
    starts = torch.zeros(batch, steps, dtype=torch.bool)
    stacks = stacked_frames(frames, starts, time_major=True).reshape(steps * batch, 4, 84, 84)
    ref_w = conv.weight.detach().double().requires_grad_()
    ref_b = conv.bias.detach().double().requires_grad_()
    ref = torch.nn.functional.conv2d(pixels_to_input(stacks, centre).double(), ref_w, ref_b, conv.stride)
    grads = torch.autograd.grad(ref.pow(2).sum(), (ref_w, ref_b))
    errors = {}
    for bf16 in (False, True):
        for k in (1, 4):
            conv.zero_grad()
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                read = read_frame_sequences(frames.transpose(0, 1), starts.T, centre, blocks=k,
                                            memory_format=torch.channels_last)
                out = conv(read.reshape(steps * batch, *read.shape[2:]))
            out.double().pow(2).sum().backward()
            errors[bf16, k] = [float((x.detach().double() - y).norm() / y.norm())
                               for x, y in ((out, ref), (conv.weight.grad, grads[0]), (conv.bias.grad, grads[1]))]
    assert max(errors[False, 4]) < 1e-4, errors
    assert max(errors[True, 4]) < 1e-2 and max(errors[True, 4]) < 2 * max(errors[True, 1]), errors
    assert conv.block_size((84, 84)) == 4 and conv.block_size((82, 84)) == 1
    assert FrameConv2d(4, 16, 3).block_size((84, 84)) == FrameConv2d(4, 16, 6, stride=4).block_size((84, 84)) == 1
    assert FrameConv2d(4, 16, 8, stride=4, padding=1).block_size((84, 84)) == 1
    assert FrameConv2d(4, 16, 4, stride=2).block_size((84, 84)) == 2
    blocks_of_two = read_frame_sequences(frames.transpose(0, 1), starts.T, centre, blocks=2)
    with pytest.raises(ValueError, match="cannot read 84x84 frames in 2x2 blocks"):
        conv(blocks_of_two.reshape(steps * batch, *blocks_of_two.shape[2:]))


def test_only_the_learners_cpu_read_comes_in_blocks():
    """set_frame_blocks (the learner's) reads a batch in blocks of the first convolution's stride where that
    convolution runs on a CPU, in bfloat16 (decision 83) or float32 (decision 92); torsos whose first convolution
    has stride 1 and nets not set read the plain stacks."""
    torch.manual_seed(0)
    b = {"frames": torch.randint(0, 256, (6, 2, 84, 84), dtype=torch.uint8),
         "stack_start": torch.zeros(3, 2, dtype=torch.bool)}
    small = LBCNet("small", (4, 84, 84), 6, 2, hidden=32, lstm=32)
    deep = LBCNet("deep", (4, 84, 84), 6, 2, hidden=32, lstm=32)

    def blocks(net: LBCNet, bf16: bool) -> int:
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            return net.sequence_input(b).blocks

    assert blocks(small, True) == 1
    small.set_frame_blocks(True)
    assert blocks(small, True) == blocks(small, False) == 4
    assert blocks(deep.set_frame_blocks(True), True) == 1
    # what the learner logs and bench.throughput's levers read: the CPU's read only
    assert (small.blocks_on("cpu"), small.blocks_on("cuda"), deep.blocks_on("cpu")) == (4, 1, 1)
    assert blocks(small.set_frame_blocks(False), True) == 1 and small.blocks_on("cpu") == 1


def test_feedforward_core_reads_the_frame_alone():
    """IMPALA's feed-forward network: each step's heads are a function of that step's frames only (no
    previous action or reward, no memory), and the recurrent state a caller passes comes back untouched."""
    torch.manual_seed(0)
    cfg = load_config("impala", ["net.core=feedforward"])
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    t, b = 4, 3
    obs = torch.randint(0, 255, (t, b, *spec.obs_shape), dtype=torch.uint8)
    state = (torch.randn(b, cfg.net.lstm), torch.randn(b, cfg.net.lstm))
    out = net(obs, torch.zeros(t, b, dtype=torch.long), torch.zeros(t, b), torch.zeros(t, b, dtype=torch.bool), state)
    other = net(obs, torch.randint(0, 18, (t, b)), torch.randn(t, b), torch.ones(t, b, dtype=torch.bool),
                net.initial_state(b))
    torch.testing.assert_close(out.adv, other.adv)
    assert out.state[0] is state[0] and out.state[1] is state[1]
    # step by step equals the whole sequence at once, and the heads are one linear map of the torso's features
    for step in range(t):
        one = net(obs[step:step + 1], torch.zeros(1, b, dtype=torch.long), torch.zeros(1, b),
                  torch.zeros(1, b, dtype=torch.bool), state)
        torch.testing.assert_close(one.adv[0], out.adv[step])
        raw = net.heads(net.torso(obs[step].float() / 255.0))
        torch.testing.assert_close(out.value[step, :, 0], raw[:, -1])
    assert _count(net) < 0.75e6   # no LSTM: IMPALA's shallow torso and heads


def test_ngu_refuses_the_feedforward_core():
    with pytest.raises(ValueError, match="recurrent net.core"):
        load_config("ngu", ["net.core=feedforward"])


def test_the_sorted_median_is_torch_median():
    """The ONNX-expressible median (a sort) picks the same element as torch.median (the lower one)."""
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 441):
        x = torch.randint(0, 256, (5, 4, n), generator=g, dtype=torch.uint8)
        assert torch.equal(lower_median(x, by_sort=True), x.median(dim=-1).values)


def test_the_counted_median_of_uint8_values_is_torch_median():
    """The median read off each row's counts of the 256 values (uint8 on a CPU, 64 rows or more; any number when
    called itself) picks torch.median's element: on random rows of odd and even lengths, rows of few distinct values
    (ties at the median), constant rows, rows all 0 or all 255, and rows of one value."""
    g = torch.Generator().manual_seed(0)
    cases = [torch.randint(0, 256, (16, 4, n), generator=g, dtype=torch.uint8) for n in (1, 2, 7, 8, 441)]
    cases.append(torch.randint(86, 89, (64, 441), generator=g, dtype=torch.uint8))
    cases.append(torch.stack([torch.full((441,), v, dtype=torch.uint8) for v in (0, 1, 87, 254, 255)] * 13))
    for x in cases:
        want = x.float().median(dim=-1).values.to(torch.uint8)
        for got in (lower_median(x), _uint8_lower_median(x), _uint8_lower_median(x[:3])):
            assert got.dtype == torch.uint8 and torch.equal(got, want[:len(got)])


@pytest.mark.parametrize("torso", ["small", "minatar", "mlp"])
@pytest.mark.parametrize("centre", [False, True])
def test_frames_read_once_give_every_network_the_outputs_and_gradients_of_reading_them_itself(torso, centre):
    """The learner reads a batch's frames once (torso_input) for its online and target networks and for the
    burn-in and learning steps (issue 11: no recomputation the learner can avoid). That must change nothing:
    each network's outputs after burn-in and the online network's gradients equal those of the network
    reading the uint8 frames itself, bit for bit, in either layout of the torso."""
    shape, actions = {"small": ((4, 84, 84), 18), "minatar": ((7, 10, 10), 6), "mlp": ((2, 10, 5), 3)}[torso]
    torch.manual_seed(0)
    t, b, burn = 7, 3, 3
    frames = torch.randint(0, 256, (t, b, *shape), dtype=torch.uint8)
    frames[:, :2, :, ::3] = 87
    seq = {"prev_action": torch.randint(0, actions, (t, b)), "prev_reward": torch.randn(t, b),
           "reset": torch.rand(t, b) < 0.2, "h0": torch.randn(b, 32), "c0": torch.randn(b, 32)}
    for channels_last in (False, True):
        model = LBCNet(torso, shape, actions, 3, hidden=32, lstm=32, centre_frames=centre)
        model.set_channels_last(channels_last)
        target = copy.deepcopy(model).requires_grad_(False)
        with torch.no_grad():
            for p in target.parameters():
                p.add_(0.01 * torch.randn_like(p))
        read = model.torso_input(frames)
        assert model.torso_input(read) is read                   # read input passes through
        for net in (model, target):
            own = unroll_after_burn_in(net, frames, seq, burn, grad=net is model)
            shared = unroll_after_burn_in(net, read, seq, burn, grad=net is model)
            assert torch.equal(own.adv, shared.adv) and torch.equal(own.value, shared.value)
            assert all(torch.equal(x, y) for x, y in zip(own.state, shared.state, strict=True))
        grads = []
        for x in (frames, read):
            model.zero_grad()
            out = unroll_after_burn_in(model, x, seq, burn, grad=True)
            (out.adv.pow(2).sum() + out.value.sum()).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        assert all(torch.equal(g, h) for g, h in zip(*grads, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_sequences_gathered_as_rows_are_index_selects_values_in_the_frames_own_layout(dtype):
    torch.manual_seed(0)
    pixels = (torch.rand(7, 5, 4, 6, 6) * 255).to(dtype)
    index = torch.tensor([4, 0, 2])
    assert torch.equal(gather_rows(pixels, index), pixels.index_select(1, index))
    assert torch.equal(gather_rows(pixels[2:], index), pixels[2:].index_select(1, index))
    assert torch.equal(gather_rows(pixels[..., 0, 0], index, dim=1), pixels[..., 0, 0].index_select(1, index))
    medians = torch.rand(7, 5, 4)
    for layout in (torch.contiguous_format, torch.channels_last):
        laid = pixels.reshape(35, 4, 6, 6).contiguous(memory_format=layout).view(7, 5, 4, 6, 6)
        taken = Frames(laid, medians).take(index)
        assert torch.equal(taken.pixels, pixels.index_select(1, index))
        assert torch.equal(taken.medians, medians.index_select(1, index))
        assert taken.pixels[0].is_contiguous(memory_format=layout)


@pytest.mark.parametrize("torso", ["small", "deep", "minatar"])
@pytest.mark.parametrize("bf16", [False, True])
def test_the_torsos_flatten_gives_a_channels_last_gradient_and_the_same_values(torso, bf16):
    """lbc.nets.Flatten hands a channels-last input its gradient in that layout (nn.Flatten's comes back in the
    default one, and the ReLU before it paid for the mismatch, docs/speed.md session 46); the torso's output and
    every parameter's gradient are nn.Flatten's to the bit, in float32 and under bf16 autocast. Where nothing
    trains, or the input is in the default layout, it is nn.Flatten itself: a view, no copy."""
    from lbc.nets import TORSOS
    shape = (7, 10, 10) if torso == "minatar" else (4, 84, 84)
    torch.manual_seed(0)
    ours = TORSOS[torso](shape, 32)
    ours.memory_format = torch.channels_last
    ours.convs.to(memory_format=torch.channels_last)
    plain = copy.deepcopy(ours)
    plain.convs[-1] = torch.nn.Flatten()
    assert isinstance(ours.convs[-1], nets.Flatten)
    frames = torch.randint(0, 256, (6, *shape), dtype=torch.uint8)
    grads = []

    def keep_grad(_module, _inputs, out):
        out.register_hook(lambda g: grads.append(g))

    results = []
    for net in (ours, plain):
        net.convs[-2].register_forward_hook(keep_grad)   # the ReLU before the flatten
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            out = net(frames)
        out.float().square().sum().backward()
        results.append((out.detach(), [p.grad for p in net.parameters()]))
    assert grads[0].is_contiguous(memory_format=torch.channels_last) and not grads[0].is_contiguous()
    assert grads[1].is_contiguous()   # nn.Flatten's: what the ReLU had to compare against its channels-last output
    assert torch.equal(results[0][0], results[1][0])
    for ours_grad, plain_grad in zip(results[0][1], results[1][1], strict=True):
        assert torch.equal(ours_grad, plain_grad)

    x = torch.randn(3, 8, 5, 5, requires_grad=True)
    assert nets.Flatten()(x)._base is x                                  # default layout: a view
    with torch.no_grad():
        assert nets.Flatten()(x.contiguous(memory_format=torch.channels_last)).grad_fn is None
