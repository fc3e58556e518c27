import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY
from torch.utils._python_dispatch import TorchDispatchMode

from lbc.config import load_config
from lbc.presets import CATCH_SIZING, deep_merge
from lbc.sequences import sequence_layout
from learner_svc import checkpoint
from learner_svc.step_time import PARTS, LoopTime
from learner_svc.training import Trainer, build_optimiser, schedule_factor

REPO = Path(__file__).resolve().parents[2]


def _batch(cfg, rng):
    out = {}
    b = cfg.learner.batch_size
    for name, (dtype, shape) in sequence_layout(cfg).items():
        if dtype == "uint8":
            out[name] = (rng.random((b, *shape)) > 0.8).astype(np.uint8) * 255
        elif dtype == "bool":
            out[name] = np.zeros((b, *shape), bool)
        elif dtype == "int32":
            out[name] = rng.integers(0, 3, (b, *shape)).astype(np.int32)
        else:
            out[name] = rng.normal(size=(b, *shape)).astype(np.float32)
    out["behaviour_prob"] = np.full_like(out["behaviour_prob"], 1 / 3)
    out["reward"] = rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0], size=out["reward"].shape).astype(np.float32)
    out["prev_reward"][:] = 0
    out["h0"][:] = 0
    out["c0"][:] = 0
    return out


def test_schedule_warms_up_then_anneals_to_zero():
    assert schedule_factor(0, 10, 100) == pytest.approx(0.1)
    assert schedule_factor(9, 10, 100) == pytest.approx(0.91)
    assert schedule_factor(50, 10, 100) == pytest.approx(0.5)
    assert schedule_factor(100, 10, 100) == 0.0
    assert schedule_factor(0, 0, 100) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("core", ["lstm", "layernorm_lstm"])
def test_trainer_fits_a_fixed_batch(core):
    """The value regression alone (V-trace targets) on one batch: its loss must fall. (With the Q and
    policy terms on random targets the LayerNorm core trades V for Q; docs/decisions.md 24.)"""
    cfg = load_config("catch", ["learner.warmup_steps=0", f"net.core={core}", "learner.q_loss_scale=0",
                                "learner.pi_loss_scale=0"])
    trainer = Trainer(cfg)
    batch = _batch(cfg, np.random.default_rng(0))
    first = trainer.train_step(batch)
    for _ in range(100):
        last = trainer.train_step(batch)
    assert np.isfinite(last.loss)
    assert sum(p["v"] for p in last.per_policy) < 0.6 * sum(p["v"] for p in first.per_policy)
    assert len(last.per_policy) == 3 and last.priorities.shape == (cfg.learner.batch_size,)


@pytest.mark.parametrize("preset", ["gdi-i3", "gdi-h3", "dice", "cpu"])
def test_every_target_policy_trains_with_finite_losses(preset):
    cfg = load_config(preset, deep_merge(CATCH_SIZING, {"learner": {"warmup_steps": 0}}))
    trainer = Trainer(cfg)
    rng = np.random.default_rng(1)
    batch = _batch(cfg, rng)
    k = cfg.num_components
    batch["psi"][..., :k] = rng.uniform(0.0, 50.0, batch["psi"][..., :k].shape)   # inverse temperatures
    eps = rng.uniform(size=batch["psi"].shape[:-1])
    batch["psi"][..., k:] = np.stack([eps, 1 - eps], -1) if k == 2 else 1.0
    for _ in range(5):
        stats = trainer.train_step(batch)
    assert np.isfinite(stats.loss) and np.isfinite(stats.grad_norm)
    assert len(stats.per_policy) == cfg.num_policies


