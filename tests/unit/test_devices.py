"""Device selection and the GPU path's pieces as they run on a machine without a GPU (CI has none):
the settings, host-to-device copies that skip pinning on the CPU, the acting step's device handling, and
bf16 autocast in the learner against the fp32 step, bf16 acting against fp32 acting, and which precision `auto`
picks."""

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lbc.acting import CoreInputs, acting_agent, forward
from lbc.agents import make_acting
from lbc.behaviour import EpisodeBehaviour
from lbc.config import load_config
from lbc.devices import (
    compute_precision,
    cpu_computes_bf16,
    pick_device,
    pinned,
    set_gpu_wait,
    to_device,
    to_host,
    wait_for_gpu,
)
from lbc.envs import make_envs
from lbc.nets import build_net, policy_net
from lbc.presets import CATCH_SIZING, deep_merge
from lbc.psi import Psi
from learner_svc.training import Trainer, to_time_major
from tests.unit.test_training import _batch

NO_GPU = not torch.cuda.is_available()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(NO_GPU, reason="no GPU"))])
def test_to_host_gives_each_tensor_back_in_its_shape(device):
    """One copy for many figures: every tensor comes back as float32 of its own shape and values, in order,
    whatever its dtype (a boolean flag, an integer, a scalar, an empty one)."""
    rng = np.random.default_rng(0)
    tensors = [torch.tensor(1.5), torch.tensor(False), torch.from_numpy(rng.normal(size=(3, 4))),
               torch.zeros(0), torch.arange(5, dtype=torch.int64),
               torch.from_numpy(rng.normal(size=7).astype(np.float32))]
    got = to_host(*(t.to(device) for t in tensors))
    assert len(got) == len(tensors)
    for g, t in zip(got, tensors, strict=True):
        assert g.dtype == np.float32 and g.shape == tuple(t.shape)
        np.testing.assert_array_equal(g, t.to(torch.float32).numpy())


def test_settings_pick_the_device_and_refuse_a_missing_gpu():
    assert pick_device("cpu", "actor.device") == torch.device("cpu")
    assert pick_device("auto", "learner.device").type == ("cpu" if NO_GPU else "cuda")
    if NO_GPU:
        with pytest.raises(SystemExit, match="actor.device=cuda but no CUDA device is visible"):
            pick_device("cuda", "actor.device")
    assert load_config("cpu").actor.device == "cpu" and load_config("cpu", ["actor.device=auto"]).actor.device == "auto"
    with pytest.raises(ValueError, match="actor.device"):
        load_config("cpu", ["actor.device=tpu"])
    with pytest.raises(ValueError, match="learner.precision"):
        load_config("cpu", ["learner.precision=fp8"])


def test_auto_precision_is_bf16_only_on_a_cpu_that_computes_in_bfloat16():
    """decision 63: bf16 autocast was faster than fp32 on a CPU with AVX-512 BF16 and slower on a GPU and on a
    CPU that emulates it; a named precision is kept as named, on any device."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert compute_precision("auto", cpu, native_bf16=True) == "bf16"
    assert compute_precision("auto", cpu, native_bf16=False) == "fp32"
    assert compute_precision("auto", gpu, native_bf16=True) == "fp32"
    for named in ("fp32", "bf16"):
        for device in (cpu, gpu):
            for native in (True, False):
                assert compute_precision(named, device, native_bf16=native) == named
    assert compute_precision("auto", cpu) == ("bf16" if cpu_computes_bf16() else "fp32")
    assert load_config("cpu", ["learner.precision=auto"]).learner.precision == "auto"
    # the presets measured with it (docs/speed.md); the others keep fp32
    for preset in ("cpu", "impala", "impala-cpu"):
        assert load_config(preset).learner.precision == "auto", preset
    for preset in ("lbc-bm", "ngu", "minatar", "catch"):
        assert load_config(preset).learner.precision == "fp32", preset


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads the CPU's flags from Linux's /proc/cpuinfo")
def test_the_cpu_check_agrees_with_the_kernels_cpu_flags():
    """torch's check against the flags the kernel lists for the CPU: AVX-512 BF16 or AMX tiles."""
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    listed = set(flags.split(":", 1)[1].split())
    assert cpu_computes_bf16() == bool({"avx512_bf16", "amx_tile"} & listed)


