"""learner.prepare_ahead: the next batch's frames and target outputs made in a thread of their own while a step
trains (issue 11: no change to what is learned, the same values as preparing each batch in its own step)."""

import threading

import numpy as np
import pytest
import torch

from lbc.config import load_config
from lbc.presets import CATCH_SIZING, deep_merge
from learner_svc.batches import BatchFetcher
from learner_svc.training import Trainer
from tests.unit.test_target_cache import _keyed


def _batches(cfg, steps):
    """Batches whose sequences repeat across steps (the target cache serves some of them)."""
    b = cfg.learner.batch_size
    out = []
    for i in range(steps):
        keys = np.arange(i * b // 2, i * b // 2 + b)   # half of each batch's sequences were in the one before
        out.append(_keyed(cfg, 10 + i, keys, [0] * b))
        if i:
            for name in out[i]:   # the repeated keys' sequences are the same sequences
                out[i][name][: b // 2] = out[i - 1][name][b // 2:]
    return out


def _prepared_where(trainer):
    """Records, per batch prepared, the name of the thread that prepared it."""
    seen = []
    prepare = trainer.prepare

    def recording(batch, **kwargs):
        seen.append((batch["key"][0], threading.current_thread().name))
        return prepare(batch, **kwargs)

    trainer.prepare = recording
    return seen


def _assert_same_training(cfg, steps=7):
    """The same batches with and without prepare_ahead give bitwise the same parameters after every step, the
    target network's copies (after steps 3 and 6) included; every batch but the first and the ones after a
    copy is used as prepared ahead.

    On a GPU (learner.device=cuda) kernels do not sum in the same order from one call to the next, and AdamW
    turns a tiny gradient difference in a near-zero coordinate into a step of the learning rate: there each
    step starts the learner preparing ahead from the other's parameters, target and optimiser state, and the
    step's loss, priorities and gradient are compared within float tolerance."""
    gpu = cfg.learner.device == "cuda"
    plain = Trainer(cfg)
    ahead_cfg = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"prepare_ahead": True})})
    ahead = Trainer(ahead_cfg)
    seen = _prepared_where(ahead)
    batches = _batches(cfg, steps)
    for i, batch in enumerate(batches):
        upcoming = batches[i + 1] if i + 1 < steps else None
        if gpu:
            ahead.agent.load_state_dict(plain.agent.state_dict())
            ahead.loss.target.load_state_dict(plain.loss.target.state_dict())
            ahead.optimiser.load_state_dict(plain.optimiser.state_dict())
        a, b = plain.train_step(batch), ahead.train_step(batch, upcoming)
        if gpu:
            torch.testing.assert_close(b.loss, a.loss, rtol=1e-4, atol=1e-6, msg=f"loss, step {i + 1}")
            np.testing.assert_allclose(b.priorities, a.priorities, rtol=1e-4, atol=1e-6, err_msg=f"step {i + 1}")
            grads = [torch.cat([p.grad.flatten() for p in t.parameters if p.grad is not None]) for t in (plain, ahead)]
            assert float(torch.nn.functional.cosine_similarity(*grads, dim=0)) > 0.9999, f"gradient, step {i + 1}"
            continue
        assert a.loss == b.loss, f"step {i + 1}"
        np.testing.assert_array_equal(a.priorities, b.priorities)
        for p, q in zip(plain.parameters, ahead.parameters, strict=True):
            assert torch.equal(p, q), f"step {i + 1}"
    if not gpu:
        for p, q in zip(plain.loss.target.parameters(), ahead.loss.target.parameters(), strict=True):
            assert torch.equal(p, q)
    first_keys = [int(batch["key"][0]) for batch in batches]
    in_thread = [first_keys.index(key) for key, name in seen if name.startswith("learner-prepare")]
    again = [first_keys.index(key) for key, name in seen if not name.startswith("learner-prepare")]
    assert in_thread == list(range(1, steps))      # each next batch, while the step before trained
    assert again == [0, 3, 6]                      # the first, and those prepared before a copy into the target
    return plain, ahead


def test_the_cpu_preset_trains_the_same_with_batches_prepared_ahead():
    """`cpu` at a small size: centred frames, channels-last torso, target cache, target copied every 3 steps."""
    cfg = load_config("cpu", ["learner.batch_size=6", "sequence.burn_in=2", "sequence.length=3",
                              "learner.warmup_steps=0", "learner.target_update_every=3", "learner.split_batch=1",
                              "learner.device=cpu"])
    plain, ahead = _assert_same_training(cfg)
    # the cache served the same sequences: the upcoming batches prepared before a copy were not counted twice
    # as hits (their outputs were dropped with the cache)
    assert ahead.loss.target_cache.hits >= plain.loss.target_cache.hits


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_split_batch_trains_the_same_with_batches_prepared_ahead(precision):
    """Under bf16 autocast too: with torch's cast cache, which all threads share and any thread empties on
    leaving autocast, the parts' gradients summed in an order that changed from run to run (decision 63)."""
    cfg = load_config("cpu", ["learner.batch_size=6", "sequence.burn_in=2", "sequence.length=3",
                              "learner.warmup_steps=0", "learner.target_update_every=3", "learner.split_batch=2",
                              "learner.device=cpu", f"learner.precision={precision}"])
    _assert_same_training(cfg)