@pytest.mark.parametrize("optimiser", ["adamw", "rmsprop_tf"])
def test_checkpoint_round_trip(tmp_path, optimiser):
    cfg = load_config("catch", ["learner.warmup_steps=0", f"learner.optimiser={optimiser}"])
    trainer = Trainer(cfg)
    assert type(trainer.optimiser).__name__ == {"adamw": "AdamW", "rmsprop_tf": "RMSpropTF"}[optimiser]
    batch = _batch(cfg, np.random.default_rng(0))
    for _ in range(3):
        trainer.train_step(batch)
    checkpoint.save(tmp_path, trainer.model, trainer.optimiser, checkpoint.Counters(step=3, version=1, samples=96))
    other = Trainer(cfg)
    counters = checkpoint.load(checkpoint.latest(tmp_path), other.model, other.optimiser)
    assert (counters.step, counters.version, counters.samples) == (3, 1, 96)
    for a, b in zip(trainer.model.parameters(), other.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
        for key, value in trainer.optimiser.state[a].items():   # RMSpropTF: the mean square and momentum
            torch.testing.assert_close(other.optimiser.state[b][key], value)
    other.step = trainer.step
    torch.manual_seed(0)
    s1 = trainer.train_step(batch).loss
    torch.manual_seed(0)
    s2 = other.train_step(batch).loss
    assert s1 == pytest.approx(s2, rel=1e-5)


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    cfg = load_config("catch", ["learner.warmup_steps=0"])
    trainer = Trainer(cfg)
    batch = _batch(cfg, np.random.default_rng(0))
    trainer.train_step(batch)
    checkpoint.save(tmp_path, trainer.model, trainer.optimiser, checkpoint.Counters(step=1, version=1, samples=32))
    good = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train_step(batch)
    newest = checkpoint.save(tmp_path, trainer.model, trainer.optimiser, checkpoint.Counters(step=2, version=2))
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])   # cut short, as by a full disk
    other = Trainer(cfg)
    path, counters = checkpoint.load_newest(tmp_path, other.model, other.optimiser)
    assert path.name == "ckpt-000000001.pt" and (counters.step, counters.version) == (1, 1)
    for a, b in zip(good, other.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert newest.name in caplog.text and "does not load" in caplog.text
    newest.unlink()
    (tmp_path / "ckpt-000000001.pt").write_bytes(b"not a checkpoint")
    assert checkpoint.load_newest(tmp_path, other.model, other.optimiser) is None


def test_impala_preset_uses_the_papers_rmsprop_and_fits_a_batch():
    cfg = load_config("impala", ["env.kind=catch", "net.torso=mlp", "net.hidden=32", "net.lstm=32"])
    trainer = Trainer(cfg)
    opt = trainer.optimiser
    assert isinstance(opt, torch.optim.RMSprop)
    group = opt.param_groups[0]
    assert (group["alpha"], group["eps"], group["momentum"], group["lr"]) == (0.99, 0.01, 0.0, 6e-4)
    assert cfg.learner.batch_size == 32 and cfg.sequence.length == 20 and cfg.learner.clip_norm == 40.0
    batch = _batch(cfg, np.random.default_rng(1))
    batch["behaviour_prob"][:] = 1 / 3
    first = trainer.train_step(batch)
    for _ in range(60):
        last = trainer.train_step(batch)
    assert last.per_policy[0]["v"] < 0.75 * first.per_policy[0]["v"]


def test_summed_losses_scale_the_gradient_by_time_and_batch():
    """IMPALA sums its losses over [T, B]; the summed gradient is T * B times the averaged one."""
    base = ["learner.warmup_steps=0", "learner.clip_norm=1e9"]
    mean_cfg = load_config("catch", base)
    sum_cfg = load_config("catch", [*base, "learner.loss_reduction=sum"])
    batch = _batch(mean_cfg, np.random.default_rng(2))
    grads = []
    for cfg in (mean_cfg, sum_cfg):
        trainer = Trainer(cfg)
        trainer.train_step(batch)
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
    elements = mean_cfg.sequence.length * mean_cfg.learner.batch_size
    # float32 rounding: tolerate 1e-4 of the largest gradient element
    torch.testing.assert_close(grads[1], grads[0] * elements, rtol=1e-4, atol=1e-4 * float(grads[1].abs().max()))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_split_batch_gives_the_whole_batch_step(reduction):
    """Parts computed in threads, each weighted by its share, make the same gradient, loss terms and
    priorities as the whole batch at once."""
    base = ["learner.warmup_steps=0", "learner.clip_norm=1e9", f"learner.loss_reduction={reduction}"]
    whole_cfg = load_config("catch", base)
    batch = _batch(whole_cfg, np.random.default_rng(4))
    results = []
    for split in (1, 3):
        torch.manual_seed(0)
        trainer = Trainer(load_config("catch", [*base, f"learner.split_batch={split}"]))
        stats = trainer.train_step(batch)
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results.append((stats, grads))
    (whole, g1), (split, g3) = results
    torch.testing.assert_close(g3, g1, rtol=1e-4, atol=1e-4 * float(g1.abs().max()))
    assert split.loss == pytest.approx(whole.loss, rel=1e-5)
    np.testing.assert_allclose(split.priorities, whole.priorities, rtol=1e-5)
    for a, b in zip(split.per_policy, whole.per_policy, strict=True):
        assert a == pytest.approx(b, rel=1e-4)


def test_split_batch_is_validated():
    with pytest.raises(ValueError, match="split_batch"):
        load_config("catch", ["learner.split_batch=64"])


@pytest.mark.parametrize("preset", ["catch", "ngu"])
def test_a_batch_with_a_non_finite_loss_is_skipped_and_changes_nothing(preset):
    """Issue 12: one poisoned batch must not reach the parameters or the optimiser's moments."""
    cfg = load_config(preset, deep_merge(CATCH_SIZING, {"learner": {"warmup_steps": 0}}))
    trainer = Trainer(cfg)
    batch = _batch(cfg, np.random.default_rng(2))
    trainer.train_step(batch)
    before = {k: v.clone() for k, v in trainer.agent.state_dict().items()}
    moments = {k: v.clone() for k, v in trainer.optimiser.state_dict()["state"][0].items()
               if isinstance(v, torch.Tensor)}
    poisoned = dict(batch, reward=batch["reward"].copy())
    poisoned["reward"][0, 3] = np.inf
    stats = trainer.train_step(poisoned)
    assert stats.skipped and trainer.step == 1
    for name, value in trainer.agent.state_dict().items():
        assert torch.equal(value, before[name]), name
    for name, value in trainer.optimiser.state_dict()["state"][0].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, moments[name]), name
    assert trainer.parameters_finite()
    assert not trainer.train_step(batch).skipped and trainer.step == 2
    with torch.no_grad():
        next(trainer.agent.parameters()).fill_(float("nan"))
    assert not trainer.parameters_finite()