def test_host_arrays_reach_the_cpu_without_a_copy_or_pinning():
    frames = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    on_cpu = to_device(frames, torch.device("cpu"))
    assert on_cpu.data_ptr() == frames.__array_interface__["data"][0] and not on_cpu.is_pinned()
    batch = {"obs": np.zeros((2, 5, 1, 3, 3), np.uint8), "h0": np.zeros((2, 4), np.float32)}
    b = to_time_major(batch, torch.device("cpu"))
    assert b["obs"].shape == (5, 2, 1, 3, 3) and b["h0"].shape == (2, 4)


@pytest.mark.skipif(NO_GPU, reason="pinned host memory needs a visible GPU")
def test_a_pinned_batch_keeps_its_values_and_reaches_the_gpu_from_pinned_memory():
    batch = {"obs": np.random.default_rng(0).integers(0, 255, (3, 7, 4, 8, 8), dtype=np.uint8),
             "h0": np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32),
             "done": np.array([[True, False]] * 3)}
    host = pinned(batch)
    for name, arr in batch.items():
        assert host[name].dtype == arr.dtype and np.array_equal(host[name], arr)
        assert torch.from_numpy(host[name]).is_pinned()
    on_gpu = to_time_major(host, torch.device("cuda"))
    assert torch.equal(on_gpu["obs"].cpu(), torch.from_numpy(batch["obs"]).transpose(0, 1))
    assert torch.equal(on_gpu["h0"].cpu(), torch.from_numpy(batch["h0"]))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(NO_GPU, reason="no GPU"))])
def test_the_acting_step_returns_its_outputs_on_the_cpu_and_keeps_the_state_with_the_network(device):
    cfg = load_config("catch")
    net = build_net(cfg, (1, 10, 5), 3).eval()
    obs = np.random.default_rng(0).integers(0, 255, (4, 1, 10, 5), dtype=np.uint8)
    on_cpu = forward(net, obs, CoreInputs.start(net, 4))
    net.to(device)
    inputs = CoreInputs.start(net, 4)
    out = forward(net, obs, inputs)
    assert out.adv.device.type == out.value.device.type == "cpu" and out.adv.shape == (1, 4, 3, 3)
    assert inputs.state[0].device == net.heads.weight.device == out.state[0].device
    torch.testing.assert_close(out.adv, on_cpu.adv)
    torch.testing.assert_close(out.value, on_cpu.value)


def test_the_learners_mps_share_is_set_only_below_the_whole_gpu():
    """learner.mps_share: below 100 the variable CUDA reads under MPS, at 100 the environment untouched (a share
    set there stays); the setting is a percent."""
    from lbc.devices import MPS_SHARE_VAR, limit_mps_share

    environ = {MPS_SHARE_VAR: "40"}
    assert not limit_mps_share(100, environ) and environ == {MPS_SHARE_VAR: "40"}
    environ = {}
    assert limit_mps_share(75, environ) and environ == {MPS_SHARE_VAR: "75"}
    for bad in (0, 101):
        with pytest.raises(Exception, match="mps_share"):
            load_config("lbc-bm", [f"learner.mps_share={bad}"])


def test_the_gpu_wait_is_sleep_unless_spin_is_asked_for():
    for preset in ("cpu", "lbc-bm"):
        cfg = load_config(preset)
        assert cfg.learner.gpu_wait == cfg.actor.gpu_wait == "sleep"
    assert load_config("lbc-bm", ["actor.gpu_wait=spin"]).actor.gpu_wait == "spin"
    with pytest.raises(ValueError, match="learner.gpu_wait"):
        load_config("cpu", ["learner.gpu_wait=yield"])
    with pytest.raises(ValueError, match="sleep or spin"):
        set_gpu_wait("yield")


