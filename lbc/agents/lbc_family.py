"""The LBC family's home: LBC-BM and its ablations, IMPALA, DiCE, GDI-I3/H3, which differ by configuration
only (lbc/presets.py).

Acting (LBC eq. 10 / 18, App. D eq. 17; GDI App. F): each environment's episode is played with the mixture
behaviour mu_psi over the policy heads, psi = (tau, omega) chosen per episode by the meta-controller
(bandit_svc, lbc/controllers.py). Learning (LBC eq. 5-7, IMPALA eq. 1-4): every policy's V-trace value
loss, Retrace Q loss and policy gradient towards its target policy (softmax(A_i); DiCE: softmax(tau_i A_i);
GDI: the episode's whole mixture), lbc.losses.lbc_policy_loss.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from lbc.agents.protocols import LossOutput, Prepared
from lbc.behaviour import EpisodeBehaviour, behaviour_probs, log_boltzmann_mixture
from lbc.config import Config
from lbc.losses import LossScales, lbc_policy_loss, sequence_priorities
from lbc.nets import LBCNet, NetOutput, unroll_after_burn_in
from lbc.psi import psi_width, split_psi
from lbc.rewards import REWARD_SHAPING
from lbc.target_cache import make_target_cache, target_outputs


class LbcActing:
    """The hybrid behaviour: mu_psi over the heads of cfg.components with each environment's psi."""

    def __init__(self, cfg: Config, num_envs: int) -> None:
        self.family = cfg.behaviour.family
        self.heads = torch.tensor(cfg.components)
        self.psi = np.zeros((num_envs, psi_width(cfg.num_components)), np.float32)
        # views of psi: an episode's new psi reaches the forward pass without copies
        self.tau, self.omega = split_psi(torch.from_numpy(self.psi), cfg.num_components)

    def begin_episode(self, env: int, chosen: EpisodeBehaviour) -> None:
        self.psi[env] = chosen.psi.packed()

    def for_evaluation(self) -> None:
        pass   # the evaluation policy is lbc.acting.evaluation_probs, from the heads alone

    def observe(self, obs: np.ndarray, reset: np.ndarray) -> dict[str, np.ndarray]:
        return {}

    def extra_inputs(self, fields: dict[str, np.ndarray]) -> torch.Tensor | None:
        return None

    def behaviour(self, out: NetOutput) -> torch.Tensor:
        return behaviour_probs(self.family, out.adv[0][:, self.heads], self.tau, self.omega)

    def exploits(self, env: int) -> bool:
        return False


