"""Never Give Up's (Badia et al. 2020) intrinsic reward and policy family, as pure pieces.

- `mixture_family`: the N pairs (beta_j, gamma_j) of App. A.
- The value rescaling h, its exact inverse and the transformed Retrace are in lbc.losses.
- `EpisodicMemories`: Algorithm 1's k-nearest-neighbour pseudo-count over each environment's episode's embeddings.
- `RunningMeanStd` and `lifelong_modulator`: RND's alpha_t = 1 + (err - mu_e) / sigma_e.
- `intrinsic_reward`: eq. 1, r^i = r^episodic * min(max(alpha, 1), L).
- `IntrinsicRewards`: one actor's r^i for its vector of environments.
- `environment_mixtures`, `environment_epsilons`, `core_inputs`: what an actor's environments play.
The embedding (inverse dynamics) and RND networks are in lbc.ngu_nets; the actor's part and the
learner's loss in lbc.agents.ngu (NguActing, NguLoss).
"""

from __future__ import annotations

import math

import numpy as np
import torch


def mixture_family(n: int, beta: float = 0.3, gamma_max: float = 0.997,
                   gamma_min: float = 0.99) -> list[tuple[float, float]]:
    """[(beta_j, gamma_j)] for j = 0..n-1 (App. A):
        beta_0 = 0, beta_{n-1} = beta, else beta * sigmoid(10 (2j - (n-2)) / (n-2));
        gamma_j = 1 - exp(((n-1-j) log(1 - gamma_max) + j log(1 - gamma_min)) / (n-1)).
    """
    if n < 2:
        raise ValueError("the family needs at least two members")
    out = []
    for j in range(n):
        if j == 0:
            b = 0.0
        elif j == n - 1:
            b = beta
        else:
            b = beta / (1.0 + math.exp(-10.0 * (2 * j - (n - 2)) / (n - 2)))
        g = 1.0 - math.exp(((n - 1 - j) * math.log(1 - gamma_max) + j * math.log(1 - gamma_min)) / (n - 1))
        out.append((b, g))
    return out


def policy_index(actor: int, n: int) -> int:
    """The fixed actor -> j assignment: j = actor mod N (the printed mod (N - 1) never uses j = N-1)."""
    return actor % n


class EpisodicMemories:
    """Algorithm 1 over ring buffers of embeddings, one per environment of an actor, each emptied as its episode starts.

    r^episodic_t = 0 if s > s_m else 1 / s, with s = sqrt(sum_i K(d_i)) + c over the k nearest
    neighbours, K = eps / (max(d_i^2 / d_m^2 - xi, 0) + eps), and d_m^2 a running mean of the squared
    k-nearest-neighbour distances kept across episodes (one per environment). With fewer than k embeddings stored, the
    missing neighbours count as infinitely far (K = 0); the first step of an episode, with an empty
    memory, gets 0 (docs/decisions.md 21).

    The squared distances are taken as ||m_i||^2 - 2 m_i . f + ||f||^2 (clamped at 0), each slot's squared norm kept
    when it is stored: one matrix-vector product over the memory rather than a [size, dim] difference: the distances and
    the k nearest 2.7x faster at 1,000 slots, 4.6x at 29,000 (decision 93); float rounding apart, the same distances.
    Only that product and the k nearest are taken memory by memory (each memory's own length); the rest is taken for
    every environment at once, in float64: 2-3x faster than a memory at a time for short episodes, where numpy's calls
    cost more than their work (docs/speed.md, session 69).
    """

    def __init__(self, num: int, capacity: int, dim: int, k: int = 10, kernel_eps: float = 1e-3, c: float = 1e-3,
                 cluster_xi: float = 8e-3, max_similarity: float = 8.0) -> None:
        self.capacity, self.k = capacity, k
        self.kernel_eps, self.c, self.xi, self.s_max = kernel_eps, c, cluster_xi, max_similarity
        self.slots = np.zeros((num, capacity, dim), np.float32)
        self.sq_norms = np.zeros((num, capacity), np.float32)   # ||m_i||^2 of each slot
        self.sizes = np.zeros(num, np.int64)
        self.next = np.zeros(num, np.int64)
        self.mean_sq_dist = np.zeros(num)
        self.mean_count = np.zeros(num, np.int64)

    def reset(self, which: np.ndarray) -> None:
        """Empties the memories `which` selects (a mask or indices)."""
        self.sizes[which] = 0
        self.next[which] = 0

    def rewards(self, embeddings: np.ndarray) -> np.ndarray:
        """r^episodic [E] of f(x_t) [E, dim] against each memory (Alg. 1, steps 1-8), then stores them."""
        f = np.asarray(embeddings, np.float32)
        sq_f = np.einsum("ed,ed->e", f, f)
        nearest = np.full((len(f), self.k), np.inf, np.float32)   # inf: a neighbour missing, K = 0
        for e in np.flatnonzero(self.sizes):
            size = self.sizes[e]
            sq = self.sq_norms[e, :size] - 2.0 * (self.slots[e, :size] @ f[e])
            sq += sq_f[e]
            nearest[e, : min(size, self.k)] = np.partition(sq, self.k - 1)[: self.k] if size > self.k else sq
        np.maximum(nearest, 0.0, out=nearest)   # rounding can take a near-zero distance below 0
        found = np.isfinite(nearest)
        count = found.sum(axis=1)
        # running mean of all k-NN squared distances: the cumulative mean, updated by each step's neighbours at once
        self.mean_count += count
        scoring = count > 0
        total = np.where(found, nearest, 0.0).sum(axis=1, dtype=np.float64)
        self.mean_sq_dist[scoring] += (total - count * self.mean_sq_dist)[scoring] / self.mean_count[scoring]
        normalised = nearest / np.maximum(self.mean_sq_dist, 1e-12)[:, None]
        kernel = self.kernel_eps / (np.maximum(normalised - self.xi, 0.0) + self.kernel_eps)
        s = np.sqrt(kernel.sum(axis=1)) + self.c
        out = np.where(scoring & (s <= self.s_max), 1.0 / s, 0.0)
        self._store(f, sq_f)
        return out

    def add(self, embeddings: np.ndarray) -> None:
        """Stores one embedding [E, dim] in each memory without scoring it (a full ring drops its oldest)."""
        f = np.asarray(embeddings, np.float32)
        self._store(f, np.einsum("ed,ed->e", f, f))

    def _store(self, f: np.ndarray, sq_f: np.ndarray) -> None:
        rows = np.arange(len(f))
        self.slots[rows, self.next] = f
        self.sq_norms[rows, self.next] = sq_f
        self.next = (self.next + 1) % self.capacity
        self.sizes = np.minimum(self.sizes + 1, self.capacity)


