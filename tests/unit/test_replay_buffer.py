import numpy as np
import pytest

from replay_svc.buffer import RateLimiter, SequenceBuffer


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
        items = buf.sample(4, rng)
        assert len({it.param_version for it in items}) == 4
        for it in items:
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