@pytest.mark.skipif(NO_GPU, reason="waits for a GPU")
@pytest.mark.parametrize("mode", ["sleep", "spin"])
def test_a_thread_waiting_for_the_gpu_sleeps_unless_spin_is_asked_for(mode):
    """The premise of decision 62 and its remedy: while the GPU runs a kernel of about 0.3 s, CUDA's own wait
    (spin) keeps the waiting thread on its core the whole time, wait_for_gpu's (sleep) hardly at all; both
    return only once the stream has run what was queued."""
    stream = torch.cuda.current_stream()
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(10**7)
    torch.cuda.synchronize()
    cycles = int(10**7 * 0.3 / (time.perf_counter() - start))
    set_gpu_wait(mode)
    try:
        torch.cuda._sleep(cycles)
        wall, cpu = time.perf_counter(), time.thread_time()
        wait_for_gpu(stream)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    finally:
        set_gpu_wait("sleep")
    assert stream.query() and wall > 0.1
    if mode == "sleep":
        assert cpu < 0.2 * wall, (cpu, wall)
    else:
        assert cpu > 0.5 * wall, (cpu, wall)


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("preset, sizing", [
    ("cpu", {"env": {"game": "breakout"}, "learner": {"batch_size": 4, "split_batch": 1}}),
    ("impala-cpu", {"env": {"game": "breakout"}, "learner": {"batch_size": 4}}),
    ("ngu", deep_merge(CATCH_SIZING, {"learner": {"batch_size": 8}})),
])
def test_bf16_autocast_keeps_the_fp32_loss_and_gradient(preset, sizing):
    """learner.precision=bf16 runs the network's matrix products in bfloat16 (8 bits of mantissa): on one
    real-sized batch every loss term stays within 2% of fp32's and the gradient points the same way (cosine
    > 0.99); the losses read fp32 outputs. Weights and optimiser state stay fp32."""
    cfg32 = load_config(preset, deep_merge(sizing, {"learner": {"warmup_steps": 0, "precision": "fp32"}}))
    cfg16 = load_config(preset, deep_merge(sizing, {"learner": {"warmup_steps": 0, "precision": "bf16"}}))
    batch = _batch(cfg32, np.random.default_rng(3))
    batch["behaviour_prob"][:] = 1.0 / (18 if cfg32.env.kind == "atari" else 3)
    results = []
    for cfg in (cfg32, cfg16):
        torch.manual_seed(0)
        trainer = Trainer(cfg)
        trainer.agent.load_state_dict(results[0][2] if results else trainer.agent.state_dict())
        out = trainer._loss(batch)
        out.total.backward()
        results.append((out.terms, _flat_grad(trainer.model), trainer.agent.state_dict()))
        assert out.total.dtype == torch.float32 and out.terms.dtype == torch.float32
        assert all(p.dtype == torch.float32 for p in trainer.agent.parameters())
    (terms32, grad32, _), (terms16, grad16, _) = results
    assert torch.isfinite(grad16).all()
    assert torch.allclose(terms16, terms32, rtol=0.02, atol=1e-3), (terms32, terms16)
    assert float(torch.nn.functional.cosine_similarity(grad32, grad16, dim=0)) > 0.99


