"""The target network's outputs kept per replayed sequence (lbc.target_cache): the learner's loss and
gradients with the cache equal those of unrolling the target over every sequence (issue 11: no
recomputation the learner can avoid, the same values within float tolerance)."""

import numpy as np
import pytest
import torch

from lbc.config import load_config
from lbc.nets import read_frames
from lbc.presets import CATCH_SIZING, deep_merge
from lbc.target_cache import TargetOutputCache
from learner_svc.training import Trainer
from tests.unit.test_training import _batch


def _keyed(cfg, seed, keys, versions):
    batch = _batch(cfg, np.random.default_rng(seed))
    batch["key"] = np.asarray(keys, np.int64)
    batch["param_version"] = np.asarray(versions, np.int64)
    return batch


def _step_against_uncached(trainer, batch):
    """The batch's loss, terms, priorities and gradients with the trainer's cache, checked against the same
    without it (the target unrolled over every sequence) on the same model; then the optimiser's step and
    the loss's after_step, as Trainer.train_step does them."""
    loss = trainer.loss
    cache, loss.target_cache = loss.target_cache, None
    trainer.optimiser.zero_grad(set_to_none=True)
    want = trainer._split_backward(trainer.prepare(batch))
    want_grads = [p.grad.clone() for p in trainer.parameters if p.grad is not None]
    loss.target_cache = cache
    trainer.optimiser.zero_grad(set_to_none=True)
    got = trainer._split_backward(trainer.prepare(batch))
    got_grads = [p.grad.clone() for p in trainer.parameters if p.grad is not None]
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-6)
    assert len(got_grads) == len(want_grads)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    trainer.optimiser.step()
    trainer.step += 1
    trainer.loss.after_step(trainer.step)


def _walk(trainer, cfg):
    """Batches that repeat sequences within and across target periods (copies after steps 3 and 6): every
    step's loss and gradients must equal the uncached ones, and the cache must have served exactly the
    repeats within a period."""
    b = cfg.learner.batch_size
    first = _keyed(cfg, 1, range(b), [7] * b)
    # every other sequence of `first` again, new ones between them: each part of a split batch has both
    fresh = _keyed(cfg, 2, range(b, 2 * b), [8] * b)
    second = {name: np.stack([row for pair in zip(first[name][1::2], fresh[name][: b // 2], strict=True)
                              for row in pair]) for name in first}
    # half of `second` again, half of `first`: sequences the cache holds, gathered out of order
    mixed = {name: np.concatenate([second[name][: b // 2][::-1], first[name][: b // 2]])
             for name in first}
    # keys of `second` with another parameter version: other sequences (the version guards the key)
    renamed = _keyed(cfg, 3, second["key"], [9] * b)
    cache = trainer.loss.target_cache
    plan = [(first, 0), (second, b // 2), (mixed, b),        # step 3 copies the model into the target
            (second, 0), (second, b), (renamed, 0)]          # step 6 copies again
    for i, (batch, hits) in enumerate(plan):
        before = cache.hits
        _step_against_uncached(trainer, batch)
        assert cache.hits - before == hits, f"step {i + 1}"
    assert len(cache) == 0                                   # emptied by the copy after step 6


def test_the_lbc_loss_with_kept_target_outputs_equals_unrolling_the_target_every_time():
    """`cpu` (the embedded default: target network every 250 steps, frames centred, channels-last torso) at a
    small size, on Atari-shaped frames, with the batch split in two threads (the other CPU presets' layout)."""
    cfg = load_config("cpu", ["learner.batch_size=6", "sequence.burn_in=2", "sequence.length=3",
                              "learner.warmup_steps=0", "learner.target_update_every=3", "learner.split_batch=2"])
    trainer = Trainer(cfg)
    assert cfg.net.centre_frames
    _walk(trainer, cfg)


def test_the_ngu_loss_with_kept_target_outputs_equals_unrolling_the_target_every_time():
    """NGU: the target's Q, conditioned on the stored mixture index and intrinsic reward (extra inputs)."""
    cfg = load_config("ngu", deep_merge(CATCH_SIZING, {"learner": {"warmup_steps": 0, "batch_size": 8},
                                                       "ngu": {"num_mixtures": 4, "target_update_every": 3}}))
    trainer = Trainer(cfg)
    _walk(trainer, cfg)


def test_without_the_switch_or_without_keys_nothing_is_kept():
    cfg = load_config("cpu", ["learner.batch_size=4", "sequence.burn_in=1", "sequence.length=2",
                              "learner.target_cache=false"])
    assert Trainer(cfg).loss.target_cache is None
    assert Trainer(load_config("impala-cpu")).loss.target is None   # no target network, nothing to keep
    trainer = Trainer(load_config("cpu", ["learner.batch_size=4", "sequence.burn_in=1", "sequence.length=2"]))
    batch = _batch(trainer.cfg, np.random.default_rng(0))   # as bench builds it: no replay keys
    trainer._loss(batch)
    assert trainer.loss.target_cache.lookups == 0


def test_the_cache_goes_by_key_and_version_and_forgets_the_oldest_first():
    cache = TargetOutputCache(max_entries=3)
    adv, value = torch.arange(2 * 4 * 2 * 3.0).view(2, 4, 2, 3), torch.arange(2 * 4 * 2.0).view(2, 4, 2)
    cache.store([10, 11, 12, 13], [1, 1, 1, 2], adv, value)
    assert len(cache) == 3                                         # key 10 went first
    found = cache.lookup([10, 11, 13, 13, 12], [1, 1, 2, 3, 1])
    assert [f is None for f in found] == [True, False, False, True, False]
    assert torch.equal(found[1][0], adv[:, 1]) and torch.equal(found[2][1], value[:, 3])
    assert (cache.lookups, cache.hits) == (5, 3)
    assert cache.describe() == "target network's outputs kept for 3 of 5 sequences drawn (60%)"
    adv[:, 1] = -1.0                                               # kept rows are copies
    assert torch.equal(cache.lookup([11], [1])[0][0], torch.arange(2 * 4 * 2 * 3.0).view(2, 4, 2, 3)[:, 1])
    cache.clear()
    assert len(cache) == 0 and cache.lookup([11], [1]) == [None]
    with pytest.raises(ValueError, match="max_entries"):
        TargetOutputCache(0)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("centre", [False, True])
def test_frames_take_picks_sequences_in_their_layout(layout, centre):
    frames = torch.randint(0, 256, (5, 4, 4, 12, 12), dtype=torch.uint8)
    read = read_frames(frames, centre, memory_format=layout)
    index = torch.tensor([3, 0, 3])
    taken = read.take(index)
    assert torch.equal(taken.pixels, read.pixels.index_select(1, index))
    assert taken.pixels.reshape(-1, 4, 12, 12).is_contiguous(memory_format=layout)
    if centre:
        assert torch.equal(taken.medians, read.medians.index_select(1, index))
    else:
        assert taken.medians is None
