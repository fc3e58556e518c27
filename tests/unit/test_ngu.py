"""NGU's pieces (lbc.ngu) against the paper's formulas, the digest's verified table and hand values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lbc.ngu import (
    EpisodicMemory,
    RunningMeanStd,
    h,
    h_inverse,
    intrinsic_reward,
    lifelong_modulator,
    mixture_family,
    policy_index,
)


@pytest.mark.parametrize("j,beta,gamma", [
    (0, 0.0, 0.997), (1, 2.65e-5, 0.99688), (5, 3.8e-4, 0.99636), (10, 0.01033, 0.99558), (15, 0.15, 0.99463),
    (20, 0.28967, 0.99348), (25, 0.29962, 0.99208), (30, 0.29999, 0.99038), (31, 0.3, 0.99),
])
def test_beta_gamma_family_for_n_32(j: int, beta: float, gamma: float) -> None:
    b, g = mixture_family(32)[j]
    assert b == pytest.approx(beta, rel=2e-2, abs=1e-6)
    assert g == pytest.approx(gamma, abs=6e-6)


def test_family_is_monotone_and_actor_assignment_uses_every_member() -> None:
    fam = mixture_family(32)
    betas, gammas = zip(*fam, strict=True)
    assert all(a <= b for a, b in zip(betas, betas[1:], strict=False))
    assert all(a > b for a, b in zip(gammas, gammas[1:], strict=False))
    assert {policy_index(a, 32) for a in range(64)} == set(range(32))


def test_h_inverse_is_the_exact_inverse() -> None:
    x = np.concatenate([-np.logspace(-3, 5, 50), [0.0], np.logspace(-3, 5, 50)])
    np.testing.assert_allclose(h_inverse(h(x)), x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(h(h_inverse(x)), x, rtol=1e-6, atol=1e-6)
    # the printed form (no square) does not invert h: h^-1(h(100)) would be about 9
    eps, z = 1e-3, h(np.array(100.0))
    printed = np.sign(z) * ((np.sqrt(1 + 4 * eps * (abs(z) + 1 + eps)) - 1) / (2 * eps) - 1)
    assert abs(float(printed) - 100.0) > 50


def test_episodic_reward_by_hand() -> None:
    mem = EpisodicMemory(capacity=100, dim=1, k=10)
    assert mem.reward(np.array([0.0], np.float32)) == 0.0          # empty memory: no evidence
    # one neighbour at squared distance 1; d_m^2 = 1; d_n = 1 - xi; K = eps / (d_n + eps)
    k_v = 1e-3 / ((1.0 - 8e-3) + 1e-3)
    assert mem.reward(np.array([1.0], np.float32)) == pytest.approx(1.0 / (math.sqrt(k_v) + 1e-3))
    # query 0.5: neighbours at squared distances 0.25 and 0.25; running mean of (1, 0.25, 0.25) = 0.5
    d_n = np.maximum(np.array([0.25, 0.25]) / 0.5 - 8e-3, 0.0)
    s = math.sqrt(float((1e-3 / (d_n + 1e-3)).sum())) + 1e-3
    assert mem.reward(np.array([0.5], np.float32)) == pytest.approx(1.0 / s)


def test_identical_neighbours_cluster_and_the_similarity_cut_off() -> None:
    mem = EpisodicMemory(capacity=100, dim=4, k=10)
    e = np.ones(4, np.float32)
    for _ in range(11):
        mem.reward(e)
    mem.mean_sq_dist = 1.0
    # ten neighbours at distance 0: K = 1 each, s = sqrt(10) + c
    assert mem.reward(e) == pytest.approx(1.0 / (math.sqrt(10) + 1e-3))
    strict = EpisodicMemory(capacity=100, dim=4, k=10, max_similarity=2.0)
    for _ in range(11):
        strict.reward(e)
    assert strict.reward(e) == 0.0
    strict.reset()
    assert strict.size == 0 and strict.reward(e) == 0.0


def test_memory_is_a_ring_buffer() -> None:
    mem = EpisodicMemory(capacity=3, dim=1, k=2)
    for v in range(5):
        mem.reward(np.array([float(v)], np.float32))
    assert mem.size == 3 and sorted(mem.slots[:, 0].tolist()) == [2.0, 3.0, 4.0]


def test_rnd_normalisation_and_clipping() -> None:
    rng = np.random.default_rng(0)
    errs = rng.gamma(2.0, 1.5, size=5000)
    stats = RunningMeanStd()
    stats.update(errs)
    assert stats.mean == pytest.approx(errs.mean()) and stats.std == pytest.approx(errs.std())
    alpha = lifelong_modulator(np.array([errs.mean(), errs.mean() + 2 * errs.std()]), stats)
    np.testing.assert_allclose(alpha, [1.0, 3.0])
    np.testing.assert_allclose(intrinsic_reward(np.array([2.0, 2.0, 2.0]), np.array([0.2, 3.0, 9.0])),
                               [2.0, 6.0, 10.0])     # min(max(alpha, 1), L = 5)
