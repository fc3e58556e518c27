"""Population-based UCB bandits of LBC App. E (Algorithm 1), the meta-controller that picks psi.

Psi = (tau_1..tau_N, omega_1..omega_N) is controlled one dimension at a time (DESIGN §5.4): each
dimension is discretised into K regions (arms) and has its own population of bandits. Per episode:
every bandit of a population proposes its top-D arms by UCB score (eq. 24, or eq. 25 with value
normalisation), the arm with the most votes wins (ties broken uniformly), and psi_d is drawn
uniformly inside that arm's region. Every bandit of the population is updated with the episode's
return; every T_replace episodes one bandit, chosen uniformly, is re-initialised with a fresh c.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np


def ucb_scores(sums: np.ndarray, counts: np.ndarray, c: float | np.ndarray, normalise: bool) -> np.ndarray:
    """Score_x = V(x) + c * sqrt(log(1 + sum_j N(j)) / (1 + N(x)))   (eq. 24)
    with V(x) replaced by (V(x) - E[V]) / D[V] when normalise (eq. 25).

    V(x) is the mean return of arm x (eq. 23 read as a mean: the printed N_T(x) * sum is an
    erratum). Unvisited arms have V = 0 unnormalised and sit at the mean (0) when normalised; the
    mean and standard deviation are taken over visited arms.

    One bandit's [K] sums and counts with a scalar c, or a population's [P, K] with c [P]: each row is
    scored on its own (the population in one pass, not P passes of small arrays).
    """
    visited = counts > 0
    values = np.where(visited, sums / np.maximum(counts, 1), 0.0)
    if normalise:
        num_visited = np.maximum(visited.sum(axis=-1, keepdims=True), 1)
        mean = values.sum(axis=-1, keepdims=True) / num_visited        # unvisited values are 0
        deviation = np.where(visited, values - mean, 0.0)
        std = np.sqrt(np.square(deviation).sum(axis=-1, keepdims=True) / num_visited)
        values = deviation / np.where(std > 1e-8, std, 1.0)           # no arm visited: all 0
    c = np.asarray(c, dtype=float)[..., None]   # a population's [P] against its [P, K]; a scalar as [1]
    bonus = c * np.sqrt(np.log(1.0 + counts.sum(axis=-1, keepdims=True)) / (1.0 + counts))
    return values + bonus


def top_d(scores: np.ndarray, d: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of the d highest scores; equal scores are ordered at random. [K] scores give [d]; a
    population's [P, K] give [P, d], the random keys drawn as P draws of K in turn would be."""
    d = min(d, scores.shape[-1])
    order = np.lexsort((rng.random(scores.shape), -scores), axis=-1)
    return order[..., :d]


def vote(proposals: np.ndarray, num_arms: int, rng: np.random.Generator) -> int:
    """The arm proposed most often (App. E.4.2); a tie is broken uniformly."""
    tally = np.bincount(np.asarray(proposals).ravel(), minlength=num_arms)
    best = np.flatnonzero(tally == tally.max())
    return int(best[rng.integers(len(best))])   # rng.choice(best)'s draw, at a fifth of its cost


@dataclass(frozen=True)
class Discretisation:
    """[low, high] cut into regions of width `accuracy`; the last may be narrower."""

    low: float
    high: float
    accuracy: float

    @property
    def num_arms(self) -> int:
        return max(1, math.ceil((self.high - self.low) / self.accuracy - 1e-9))

    def region(self, arm: int) -> tuple[float, float]:
        lo = self.low + arm * self.accuracy
        return lo, min(lo + self.accuracy, self.high)

    def sample(self, arm: int, rng: np.random.Generator) -> float:
        lo, hi = self.region(arm)
        return float(rng.uniform(lo, hi))