class RunningMeanStd:
    """Mean and standard deviation of a stream (Welford), for RND's error normalisation."""

    def __init__(self) -> None:
        self.count, self.mean, self._m2 = 0, 0.0, 0.0

    def update(self, values: np.ndarray) -> None:
        for v in np.asarray(values, np.float64).ravel():
            self.count += 1
            delta = v - self.mean
            self.mean += delta / self.count
            self._m2 += delta * (v - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / self.count) if self.count > 1 else 1.0


def lifelong_modulator(err: np.ndarray, stats: RunningMeanStd) -> np.ndarray:
    """alpha_t = 1 + (err(x_t) - mu_e) / sigma_e."""
    return 1.0 + (np.asarray(err, np.float64) - stats.mean) / max(stats.std, 1e-8)


def intrinsic_reward(episodic: np.ndarray, alpha: np.ndarray, max_modulation: float = 5.0) -> np.ndarray:
    """Eq. 1: r^i_t = r^episodic_t * min(max(alpha_t, 1), L)."""
    return np.asarray(episodic) * np.clip(alpha, 1.0, max_modulation)


def actor_epsilons(num: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Ape-X / R2D2's per-actor exploration, eps_i = base^(1 + alpha i / (num - 1)), i = 0..num-1
    (NGU does not print its schedule; seeds_003_004 A1.10 reads it from R2D2)."""
    if num == 1:
        return np.array([base])
    return base ** (1.0 + alpha * np.arange(num) / (num - 1))


class IntrinsicRewards:
    """One actor's intrinsic reward for its vector of environments (NGU eq. 1, Alg. 1).

    Each environment has its own episodic memory, emptied when its episode starts; the RND errors
    of all of them feed one running mean and standard deviation (the modulator's normalisation).
    """

    def __init__(self, num_envs: int, capacity: int, dim: int, k: int = 10, kernel_eps: float = 1e-3,
                 c: float = 1e-3, cluster_xi: float = 8e-3, max_similarity: float = 8.0,
                 max_modulation: float = 5.0) -> None:
        self.memories = EpisodicMemories(num_envs, capacity, dim, k, kernel_eps, c, cluster_xi, max_similarity)
        self.rnd_stats = RunningMeanStd()
        self.max_modulation = max_modulation

    def step(self, embeddings: np.ndarray, rnd_errors: np.ndarray, episode_start: np.ndarray) -> np.ndarray:
        """r^i_t [E] for x_t of every environment; episode_start [E] marks x_t as an episode's first."""
        self.memories.reset(np.asarray(episode_start, bool))
        episodic = self.memories.rewards(embeddings)
        self.rnd_stats.update(rnd_errors)
        return intrinsic_reward(episodic, lifelong_modulator(rnd_errors, self.rnd_stats), self.max_modulation)


def environment_mixtures(actor_index: int, num_envs: int, n: int) -> np.ndarray:
    """j of each environment of an actor: environment e of actor i is NGU's actor i * E + e, and plays
    j = (i * E + e) mod N (policy_index), so one actor of E >= N environments covers the family."""
    return np.array([policy_index(actor_index * num_envs + e, n) for e in range(num_envs)], np.int64)


def environment_epsilons(num_envs: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """epsilon of each environment of an actor: the actor_epsilons schedule over its E environments,
    largest last, so that j = 0 (the exploitative member) acts most greedily when E = N
    (docs/decisions.md 27)."""
    return actor_epsilons(num_envs, base, alpha)[::-1].copy()


def core_inputs(mixture: torch.Tensor, intrinsic: torch.Tensor, n: int) -> torch.Tensor:
    """The Q-network's extra inputs at x_t (NGU sec. 3): one-hot j [..., N] and the intrinsic reward of
    arriving at x_t [..., 1]."""
    one_hot = torch.nn.functional.one_hot(mixture.long(), n).to(intrinsic.dtype)
    return torch.cat([one_hot, intrinsic.unsqueeze(-1)], dim=-1)
