"""Learner replicas (learner_svc.replicas) in real processes over gloo: the group's averaged gradient is
the one learner's gradient over the union of the replicas' batches, replica 0's state becomes everyone's,
and a replica's non-finite batch makes every replica skip the step. On a GPU too, two replicas sharing it
(learner.group_backend=gloo; NCCL refuses two ranks on one GPU)."""

import multiprocessing as mp

import numpy as np
import pytest
import torch

from lbc.config import load_config
from learner_svc.replicas import ReplicaGroup
from learner_svc.training import Trainer
from tests.support import free_port
from tests.unit.test_training import _batch

OVERRIDES = ["learner.warmup_steps=0", "learner.split_batch=1", "learner.batch_size=4"]


def _flat(tensors) -> np.ndarray:
    return torch.cat([t.detach().flatten() for t in tensors]).cpu().numpy()


def _replica(rank: int, port: int, out: mp.Queue, device: str) -> None:
    torch.set_num_threads(1)
    cfg = load_config("catch", [*OVERRIDES, f"learner.device={device}"])
    group = ReplicaGroup(rank, 2, "127.0.0.1", port, torch.device(device), timeout_s=60, backend="gloo")
    trainer = Trainer(cfg)   # alone for its first step: replica 0 as if resumed, with optimiser state
    if rank == 0:
        trainer.train_step(_batch(cfg, np.random.default_rng(50)))
    else:   # a replica that starts apart, without optimiser state, is brought to replica 0's state
        with torch.no_grad():
            for p in trainer.agent.parameters():
                p.add_(1.0)
    trainer.group = group
    group.share_state(trainer.agent, trainer.optimiser)
    params = _flat(trainer.agent.parameters())
    moments = _flat(s["exp_avg_sq"] for s in trainer.optimiser.state.values())
    trainer.optimiser.zero_grad(set_to_none=True)
    trainer._split_backward(trainer.prepare(_batch(cfg, np.random.default_rng(100 + rank))))
    finite = bool(group.average_gradients(trainer.parameters, torch.tensor(True, device=device)))
    grads = _flat(p.grad for p in trainer.parameters)
    poisoned = _batch(cfg, np.random.default_rng(7))
    if rank == 1:
        poisoned["reward"][:] = np.nan
    skipped = trainer.train_step(poisoned).skipped
    out.put((rank, params, moments, grads, finite, skipped))
    group.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="two replicas sharing a GPU need a visible GPU"))])
def test_the_groups_gradient_is_the_gradient_over_the_union_of_the_batches(device):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_replica, args=(rank, port, out, device)) for rank in range(2)]
    for p in procs:
        p.start()
    results = dict((r[0], r[1:]) for r in (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0

    cfg = load_config("catch", [*OVERRIDES, f"learner.device={device}"])
    halves = [_batch(cfg, np.random.default_rng(100 + rank)) for rank in range(2)]
    union = {name: np.concatenate([h[name] for h in halves]) for name in halves[0]}
    union_cfg = load_config("catch", [*OVERRIDES[:2], "learner.batch_size=8", f"learner.device={device}"])
    alone = Trainer(union_cfg)
    alone.train_step(_batch(cfg, np.random.default_rng(50)))   # replica 0's first step, batch of 4
    alone.optimiser.zero_grad(set_to_none=True)
    alone._split_backward(alone.prepare(union))
    expected = _flat(p.grad for p in alone.parameters)

    (params0, moments0, grads0, finite0, skipped0) = results[0]
    (params1, moments1, grads1, finite1, skipped1) = results[1]
    np.testing.assert_array_equal(params0, params1)                      # replica 0's state everywhere
    np.testing.assert_array_equal(moments0, moments1)
    assert moments0.any()
    np.testing.assert_allclose(params0, _flat(alone.agent.parameters()), rtol=1e-5, atol=1e-8)   # thread counts differ
    np.testing.assert_array_equal(grads0, grads1)
    np.testing.assert_allclose(grads0, expected, rtol=1e-4, atol=1e-6)   # the mean over both batches
    assert finite0 and finite1 and skipped0 and skipped1                  # one poisoned batch: both skip


def test_nccl_is_refused_for_a_learner_on_the_cpu():
    with pytest.raises(ValueError, match="group_backend=nccl needs the learner on a GPU"):
        ReplicaGroup(0, 2, "127.0.0.1", free_port(), torch.device("cpu"), backend="nccl")
