"""NGU's pieces (lbc.ngu) against the paper's formulas, the digest's verified table and hand values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lbc.losses import (
    ngu_q_loss,
    retrace_targets,
    transformed_retrace_targets,
    value_rescale,
    value_rescale_inverse,
)
from lbc.ngu import (
    EpisodicMemories,
    IntrinsicRewards,
    RunningMeanStd,
    actor_epsilons,
    core_inputs,
    environment_epsilons,
    environment_mixtures,
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


def _h(z, eps=1e-3):
    return np.sign(z) * (np.sqrt(np.abs(z) + 1.0) - 1.0) + eps * z


def test_h_inverse_is_the_exact_inverse() -> None:
    x = torch.tensor(np.concatenate([-np.logspace(-3, 5, 50), [0.0], np.logspace(-3, 5, 50)]))
    torch.testing.assert_close(value_rescale_inverse(value_rescale(x)), x, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(value_rescale(value_rescale_inverse(x)), x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(value_rescale(x).numpy(), _h(x.numpy()), rtol=1e-12)
    # the printed form (no square) does not invert h: h^-1(h(100)) would be about 9
    eps, z = 1e-3, _h(np.array(100.0))
    printed = np.sign(z) * ((np.sqrt(1 + 4 * eps * (abs(z) + 1 + eps)) - 1) / (2 * eps) - 1)
    assert abs(float(printed) - 100.0) > 50


def _one(memory: EpisodicMemories, embedding: list[float]) -> float:
    """The reward of one embedding in a single memory."""
    return float(memory.rewards(np.array([embedding], np.float32))[0])


def test_episodic_reward_by_hand() -> None:
    mem = EpisodicMemories(1, capacity=100, dim=1, k=10)
    assert _one(mem, [0.0]) == 0.0          # empty memory: no evidence
    # one neighbour at squared distance 1; d_m^2 = 1; d_n = 1 - xi; K = eps / (d_n + eps)
    k_v = 1e-3 / ((1.0 - 8e-3) + 1e-3)
    assert _one(mem, [1.0]) == pytest.approx(1.0 / (math.sqrt(k_v) + 1e-3))
    # query 0.5: neighbours at squared distances 0.25 and 0.25; running mean of (1, 0.25, 0.25) = 0.5
    d_n = np.maximum(np.array([0.25, 0.25]) / 0.5 - 8e-3, 0.0)
    s = math.sqrt(float((1e-3 / (d_n + 1e-3)).sum())) + 1e-3
    assert _one(mem, [0.5]) == pytest.approx(1.0 / s)


def test_identical_neighbours_cluster_and_the_similarity_cut_off() -> None:
    mem = EpisodicMemories(1, capacity=100, dim=4, k=10)
    e = [1.0] * 4
    for _ in range(11):
        _one(mem, e)
    mem.mean_sq_dist[0] = 1.0
    # ten neighbours at distance 0: K = 1 each, s = sqrt(10) + c
    assert _one(mem, e) == pytest.approx(1.0 / (math.sqrt(10) + 1e-3))
    strict = EpisodicMemories(1, capacity=100, dim=4, k=10, max_similarity=2.0)
    for _ in range(11):
        _one(strict, e)
    assert _one(strict, e) == 0.0
    strict.reset([0])
    assert strict.sizes[0] == 0 and _one(strict, e) == 0.0


def _episodic_rewards_by_loop(embeddings: np.ndarray, capacity: int, k: int, eps: float = 1e-3, c: float = 1e-3,
                              xi: float = 8e-3, s_max: float = 8.0, starts: np.ndarray | None = None) -> list[float]:
    """NGU Alg. 1 as a plain loop over one environment's embeddings: each scored against the last `capacity` before
    it since its episode's start (`starts`: where an episode starts, none by default), the squared distances summed
    coordinate by coordinate in float64, then stored; the mean of the k-NN distances kept across episodes."""
    stored: list[np.ndarray] = []
    total, count, out = 0.0, 0, []
    for t, f in enumerate(embeddings.astype(np.float64)):
        if starts is not None and starts[t]:
            stored = []
        if not stored:
            out.append(0.0)
        else:
            sq = sorted(sum((m[i] - f[i]) ** 2 for i in range(len(f))) for m in stored)[:k]
            for d in sq:   # the running mean of every k-NN squared distance so far
                count += 1
                total += d
            mean = total / count
            s = math.sqrt(sum(eps / (max(d / mean - xi, 0.0) + eps) for d in sq)) + c
            out.append(0.0 if s > s_max else 1.0 / s)
        stored = (stored + [f])[-capacity:]
    return out


def test_episodic_rewards_match_a_plain_loop_over_the_memory() -> None:
    """The memory's distances by norms and one product (decision 93) against Alg. 1 as a loop: random embeddings of
    an embedding network's scale, repeats among them (distance 0, where the product's rounding would go below 0),
    the ring wrapping, and a far-off embedding (norm 100) among near ones."""
    rng = np.random.default_rng(3)
    embeddings = rng.standard_normal((90, 8)).astype(np.float32)
    embeddings[40:50] = embeddings[30]          # ten repeats
    embeddings[60] = embeddings[61] = 100.0 * embeddings[59] / np.linalg.norm(embeddings[59])
    embeddings[70:] = embeddings[70:] * 1e-2 + 3.0   # close together far from the origin
    mem = EpisodicMemories(1, capacity=25, dim=8, k=5)
    got = [_one(mem, e) for e in embeddings]
    np.testing.assert_allclose(got, _episodic_rewards_by_loop(embeddings, capacity=25, k=5), rtol=2e-4, atol=1e-6)
    assert len(set(np.round(got, 6))) > 40   # the rewards vary, so the comparison can tell


def test_memories_score_each_environment_as_its_own_loop() -> None:
    """Several environments at once, each against Alg. 1's loop over its own embeddings: episodes
    starting at different steps, so that the memories hold different numbers of embeddings (empty, fewer than k,
    more than k, a full ring), and one environment whose episode starts every step."""
    rng = np.random.default_rng(5)
    steps, envs, capacity, k = 60, 5, 12, 4
    embeddings = rng.standard_normal((steps, envs, 6)).astype(np.float32)
    embeddings[20:30, 2] = embeddings[19, 2]    # repeats in one environment
    starts = rng.random((steps, envs)) < 0.06
    starts[0] = True
    starts[:, 4] = True
    mem = EpisodicMemories(envs, capacity=capacity, dim=6, k=k)
    got = []
    for t in range(steps):
        mem.reset(starts[t])
        got.append(mem.rewards(embeddings[t]))
    got = np.array(got)
    for e in range(envs):
        expected = _episodic_rewards_by_loop(embeddings[:, e], capacity, k, starts=starts[:, e])
        np.testing.assert_allclose(got[:, e], expected, rtol=2e-4, atol=1e-6, err_msg=f"environment {e}")
    assert (got[:, 4] == 0).all() and len(set(np.round(got[:, :4].ravel(), 6))) > 100
    assert np.ptp(mem.sizes[:4]) > 0   # the memories held different numbers of embeddings


def test_memory_is_a_ring_buffer() -> None:
    mem = EpisodicMemories(1, capacity=3, dim=1, k=2)
    for v in range(5):
        _one(mem, [float(v)])
    assert mem.sizes[0] == 3 and sorted(mem.slots[0, :, 0].tolist()) == [2.0, 3.0, 4.0]


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


def test_transformed_retrace_against_the_explicit_sum_of_eq_12_and_14() -> None:
    """y_t = h(h^-1 Q(x_t,a_t) + sum_s gamma^{s-t} (prod_{i=t+1}^{s} c_i) delta^h_s), summed by a plain loop."""
    rng = np.random.default_rng(0)
    steps, batch, actions = 6, 3, 4
    q_taken = rng.normal(0, 30, (steps, batch))
    q_next = rng.normal(0, 30, (steps, batch, actions))
    pi_next = rng.dirichlet(np.ones(actions), (steps, batch))
    rewards = rng.normal(0, 5, (steps, batch))
    discounts = np.where(rng.random((steps, batch)) < 0.1, 0.0, 0.997)
    c = rng.uniform(0, 1, (steps, batch))

    def h_inv(z, eps=1e-3):
        return np.sign(z) * (((np.sqrt(1 + 4 * eps * (np.abs(z) + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1)

    z_next = (pi_next * h_inv(q_next)).sum(-1)
    expected = np.zeros((steps, batch))
    for t in range(steps):
        total = h_inv(q_taken[t])
        for s in range(t, steps):
            weight = np.ones(batch)
            for i in range(t, s):          # gamma_i c_{i+1} for each step between t and s
                weight = weight * discounts[i] * c[i + 1]
            delta = rewards[s] + discounts[s] * z_next[s] - h_inv(q_taken[s])
            total = total + weight * delta
        expected[t] = _h(total)
    got = transformed_retrace_targets(*(torch.tensor(x) for x in (q_taken, q_next, pi_next, rewards, discounts, c)))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-9)


def test_transformed_retrace_equals_retrace_where_h_cancels() -> None:
    """One step, zero reward, gamma = 1 and a one-hot pi: y = h(h^-1(Q'(a*))) = Q'(a*), the plain target."""
    q_next = torch.tensor([[[3.0, 40.0]]], dtype=torch.float64)
    pi = torch.tensor([[[0.0, 1.0]]], dtype=torch.float64)
    y = transformed_retrace_targets(torch.tensor([[7.0]], dtype=torch.float64), q_next, pi,
                                    torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
                                    torch.ones(1, 1, dtype=torch.float64))
    plain = retrace_targets(torch.tensor([[7.0]], dtype=torch.float64), torch.tensor([[40.0]], dtype=torch.float64),
                            torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
                            torch.ones(1, 1, dtype=torch.float64))
    torch.testing.assert_close(y, plain)


def test_actor_epsilons_follow_ape_x() -> None:
    eps = actor_epsilons(8)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert eps[3] == pytest.approx(0.4 ** (1 + 7 * 3 / 7))
    assert actor_epsilons(1).tolist() == [0.4]


def test_intrinsic_rewards_keep_one_memory_per_environment_and_reset_it() -> None:
    """Env 0 sees the same embedding again (not novel); env 1 starts a new episode each step, so its
    memory is always empty and its reward 0 (decision 21); RND errors above their running mean amplify."""
    rewards = IntrinsicRewards(num_envs=2, capacity=100, dim=2, k=2)
    same = np.array([[0.0, 0.0], [5.0, 5.0]], np.float32)
    first = rewards.step(same, np.array([1.0, 1.0]), np.array([True, True]))
    assert first.tolist() == [0.0, 0.0]
    far = np.array([[3.0, 4.0], [5.0, 5.0]], np.float32)
    second = rewards.step(far, np.array([1.0, 1.0]), np.array([False, True]))
    # env 0: one neighbour at squared distance 25 = the running mean: d_n = 1, K = eps / (1 - xi + eps)
    k_v = 1e-3 / (1.0 - 8e-3 + 1e-3)
    assert second[0] == pytest.approx(1.0 / (math.sqrt(k_v) + 1e-3)) and second[1] == 0.0
    assert rewards.memories.sizes.tolist() == [2, 1]
    # step 3, env 1: one neighbour ([5, 5]) at squared distance 32, its memory's first distance, so
    # d_n = 1 again; the errors so far [1, 1, 1, 1, 3, 3] give alpha = 1 + (3 - 5/3) / sqrt(8/9) for 3
    third = rewards.step(np.array([[0.0, 0.0], [1.0, 1.0]], np.float32), np.array([3.0, 3.0]), np.array([False, False]))
    alpha = 1.0 + (3.0 - 5.0 / 3.0) / math.sqrt(8.0 / 9.0)
    assert third[1] == pytest.approx(second[0] * alpha)


def test_ngu_q_loss_targets_and_traces_by_hand() -> None:
    """Two steps, two actions, float64. pi = eps-greedy(0.01) on the online Q; values from the target
    network; c_t = 0.95 min(1, pi/mu); y = transformed Retrace; loss 0.5 (Q - y)^2."""
    d = torch.float64
    q_online = torch.tensor([[[1.0, 2.0]], [[3.0, 0.0]], [[0.0, 5.0]]], dtype=d)   # [T+1=3, B=1, A=2]
    q_target = torch.tensor([[[1.5, 2.5]], [[2.0, 1.0]], [[4.0, 6.0]]], dtype=d)
    actions = torch.tensor([[1], [0]])
    mu = torch.tensor([[0.5], [0.8]], dtype=d)
    rewards = torch.tensor([[1.0], [2.0]], dtype=d)
    disc = torch.tensor([[0.99], [0.99]], dtype=d)
    out = ngu_q_loss(q_online, q_target, actions, mu, rewards, disc)

    pi = lambda best: np.array([0.995, 0.005]) if best == 0 else np.array([0.005, 0.995])  # noqa: E731
    pi1, pi2 = pi(0), pi(1)                          # online argmax at x_1 is action 0, at x_2 action 1
    hinv = lambda z: float(value_rescale_inverse(torch.tensor(z, dtype=d)))  # noqa: E731
    h = lambda z: float(value_rescale(torch.tensor(z, dtype=d)))  # noqa: E731
    c1 = 0.95 * min(1.0, pi1[0] / 0.8)               # trace of step 1 (action 0 taken at x_1)
    z2 = pi2 @ np.array([hinv(4.0), hinv(6.0)])
    z1 = pi1 @ np.array([hinv(2.0), hinv(1.0)])
    g1 = 2.0 + 0.99 * z2
    g0 = 1.0 + 0.99 * (z1 + c1 * (g1 - hinv(2.0)))
    y = np.array([h(g0), h(g1)])
    q_taken = np.array([2.0, 3.0])
    np.testing.assert_allclose(out.loss[:, 0].numpy(), 0.5 * (q_taken - y) ** 2, rtol=1e-10)
    np.testing.assert_allclose(out.abs_td[:, 0].numpy(), np.abs(y - q_taken), rtol=1e-10)


def test_environments_cover_the_family_and_the_exploitative_member_acts_most_greedily() -> None:
    """Environment e of actor i is NGU's actor i*E + e: j = (i*E + e) mod N; epsilons run over the
    actor's environments largest last, so with E = N the member j = 0 has the smallest epsilon."""
    np.testing.assert_array_equal(environment_mixtures(0, 4, 8), [0, 1, 2, 3])
    np.testing.assert_array_equal(environment_mixtures(1, 4, 8), [4, 5, 6, 7])
    np.testing.assert_array_equal(environment_mixtures(1, 8, 6), [2, 3, 4, 5, 0, 1, 2, 3])
    eps = environment_epsilons(16)
    np.testing.assert_allclose(eps, actor_epsilons(16)[::-1])
    assert eps[0] == pytest.approx(0.4 ** 8) and eps[-1] == pytest.approx(0.4)


def test_core_inputs_are_one_hot_j_and_the_intrinsic_reward() -> None:
    x = core_inputs(torch.tensor([[2, 0]]), torch.tensor([[0.5, 1.25]]), 3)
    assert x.shape == (1, 2, 4)
    np.testing.assert_allclose(x[0].numpy(), [[0, 0, 1, 0.5], [1, 0, 0, 1.25]])