@pytest.mark.parametrize("preset", ["cpu", "impala"])
def test_bf16_acting_keeps_the_fp32_behaviour(preset):
    """actor.precision=bf16 (decision 64): the acting network's convolutions and linear layers hold bfloat16
    weights, a pull converts fp32 parameters into them, and over ten steps on real Pong frames the behaviour
    it samples from stays close to the fp32 network's (KL under 2e-3 nats, each probability within 0.03), with
    a policy sharpened so that its probabilities span 1e-3 to over 0.5. bf16 keeps 8 significant bits, so
    logits of +-20 move by about 0.05-0.1 and small probabilities by up to ~10% of themselves (measured:
    KL 2e-5 to 1e-3). What the learner divides by is the probability the actions were drawn with, bf16's
    own, so V-trace's ratios stay exact. Outputs and the recurrent state stay fp32."""
    cfg32 = load_config(preset, ["env.game=pong", "env.num_envs=4", "actor.precision=fp32"])
    cfg16 = load_config(preset, ["env.game=pong", "env.num_envs=4", "actor.precision=bf16"])
    envs = make_envs(cfg32.env, 4, seed=0)
    torch.manual_seed(0)
    agent32 = acting_agent(cfg32, envs.spec.obs_shape, envs.spec.num_actions)
    with torch.no_grad():
        policy_net(agent32).heads.weight.mul_(30.0)   # a confident policy, not the near-uniform initial one
    agent16 = acting_agent(cfg16, envs.spec.obs_shape, envs.spec.num_actions)
    agent16.load_state_dict(agent32.state_dict())   # what a parameter pull does
    net32, net16 = policy_net(agent32), policy_net(agent16)
    assert net16.heads.weight.dtype == net16.torso.fc[0].weight.dtype == torch.bfloat16
    assert torch.equal(net16.heads.weight, net32.heads.weight.bfloat16())
    assert net16.core.input_norm.weight.dtype == torch.float32 and net32.heads.weight.dtype == torch.float32
    acts = [make_acting(cfg, agent, 4) for cfg, agent in ((cfg32, agent32), (cfg16, agent16))]
    for acting in acts:
        for e in range(4):
            acting.begin_episode(e, EpisodeBehaviour("", Psi.uniform(0.5, cfg32.num_components)))
    inputs = [CoreInputs.start(net32, 4), CoreInputs.start(net16, 4)]
    obs, rng = envs.reset(), np.random.default_rng(0)
    spread = []
    for _ in range(10):
        outs = [forward(net, obs, inp) for net, inp in zip((net32, net16), inputs, strict=True)]
        mu32, mu16 = (acting.behaviour(out) for acting, out in zip(acts, outs, strict=True))
        assert all(t.dtype == torch.float32 for t in (outs[1].adv, outs[1].value, *outs[1].state))
        assert float((mu32 * (mu32 / mu16).log()).sum(-1).max()) < 2e-3   # KL(fp32 || bf16) per environment
        assert float((mu16 - mu32).abs().max()) < 0.03
        spread += [float(mu32.min()), float(mu32.max())]
        actions = rng.integers(0, envs.spec.num_actions, 4)
        result = envs.step(actions)
        for inp, out in zip(inputs, outs, strict=True):
            inp.advance(actions, result.reward, result.done, out.state)
        obs = result.obs
    envs.close()
    assert min(spread) < 1e-3 and max(spread) > 0.5, spread


@pytest.mark.parametrize("preset", ["impala-cpu", "cpu"])
def test_frames_read_into_bf16_give_the_loss_and_gradient_of_float32_frames(preset, monkeypatch):
    """Decision 65: under bf16 autocast the learner reads uint8 frames straight into bfloat16 (lbc.nets.pixel_dtype),
    one pass instead of a float32 copy that the first convolution then casts. Uncentred (impala-cpu) the
    convolution sees the very values the cast gave, so the loss and gradient are the float32 read's exactly;
    centred (cpu) the convolution of x - m now runs in bfloat16 where it ran in float32, so they agree to
    bfloat16's precision (measured: terms within 0.8% relative, 2% on an AMX host where a term nearly
    cancels, so within 1% of each term's largest value; gradient cosine 0.9999)."""
    import lbc.nets

    cfg = load_config(preset, {"env": {"game": "breakout"}, "learner": {"batch_size": 4, "split_batch": 1,
                                                                        "warmup_steps": 0, "precision": "bf16"}})
    batch = _batch(cfg, np.random.default_rng(3))
    batch["behaviour_prob"][:] = 1.0 / 18
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    trainer.model.set_frame_blocks(False)   # the read in blocks (decision 83) has a test of its own
    results = []
    for read_as_float32 in (True, False):   # the read before decision 65, then the read itself
        if read_as_float32:
            monkeypatch.setattr(lbc.nets, "pixel_dtype", lambda device_type: torch.float32)
        else:
            monkeypatch.undo()
        trainer.model.zero_grad(set_to_none=True)
        out = trainer._loss(batch)
        out.total.backward()
        results.append((out.terms.detach(), _flat_grad(trainer.model)))
    (terms32, grad32), (terms16, grad16) = results
    if preset == "impala-cpu":
        assert torch.equal(terms16, terms32) and torch.equal(grad16, grad32)
    else:
        assert not torch.equal(grad16, grad32)   # the bfloat16 read did take the other path
        # each loss term is a sum of signed parts, so its rounding scales with the parts, not the sum: within 1%
        # of the term's largest value over the batch (session 45's AMX host: -2.2634 against -2.3083, where 1% of
        # the term itself did not hold)
        scale = terms32.abs().amax(dim=0, keepdim=True)
        assert bool(((terms16 - terms32).abs() <= 1e-2 * scale + 1e-4).all()), (terms32, terms16)
        assert float(torch.nn.functional.cosine_similarity(grad32, grad16, dim=0)) > 0.999


