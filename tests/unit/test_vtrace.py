"""V-trace against a plain numpy loop written from IMPALA eq. (1), and the paper's properties."""

import numpy as np
import pytest
import torch

from lbc.losses import vtrace


def vtrace_reference(values, bootstrap, rewards, discounts, rhos, rho_bar, c_bar, lam=1.0):
    """IMPALA eq. (1), the sum form, one batch column at a time:
    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t,
    delta_t = min(rho_bar, rho_t) (r_t + gamma_t V(x_{t+1}) - V(x_t)), c_i = lam min(c_bar, rho_i)."""
    steps, batch = values.shape
    vs = np.zeros_like(values)
    for b in range(batch):
        v_ext = np.append(values[:, b], bootstrap[b])
        for s in range(steps):
            total = v_ext[s]
            for t in range(s, steps):
                weight = 1.0
                for i in range(s, t):
                    weight *= discounts[i, b] * lam * min(c_bar, rhos[i, b])
                delta = min(rho_bar, rhos[t, b]) * (rewards[t, b] + discounts[t, b] * v_ext[t + 1] - v_ext[t])
                total += weight * delta
            vs[s, b] = total
    return vs


def _random_inputs(rng, steps=7, batch=3):
    values = rng.normal(size=(steps, batch))
    bootstrap = rng.normal(size=batch)
    rewards = rng.normal(size=(steps, batch))
    discounts = 0.97 * (rng.random((steps, batch)) > 0.15)   # some episode ends inside the window
    rhos = np.exp(rng.normal(scale=0.7, size=(steps, batch)))
    return values, bootstrap, rewards, discounts, rhos


@pytest.mark.parametrize("rho_bar,c_bar,lam", [(1.0, 1.0, 1.0), (1.05, 1.05, 1.0), (2.0, 1.0, 0.8), (100.0, 0.5, 0.5)])
def test_vtrace_matches_numpy_reference(rho_bar, c_bar, lam):
    rng = np.random.default_rng(0)
    values, bootstrap, rewards, discounts, rhos = _random_inputs(rng)
    got = vtrace(*(torch.tensor(x) for x in (values, bootstrap, rewards, discounts, np.log(rhos))),
                 rho_bar=rho_bar, c_bar=c_bar, lam=lam)
    want = vtrace_reference(values, bootstrap, rewards, discounts, rhos, rho_bar, c_bar, lam)
    np.testing.assert_allclose(got.vs.numpy(), want, rtol=1e-10, atol=1e-10)


def test_vtrace_on_policy_is_n_step_return():
    """IMPALA eq. (2): with pi = mu and c_bar >= 1, v_s = sum_t gamma^{t-s} r_t + gamma^{n} V(x_{s+n})."""
    rng = np.random.default_rng(1)
    steps, batch, gamma = 6, 2, 0.9
    values = rng.normal(size=(steps, batch))
    bootstrap = rng.normal(size=batch)
    rewards = rng.normal(size=(steps, batch))
    discounts = np.full((steps, batch), gamma)
    got = vtrace(torch.tensor(values), torch.tensor(bootstrap), torch.tensor(rewards), torch.tensor(discounts),
                 torch.zeros(steps, batch), rho_bar=1.0, c_bar=1.0).vs.numpy()
    for s in range(steps):
        n = steps - s
        want = sum(gamma ** (t - s) * rewards[t] for t in range(s, steps)) + gamma ** n * bootstrap
        np.testing.assert_allclose(got[s], want, rtol=1e-10)


def test_vtrace_on_policy_with_lambda_is_td_lambda_return():
    """Remark 2: c_i = lam min(c_bar, rho_i); on-policy this is the lambda-return
    G_s = r_s + gamma ((1 - lam) V(x_{s+1}) + lam G_{s+1}), G_T = V(x_T)."""
    rng = np.random.default_rng(2)
    steps, batch, gamma, lam = 8, 3, 0.95, 0.7
    values = rng.normal(size=(steps, batch))
    bootstrap = rng.normal(size=batch)
    rewards = rng.normal(size=(steps, batch))
    got = vtrace(torch.tensor(values), torch.tensor(bootstrap), torch.tensor(rewards),
                 torch.full((steps, batch), gamma, dtype=torch.float64), torch.zeros(steps, batch, dtype=torch.float64),
                 lam=lam).vs.numpy()
    v_ext = np.vstack([values, bootstrap])
    g = bootstrap.copy()
    want = np.zeros_like(values)
    for s in reversed(range(steps)):
        g = rewards[s] + gamma * ((1 - lam) * v_ext[s + 1] + lam * g)
        want[s] = g
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_vtrace_pg_advantage_uses_next_target():
    """Sec. 4.2: the policy gradient advantage is rho_s (r_s + gamma v_{s+1} - V(x_s))."""
    rng = np.random.default_rng(3)
    values, bootstrap, rewards, discounts, rhos = _random_inputs(rng, steps=5, batch=2)
    out = vtrace(*(torch.tensor(x) for x in (values, bootstrap, rewards, discounts, np.log(rhos))),
                 rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0)
    vs_next = np.vstack([out.vs.numpy()[1:], bootstrap])
    want = np.minimum(1.0, rhos) * (rewards + discounts * vs_next - values)
    np.testing.assert_allclose(out.pg_advantages.numpy(), want, rtol=1e-10)


def test_vtrace_zero_discount_stops_bootstrapping():
    values = torch.tensor([[5.0], [7.0]], dtype=torch.float64)
    out = vtrace(values, torch.tensor([100.0], dtype=torch.float64), torch.tensor([[1.0], [2.0]], dtype=torch.float64),
                 torch.tensor([[0.0], [0.0]], dtype=torch.float64), torch.zeros(2, 1, dtype=torch.float64))
    np.testing.assert_allclose(out.vs.numpy().ravel(), [1.0, 2.0])


def test_a_truncated_step_splits_the_window_into_two_vtrace_problems():
    """An episode cut by the frame cap after step k: V-trace over the whole window with (truncated,
    truncation_values) equals the numpy reference run on steps 0..k bootstrapped from the cut episode's
    last value and, apart, on steps k+1..T-1 with the window's own bootstrap; the discount at k stays gamma."""
    rng = np.random.default_rng(5)
    values, bootstrap, rewards, _, rhos = _random_inputs(rng, steps=8, batch=2)
    discounts = np.full_like(values, 0.97)
    k, last_value = 3, np.array([2.5, -1.0])
    truncated = np.zeros(values.shape, bool)
    truncated[k] = True
    truncation_values = np.zeros_like(values)
    truncation_values[k] = last_value
    got = vtrace(*(torch.tensor(x) for x in (values, bootstrap, rewards, discounts, np.log(rhos))),
                 rho_bar=1.05, c_bar=1.0, truncated=torch.tensor(truncated),
                 truncation_values=torch.tensor(truncation_values))
    head = vtrace_reference(values[: k + 1], last_value, rewards[: k + 1], discounts[: k + 1], rhos[: k + 1], 1.05, 1.0)
    tail = vtrace_reference(values[k + 1:], bootstrap, rewards[k + 1:], discounts[k + 1:], rhos[k + 1:], 1.05, 1.0)
    np.testing.assert_allclose(got.vs.numpy(), np.concatenate([head, tail]), rtol=1e-10)
    # the policy-gradient target at k reads the cut episode's value, not the next episode's first v
    expected_pg = np.minimum(1.0, rhos[k]) * (rewards[k] + 0.97 * last_value - values[k])   # pg_rho_bar 1
    np.testing.assert_allclose(got.pg_advantages[k].numpy(), expected_pg, rtol=1e-10)