class BanditPopulation:
    """The population of UCB bandits over the arms of one dimension (Algorithm 1, actor-wise)."""

    def __init__(self, num_arms: int, size: int, c_range: tuple[float, float], top_d: int,
                 replace_every: int, normalise: bool, rng: np.random.Generator) -> None:
        self.num_arms = num_arms
        self.c_range = c_range
        self.top_d = top_d
        self.replace_every = replace_every
        self.normalise = normalise
        self.c = rng.uniform(*c_range, size=size)
        self.counts = np.zeros((size, num_arms))
        self.sums = np.zeros((size, num_arms))
        self.selections = np.zeros(num_arms, dtype=np.int64)  # times each arm won the vote
        self.episodes = 0
        self.replacements = 0

    def propose(self, rng: np.random.Generator) -> np.ndarray:
        """[size, D] arms: each bandit's top-D by UCB score."""
        return top_d(ucb_scores(self.sums, self.counts, self.c, self.normalise), self.top_d, rng)

    def select(self, rng: np.random.Generator) -> int:
        arm = vote(self.propose(rng), self.num_arms, rng)
        self.selections[arm] += 1
        return arm

    def update(self, arm: int, episode_return: float, rng: np.random.Generator) -> None:
        """Every bandit records the return for the arm played (eq. 22, 23); then replacement."""
        self.counts[:, arm] += 1.0
        self.sums[:, arm] += episode_return
        self.episodes += 1
        if self.episodes % self.replace_every == 0:
            i = int(rng.integers(len(self.c)))
            self.c[i] = rng.uniform(*self.c_range)
            self.counts[i] = 0.0
            self.sums[i] = 0.0
            self.replacements += 1

    def to_dict(self) -> dict[str, Any]:
        return {"c": self.c.tolist(), "counts": self.counts.tolist(), "sums": self.sums.tolist(),
                "selections": self.selections.tolist(), "episodes": self.episodes,
                "replacements": self.replacements}

    def load_dict(self, d: dict[str, Any]) -> None:
        c, counts, sums = np.asarray(d["c"]), np.asarray(d["counts"]), np.asarray(d["sums"])
        if counts.shape != self.counts.shape or c.shape != self.c.shape or sums.shape != self.sums.shape:
            raise ValueError(f"snapshot shape {counts.shape} does not match the configured {self.counts.shape}")
        self.c, self.counts, self.sums = c, counts, sums
        self.selections = np.asarray(d["selections"], dtype=np.int64)
        self.episodes = int(d["episodes"])
        self.replacements = int(d["replacements"])


@dataclass(frozen=True)
class Choice:
    arms: tuple[int, ...]         # one per dimension
    tau: tuple[float, ...]        # tau_i (or epsilon_i for the epsilon-greedy family)
    omega: tuple[float, ...]      # normalised to sum to 1
    mixture: int | None = None    # NGU's j (Agent57's meta-controller), else None