def test_checkpoint_writes_are_whole_and_leftovers_of_a_killed_write_are_removed(tmp_path):
    from lbc.files import remove_stale_temporaries

    cfg = load_config("catch")
    trainer = Trainer(cfg)
    path = checkpoint.save(tmp_path, trainer.agent, trainer.optimiser, checkpoint.Counters(step=7))
    assert path.name == "ckpt-000000007.pt" and not list(tmp_path.glob("*.tmp"))
    (tmp_path / "ckpt-000000008.pt.tmp").write_bytes(b"half a checkpoint")
    assert remove_stale_temporaries(tmp_path) == [tmp_path / "ckpt-000000008.pt.tmp"]
    assert checkpoint.latest(tmp_path) == path
    checkpoint.record_version(tmp_path, 12)
    assert checkpoint.published_version(tmp_path) == 12


def test_the_lbc_loss_bootstraps_cut_episodes_from_the_recorded_value():
    """The learner reads `truncated` and `bootstrap`: where an episode really ended the recorded value is
    ignored; where the frame cap cut it, the V-trace target moves with the value of the cut episode's end."""
    cfg = load_config("catch", ["learner.warmup_steps=0"])
    trainer = Trainer(cfg)
    batch = _batch(cfg, np.random.default_rng(1))
    k = cfg.sequence.burn_in + 3
    batch["done"][:, k] = True

    def v_term(truncated: bool, value: float) -> float:
        b = {name: arr.copy() for name, arr in batch.items()}
        b["truncated"][:, k] = truncated
        b["bootstrap"][:, k] = value
        with torch.no_grad():
            return float(trainer._loss(b).terms[:, 0].sum())

    assert v_term(False, 0.0) == v_term(False, 50.0)          # a real end: nothing to bootstrap
    assert v_term(True, 50.0) > v_term(True, 0.0) + 1.0       # a cut: the target follows V(x_last)


def test_lbc_target_network_is_copied_every_period_and_sets_the_targets():
    """learner.target_update_every: a frozen copy of the model, synced after every n-th step and kept in
    checkpoints; with it the step's loss differs from the one that bootstraps from the model itself."""
    cfg = load_config("catch", ["learner.warmup_steps=0", "learner.target_update_every=3"])
    trainer = Trainer(cfg)
    batch = _batch(cfg, np.random.default_rng(2))
    target = trainer.loss.target
    assert trainer.checkpointed_modules() == {"target": target}
    assert not any(p.requires_grad for p in target.parameters())

    def same() -> bool:
        return all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), target.parameters(), strict=True))

    assert same()
    trainer.train_step(batch)
    trainer.train_step(batch)
    assert not same()
    # the same step from the same state, bootstrapping from the model instead of the stale target
    plain = Trainer(load_config("catch", ["learner.warmup_steps=0"]))
    plain.model.load_state_dict(trainer.model.state_dict())
    assert plain.checkpointed_modules() == {} and plain.loss.target is None
    with torch.no_grad():
        assert not torch.allclose(trainer._loss(batch).terms, plain._loss(batch).terms)
    trainer.train_step(batch)
    assert same()


