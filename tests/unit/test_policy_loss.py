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


def loss(x: dict[str, torch.Tensor], tau: float | None = None, **kw):
    """lbc_policy_loss with pi = softmax(A), or DiCE's softmax(tau A) with the 1/tau gradient scale."""
    if tau is None:
        return lbc_policy_loss(**{**x, "log_pi": torch.log_softmax(x["adv"], -1)}, **kw)
    return lbc_policy_loss(**{**x, "log_pi": torch.log_softmax(tau * x["adv"], -1)},
                           pg_scale=torch.full((T, B), 1.0 / tau), **kw)


def test_unit_temperature_is_the_plain_loss() -> None:
    x = inputs()
    plain = loss(x, scales=SCALES)
    ones = loss(x, 1.0, scales=SCALES)
    for name in ("total", "v", "q", "pi", "entropy"):
        assert torch.allclose(getattr(plain, name), getattr(ones, name)), name


@pytest.mark.parametrize("tau", [0.1, 1.0, 7.0, 50.0])
def test_temperature_scaled_gradient_is_advantage_times_e_a_minus_pi(tau: float) -> None:
    """d(pi loss)/dA_t = -(1/(T B)) adv_t (e_{a_t} - softmax(tau A_t)): the step does not grow with tau."""
    x = inputs(1)
    adv = x["adv"].clone().requires_grad_(True)
    scales = LossScales(v=0.0, q=0.0, pi=1.0, entropy=0.0, rho_bar=1.05, c_bar=1.05, lam=1.0)
    out = loss({**x, "adv": adv}, tau, scales=scales)
    out.total.backward()

    # the V-trace advantage, recomputed with a numpy loop from IMPALA eq. (1) for pi = softmax(tau A)
    a = x["adv"].numpy().astype(np.float64)
    pi = np.exp(tau * a - (tau * a).max(-1, keepdims=True))
    pi /= pi.sum(-1, keepdims=True)
    acts, mu = x["actions"].numpy(), x["behaviour_prob"].numpy()
    v, r, disc = x["value"].numpy(), x["rewards"].numpy(), x["discounts"].numpy()
    vs, clipped = _vtrace_numpy(v, pi, acts, mu, r, disc, 1.05)
    pg_adv = clipped * (r + disc * vs[1:] - v[:-1])
    onehot = np.eye(A)[acts]
    expected = np.zeros_like(a)
    expected[:-1] = -(pg_adv[..., None] * (onehot - pi[:-1])) / (T * B)
    np.testing.assert_allclose(adv.grad.numpy(), expected, rtol=1e-4, atol=1e-6)


def _vtrace_numpy(v, pi, actions, mu, rewards, discounts, bar):
    """IMPALA eq. (1) by a plain loop, rho_bar = c_bar = bar, lambda 1: v_s [T+1] (v_T = V(x_T)) and the
    clipped rho_s."""
    steps = actions.shape[0]
    clipped = np.minimum(np.take_along_axis(pi[:-1], actions[..., None], -1)[..., 0] / mu, bar)
    vs = np.zeros_like(v)
    vs[steps] = v[steps]
    for t in reversed(range(steps)):
        vs[t] = (v[t] + clipped[t] * (rewards[t] + discounts[t] * v[t + 1] - v[t])
                 + discounts[t] * clipped[t] * (vs[t + 1] - v[t + 1]))
    return vs, clipped


def test_temperature_sets_the_evaluated_policy() -> None:
    """With a large tau the target policy is near greedy: V-trace's rho uses softmax(tau A), not softmax(A)."""
    x = inputs(2)
    x["behaviour_prob"] = torch.full((T, B), 1.0 / A)
    low = loss(x, 1e-3, scales=SCALES)
    plain = loss(x, scales=SCALES)
    # tau -> 0: the target policy is uniform, equal to mu, so every rho is 1: the entropy is log |A|
    assert float(low.entropy) == pytest.approx(np.log(A), abs=1e-4)
    assert float(plain.entropy) < np.log(A) - 1e-3


def test_importance_weights_scale_each_sequence() -> None:
    x = inputs(3)
    per_seq = [loss({k: v[:, b:b + 1] for k, v in x.items()}, scales=SCALES) for b in range(B)]
    weights = torch.tensor([2.0, 0.0, 0.5])
    weighted = loss(x, scales=SCALES, weights=weights)
    for term in ("v", "q", "pi"):
        expected = sum(float(w) * float(getattr(loss, term)) for w, loss in zip(weights, per_seq, strict=True)) / B
        assert float(getattr(weighted, term)) == pytest.approx(expected, rel=1e-5), term
    # the entropy is not weighted
    assert float(weighted.entropy) == pytest.approx(float(loss(x, scales=SCALES).entropy))