def _frames_batch(preset: str, precision: str) -> tuple:
    """A small batch of the preset (NGU's with the small torso) of random frames on a background, for the learner
    at `precision`, with stacks that start afresh at the first, a middle and the next-to-last observation."""
    small = {"net": {"torso": "small"}, "sequence": {"burn_in": 2, "length": 5}} if preset == "ngu" else {}
    cfg = load_config(preset, deep_merge(small, {"env": {"game": "breakout"}, "learner": {
        "batch_size": 4, "split_batch": 1, "warmup_steps": 0, "precision": precision}}))
    rng = np.random.default_rng(3)
    batch = _batch(cfg, rng)
    batch["frames"] = rng.integers(0, 256, batch["frames"].shape).astype(np.uint8)
    batch["frames"][:, :, ::3] = 87   # a background for the medians
    batch["stack_start"][0, 0] = batch["stack_start"][1, 5] = batch["stack_start"][2, -2] = True
    batch["behaviour_prob"][:] = 1.0 / 18
    return cfg, batch


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("preset", ["impala", "cpu", "ngu"])
def test_stacks_read_from_single_frames_give_the_loss_and_gradient_of_the_stacks_read(preset, precision, monkeypatch):
    """The learner reads a batch's stacks straight from its single frames (LBCNet.sequence_input,
    lbc.nets.read_frame_sequences) instead of building the uint8 stacks and reading those: the first convolution
    sees the same values in the same layout, so the loss terms and the gradient are the stacked read's exactly,
    centred (cpu, its target network unrolled both times) or not (impala; NGU, whose auxiliary networks read the
    stacks lbc.frame_stacks.observations rebuilds), in float32 and in bfloat16."""
    from lbc.frame_stacks import observations
    from lbc.nets import LBCNet

    cfg, batch = _frames_batch(preset, precision)
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    trainer.model.set_frame_blocks(False)   # the read in blocks (decision 83) has a test of its own
    results = []
    for stacks_first in (True, False):   # the read before, then the read from single frames
        if stacks_first:
            monkeypatch.setattr(LBCNet, "sequence_input", lambda net, b: net.torso_input(observations(b)))
        else:
            monkeypatch.undo()
        if trainer.loss.target_cache is not None:
            trainer.loss.target_cache.clear()   # the target network unrolls on each read, not from the first's
        trainer.model.zero_grad(set_to_none=True)
        out = trainer._loss(batch)
        out.total.backward()
        results.append((out.terms.detach(), _flat_grad(trainer.model)))
    (terms_stacked, grad_stacked), (terms, grad) = results
    assert torch.equal(terms, terms_stacked) and torch.equal(grad, grad_stacked)


