"""lbc_policy_loss: the per-policy loss, and its target-policy temperature option against DiCE's
statement that the temperature-scaled policy gradient is A_t (e_a - pi_tau) at every tau."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lbc.losses import LossScales, lbc_policy_loss

SCALES = LossScales(v=1.0, q=5.0, pi=5.0, entropy=0.0, rho_bar=1.05, c_bar=1.05, lam=1.0)
T, B, A = 5, 3, 4


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "adv": torch.randn(T + 1, B, A, generator=g),
        "value": torch.randn(T + 1, B, generator=g),
        "actions": torch.randint(0, A, (T, B), generator=g),
        "behaviour_prob": torch.rand(T, B, generator=g) * 0.5 + 0.25,
        "rewards": torch.randn(T, B, generator=g),
        "discounts": torch.full((T, B), 0.99),
    }


def test_unit_temperature_is_the_plain_loss() -> None:
    x = inputs()
    plain = lbc_policy_loss(**x, scales=SCALES)
    ones = lbc_policy_loss(**x, scales=SCALES, inv_temperature=torch.ones(T + 1, B))
    for name in ("total", "v", "q", "pi", "entropy"):
        assert torch.allclose(getattr(plain, name), getattr(ones, name)), name


@pytest.mark.parametrize("tau", [0.1, 1.0, 7.0, 50.0])
def test_temperature_scaled_gradient_is_advantage_times_e_a_minus_pi(tau: float) -> None:
    """d(pi loss)/dA_t = -(1/(T B)) adv_t (e_{a_t} - softmax(tau A_t)): the step does not grow with tau."""
    x = inputs(1)
    adv = x["adv"].clone().requires_grad_(True)
    scales = LossScales(v=0.0, q=0.0, pi=1.0, entropy=0.0, rho_bar=1.05, c_bar=1.05, lam=1.0)
    out = lbc_policy_loss(**{**x, "adv": adv}, scales=scales, inv_temperature=torch.full((T + 1, B), tau))
    out.total.backward()

    # the V-trace advantage, recomputed with a numpy loop from IMPALA eq. (1) for pi = softmax(tau A)
    a = x["adv"].numpy().astype(np.float64)
    pi = np.exp(tau * a - (tau * a).max(-1, keepdims=True))
    pi /= pi.sum(-1, keepdims=True)
    acts, mu = x["actions"].numpy(), x["behaviour_prob"].numpy()
    v, r, disc = x["value"].numpy(), x["rewards"].numpy(), x["discounts"].numpy()
    rho = np.take_along_axis(pi[:-1], acts[..., None], -1)[..., 0] / mu
    clipped = np.minimum(rho, 1.05)
    vs = np.zeros((T + 1, B))
    vs[T] = v[T]
    for t in reversed(range(T)):
        vs[t] = v[t] + clipped[t] * (r[t] + disc[t] * v[t + 1] - v[t]) + disc[t] * clipped[t] * (vs[t + 1] - v[t + 1])
    pg_adv = clipped * (r + disc * vs[1:] - v[:-1])
    onehot = np.eye(A)[acts]
    expected = np.zeros_like(a)
    expected[:-1] = -(pg_adv[..., None] * (onehot - pi[:-1])) / (T * B)
    np.testing.assert_allclose(adv.grad.numpy(), expected, rtol=1e-4, atol=1e-6)


def test_temperature_sets_the_evaluated_policy() -> None:
    """With a large tau the target policy is near greedy: V-trace's rho uses softmax(tau A), not softmax(A)."""
    x = inputs(2)
    x["behaviour_prob"] = torch.full((T, B), 1.0 / A)
    low = lbc_policy_loss(**x, scales=SCALES, inv_temperature=torch.full((T + 1, B), 1e-3))
    plain = lbc_policy_loss(**x, scales=SCALES)
    # tau -> 0: the target policy is uniform, equal to mu, so every rho is 1: the entropy is log |A|
    assert float(low.entropy) == pytest.approx(np.log(A), abs=1e-4)
    assert float(plain.entropy) < np.log(A) - 1e-3


def test_importance_weights_scale_each_sequence() -> None:
    x = inputs(3)
    per_seq = [lbc_policy_loss(**{k: v[:, b:b + 1] for k, v in x.items()}, scales=SCALES) for b in range(B)]
    weights = torch.tensor([2.0, 0.0, 0.5])
    weighted = lbc_policy_loss(**x, scales=SCALES, weights=weights)
    for term in ("v", "q", "pi"):
        expected = sum(float(w) * float(getattr(loss, term)) for w, loss in zip(weights, per_seq, strict=True)) / B
        assert float(getattr(weighted, term)) == pytest.approx(expected, rel=1e-5), term
    # the entropy is not weighted
    assert float(weighted.entropy) == pytest.approx(float(lbc_policy_loss(**x, scales=SCALES).entropy))
