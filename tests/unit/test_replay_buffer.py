import numpy as np
import pytest

from replay_svc.buffer import PrioritisedSequenceBuffer, RateLimiter, SequenceBuffer


def _seq(nbytes=100):
    return {"x": np.zeros(nbytes, np.uint8)}


def test_buffer_bounded_in_count_and_bytes():
    buf = SequenceBuffer(capacity_sequences=5, capacity_bytes=1000)
    for i in range(8):
        buf.add(_seq(), i)
    assert len(buf) == 5 and buf.evicted == 3
    buf = SequenceBuffer(capacity_sequences=100, capacity_bytes=350)
    for i in range(8):
        buf.add(_seq(), i)
    assert len(buf) == 3 and buf.nbytes == 300
    with pytest.raises(ValueError, match="exceeds"):
        buf.add(_seq(400), 0)


def test_sampling_is_uniform_and_distinct():
    buf = SequenceBuffer(10, 10_000)
    for i in range(10):
        buf.add(_seq(), i)
    rng = np.random.default_rng(0)
    counts = np.zeros(10)
    for _ in range(3000):
        sample = buf.sample(4, rng)
        assert len({it.param_version for it in sample.items}) == 4
        np.testing.assert_array_equal(sample.weights, 1.0)
        for it in sample.items:
            counts[it.param_version] += 1
    np.testing.assert_allclose(counts / counts.sum(), 0.1, atol=0.015)


@pytest.mark.parametrize("ratio,batch", [(2.0, 16), (0.5, 8), (4.0, 32)])
def test_rate_limiter_holds_the_ratio_and_never_deadlocks(ratio, batch):
    tol = batch + ratio + 10
    lim = RateLimiter(ratio, min_size=batch, tolerance=tol)
    stored = 0
    rng = np.random.default_rng(0)
    for _ in range(20_000):
        can_i, can_s = lim.can_insert(), lim.can_sample(batch, stored)
        assert can_i or can_s
        if can_s and (not can_i or rng.random() < 0.5):
            lim.sample(batch)
        else:
            lim.insert()
            stored += 1
    owed = ratio * (lim.inserted - batch) - lim.sampled
    assert -tol - batch <= owed <= tol
    assert lim.sampled / lim.inserted == pytest.approx(ratio, rel=0.05)


def test_no_sampling_before_min_size():
    lim = RateLimiter(2.0, min_size=10, tolerance=50)
    for _ in range(9):
        lim.insert()
    assert not lim.can_sample(4, stored=9)
    lim.insert()
    assert lim.can_sample(4, stored=10)


def _prioritised(priorities, alpha=0.9, beta=0.6, capacity=100):
    buf = PrioritisedSequenceBuffer(capacity, 10**9, alpha=alpha, beta=beta)
    keys = [buf.add(_seq(), i).key for i in range(len(priorities))]
    buf.update_priorities(np.array(keys), np.array(priorities, float))
    return buf, keys


def test_prioritised_sampling_frequencies_match_priorities_to_the_alpha():
    priorities = [0.1, 0.5, 1.0, 2.0, 4.0]
    buf, _ = _prioritised(priorities, alpha=0.7)
    rng = np.random.default_rng(1)
    counts = np.zeros(len(priorities))
    for _ in range(4000):
        for it in buf.sample(8, rng).items:
            counts[it.param_version] += 1
    expected = np.array(priorities) ** 0.7 / sum(p ** 0.7 for p in priorities)
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.01)


def test_importance_weights_by_hand():
    """P = p^a / sum p^a; w = (n P)^-b / max w. Priorities 1 and 3 with a = 1, b = 0.5:
    P = (0.25, 0.75); n P = (0.5, 1.5); w = (0.5^-0.5, 1.5^-0.5) / 0.5^-0.5 = (1, sqrt(1/3))."""
    buf, _ = _prioritised([1.0, 3.0], alpha=1.0, beta=0.5)
    np.testing.assert_allclose(buf.probabilities(), [0.25, 0.75])
    rng = np.random.default_rng(0)
    for _ in range(200):
        sample = buf.sample(2, rng)
        if {it.param_version for it in sample.items} == {0, 1}:
            break
    weights = {it.param_version: float(w) for it, w in zip(sample.items, sample.weights, strict=True)}
    assert weights == {0: pytest.approx(1.0), 1: pytest.approx(np.sqrt(1 / 3), rel=1e-5)}


def test_new_sequences_enter_at_the_max_priority_and_evicted_keys_are_ignored():
    buf, keys = _prioritised([0.5, 7.0, 2.0], capacity=3)
    newest = buf.add(_seq(), 3)            # evicts key 0
    assert newest.priority == 7.0
    assert buf.update_priorities(np.array([keys[0], newest.key]), np.array([9.0, 0.0])) == 1
    assert newest.priority == buf.min_priority   # a zero TD error still leaves it a chance
    assert SequenceBuffer(3, 10**9).update_priorities(np.array([0]), np.array([1.0])) == 0
