"""An NGU actor's own part (Badia et al. 2020, App. A): the mixture member j and epsilon of each of its
environments, and the intrinsic reward r^i of every observation from the embedding and RND networks
pulled with the Q-network."""

from __future__ import annotations

import numpy as np
import torch

from lbc.behaviour import epsilon_greedy
from lbc.config import Config
from lbc.nets import NetOutput
from lbc.ngu import IntrinsicRewards, core_inputs, environment_epsilons, environment_mixtures
from lbc.ngu_nets import NguAux


class NguActing:
    def __init__(self, cfg: Config, actor_index: int, num_envs: int, aux: NguAux) -> None:
        ng = cfg.ngu
        self.num_mixtures = ng.num_mixtures
        self.aux = aux
        self.own_mixture = environment_mixtures(actor_index, num_envs, ng.num_mixtures)
        self.mixture = self.own_mixture.copy()
        self.epsilon = torch.from_numpy(
            environment_epsilons(num_envs, ng.actor_epsilon_base, ng.actor_epsilon_alpha)).float().unsqueeze(-1)
        self.rewards = IntrinsicRewards(num_envs, ng.memory_capacity, ng.embedding_dim, ng.neighbours,
                                        ng.kernel_eps, ng.pseudo_count_c, ng.cluster_xi, ng.max_similarity,
                                        ng.max_modulation)

    def observe(self, obs: np.ndarray, reset: np.ndarray) -> dict[str, np.ndarray]:
        """r^i of arriving at x_t in every environment (its episodic memory is emptied where x_t starts an
        episode) and the environment's j: the per-observation fields of the sequence."""
        with torch.no_grad():
            frames = torch.from_numpy(obs)
            embeddings = self.aux.embedding(frames).numpy()
            errors = self.aux.rnd.error(frames).numpy()
        intrinsic = self.rewards.step(embeddings, errors, reset).astype(np.float32)
        return {"mixture": self.mixture.astype(np.int32), "prev_intrinsic": intrinsic}

    def core_inputs(self, fields: dict[str, np.ndarray]) -> torch.Tensor:
        """[1, E, N + 1]: the Q-network's extra inputs for this step."""
        return core_inputs(torch.from_numpy(fields["mixture"]), torch.from_numpy(fields["prev_intrinsic"]),
                           self.num_mixtures)[None]

    def behaviour(self, out: NetOutput) -> torch.Tensor:
        """mu [E, A]: epsilon-greedy on Q(x_t, ., j) = V + A of the one head, with each environment's eps."""
        q = out.value[0, :, :1] + out.adv[0, :, 0]
        return epsilon_greedy(q, self.epsilon)

    def new_episode(self, env: int, mixture: int | None) -> None:
        """The j of the environment's next episode: the meta-controller's choice, else its own."""
        self.mixture[env] = self.own_mixture[env] if mixture is None else mixture
