"""Off-policy targets and losses: V-trace (IMPALA eq. 1), Retrace (Munos et al. 2016) and the
IMPALA policy gradient, each a pure function over time-major tensors [T, B].

`discounts[t]` is gamma * (1 - done[t]): zero where the episode ended at step t, so nothing is
bootstrapped across an episode boundary inside a sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lbc.behaviour import epsilon_greedy
from lbc.rewards import value_rescale


@dataclass(frozen=True)
class VTraceReturns:
    vs: torch.Tensor             # [T, B] targets v_s for V(x_s)
    pg_advantages: torch.Tensor  # [T, B] rho_s (r_s + gamma v_{s+1} - V(x_s))


def reverse_affine_scan(a: torch.Tensor, b: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """The backward recursion every return target here is built on,

        x_t = b_t + a_t x_{t+1}   for t = T-1 .. 0,   x_T = last,

    over a, b [T, ...] and last [...], in ceil(log2 T) rounds of doubling (the Hillis-Steele scan) instead of
    T steps: step t is the affine map y -> b_t + a_t y, and after the round of stride d, (a_t, b_t) is the
    composition of the maps t .. t+2d-1 (those before T), so that finally x_t = b_t + a_t x_T. The same
    arithmetic in another order (equal within float rounding); on a GPU each step of a loop is a few kernel
    launches, and a learner step ran 976 of them in V-trace's and Retrace's loops (docs/speed.md)."""
    steps, stride = a.shape[0], 1
    while stride < steps:
        b = torch.cat([b[:-stride] + a[:-stride] * b[stride:], b[-stride:]])
        a = torch.cat([a[:-stride] * a[stride:], a[-stride:]])
        stride *= 2
    return b + a * last


@torch.no_grad()
def vtrace(
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    log_rhos: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float = 1.0,
    lam: float = 1.0,
    truncated: torch.Tensor | None = None,
    truncation_values: torch.Tensor | None = None,
) -> VTraceReturns:
    """V-trace targets, IMPALA eq. (1) in its recursive form (Remark 1):

        v_s = V(x_s) + delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1})),
        delta_s V = rho_s (r_s + gamma_s V(x_{s+1}) - V(x_s)),
        rho_s = min(rho_bar, pi/mu),  c_s = lam * min(c_bar, pi/mu)   (Remark 2 for lam).

    values [T, B] are V(x_0..x_{T-1}); bootstrap_value [B] is V(x_T); log_rhos = log pi(a|x) - log mu(a|x).
    The policy-gradient advantage uses q_s = r_s + gamma_s v_{s+1} (sec. 4.2).

    truncated [T, B] (bool, optional) marks steps after which the episode was cut by the frame cap: there
    x_{s+1} is the next episode's start, so V(x_{s+1}) and v_{s+1} are replaced by truncation_values [T, B]
    (the value of the cut episode's last state) and the trace stops; discounts stay gamma there (they are
    0 only where the episode really ended). The result equals V-trace run on the two pieces apart.
    """
    rhos = torch.exp(log_rhos)
    clipped_rhos = torch.clamp(rhos, max=rho_bar)
    cs = lam * torch.clamp(rhos, max=c_bar)
    values_next = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    continuing = discounts
    if truncated is not None:
        values_next = torch.where(truncated, truncation_values, values_next)
        continuing = torch.where(truncated, 0.0, discounts)
    deltas = clipped_rhos * (rewards + discounts * values_next - values)

    vs = reverse_affine_scan(continuing * cs, deltas, torch.zeros_like(bootstrap_value)) + values

    vs_next = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    if truncated is not None:
        vs_next = torch.where(truncated, truncation_values, vs_next)
    pg_rhos = torch.clamp(rhos, max=pg_rho_bar)
    pg_advantages = pg_rhos * (rewards + discounts * vs_next - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


@torch.no_grad()
def retrace_targets(
    q_taken: torch.Tensor,
    expected_q_next: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    traces: torch.Tensor,
    truncated: torch.Tensor | None = None,
) -> torch.Tensor:
    """Retrace targets for Q(x_t, a_t) (Munos et al. 2016, DESIGN §5.1):

        G_t = r_t + gamma_t [ E_pi Q(x_{t+1}, .) + c_{t+1} (G_{t+1} - Q(x_{t+1}, a_{t+1})) ],
        c_t = lam * min(c_bar, pi(a_t|x_t) / mu(a_t|x_t)).

    q_taken [T, B] = Q(x_t, a_t); expected_q_next [T, B] = sum_a pi(a|x_{t+1}) Q(x_{t+1}, a), the
    last row at the bootstrap state x_T; traces [T, B] = c_t. The last step has no correction term
    because a_T is not in the sequence. truncated [T, B] (optional): the episode was cut by the frame cap
    after step t, so the caller's expected_q_next[t] is the cut episode's last state's and no correction
    crosses into the next episode.
    """
    # G_t = b_t + a_t G_{t+1} with a_t = gamma_t c_{t+1} (0 at the last step and where the episode was cut),
    # b_t = r_t + gamma_t E_pi Q(x_{t+1}, .) - a_t Q(x_{t+1}, a_{t+1})
    last = torch.zeros_like(q_taken[-1:])
    a = torch.cat([discounts[:-1] * traces[1:], last])
    if truncated is not None:
        a = torch.where(truncated, 0.0, a)
    b = rewards + discounts * expected_q_next - a * torch.cat([q_taken[1:], last])
    return reverse_affine_scan(a, b, last[0])


def value_rescale_inverse(z: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h^-1(z) = sign(z) (((sqrt(1 + 4 eps (|z| + 1 + eps)) - 1) / (2 eps))^2 - 1), the exact inverse
    of h (lbc.rewards.value_rescale; NGU's printed eq. 17 misses the square; DESIGN §5.3)."""
    return torch.sign(z) * (((torch.sqrt(1.0 + 4.0 * eps * (z.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0)


@torch.no_grad()
def transformed_retrace_targets(
    q_taken: torch.Tensor,
    q_next: torch.Tensor,
    pi_next: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    traces: torch.Tensor,
    eps: float = 1e-3,
) -> torch.Tensor:
    """NGU's transformed Retrace (App. E eq. 12, 14):

        y_t = h( h^-1(Q(x_t, a_t)) + sum_{s >= t} gamma^{s-t} (prod_{i=t+1}^{s} c_i) delta^h_s ),
        delta^h_s = r_s + gamma sum_a pi(a|x_{s+1}) h^-1(Q(x_{s+1}, a)) - h^-1(Q(x_s, a_s)),

    which is Retrace's recursion run on h^-1 of the values, then mapped back by h. q_taken [T, B] =
    Q(x_t, a_t) and q_next [T, B, A] = Q(x_{t+1}, .), both from the target network; pi_next [T, B, A];
    traces [T, B] = c_t.
    """
    z_taken = value_rescale_inverse(q_taken, eps)
    z_next = (pi_next * value_rescale_inverse(q_next, eps)).sum(-1)
    return value_rescale(retrace_targets(z_taken, z_next, rewards, discounts, traces), eps)


@dataclass(frozen=True)
class QLoss:
    loss: torch.Tensor     # [T, B] 0.5 (Q(x_t, a_t) - y_t)^2
    abs_td: torch.Tensor   # [T, B] |y_t - Q(x_t, a_t)|, for priorities


def ngu_q_loss(
    q_online: torch.Tensor,
    q_target: torch.Tensor,
    actions: torch.Tensor,
    behaviour_prob: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    target_epsilon: float = 0.01,
    lam: float = 0.95,
    eps_h: float = 1e-3,
) -> QLoss:
    """NGU's learner loss (App. A, E): transformed Retrace(lambda) from the target network, double-Q.

    q_online, q_target [T+1, B, A] (the last row is the bootstrap state); rewards are the augmented
    r^e + beta_j r^i and discounts gamma_j (1 - done), [T, B]. The target policy is eps-greedy
    (eps = 0.01) on the *online* Q; values come from the target network; traces are
    c_t = lam min(1, pi(a_t|x_t) / mu(a_t|x_t)) (eq. 8).
    """
    pi = epsilon_greedy(q_online.detach(), target_epsilon)                       # [T+1, B, A]
    pi_taken = pi[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    traces = lam * torch.clamp(pi_taken / behaviour_prob.clamp_min(1e-8), max=1.0)
    q_target_taken = q_target[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    targets = transformed_retrace_targets(q_target_taken.detach(), q_target[1:].detach(), pi[1:], rewards,
                                          discounts, traces, eps_h)
    q_taken = q_online[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return QLoss(loss=0.5 * (q_taken - targets).pow(2), abs_td=(targets - q_taken.detach()).abs())


def standardise(x: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over the time and batch axes (the first two), separately for each problem after
    them: PPO's per-batch advantage normalisation (Schulman et al. 2017; cleanrl's `norm_adv`)."""
    mean = x.mean(dim=(0, 1), keepdim=True)
    std = x.std(dim=(0, 1), keepdim=True)
    return (x - mean) / (std + 1e-8)


@dataclass(frozen=True)
class LossScales:
    """LBC Table 3: V-loss xi = 1, Q-loss alpha = 5, pi-loss beta = 5; IMPALA adds an entropy cost."""

    v: float
    q: float
    pi: float
    entropy: float
    rho_bar: float
    c_bar: float
    lam: float


@dataclass(frozen=True)
class PolicyLoss:
    total: torch.Tensor   # scalar, summed over the problems after [T, B]
    v: torch.Tensor       # per problem: means over [T, B]
    q: torch.Tensor
    pi: torch.Tensor
    entropy: torch.Tensor
    abs_td: torch.Tensor  # [T, B, ...] |v_s - V(x_s)|, for priorities and monitoring


def lbc_policy_loss(
    adv: torch.Tensor,
    value: torch.Tensor,
    log_pi: torch.Tensor,
    actions: torch.Tensor,
    behaviour_prob: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    scales: LossScales,
    pg_scale: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    centre_q: bool = False,
    standardise_advantages: bool = False,
    truncated: torch.Tensor | None = None,
    truncation_values: torch.Tensor | None = None,
    target_adv: torch.Tensor | None = None,
    target_value: torch.Tensor | None = None,
) -> PolicyLoss:
    """Losses of LBC's policies (App. F, Algorithm 2) over one learning window.

    adv [T+1, B, ..., A] dueling advantages A_i, value [T+1, B, ...] = V_i, log_pi [T+1, B, ..., A] the
    log target policy (with its gradient; LBC: log softmax(A_i)); the last row is the bootstrap state.
    The dimensions after B (e.g. one per policy, each with its own rewards and discounts) are
    independent problems computed together: the terms are per-problem means over time and batch,
    and `total` sums them.
    V_i is fitted to V-trace targets, Q_i to Retrace targets, pi by the V-trace policy gradient.
    rewards [T, B, ...] are already shaped by RS_i, discounts are gamma_i * (1 - done); actions and
    behaviour_prob [T, B, ...]; weights [B].

    Q_i = V_i + A_i (LBC), or with centre_q Q_i = V_i + A_i - E_pi[A_i] (GDI App. F eq. 9), so that
    E_pi Q_i = V_i.
    pg_scale [T, B] (optional) multiplies the policy-gradient term per step: DiCE's temperature-scaled
    gradient is -(1/tau) A_t log softmax(tau A)(a_t), whose gradient in A is A_t (e_a - pi), the same
    step at every tau (docs/decisions.md 18).
    standardise_advantages: the policy gradient uses standardise(rho_s (r_s + gamma v_{s+1} - V(x_s))), so
    its size does not depend on how sparse and small the rewards are (docs/decisions.md 35).
    truncated [T, B, ...] and truncation_values [T, B, ...] (optional, see vtrace): steps cut by the frame
    cap bootstrap V-trace from V_i of the cut episode's last state, and Retrace from the same value (exact
    for E_pi Q with centre_q; without it E_pi Q = V + E_pi A, of which the actor knows only V); there
    discounts are gamma_i, not 0.
    target_adv [T+1, B, ..., A] and target_value [T+1, B, ...] (optional, both or neither): a target
    network's outputs (theta^-, copied from the online network every so many steps: DQN, R2D2). V-trace's
    and Retrace's targets are then built from its V and Q instead of the online network's detached ones;
    the target policy pi (from log_pi), the values fitted and the policy gradient's V(x_s) stay online.
    """
    log_pi_fixed = log_pi.detach()
    pi = log_pi_fixed.exp()
    log_pi_taken = log_pi_fixed[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    log_rhos = log_pi_taken - torch.log(behaviour_prob.clamp_min(1e-8))

    if (target_adv is None) != (target_value is None):
        raise ValueError("target_adv and target_value come together (one target network)")
    bootstrap_value = (value if target_value is None else target_value).detach()
    vt = vtrace(bootstrap_value[:-1], bootstrap_value[-1], rewards, discounts, log_rhos,
                rho_bar=scales.rho_bar, c_bar=scales.c_bar, pg_rho_bar=scales.rho_bar, lam=scales.lam,
                truncated=truncated, truncation_values=truncation_values)
    v_loss = 0.5 * (vt.vs - value[:-1]).pow(2)

    def as_q(v: torch.Tensor, a: torch.Tensor) -> torch.Tensor:   # [T+1, B, A]
        return v.unsqueeze(-1) + (a - (pi * a).sum(-1, keepdim=True) if centre_q else a)

    q = as_q(value, adv)
    q_bootstrap = (q if target_adv is None else as_q(target_value, target_adv)).detach()
    q_taken = q[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    expected_next = (pi[1:] * q_bootstrap[1:]).sum(-1)          # E_pi Q(x_{t+1}, .)
    if truncated is not None:
        expected_next = torch.where(truncated, truncation_values, expected_next)
    traces = scales.lam * torch.clamp(log_rhos.exp(), max=scales.c_bar)
    q_taken_bootstrap = q_bootstrap[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    q_targets = retrace_targets(q_taken_bootstrap, expected_next, rewards, discounts, traces, truncated)
    q_loss = 0.5 * (q_targets - q_taken).pow(2)

    log_pi_action = log_pi[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    pg_advantages = vt.pg_advantages
    if target_value is not None:   # the policy gradient's baseline is the online V(x_s)
        pg_rhos = torch.clamp(log_rhos.exp(), max=scales.rho_bar)
        pg_advantages = pg_advantages + pg_rhos * (bootstrap_value[:-1] - value[:-1].detach())
    pg_advantages = standardise(pg_advantages) if standardise_advantages else pg_advantages
    pi_loss = -log_pi_action * pg_advantages
    if pg_scale is not None:
        pi_loss = pi_loss * pg_scale
    ent = -(log_pi[:-1].exp() * log_pi[:-1]).sum(-1)

    if weights is not None:
        w = weights.view(1, -1, *[1] * (v_loss.dim() - 2))
        v_loss, q_loss, pi_loss = (loss * w for loss in (v_loss, q_loss, pi_loss))
    v, q, pi_term, ent = (x.mean(dim=(0, 1)) for x in (v_loss, q_loss, pi_loss, ent))
    total = (scales.v * v + scales.q * q + scales.pi * pi_term - scales.entropy * ent).sum()
    return PolicyLoss(total=total, v=v, q=q, pi=pi_term, entropy=ent, abs_td=(vt.vs - value[:-1].detach()).abs())


def sequence_priorities(abs_td: torch.Tensor, eta: float) -> torch.Tensor:
    """R2D2's sequence priority p = eta max_t |delta_t| + (1 - eta) mean_t |delta_t| over the time axis
    (the first) of abs_td [T, ...]; detached."""
    return (eta * abs_td.max(0).values + (1 - eta) * abs_td.mean(0)).detach()
