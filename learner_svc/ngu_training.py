"""NGU's learner step (Badia et al. 2020, App. A and E): the j-conditioned Q-network trained by
transformed Retrace(lambda) from a target network on r^e + beta_j r^i with gamma_j, and the embedding
(inverse dynamics) and RND networks trained on the last steps of every sequence."""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from lbc.config import Config
from lbc.losses import ngu_q_loss
from lbc.ngu import core_inputs, mixture_family
from learner_svc.training import StepStats, Trainer, to_time_major


class NguTrainer(Trainer):
    TERMS = ("q", "inverse_dynamics", "rnd")

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        ng = cfg.ngu
        family = mixture_family(ng.num_mixtures, ng.beta, ng.gamma_max, ng.gamma_min)
        self.betas = torch.tensor([b for b, _ in family], device=self.device)
        self.mixture_gammas = torch.tensor([g for _, g in family], device=self.device)
        self.aux = self.agent.aux
        self.optimiser.add_param_group({"params": list(self.aux.parameters()), "lr": ng.aux_learning_rate,
                                        "weight_decay": 0.0, "fixed_lr": True})
        self.target = copy.deepcopy(self.model).requires_grad_(False)

    def sync_target(self) -> None:
        """theta^- <- theta (every ngu.target_update_every steps)."""
        self.target.load_state_dict(self.model.state_dict())

    def checkpointed_modules(self) -> dict[str, torch.nn.Module]:
        return {"target": self.target}

    def _unroll(self, net: torch.nn.Module, b: dict[str, torch.Tensor], extra: torch.Tensor,
                grad: bool) -> torch.Tensor:
        """Q(x_t, ., j) [T+1, B, A] of the learning steps, after burn-in from the stored state."""
        burn = self.cfg.sequence.burn_in
        inputs = (b["obs"], b["prev_action"].long(), b["prev_reward"], b["reset"])
        state = (b["h0"], b["c0"])
        if burn > 0:
            with torch.no_grad():
                state = net(*(x[:burn] for x in inputs), state, extra[:burn]).state
        with torch.set_grad_enabled(grad):
            out = net(*(x[burn:] for x in inputs), state, extra[burn:])
            return out.value[..., :1] + out.adv[..., 0, :]

    def _loss(self, batch: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ng = self.cfg.ngu
        b = to_time_major(batch, self.device)
        burn = self.cfg.sequence.burn_in
        extra = core_inputs(b["mixture"], b["prev_intrinsic"], ng.num_mixtures)
        q_online = self._unroll(self.model, b, extra, grad=True)
        q_target = self._unroll(self.target, b, extra, grad=False)

        actions = b["action"][burn:].long()
        not_done = 1.0 - b["done"][burn:].float()
        j = b["mixture"][burn:-1].long()                 # the member that acted at x_t
        intrinsic = b["prev_intrinsic"][burn + 1:]       # r^i of arriving at x_{t+1}: step t's
        rewards = self.shaping[0](b["reward"][burn:]) + self.betas[j] * intrinsic
        loss = ngu_q_loss(q_online, q_target, actions, b["behaviour_prob"][burn:], rewards,
                          self.mixture_gammas[j] * not_done, ng.target_epsilon, ng.retrace_lambda,
                          ng.value_rescale_eps)
        weights = b.get("weight")
        q_term = (loss.loss * weights).mean() if weights is not None else loss.loss.mean()

        # auxiliary networks: the triplets (x_t, a_t, x_{t+1}) of the last aux_steps steps
        k, steps = ng.aux_steps, self.cfg.sequence.length
        obs = b["obs"][burn:]
        frames = obs.shape[2:]
        inverse, rnd = self.aux.loss(obs[steps - k:steps].reshape(-1, *frames),
                                     obs[steps - k + 1:steps + 1].reshape(-1, *frames),
                                     actions[steps - k:].reshape(-1), not_done[steps - k:].reshape(-1),
                                     ng.inverse_l2)
        terms = torch.stack([q_term, inverse, rnd]).detach().unsqueeze(0)
        return q_term + inverse + rnd, terms, self._priorities(loss.abs_td)

    def _clip_gradients(self) -> float:
        """The Q-network and the auxiliary networks clipped apart (their losses are unrelated); returns the
        Q-network's norm, or the auxiliary networks' where that one is not finite."""
        aux = float(torch.nn.utils.clip_grad_norm_(self.aux.parameters(), self.cfg.learner.clip_norm))
        q = super()._clip_gradients()
        return q if math.isfinite(aux) else aux

    def train_step(self, batch: dict[str, np.ndarray]) -> StepStats:
        stats = super().train_step(batch)
        if self.step % self.cfg.ngu.target_update_every == 0:
            self.sync_target()
        return stats
