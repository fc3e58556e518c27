"""Behaviour mappings F_psi: from the N policies' advantages to one behaviour policy mu_psi.

LBC eq. (10) / (18): mu_psi(a|s) = sum_i omega_i * softmax(tau_i * A_i(s, .))(a), psi = (tau, omega).
LBC App. D eq. (17): the epsilon-greedy family, mu = sum_i omega_i * eps_i-greedy(A_i).

The mixture runs over behaviour *components*; component k uses policy head `heads[k]`. LBC has one
component per policy. GDI (App. F eq. 10, 12) has two, mu = eps softmax(A_1/tau_1) + (1 - eps)
softmax(A_2/tau_2), i.e. tau = (1/tau_1, 1/tau_2) and omega = (eps, 1 - eps), on one head twice
(GDI-I3) or on two heads (GDI-H3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lbc.psi import Psi


@dataclass
class EpisodeBehaviour:
    """What an episode is played with, as the meta-controller (bandit_svc) or the local default chose it."""

    episode_id: str          # "" when chosen locally (bandit unreachable or no control)
    psi: Psi
    mixture: int | None = None   # NGU's j chosen by Agent57's meta-controller; None: the environment's own


def boltzmann_mixture(adv: torch.Tensor, tau: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """mu(a) = sum_i omega_i softmax(tau_i * A_i)(a).

    adv: [..., N, A] advantages (policy logits); tau, omega: [..., N] with omega summing to 1.
    Returns [..., A]. tau -> 0 gives the uniform policy, tau -> inf the greedy one.
    """
    per_policy = torch.softmax(tau.unsqueeze(-1) * adv, dim=-1)
    return (omega.unsqueeze(-1) * per_policy).sum(dim=-2)


def log_boltzmann_mixture(adv: torch.Tensor, tau: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """log mu(a) of boltzmann_mixture, computed as logsumexp_i(log omega_i + log_softmax(tau_i A_i)) so
    that it stays finite and differentiable where a component's probability underflows; a zero
    weight omega_i drops its component. The learner's target policy for GDI (App. F eq. 10, 12)."""
    log_components = torch.log_softmax(tau.unsqueeze(-1) * adv, dim=-1)
    return torch.logsumexp(torch.log(omega).unsqueeze(-1) + log_components, dim=-2)


def epsilon_greedy(q: torch.Tensor, epsilon: torch.Tensor | float) -> torch.Tensor:
    """pi(a) = (1 - eps) 1[a = argmax_b q(b)] + eps / |A| over the last axis; epsilon broadcasts
    against q[..., :1]."""
    greedy = torch.nn.functional.one_hot(q.argmax(dim=-1), q.shape[-1]).to(q.dtype)
    return (1.0 - epsilon) * greedy + epsilon / q.shape[-1]


def epsilon_greedy_mixture(adv: torch.Tensor, epsilon: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """mu(a) = sum_i omega_i [(1 - eps_i) 1[a = argmax A_i] + eps_i / |A|]."""
    per_policy = epsilon_greedy(adv, epsilon.unsqueeze(-1))
    return (omega.unsqueeze(-1) * per_policy).sum(dim=-2)


def behaviour_probs(family: str, adv: torch.Tensor, psi_a: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """Dispatch on the configured family; psi_a is tau (Boltzmann) or epsilon (epsilon-greedy)."""
    if family == "boltzmann_mixture":
        return boltzmann_mixture(adv, psi_a, omega)
    if family == "epsilon_greedy_mixture":
        return epsilon_greedy_mixture(adv, psi_a, omega)
    raise ValueError(f"unknown behaviour family {family!r}")


def sample_actions(probs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one action per row of probs [B, A]; return (actions [B], mu(a|s) [B])."""
    actions = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return actions, probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