@pytest.mark.parametrize("preset", ["impala", "cpu", "ngu"])
def test_frames_read_in_blocks_give_the_loss_and_gradient_of_the_plain_read(preset):
    """Decisions 83 and 92: the CPU learner reads a batch's stacks in 4x4 blocks, which its first convolution reads
    as a stride-1 convolution: the same sums in another order, so the loss terms and the gradient agree with the
    plain read's to bfloat16's precision in bf16 (each term within 1% of its largest value over the batch, the
    gradient's cosine above 0.999) and to float32's in fp32 (each term within 1e-5 of its largest, every gradient
    element within 1e-5 of the largest; measured 1e-7 and 1e-6), centred (cpu, its target network too: in blocks
    the frames come centred, in the plain read the first convolution folds the medians in) or not (impala; NGU)."""
    results = {}
    for precision in ("bf16", "fp32"):
        cfg, batch = _frames_batch(preset, precision)
        torch.manual_seed(0)
        trainer = Trainer(cfg)
        assert trainer.model.frame_blocks == 4
        for blocks in (False, True):
            trainer.model.set_frame_blocks(blocks)
            if trainer.loss.target_cache is not None:
                trainer.loss.target_cache.clear()   # the target network unrolls on each read
            with trainer._autocast():
                read = trainer.model.sequence_input(to_time_major(batch, trainer.device))
            trainer.model.zero_grad(set_to_none=True)
            out = trainer._loss(batch)
            out.total.backward()
            results[precision, blocks] = (read.blocks, out.terms.detach(), _flat_grad(trainer.model))
    assert results["bf16", True][0] == results["fp32", True][0] == 4
    assert results["bf16", False][0] == results["fp32", False][0] == 1
    off = load_config(preset, deep_merge(cfg.model_dump(), {"learner": {"frame_blocks": False}}))
    assert Trainer(off).model.frame_blocks == 1   # learner.frame_blocks=false: the plain read
    (_, terms, grad), (_, terms_blocks, grad_blocks) = results["bf16", False], results["bf16", True]
    scale = terms.abs().amax(dim=0, keepdim=True)
    assert bool(((terms_blocks - terms).abs() <= 1e-2 * scale + 1e-4).all()), (terms, terms_blocks)
    assert float(torch.nn.functional.cosine_similarity(grad, grad_blocks, dim=0)) > 0.999
    (_, terms32, grad32), (_, terms32_blocks, grad32_blocks) = results["fp32", False], results["fp32", True]
    scale32 = terms32.abs().amax(dim=0, keepdim=True)
    assert bool(((terms32_blocks - terms32).abs() <= 1e-5 * scale32 + 1e-7).all()), (terms32, terms32_blocks)
    assert float((grad32_blocks - grad32).abs().max()) <= 1e-5 * float(grad32.abs().max())


@pytest.mark.parametrize("preset", ["cpu", "impala"])
def test_the_native_unroll_gives_the_loss_and_gradient_of_torchscripts(preset):
    """Decision 90: a CPU learner unrolls its LayerNorm-LSTM (online network, burn-in, target network) by lbc.native's
    C++ instead of TorchScript's compile of the same equations: on one batch the loss terms and the gradient agree,
    in float32 to float32's rounding (the norms' sums in another order), in bfloat16 to its rounding (each term
    within 1% of its largest value over the batch, the gradient's cosine above 0.999), as decision 83's check."""
    from lbc import native

    if native.ln_lstm_ops() is None:
        pytest.fail(f"lbc.native does not run here: {native.unavailable()}")   # make install builds it
    for precision in ("fp32", "bf16"):
        cfg, batch = _frames_batch(preset, precision)
        results = []
        for native_unroll in (False, True):
            on = load_config(preset, deep_merge(cfg.model_dump(), {"learner": {"native_unroll": native_unroll}}))
            torch.manual_seed(0)
            trainer = Trainer(on)
            assert trainer.native_unroll == native_unroll
            out = trainer._loss(batch)
            out.total.backward()
            results.append((out.terms.detach(), _flat_grad(trainer.model)))
        (terms, grad), (terms_native, grad_native) = results
        cosine = float(torch.nn.functional.cosine_similarity(grad, grad_native, dim=0))
        if precision == "fp32":
            torch.testing.assert_close(terms_native, terms, rtol=1e-4, atol=1e-5)
            assert cosine > 0.99999
        else:
            scale = terms.abs().amax(dim=0, keepdim=True)
            assert bool(((terms_native - terms).abs() <= 1e-2 * scale + 1e-4).all()), (terms, terms_native)
            assert cosine > 0.999
