"""NGU's learner step: the targets it trains on, its target network and its auxiliary networks."""

import numpy as np
import pytest
import torch

from lbc.config import load_config
from lbc.ngu import core_inputs, mixture_family
from lbc.presets import CATCH_SIZING, deep_merge
from learner_svc import checkpoint
from learner_svc.training import Trainer, to_time_major
from tests.unit.test_training import _batch


def _config(**ngu):
    return load_config("ngu", deep_merge(CATCH_SIZING, {"learner": {"warmup_steps": 0},
                                                 "ngu": {"num_mixtures": 4, **ngu}}))


def _ngu_batch(cfg, seed=0):
    rng = np.random.default_rng(seed)
    batch = _batch(cfg, rng)
    batch["mixture"] = rng.integers(0, cfg.ngu.num_mixtures, batch["mixture"].shape).astype(np.int32)
    batch["prev_intrinsic"] = rng.uniform(0.0, 2.0, batch["prev_intrinsic"].shape).astype(np.float32)
    batch["done"] = rng.random(batch["done"].shape) < 0.1
    batch["weight"] = rng.uniform(0.5, 1.0, cfg.learner.batch_size).astype(np.float32)
    return batch


def _h(z, eps=1e-3):
    return np.sign(z) * (np.sqrt(np.abs(z) + 1) - 1) + eps * z


def _h_inv(z, eps=1e-3):
    return np.sign(z) * (((np.sqrt(1 + 4 * eps * (np.abs(z) + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1)


def test_one_step_targets_by_hand():
    """With lambda = 0 and a greedy target policy, transformed Retrace is the one-step double-Q target
    y_t = h(r^e_t + beta_j r^i_{t+1} + gamma_j (1 - done_t) h^-1(Q^-(x_{t+1}, argmax_a Q(x_{t+1}, a)))),
    with j the member that acted and r^i_{t+1} the intrinsic reward of arriving at x_{t+1}. Computed
    here in numpy from the networks' outputs; the target network is perturbed so that it differs."""
    cfg = _config(retrace_lambda=0.0, target_epsilon=0.0)
    trainer = Trainer(cfg)
    with torch.no_grad():
        for p in trainer.loss.target.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = _ngu_batch(cfg)
    _, terms, priorities = trainer._loss(batch)

    b = to_time_major(batch)
    extra = core_inputs(b["mixture"], b["prev_intrinsic"], cfg.ngu.num_mixtures)
    with torch.no_grad():
        q = trainer.loss.q_values(trainer.model, b["obs"], b, extra, grad=False).numpy()
        q_target = trainer.loss.q_values(trainer.loss.target, b["obs"], b, extra, grad=False).numpy()
    family = mixture_family(4, cfg.ngu.beta, cfg.ngu.gamma_max, cfg.ngu.gamma_min)
    burn, steps = cfg.sequence.burn_in, cfg.sequence.length
    losses = np.zeros((steps, cfg.learner.batch_size))
    abs_td = np.zeros_like(losses)
    for i in range(cfg.learner.batch_size):
        for t in range(steps):
            beta, gamma = family[batch["mixture"][i, burn + t]]
            r = batch["reward"][i, burn + t] + beta * batch["prev_intrinsic"][i, burn + t + 1]
            discount = gamma * (1.0 - batch["done"][i, burn + t])
            a_star = np.argmax(q[t + 1, i])
            y = _h(r + discount * _h_inv(q_target[t + 1, i, a_star]))
            a = batch["action"][i, burn + t]
            losses[t, i] = 0.5 * (q[t, i, a] - y) ** 2 * batch["weight"][i]
            abs_td[t, i] = abs(y - q[t, i, a])
    assert float(terms[0, 0]) == pytest.approx(losses.mean(), rel=1e-4)
    expected = 0.9 * abs_td.max(0) + 0.1 * abs_td.mean(0)
    # h^-1 in float32 loses ~1e-4 (its (sqrt(1 + 4 eps (|z| + 1)) - 1) / 2 eps cancels digits)
    np.testing.assert_allclose(priorities.numpy(), expected, atol=5e-4)


def test_target_network_is_copied_every_period_and_auxiliary_rate_is_not_scheduled():
    cfg = _config(target_update_every=3)
    trainer = Trainer(cfg)
    batch = _ngu_batch(cfg)

    def same() -> bool:
        return all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), trainer.loss.target.parameters(),
                                                     strict=True))

    trainer.train_step(batch)
    trainer.train_step(batch)
    assert not same()
    trainer.train_step(batch)
    assert same()
    groups = trainer.optimiser.param_groups
    assert groups[1]["fixed_lr"] and groups[1]["lr"] == cfg.ngu.aux_learning_rate
    assert groups[0]["lr"] == pytest.approx(cfg.learner.learning_rate * (1 - 2 / cfg.learner.anneal_steps))


def test_auxiliary_networks_learn_and_travel_in_checkpoints(tmp_path):
    """RND's predictor and the inverse-dynamics model fit a fixed batch; the checkpoint holds them, the
    random RND target, the target Q-network and the optimiser with both groups."""
    cfg = _config()
    trainer = Trainer(cfg)
    batch = _ngu_batch(cfg)
    first = trainer.train_step(batch).per_policy[0]
    for _ in range(30):
        last = trainer.train_step(batch).per_policy[0]
    assert set(last) == {"q", "inverse_dynamics", "rnd"}
    assert last["rnd"] < 0.5 * first["rnd"] and last["inverse_dynamics"] < first["inverse_dynamics"]
    checkpoint.save(tmp_path, trainer.agent, trainer.optimiser, checkpoint.Counters(step=31),
                    trainer.checkpointed_modules())
    sizing = deep_merge(CATCH_SIZING, {"ngu": {"num_mixtures": 4}, "learner": {"seed": 5}})
    other = Trainer(load_config("ngu", sizing))
    checkpoint.load(checkpoint.latest(tmp_path), other.agent, other.optimiser, other.checkpointed_modules())
    for mine, theirs in ((trainer.agent, other.agent), (trainer.loss.target, other.loss.target)):
        for a, b in zip(mine.state_dict().values(), theirs.state_dict().values(), strict=True):
            assert torch.equal(a, b)
    assert not torch.equal(next(trainer.loss.target.parameters()), next(trainer.model.parameters()))   # 31 % 1500
    assert len(other.optimiser.param_groups) == 2 and other.optimiser.param_groups[1]["fixed_lr"]


def test_a_checkpoint_without_the_target_network_is_refused(tmp_path):
    trainer = Trainer(_config())
    checkpoint.save(tmp_path, trainer.agent, trainer.optimiser, checkpoint.Counters())
    with pytest.raises(ValueError, match="lacks"):
        checkpoint.load(checkpoint.latest(tmp_path), trainer.agent, trainer.optimiser, trainer.checkpointed_modules())
