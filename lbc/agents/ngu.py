"""NGU's and Agent57's home (Badia et al. 2020a, App. A and E; 2020b, App. D). The maths is in lbc/ngu.py
(mixture family, episodic memory, intrinsic reward) and lbc/losses.py (transformed Retrace), the
networks in lbc/ngu_nets.py.

Acting: each environment plays mixture member j (its own, or Agent57's meta-controller's choice per
episode) epsilon-greedily on Q(x, ., j), with the intrinsic reward r^i of every observation from the
embedding and RND networks pulled with the Q-network. Learning: the j-conditioned Q-network by
transformed Retrace(lambda) from a target network on r^e + beta_j r^i with gamma_j, and the embedding
(inverse dynamics) and RND networks on the last steps of every sequence.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from lbc.agents.protocols import LossOutput, Prepared
from lbc.behaviour import EpisodeBehaviour, epsilon_greedy
from lbc.config import Config
from lbc.devices import to_device, to_host
from lbc.frame_stacks import observations
from lbc.losses import ngu_q_loss, sequence_priorities
from lbc.nets import Frames, LBCNet, NetOutput, unroll_after_burn_in
from lbc.ngu import IntrinsicRewards, core_inputs, environment_epsilons, environment_mixtures, mixture_family
from lbc.ngu_nets import NguAux
from lbc.psi import psi_width
from lbc.rewards import REWARD_SHAPING
from lbc.target_cache import make_target_cache, target_outputs


class NguActing:
    def __init__(self, cfg: Config, actor_index: int, num_envs: int, aux: NguAux) -> None:
        ng = cfg.ngu
        self.num_mixtures = ng.num_mixtures
        self.aux = aux
        self.psi = np.zeros((num_envs, psi_width(cfg.num_components)), np.float32)   # recorded, not used
        self.own_mixture = environment_mixtures(actor_index, num_envs, ng.num_mixtures)
        self.mixture = self.own_mixture.copy()
        self.epsilon = torch.from_numpy(
            environment_epsilons(num_envs, ng.actor_epsilon_base, ng.actor_epsilon_alpha)).float().unsqueeze(-1)
        self.rewards = IntrinsicRewards(num_envs, ng.memory_capacity, ng.embedding_dim, ng.neighbours,
                                        ng.kernel_eps, ng.pseudo_count_c, ng.cluster_xi, ng.max_similarity,
                                        ng.max_modulation)

    def begin_episode(self, env: int, chosen: EpisodeBehaviour) -> None:
        """The j of the environment's next episode: the meta-controller's choice, else its own."""
        self.psi[env] = chosen.psi.packed()
        self.mixture[env] = self.own_mixture[env] if chosen.mixture is None else chosen.mixture

    def for_evaluation(self) -> None:
        self.mixture[:] = 0   # the exploitative member

    def observe(self, obs: np.ndarray, reset: np.ndarray) -> dict[str, np.ndarray]:
        """r^i of arriving at x_t in every environment (its episodic memory is emptied where x_t starts an
        episode) and the environment's j: the per-observation fields of the sequence."""
        with torch.no_grad():
            frames = to_device(obs, next(self.aux.parameters()).device)
            embeddings, errors = to_host(self.aux.embedding(frames), self.aux.rnd.error(frames))
        intrinsic = self.rewards.step(embeddings, errors, reset).astype(np.float32)
        return {"mixture": self.mixture.astype(np.int32), "prev_intrinsic": intrinsic}

    def extra_inputs(self, fields: dict[str, np.ndarray]) -> torch.Tensor:
        """[1, E, N + 1]: the Q-network's extra inputs for this step."""
        return core_inputs(torch.from_numpy(fields["mixture"]), torch.from_numpy(fields["prev_intrinsic"]),
                           self.num_mixtures)[None]

    def behaviour(self, out: NetOutput) -> torch.Tensor:
        """mu [E, A]: epsilon-greedy on Q(x_t, ., j) = V + A of the one head, with each environment's eps."""
        q = q_of_heads(out.adv[0], out.value[0])
        return epsilon_greedy(q, self.epsilon)

    def exploits(self, env: int) -> bool:
        return bool(self.mixture[env] == 0)