def _retrace_numpy(q, pi, actions, mu, rewards, discounts, c_bar):
    """Munos et al. 2016 by a plain loop:
    G_t = r_t + g_t (E_pi Q(x_{t+1}) + c_{t+1} (G_{t+1} - Q(x_{t+1}, a_{t+1})))."""
    steps, batch = actions.shape
    q_taken = np.take_along_axis(q[:-1], actions[..., None], -1)[..., 0]
    pi_taken = np.take_along_axis(pi[:-1], actions[..., None], -1)[..., 0]
    c = np.minimum(c_bar, pi_taken / mu)
    expected = (pi * q).sum(-1)
    g = np.zeros((steps, batch))
    for t in reversed(range(steps)):
        g[t] = rewards[t] + discounts[t] * expected[t + 1]
        if t + 1 < steps:
            g[t] += discounts[t] * c[t + 1] * (g[t + 1] - q_taken[t + 1])
    return g, q_taken


@pytest.mark.parametrize("centre", [False, True])
def test_q_loss_against_numpy_retrace_with_and_without_gdi_centring(centre: bool) -> None:
    """LBC: Q = V + A; GDI App. F eq. 9: Q = V + A - E_pi[A], so that E_pi Q = V."""
    x = inputs(4)
    mix = torch.softmax(torch.randn(T + 1, B, A, generator=torch.Generator().manual_seed(7)), -1)
    scales = LossScales(v=0.0, q=1.0, pi=0.0, entropy=0.0, rho_bar=1.05, c_bar=1.05, lam=1.0)
    out = lbc_policy_loss(**x, log_pi=mix.log(), scales=scales, centre_q=centre)

    a, v, pi = x["adv"].numpy().astype(np.float64), x["value"].numpy(), mix.numpy().astype(np.float64)
    if centre:
        a = a - (pi * a).sum(-1, keepdims=True)
        np.testing.assert_allclose((pi * (v[..., None] + a)).sum(-1), v, rtol=1e-5, atol=1e-5)
    g, q_taken = _retrace_numpy(v[..., None] + a, pi, x["actions"].numpy(), x["behaviour_prob"].numpy(),
                                x["rewards"].numpy(), x["discounts"].numpy(), 1.05)
    assert float(out.q) == pytest.approx(float(np.mean(0.5 * (g - q_taken) ** 2)), rel=1e-4)


def test_gradient_flows_through_the_given_target_policy() -> None:
    """The policy gradient is -adv_t d log pi(a_t) for the log pi passed in (GDI: the mixture)."""
    x = inputs(5)
    logits = torch.randn(T + 1, B, A, requires_grad=True)
    scales = LossScales(v=0.0, q=0.0, pi=1.0, entropy=0.0, rho_bar=1.05, c_bar=1.05, lam=1.0)
    out = lbc_policy_loss(**x, log_pi=torch.log_softmax(logits, -1), scales=scales)
    out.total.backward()
    assert logits.grad[-1].abs().max() == 0.0      # the bootstrap row has no policy-gradient term
    assert logits.grad[:-1].abs().max() > 0.0


def _logit_grad(x: dict[str, torch.Tensor], **kw) -> torch.Tensor:
    logits = x["adv"].clone().requires_grad_(True)
    scales = LossScales(v=0.0, q=0.0, pi=1.0, entropy=0.0, rho_bar=1.05, c_bar=1.05, lam=1.0)
    lbc_policy_loss(**{**x, "adv": logits}, log_pi=torch.log_softmax(logits, -1), scales=scales, **kw).total.backward()
    return logits.grad


def test_standardised_advantages_against_numpy() -> None:
    """PPO's normalisation: the gradient is the plain one with each advantage replaced by
    (adv - mean) / std over the batch and time (std with Bessel's correction, as torch.std)."""
    x = inputs(6)
    plain = _logit_grad(x)
    standard = _logit_grad(x, standardise_advantages=True)
    pi = torch.softmax(x["adv"], -1)[:-1].double().numpy()
    onehot = np.eye(A)[x["actions"].numpy()]
    # recover each step's advantage from the plain gradient: grad_t = -adv_t (e_a - pi) / (T B)
    adv = -(plain[:-1].double().numpy() * (onehot - pi)).sum(-1) / ((onehot - pi) ** 2).sum(-1) * (T * B)
    z = (adv - adv.mean()) / adv.std(ddof=1)
    expected = -(z[..., None] * (onehot - pi)) / (T * B)
    np.testing.assert_allclose(standard[:-1].numpy(), expected, rtol=1e-4, atol=1e-6)


