"""Retrace (Munos et al. 2016) against hand-derived values and the sum-form definition."""

import numpy as np
import torch

from lbc.losses import retrace_targets


def test_retrace_hand_derived_two_steps():
    # G_1 = r_1 + g E_1 = -1 + 0.9 * 0.5 = -0.55
    # G_0 = r_0 + g (E_0 + c_1 (G_1 - Q_1)) = 1 + 0.9 * (1.5 + 0.8 * (-0.55 - 2.0)) = 0.514
    q_taken = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    expected_next = torch.tensor([[1.5], [0.5]], dtype=torch.float64)
    rewards = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    discounts = torch.full((2, 1), 0.9, dtype=torch.float64)
    traces = torch.tensor([[0.5], [0.8]], dtype=torch.float64)
    got = retrace_targets(q_taken, expected_next, rewards, discounts, traces).numpy().ravel()
    np.testing.assert_allclose(got, [0.514, -0.55], rtol=1e-12)


def test_retrace_episode_end_cuts_the_trace():
    q_taken = torch.tensor([[3.0], [4.0]], dtype=torch.float64)
    expected_next = torch.tensor([[10.0], [10.0]], dtype=torch.float64)
    rewards = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    discounts = torch.tensor([[0.0], [0.9]], dtype=torch.float64)
    got = retrace_targets(q_taken, expected_next, rewards, discounts, torch.ones(2, 1, dtype=torch.float64))
    np.testing.assert_allclose(got.numpy().ravel(), [1.0, 2.0 + 0.9 * 10.0])


def test_retrace_matches_sum_form():
    """Q_ret(x_t, a_t) = Q(x_t, a_t) + sum_{k>=t} (prod_{i=t+1}^{k} gamma_{i-1} c_i) delta_k,
    delta_k = r_k + gamma_k E_pi Q(x_{k+1}, .) - Q(x_k, a_k)."""
    rng = np.random.default_rng(0)
    steps, batch = 6, 3
    q = rng.normal(size=(steps, batch))
    e = rng.normal(size=(steps, batch))
    r = rng.normal(size=(steps, batch))
    g = 0.97 * (rng.random((steps, batch)) > 0.2)
    c = rng.random((steps, batch)) * 1.05
    got = retrace_targets(*(torch.tensor(x) for x in (q, e, r, g, c))).numpy()
    want = np.zeros_like(q)
    for b in range(batch):
        for t in range(steps):
            total = q[t, b]
            weight = 1.0
            for k in range(t, steps):
                if k > t:
                    weight *= g[k - 1, b] * c[k, b]
                total += weight * (r[k, b] + g[k, b] * e[k, b] - q[k, b])
            want[t, b] = total
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_retrace_zero_traces_is_expected_sarsa():
    rng = np.random.default_rng(1)
    q, e, r = (torch.tensor(rng.normal(size=(4, 2))) for _ in range(3))
    g = torch.full((4, 2), 0.9, dtype=torch.float64)
    got = retrace_targets(q, e, r, g, torch.zeros(4, 2, dtype=torch.float64))
    torch.testing.assert_close(got, r + g * e)


def test_a_truncated_step_bootstraps_from_the_cut_episode_and_stops_the_trace():
    """Truncated after step 0: G_0 = r_0 + g * V_last (the caller's expected_q_next[0]), no correction from
    step 1, which starts the next episode; G_1 is untouched. By hand: G_1 = 2 + 0.9 * 10 = 11,
    G_0 = 1 + 0.9 * 4 = 4.6 (untruncated it would be 1 + 0.9 * (4 + 1 * (11 - 3)) = 11.8)."""
    q_taken = torch.tensor([[5.0], [3.0]], dtype=torch.float64)
    expected_next = torch.tensor([[4.0], [10.0]], dtype=torch.float64)
    rewards = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    discounts = torch.full((2, 1), 0.9, dtype=torch.float64)
    traces = torch.ones(2, 1, dtype=torch.float64)
    truncated = torch.tensor([[True], [False]])
    got = retrace_targets(q_taken, expected_next, rewards, discounts, traces, truncated)
    np.testing.assert_allclose(got.numpy().ravel(), [4.6, 11.0])
    plain = retrace_targets(q_taken, expected_next, rewards, discounts, traces)
    np.testing.assert_allclose(plain.numpy().ravel(), [11.8, 11.0])