def test_a_compiled_recurrence_trains_as_the_eager_one(monkeypatch):
    """learner.compile: the online network's and the target network's LayerNormLSTM unroll through
    torch.compile's kernels, and a step's gradient, loss and priorities match the eager learner's within float
    rounding (the kernels fuse the step's sums in another order), states reset inside the sequences included.
    Chunks of 2 steps (the learner's 8 take longer to compile): Catch's 10 + 1 learning steps are five chunks
    and an eager step. The target network then unrolls varying counts of sequences without a graph for each
    count. On a CPU this is make test's one compiling test (compiling costs about 2 s a kernel on two cores);
    tests/unit/test_nets.py checks the module alone on a GPU."""
    from lbc import nets
    from lbc.nets import LayerNormLSTM
    from tests.unit.test_nets import graphs_compiled_unrolling
    monkeypatch.setattr(nets, "COMPILED_STEPS", 2)
    torch._dynamo.reset()   # graphs compiled by other tests count against torch's recompile limit
    base = ["learner.warmup_steps=0", "learner.clip_norm=1e9", "learner.target_update_every=2"]
    batch = _batch(load_config("catch", base), np.random.default_rng(5))
    batch["reset"][0, 3] = batch["reset"][1, 8] = True   # the state starts afresh inside a chunk and at a chunk's start
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        trainer = Trainer(load_config("catch", [*base, f"learner.compile={str(compiled).lower()}"]))
        cores = [m for net in (trainer.model, trainer.loss.target) for m in net.modules()
                 if isinstance(m, LayerNormLSTM)]
        assert len(cores) == 2 and all(core.compiled == compiled for core in cores)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        stats = trainer.train_step(batch)
        results.append((stats, torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs   # it did compile
    (eager, g_eager), (fused, g_fused) = results
    torch.testing.assert_close(g_fused, g_eager, rtol=1e-4, atol=1e-4 * float(g_eager.abs().max()))
    assert fused.loss == pytest.approx(eager.loss, rel=1e-5)
    np.testing.assert_allclose(fused.priorities, eager.priorities, rtol=1e-4, atol=1e-6)
    assert graphs_compiled_unrolling(cores[1], (2, 3, 5, 6, 7), steps=4) <= 2   # the target network's


@pytest.mark.parametrize("preset", ["cpu", "impala", "ngu"])
def test_the_bootstrap_steps_frames_read_without_a_gradient_change_no_step(preset, monkeypatch):
    """Every family's loss reads the online network's bootstrap step only detached, so its torso pass there runs
    without a gradient (unroll_after_burn_in's bootstrap_grad=False): a step's loss, gradient and priorities match
    those with the gradient kept within float rounding (the torso's rows summed in other batches), and the step
    does take the pass without one (else this test could not tell)."""
    from lbc.nets import LBCNet
    features = LBCNet._features
    seen = []

    def recorded(keep_grad: bool):
        def run(self, x, last_step_grad):
            if torch.is_grad_enabled():
                seen.append(last_step_grad)
            return features(self, x, last_step_grad or keep_grad)
        return run

    layers = deep_merge(CATCH_SIZING, {"learner": {"warmup_steps": 0, "clip_norm": 1e9}})
    batch = _batch(load_config(preset, layers), np.random.default_rng(3))
    results = []
    for keep_grad in (True, False):
        monkeypatch.setattr(LBCNet, "_features", recorded(keep_grad))
        torch.manual_seed(0)
        trainer = Trainer(load_config(preset, layers))
        seen.clear()
        stats = trainer.train_step(batch)
        assert seen and not any(seen)   # the online network's learning pass asks for the bootstrap step without
        results.append((stats, torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])))
    (kept, g_kept), (without, g_without) = results
    torch.testing.assert_close(g_without, g_kept, rtol=1e-5, atol=1e-6 * float(g_kept.abs().max()))
    assert without.loss == pytest.approx(kept.loss, rel=1e-6)
    np.testing.assert_allclose(without.priorities, kept.priorities, rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a visible GPU")
def test_a_learner_replaying_the_recurrence_as_cuda_graphs_trains_as_the_eager_one():
    """learner.cuda_graphs: three steps (the graphs captured in the first, replayed with the weights each step
    left) give the eager GPU learner's losses, priorities and parameters within float rounding."""
    base = ["learner.device=cuda", "learner.warmup_steps=0", "learner.target_update_every=2"]
    rng = np.random.default_rng(5)
    batches = [_batch(load_config("catch", base), rng) for _ in range(3)]
    results = []
    for graphs in (False, True):
        torch.manual_seed(0)
        trainer = Trainer(load_config("catch", [*base, f"learner.cuda_graphs={str(graphs).lower()}"]))
        stats = [trainer.train_step(batch) for batch in batches]
        results.append((stats, torch.cat([p.detach().flatten() for p in trainer.model.parameters()])))
    (eager, p_eager), (graphed, p_graphed) = results
    for a, b in zip(eager, graphed, strict=True):
        assert b.loss == pytest.approx(a.loss, rel=1e-5)
        np.testing.assert_allclose(b.priorities, a.priorities, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(p_graphed, p_eager, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="learner.device=auto finds the GPU")
def test_cuda_graphs_are_refused_where_no_gpu_learns():
    with pytest.raises(SystemExit, match="cuda_graphs needs a GPU learner"):
        Trainer(load_config("catch", ["learner.cuda_graphs=true"]))


def test_compiled_kernels_are_kept_in_the_run_folder_unless_the_environment_names_a_place(tmp_path):
    """learner.compile: a restarted learner finds the kernels it compiled (torch's default place is under /tmp,
    which a new pod does not keep)."""
    from learner_svc.__main__ import keep_compiled_kernels
    cfg = load_config("catch", [f"run_dir={tmp_path}", "learner.compile=true"])
    environ: dict[str, str] = {}
    assert keep_compiled_kernels(cfg, environ) == str(tmp_path / "compile-cache")
    assert environ == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "compile-cache")}
    named = {"TORCHINDUCTOR_CACHE_DIR": "/somewhere"}
    assert keep_compiled_kernels(cfg, named) == "/somewhere" and named == {"TORCHINDUCTOR_CACHE_DIR": "/somewhere"}
    plain: dict[str, str] = {}
    assert keep_compiled_kernels(load_config("catch", [f"run_dir={tmp_path}"]), plain) is None and plain == {}