class BehaviourController:
    """All dimensions of psi for one actor: 2N populations, one per tau_i and omega_i."""

    def __init__(self, num_policies: int, tau: Discretisation, omega: Discretisation, population: int,
                 c_range: tuple[float, float], top_d: int, replace_every: int, normalise: bool,
                 seed: int, learn: bool = True) -> None:
        self.num_policies = num_policies
        self.learn = learn   # False: psi drawn by untrained bandits, i.e. uniformly (LBC's "random" ablation)
        self.rng = np.random.default_rng(seed)
        self.dims = [tau] * num_policies + [omega] * num_policies
        self.names = self.dimension_names(num_policies)
        self.populations = [BanditPopulation(d.num_arms, population, c_range, top_d, replace_every,
                                             normalise, self.rng) for d in self.dims]

    @staticmethod
    def dimension_names(num_policies: int) -> list[str]:
        return [f"tau_{i + 1}" for i in range(num_policies)] + [f"omega_{i + 1}" for i in range(num_policies)]

    def select(self) -> Choice:
        arms = tuple(p.select(self.rng) for p in self.populations)
        values = [d.sample(a, self.rng) for d, a in zip(self.dims, arms, strict=True)]
        n = self.num_policies
        raw_omega = np.asarray(values[n:])
        total = raw_omega.sum()
        omega = raw_omega / total if total > 1e-12 else np.full(n, 1.0 / n)
        return Choice(arms=arms, tau=tuple(values[:n]), omega=tuple(float(w) for w in omega))

    def update(self, arms: tuple[int, ...], episode_return: float) -> None:
        for pop, arm in zip(self.populations, arms, strict=True):
            if self.learn:
                pop.update(arm, episode_return, self.rng)
            else:
                pop.episodes += 1

    @property
    def episodes(self) -> int:
        return self.populations[0].episodes

    def stats(self) -> list[dict[str, Any]]:
        """Per dimension: how often each arm was voted and the first bandit's mean return per arm."""
        return [{"name": name, "selections": pop.selections.tolist(),
                 "mean_return": (pop.sums[0] / (pop.counts[0] + (pop.counts[0] == 0))).tolist()}
                for name, pop in zip(self.names, self.populations, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        return {"populations": [p.to_dict() for p in self.populations], "rng": self.rng.bit_generator.state}

    def load_dict(self, d: dict[str, Any]) -> None:
        if len(d["populations"]) != len(self.populations):
            raise ValueError("snapshot has a different number of dimensions than the configuration")
        for pop, pd in zip(self.populations, d["populations"], strict=True):
            pop.load_dict(pd)
        self.rng.bit_generator.state = d["rng"]


class SlidingWindowUCB:
    """Agent57's meta-controller over the policy index j (Badia et al. 2020a, App. D):

        j_k = argmax_j  mu(j, tau) + beta * sqrt(1 / N(j, tau))     with probability 1 - eps,
              uniform                                                 with probability eps,

    where N(j, tau) and mu(j, tau) are the count and mean return of arm j over the last tau episodes
    (all arms' episodes together). Arms not played in the window are played first, in order.
    Agent57's values: tau = 160, beta = 1, eps = 0.5.
    """

    def __init__(self, num_arms: int, window: int = 160, beta: float = 1.0, epsilon: float = 0.5) -> None:
        self.num_arms, self.window, self.beta, self.epsilon = num_arms, window, beta, epsilon
        self.history: deque[tuple[int, float]] = deque(maxlen=window)

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        counts, sums = np.zeros(self.num_arms), np.zeros(self.num_arms)
        for arm, g in self.history:
            counts[arm] += 1
            sums[arm] += g
        return counts, sums

    def select(self, rng: np.random.Generator) -> int:
        counts, sums = self.stats()
        unplayed = np.flatnonzero(counts == 0)
        if len(unplayed):
            return int(unplayed[0])
        if rng.random() < self.epsilon:
            return int(rng.integers(self.num_arms))
        return int(np.argmax(sums / counts + self.beta * np.sqrt(1.0 / counts)))

    def update(self, arm: int, episode_return: float) -> None:
        self.history.append((arm, float(episode_return)))


class MixtureController:
    """Agent57's meta-controller for one actor: a sliding-window UCB over NGU's mixture index j, learning
    from each episode's extrinsic return. A lbc.controllers.Controller; psi stays fixed
    (tau = fixed_tau, omega = 1), the choice is Choice.mixture."""

    def __init__(self, num_mixtures: int, window: int, beta: float, epsilon: float, fixed_tau: float,
                 seed: int, learn: bool = True) -> None:
        self.ucb = SlidingWindowUCB(num_mixtures, window, beta, epsilon)
        self.learn = learn
        self.fixed_tau = fixed_tau
        self.rng = np.random.default_rng(seed)
        self.selections = np.zeros(num_mixtures, np.int64)
        self.episodes = 0

    @staticmethod
    def dimension_names() -> list[str]:
        return ["mixture"]

    def select(self) -> Choice:
        j = self.ucb.select(self.rng) if self.learn else int(self.rng.integers(self.ucb.num_arms))
        self.selections[j] += 1
        return Choice(arms=(j,), tau=(self.fixed_tau,), omega=(1.0,), mixture=j)

    def update(self, arms: tuple[int, ...], episode_return: float) -> None:
        self.episodes += 1
        if self.learn:
            self.ucb.update(arms[0], episode_return)

    def stats(self) -> list[dict[str, Any]]:
        """Times each j was chosen, and its mean return over the window (0 where unplayed)."""
        counts, sums = self.ucb.stats()
        return [{"name": "mixture", "selections": self.selections.tolist(),
                 "mean_return": (sums / np.maximum(counts, 1)).tolist()}]

    def to_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.ucb.history], "selections": self.selections.tolist(),
                "episodes": self.episodes, "rng": self.rng.bit_generator.state}

    def load_dict(self, d: dict[str, Any]) -> None:
        history = [(int(j), float(g)) for j, g in d["history"]]
        if any(not 0 <= j < self.ucb.num_arms for j, _ in history) or len(d["selections"]) != self.ucb.num_arms:
            raise ValueError(f"bandit snapshot's mixture indices do not fit N = {self.ucb.num_arms}")
        self.ucb.history.clear()
        self.ucb.history.extend(history)
        self.selections = np.asarray(d["selections"], np.int64)
        self.episodes = int(d["episodes"])
        self.rng.bit_generator.state = d["rng"]