def test_ngu_trains_the_same_with_batches_prepared_ahead():
    cfg = load_config("ngu", deep_merge(CATCH_SIZING, {"learner": {"warmup_steps": 0, "batch_size": 8, "device": "cpu"},
                                                       "ngu": {"num_mixtures": 4, "target_update_every": 3}}))
    _assert_same_training(cfg)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the copy stream needs a visible GPU")
def test_a_gpu_learner_trains_the_same_with_batches_copied_on_a_stream_of_their_own():
    """On a GPU the preparing thread copies the next batch on copy_stream while the step's kernels run."""
    cfg = load_config("cpu", ["learner.batch_size=6", "sequence.burn_in=2", "sequence.length=3",
                              "learner.warmup_steps=0", "learner.target_update_every=3", "learner.split_batch=1",
                              "learner.device=cuda"])
    _, ahead = _assert_same_training(cfg)
    assert ahead.copy_stream is not None


def test_a_batch_not_prepared_ahead_is_prepared_in_its_step():
    """Passing another batch than the one prepared ahead trains on what was passed."""
    cfg = load_config("cpu", ["learner.batch_size=4", "sequence.burn_in=1", "sequence.length=2",
                              "learner.warmup_steps=0", "learner.prepare_ahead=true", "learner.device=cpu"])
    plain, ahead = Trainer(cfg), Trainer(cfg)
    # no key in two batches: the same sequences unrolled in the same batches in both trainers, bitwise alike
    first, second, other = (_keyed(cfg, 20 + i, range(4 * i, 4 * i + 4), [0] * 4) for i in range(3))
    plain.train_step(first)
    plain.train_step(other)
    ahead.train_step(first, second)
    ahead.train_step(other)
    for p, q in zip(plain.parameters, ahead.parameters, strict=True):
        assert torch.equal(p, q)


def test_the_fetcher_hands_out_each_batch_once_with_the_one_after_it():
    cfg = load_config("cpu", ["learner.prepare_ahead=true", "learner.prefetch=3"])
    fetcher = BatchFetcher(cfg, threading.Event())
    assert fetcher.queue.maxsize == 2   # one more is held by the learner: 3 ahead of the step in all
    batches = [{"key": np.array([i])} for i in range(3)]
    fetcher.queue.put(batches[0], timeout=1)
    fetcher.queue.put(batches[1], timeout=1)
    assert fetcher.next_pair(timeout=0.01) == (batches[0], batches[1])
    fetcher.queue.put(batches[2], timeout=1)
    assert fetcher.next_pair(timeout=0.01) == (batches[1], batches[2])
    assert fetcher.next_pair(timeout=0.01) == (batches[2], None)
    assert fetcher.next_pair(timeout=0.01) == (None, None)
    plain = BatchFetcher(load_config("cpu", ["learner.prefetch=3", "learner.prepare_ahead=false"]), threading.Event())
    assert plain.queue.maxsize == 3
    plain.queue.put(batches[0], timeout=1)
    plain.queue.put(batches[1], timeout=1)
    assert plain.next_pair(timeout=0.01) == (batches[0], None)


def test_a_failed_preparation_fails_the_step_that_trains_its_batch():
    """The step that was training meanwhile completes; the batch's own step raises where it trains."""
    cfg = load_config("cpu", ["learner.batch_size=4", "sequence.burn_in=1", "sequence.length=2",
                              "learner.prepare_ahead=true"])
    trainer = Trainer(cfg)
    first, second = _batches(cfg, 2)
    del second["prev_action"]
    trainer.train_step(first, second)
    assert trainer.step == 1
    with pytest.raises(KeyError, match="prev_action"):
        trainer.train_step(second)
    assert trainer.step == 1


def test_the_next_batch_is_taken_even_while_the_fetcher_still_holds_it():
    """The fetcher's thread puts each batch as soon as the queue has room (BatchFetcher._run): when the
    learner takes the batch that filled the queue, the next one is still in that thread's hands."""
    cfg = load_config("cpu", ["learner.prepare_ahead=true", "learner.prefetch=2"])
    fetcher = BatchFetcher(cfg, threading.Event())
    batches = [{"key": np.array([i])} for i in range(6)]

    def produce():
        for batch in batches:
            fetcher.queue.put(batch, timeout=5)

    producer = threading.Thread(target=produce)
    producer.start()
    pairs = [fetcher.next_pair(timeout=5, ahead_wait=1.0) for _ in range(len(batches) - 1)]
    pairs.append(fetcher.next_pair(timeout=5, ahead_wait=0.01))
    producer.join()
    assert [a["key"][0] for a, _ in pairs] == list(range(6))
    assert [b["key"][0] for _, b in pairs[:-1]] == list(range(1, 6))