def test_standardised_advantages_ignore_the_reward_scale_per_policy() -> None:
    """Rewards and values 100 times larger (or smaller) leave the standardised policy gradient as it was;
    with two problems side by side, each is standardised on its own."""
    x = inputs(7)
    base = _logit_grad(x, standardise_advantages=True)
    for c in (100.0, 0.01):
        scaled = _logit_grad({**x, "rewards": c * x["rewards"], "value": c * x["value"]}, standardise_advantages=True)
        torch.testing.assert_close(scaled, base, rtol=1e-3, atol=1e-6)
    two = {k: torch.stack([v, v], dim=2) for k, v in x.items() if k != "adv"}
    two["adv"] = torch.stack([x["adv"], x["adv"]], dim=2)
    two["rewards"] = torch.stack([x["rewards"], 50.0 * x["rewards"]], dim=2)
    two["value"] = torch.stack([x["value"], 50.0 * x["value"]], dim=2)
    both = _logit_grad(two, standardise_advantages=True)
    torch.testing.assert_close(both[:, :, 0], base, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(both[:, :, 1], base, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("centre", [False, True])
def test_targets_bootstrap_from_the_target_network(centre: bool) -> None:
    """With a target network (theta^-), V-trace's v_s and Retrace's G_t are built from its V and Q; the values
    fitted, the target policy and the policy gradient's baseline V(x_s) stay the online network's."""
    x = inputs(8)
    g = torch.Generator().manual_seed(9)
    target_adv, target_value = torch.randn(T + 1, B, A, generator=g), torch.randn(T + 1, B, generator=g)
    mix = torch.softmax(torch.randn(T + 1, B, A, generator=g), -1)
    scales = LossScales(v=1.0, q=1.0, pi=1.0, entropy=0.0, rho_bar=1.05, c_bar=1.05, lam=1.0)
    out = lbc_policy_loss(**x, log_pi=mix.log(), scales=scales, centre_q=centre, target_adv=target_adv,
                          target_value=target_value)

    pi = mix.numpy().astype(np.float64)
    acts, mu = x["actions"].numpy(), x["behaviour_prob"].numpy()
    r, disc = x["rewards"].numpy(), x["discounts"].numpy()
    v, tv = x["value"].numpy().astype(np.float64), target_value.numpy().astype(np.float64)

    def q_of(values: np.ndarray, adv: np.ndarray) -> np.ndarray:
        return values[..., None] + (adv - (pi * adv).sum(-1, keepdims=True) if centre else adv)

    g_ret, _ = _retrace_numpy(q_of(tv, target_adv.numpy()), pi, acts, mu, r, disc, 1.05)
    q_online = np.take_along_axis(q_of(v, x["adv"].numpy())[:-1], acts[..., None], -1)[..., 0]
    assert float(out.q) == pytest.approx(float(np.mean(0.5 * (g_ret - q_online) ** 2)), rel=1e-4)
    vs, clipped = _vtrace_numpy(tv, pi, acts, mu, r, disc, 1.05)
    assert float(out.v) == pytest.approx(float(np.mean(0.5 * (vs[:-1] - v[:-1]) ** 2)), rel=1e-4)
    log_pi_taken = np.log(np.take_along_axis(pi[:-1], acts[..., None], -1)[..., 0])
    pg_adv = clipped * (r + disc * vs[1:] - v[:-1])
    assert float(out.pi) == pytest.approx(float(np.mean(-log_pi_taken * pg_adv)), rel=1e-4)
    # the online network's own values as the target: the loss without one
    same = lbc_policy_loss(**x, log_pi=mix.log(), scales=scales, centre_q=centre, target_adv=x["adv"],
                           target_value=x["value"])
    plain = lbc_policy_loss(**x, log_pi=mix.log(), scales=scales, centre_q=centre)
    for term in ("total", "v", "q", "pi"):
        assert torch.allclose(getattr(same, term), getattr(plain, term)), term