def q_of_heads(adv: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Q(x, ., j) = V + A [..., A] from the net's one head: adv [..., 1, A], value [..., 1]."""
    return value[..., :1] + adv[..., 0, :]


class NguLoss:
    """NGU's learner loss. It ends every episode at `done`, the frame cap's cuts included (decision 7): its
    transformed Retrace bootstraps from the target network's Q, which the actor's recorded V does not give."""

    TERMS = ("q", "inverse_dynamics", "rnd")

    def __init__(self, cfg: Config, model: LBCNet, aux: NguAux, device: torch.device) -> None:
        self.cfg = cfg
        ng = cfg.ngu
        family = mixture_family(ng.num_mixtures, ng.beta, ng.gamma_max, ng.gamma_min)
        self.betas = torch.tensor([b for b, _ in family], device=device)
        self.mixture_gammas = torch.tensor([g for _, g in family], device=device)
        self.shaping = REWARD_SHAPING[cfg.policies[0].reward_shaping]
        self.model = model
        self.aux = aux
        self.target = copy.deepcopy(model).requires_grad_(False)
        self.target_version = 0
        self.target_cache = make_target_cache(cfg.learner.target_cache, cfg.replay.capacity_sequences, model,
                                              cfg.sequence.length + 1)

    def sync_target(self) -> None:
        """theta^- <- theta (every ngu.target_update_every steps)."""
        self.target.load_state_dict(self.model.state_dict())
        self.target_version += 1
        if self.target_cache is not None:
            self.target_cache.clear()

    def q_values(self, net: LBCNet, frames: torch.Tensor | Frames, b: dict[str, torch.Tensor], extra: torch.Tensor,
                 grad: bool) -> torch.Tensor:
        """Q(x_t, ., j) [T+1, B, A] of the learning steps, after burn-in from the stored state."""
        # ngu_q_loss reads the bootstrap step's online Q only detached: its frames need no torso gradient
        out = unroll_after_burn_in(net, frames, b, self.cfg.sequence.burn_in, grad, extra, bootstrap_grad=False)
        return q_of_heads(out.adv, out.value)

    def prepare(self, model: LBCNet, b: dict[str, torch.Tensor]) -> Prepared:
        extra = core_inputs(b["mixture"], b["prev_intrinsic"], self.cfg.ngu.num_mixtures)
        frames = model.sequence_input(b)   # read once for both networks
        target = target_outputs(self.target, frames, b, self.cfg.sequence.burn_in, self.target_cache, extra)
        return Prepared(b, frames, extra, target, self.target_version)

    def __call__(self, model: LBCNet, prepared: Prepared) -> LossOutput:
        ng = self.cfg.ngu
        burn = self.cfg.sequence.burn_in
        b = prepared.batch
        q_online = self.q_values(model, prepared.frames, b, prepared.extra, grad=True)
        q_target = q_of_heads(*prepared.target)

        actions = b["action"][burn:].long()
        not_done = 1.0 - b["done"][burn:].float()
        j = b["mixture"][burn:-1].long()                 # the member that acted at x_t
        intrinsic = b["prev_intrinsic"][burn + 1:]       # r^i of arriving at x_{t+1}: step t's
        rewards = self.shaping(b["reward"][burn:]) + self.betas[j] * intrinsic
        loss = ngu_q_loss(q_online, q_target, actions, b["behaviour_prob"][burn:], rewards,
                          self.mixture_gammas[j] * not_done, ng.target_epsilon, ng.retrace_lambda,
                          ng.value_rescale_eps)
        weights = b.get("weight")
        q_term = (loss.loss * weights).mean() if weights is not None else loss.loss.mean()

        # auxiliary networks: the triplets (x_t, a_t, x_{t+1}) of the last aux_steps steps
        k, steps = ng.aux_steps, self.cfg.sequence.length
        obs = observations(b)[burn:]
        frames = obs.shape[2:]
        inverse, rnd = self.aux.loss(obs[steps - k:steps].reshape(-1, *frames),
                                     obs[steps - k + 1:steps + 1].reshape(-1, *frames),
                                     actions[steps - k:].reshape(-1), not_done[steps - k:].reshape(-1),
                                     ng.inverse_l2)
        terms = torch.stack([q_term, inverse, rnd]).detach().unsqueeze(0)
        return LossOutput(q_term + inverse + rnd, terms, sequence_priorities(loss.abs_td, self.cfg.replay.priority_eta))

    def param_groups(self) -> list[dict]:
        return [{"params": list(self.aux.parameters()), "lr": self.cfg.ngu.aux_learning_rate, "weight_decay": 0.0,
                 "fixed_lr": True}]

    def clipped_apart(self) -> list[list[torch.nn.Parameter]]:
        return [list(self.aux.parameters())]   # the Q-network's and the auxiliary losses are unrelated

    def checkpointed(self) -> dict[str, torch.nn.Module]:
        return {"target": self.target}

    def after_step(self, step: int) -> None:
        if step % self.cfg.ngu.target_update_every == 0:
            self.sync_target()