class LbcLoss:
    TERMS = ("v", "q", "pi", "entropy")

    def __init__(self, cfg: Config, model: LBCNet, device: torch.device) -> None:
        self.cfg = cfg
        lc = cfg.learner
        self.model = model
        # theta^-, copied from the model every learner.target_update_every steps (None: bootstrap online)
        self.target = copy.deepcopy(model).requires_grad_(False) if lc.target_update_every else None
        self.target_version = 0
        self.target_cache = make_target_cache(lc.target_cache and self.target is not None,
                                              cfg.replay.capacity_sequences, model, cfg.sequence.length + 1)
        self.scales = LossScales(v=lc.v_loss_scale, q=lc.q_loss_scale, pi=lc.pi_loss_scale,
                                 entropy=lc.entropy_cost, rho_bar=lc.rho_bar, c_bar=lc.c_bar, lam=lc.trace_lambda)
        self.shaping = [REWARD_SHAPING[p.reward_shaping] for p in cfg.policies]
        self.gammas = torch.tensor([p.gamma for p in cfg.policies], device=device)
        self.components = torch.tensor(cfg.components, device=device)

    def target_log_policy(self, adv: torch.Tensor, psi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every policy's log pi [T+1, B, N, A] and policy-gradient scale [T, B, N] (or one for all, or None).

        adv is [T+1, B, N, A]; psi [T, B, 2K] holds (tau_1..tau_K, omega_1..omega_K) of the episode each
        step belongs to. The bootstrap row repeats the last step's psi (across an episode end it is
        discounted to 0)."""
        lc = self.cfg.learner
        psi = torch.cat([psi, psi[-1:]], dim=0)
        k = self.cfg.num_components
        if lc.target_policy == "softmax":
            return torch.log_softmax(adv, dim=-1), None
        if lc.target_policy == "fixed_temperature":   # DiCE's form at one temperature for every episode
            return torch.log_softmax(adv * lc.target_tau, dim=-1), adv.new_tensor(1.0 / lc.target_tau)
        if lc.target_policy == "behaviour_temperature":   # DiCE: softmax(tau_i A_i), gradient scaled by 1/tau_i
            tau = split_psi(psi, k)[0].clamp_min(lc.min_target_tau)
            return torch.log_softmax(adv * tau.unsqueeze(-1), dim=-1), 1.0 / tau[:-1]
        # GDI: every policy learns the episode's whole mixture
        mixture = log_boltzmann_mixture(adv[:, :, self.components], *split_psi(psi, k))
        return mixture.unsqueeze(2).expand_as(adv), None

    def prepare(self, model: LBCNet, b: dict[str, torch.Tensor]) -> Prepared:
        frames = model.sequence_input(b)   # read once for both networks
        target = None if self.target is None else target_outputs(self.target, frames, b, self.cfg.sequence.burn_in,
                                                                 self.target_cache)
        return Prepared(b, frames, None, target, self.target_version)

    def __call__(self, model: LBCNet, prepared: Prepared) -> LossOutput:
        lc = self.cfg.learner
        burn = self.cfg.sequence.burn_in
        b, target = prepared.batch, prepared.target
        # lbc_policy_loss reads the bootstrap step's outputs only detached: its frames need no torso gradient
        out = unroll_after_burn_in(model, prepared.frames, b, burn, grad=True, bootstrap_grad=False)

        # all N policies in one loss call: the policy axis is a trailing batch axis
        actions = b["action"][burn:].long()
        per_policy_steps = (*actions.shape, self.cfg.num_policies)
        # an episode cut by the frame cap is not over: gamma there, and the value of its last state
        truncated = b["truncated"][burn:]
        not_terminal = 1.0 - (b["done"][burn:] & ~truncated).float()
        log_pi, pg_scale = self.target_log_policy(out.adv, b["psi"][burn:])
        loss = lbc_policy_loss(
            out.adv, out.value, log_pi, actions.unsqueeze(-1).expand(per_policy_steps),
            b["behaviour_prob"][burn:].unsqueeze(-1).expand(per_policy_steps),
            torch.stack([shape(b["reward"][burn:]) for shape in self.shaping], dim=-1),
            not_terminal.unsqueeze(-1) * self.gammas, self.scales, pg_scale=pg_scale, weights=b.get("weight"),
            centre_q=lc.centre_q, standardise_advantages=lc.standardise_advantages,
            truncated=truncated.unsqueeze(-1).expand(per_policy_steps), truncation_values=b["bootstrap"][burn:],
            target_adv=target[0] if target is not None else None,
            target_value=target[1] if target is not None else None)
        terms = torch.stack([loss.v, loss.q, loss.pi, loss.entropy], dim=-1).detach()
        priorities = sequence_priorities(loss.abs_td, self.cfg.replay.priority_eta).max(-1).values
        return LossOutput(loss.total, terms, priorities)

    def param_groups(self) -> list[dict]:
        return []

    def clipped_apart(self) -> list[list[torch.nn.Parameter]]:
        return []

    def checkpointed(self) -> dict[str, torch.nn.Module]:
        return {"target": self.target} if self.target is not None else {}

    def after_step(self, step: int) -> None:
        if self.target is not None and step % self.cfg.learner.target_update_every == 0:
            self.target.load_state_dict(self.model.state_dict())
            self.target_version += 1
            if self.target_cache is not None:
                self.target_cache.clear()
