import numpy as np
import pytest
import torch

from lbc.config import load_config
from lbc.sequences import sequence_layout
from learner_svc import checkpoint
from learner_svc.training import Trainer, schedule_factor


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


def test_trainer_fits_a_fixed_batch():
    cfg = load_config("catch", ["learner.warmup_steps=0"])
    trainer = Trainer(cfg)
    batch = _batch(cfg, np.random.default_rng(0))
    def regression(stats):
        return sum(p["v"] + p["q"] for p in stats.per_policy)

    first = trainer.train_step(batch)
    for _ in range(150):
        last = trainer.train_step(batch)
    assert np.isfinite(last.loss) and regression(last) < 0.75 * regression(first)
    assert len(last.per_policy) == 3 and last.priorities.shape == (cfg.learner.batch_size,)


def test_checkpoint_round_trip(tmp_path):
    cfg = load_config("catch", ["learner.warmup_steps=0"])
    trainer = Trainer(cfg)
    batch = _batch(cfg, np.random.default_rng(0))
    for _ in range(3):
        trainer.train_step(batch)
    checkpoint.save(tmp_path, trainer.model, trainer.optimiser, checkpoint.Counters(step=3, version=1, samples=96))
    other = Trainer(cfg)
    counters = checkpoint.load(checkpoint.latest(tmp_path), other.model, other.optimiser)
    assert (counters.step, counters.version, counters.samples) == (3, 1, 96)
    for a, b in zip(trainer.model.parameters(), other.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    other.step = trainer.step
    torch.manual_seed(0)
    s1 = trainer.train_step(batch).loss
    torch.manual_seed(0)
    s2 = other.train_step(batch).loss
    assert s1 == pytest.approx(s2, rel=1e-5)


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
    torch.testing.assert_close(grads[1], grads[0] * elements, rtol=1e-4, atol=1e-6)