class _ScalarReads(TorchDispatchMode):
    """Where a scalar is read off a tensor (float(), bool(), .item(): aten._local_scalar_dense, a wait for the
    device on a GPU): the file and line whose code asked for it (torch's own reads, such as the optimiser's
    step count on the host, name torch's files)."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            frames = traceback.extract_stack()[:-1]
            while frames[-1].filename.endswith(("torch/_dynamo/eval_frame.py", "torch/_compile.py")):
                frames.pop()   # the machinery that calls this mode
            caller = frames[-1]
            path = Path(caller.filename)
            self.sites.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{caller.lineno}")
        return func(*args, **(kwargs or {}))


def test_a_steps_figures_are_read_at_once_and_are_the_losss_own():
    """The step reads its loss, gradient norm, terms and priorities from the device in one copy
    (lbc.devices.to_host; a GPU learner then waits once a step, not at each figure), and they are the ones
    the loss gives: against a second learner from the same seed whose loss and gradient are computed here."""
    cfg = load_config("cpu", ["learner.split_batch=1", "learner.warmup_steps=0", "learner.batch_size=4",
                              "learner.precision=fp32"])   # the reference's loss runs outside autocast
    batch = _batch(cfg, np.random.default_rng(3))
    torch.manual_seed(0)
    reference = Trainer(cfg)
    out = reference.loss(reference.model, reference.prepare(batch)[0])
    out.total.backward()
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in reference.model.parameters()
                                                 if p.grad is not None]))
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    parts = trainer.prepare(batch)
    reads = _ScalarReads()
    with reads:
        stats = trainer._optimise(parts)
    assert not [s for s in reads.sites if s.startswith(("learner_svc/training.py", "learner_svc/replicas.py"))], \
        reads.sites
    assert not stats.skipped
    assert stats.loss == pytest.approx(float(out.total.detach()), rel=1e-6)
    assert stats.grad_norm == pytest.approx(float(norm), rel=1e-5)
    np.testing.assert_allclose([list(p.values()) for p in stats.per_policy], out.terms.detach().numpy(), rtol=1e-6)
    assert list(stats.per_policy[0]) == list(trainer.terms)
    np.testing.assert_allclose(stats.priorities, out.priorities.detach().numpy(), rtol=1e-6)
    assert stats.priorities.dtype == np.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="waits for the device happen only on a GPU")
def test_a_gpu_learners_step_waits_for_the_device_once():
    """torch's sync debug mode warns at each wait for the GPU: the optimising half of a step (loss, backward,
    clipping, the optimiser's step; its batch prepared before) waits once, for its figures."""
    cfg = load_config("cpu", ["learner.device=cuda", "learner.split_batch=1", "learner.warmup_steps=0"])
    trainer = Trainer(cfg)
    rng = np.random.default_rng(4)
    trainer.train_step(_batch(cfg, rng))   # the optimiser's state is made in the first step
    parts = trainer.prepare(_batch(cfg, rng))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer._optimise(parts)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    waits = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
    assert len(waits) == 1, waits


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a visible GPU"))])
def test_the_fused_adamw_steps_as_the_per_list_one(device):
    """build_optimiser's AdamW is torch's fused kernel: over steps whose learning rate and weight decay change
    (as the schedules change them), the parameters and moments follow the per-list (foreach) AdamW within
    float rounding, and the update is AdamW's, checked by hand on the first step."""
    cfg = load_config("catch", ["learner.weight_decay=0.1"])
    assert build_optimiser(torch.nn.Linear(2, 2), cfg.learner).defaults["fused"]
    torch.manual_seed(0)
    shapes = [(64, 32), (32,), (7, 3, 3, 3)]
    start = [torch.randn(s, device=device) for s in shapes]
    grads = [[torch.randn(s, device=device) for s in shapes] for _ in range(6)]
    runs = []
    for fused in (True, False):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        model = torch.nn.ParameterList(params)
        opt = build_optimiser(model, cfg.learner) if fused else torch.optim.AdamW(
            params, lr=cfg.learner.learning_rate, betas=cfg.learner.adam_betas, eps=cfg.learner.adam_eps,
            weight_decay=cfg.learner.weight_decay, foreach=True)
        for step, g in enumerate(grads):
            for group in opt.param_groups:
                group["lr"] = cfg.learner.learning_rate * (step + 1) / 6
                group["weight_decay"] = cfg.learner.weight_decay * (1 - step / 6)
            for p, gi in zip(params, g, strict=True):
                p.grad = gi.clone()
            opt.step()
            if step == 0:   # AdamW, first step (m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected to g and g^2)
                lr, wd, eps = cfg.learner.learning_rate / 6, cfg.learner.weight_decay, cfg.learner.adam_eps
                for p, p0, gi in zip(params, start, g, strict=True):
                    torch.testing.assert_close(p.detach(), p0 * (1 - lr * wd) - lr * gi / (gi.abs() + eps))
        runs.append((params, [opt.state[p]["exp_avg_sq"] for p in params]))
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def _seconds() -> dict[str, float]:
    return {part: REGISTRY.get_sample_value("lbc_learner_step_seconds_total", {"part": part}) for part in PARTS}


def test_the_parts_of_a_training_loop_add_up_to_its_wall_time():
    cfg = load_config("catch", ["learner.prepare_ahead=true", "learner.device=cpu"])
    trainer = Trainer(cfg)
    rng = np.random.default_rng(0)
    batches = [_batch(cfg, rng) for _ in range(5)]
    loop_time = LoopTime()
    before = _seconds()
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        with loop_time.waiting_for_batch():
            time.sleep(0.05)   # replay's batch on its way
        trainer.train_step(batch, batches[i + 1] if i + 1 < len(batches) else None)
        loop_time.trained()
        time.sleep(0.02)       # what the loop does after a step
    with loop_time.waiting_for_batch():
        pass
    wall = time.perf_counter() - start
    spent = {part: seconds - before[part] for part, seconds in _seconds().items()}
    assert sum(spent.values()) == pytest.approx(wall, rel=0.02, abs=0.005)
    assert 5 * 0.05 <= spent["batch"] < 5 * 0.05 + 0.05
    assert 5 * 0.02 <= spent["after"] < 5 * 0.02 + 0.05
    # the first batch was not prepared ahead, the others were (the step before made them)
    assert trainer.prepared_ahead == 4 and spent["prepare"] > 0
    assert spent["loss_backward"] > 0 and spent["optimiser"] > 0
    assert spent["device_wait"] >= 0 and spent["ahead_wait"] >= 0
