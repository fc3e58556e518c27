"""DiCE's Bandits Vote Algorithm (BVA, DiCE App. A, Algorithm 2): an ensemble of tile-coded bandits
over x = log(1 + 1/tau_DiCE) that chooses the behaviour temperature of each episode.

One bandit B = (mode, l, r, acc, width, lr, w, N, d):
    tile        i(x) = floor((clip(x, l, r) - l) / acc), clamped to K - 1;  K = floor((r - l) / acc)
    evaluate    V_i = 1/(2 width + 1) sum_{k=i-width}^{i+width} w_k                          (eq. 9)
    update      w_j += lr (g - V_i) for j in i-width..i+width;  N_i += 1                      (eq. 10)
    score       (V_i - mean V) / std V + c sqrt(log(1 + sum N) / (1 + N_i))                    (eq. 11)
    candidates  argmax mode: the top-d tiles; random mode: d tiles without replacement with
                probabilities softmax(score); one x drawn uniformly inside each tile.
The ensemble draws one x uniformly among all M x d candidates, and every bandit learns from (x, g).
Edges (docs/decisions.md 19): the window is cut at the ends of the tile range and averaged over the
tiles it covers; std V = 0 (nothing learned yet) leaves the normalised value at 0.

lbc's behaviour mixes softmax(tau A) with tau an inverse temperature, so the temperature DiCE
prints, tau_DiCE = 1 / (exp(x) - 1), becomes tau = exp(x) - 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from lbc.bandit import Choice


def tile_values(w: np.ndarray, width: np.ndarray) -> np.ndarray:
    """V_i = 1/(2 width + 1) sum_{k=i-width}^{i+width} w_k (eq. 9), the window cut at the ends of the tile
    range and averaged over the tiles it covers: for one bandit's [K] weights (width a scalar array) or an
    ensemble's [M, K] (width [M]), as differences of a cumulative sum."""
    num_tiles = w.shape[-1]
    cum = np.concatenate([np.zeros(w.shape[:-1] + (1,)), np.cumsum(w, axis=-1)], axis=-1)
    tiles = np.arange(num_tiles)
    width = width[..., None]
    lo, hi = np.maximum(0, tiles - width), np.minimum(num_tiles, tiles + width + 1)
    lo, hi = np.broadcast_to(lo, w.shape), np.broadcast_to(hi, w.shape)
    return (np.take_along_axis(cum, hi, axis=-1) - np.take_along_axis(cum, lo, axis=-1)) / (hi - lo)


def tile_scores(w: np.ndarray, n: np.ndarray, width: np.ndarray, ucb_c: float, normalise: bool) -> np.ndarray:
    """(V_i - mean V) / std V + c sqrt(log(1 + sum N) / (1 + N_i)) (eq. 11), each bandit's row on its own;
    std V = 0 leaves the normalised value at 0 (docs/decisions.md 19)."""
    v = tile_values(w, width)
    if normalise:
        std = v.std(axis=-1, keepdims=True)
        v = np.where(std > 1e-12, (v - v.mean(axis=-1, keepdims=True)) / np.maximum(std, 1e-12), 0.0)
    return v + ucb_c * np.sqrt(np.log1p(n.sum(axis=-1, keepdims=True)) / (1.0 + n))


@dataclass
class TileBandit:
    mode: Literal["argmax", "random"]
    low: float
    high: float
    acc: float
    width: int
    lr: float
    candidates: int
    ucb_c: float = 1.0
    normalise: bool = True
    w: np.ndarray = field(init=False)
    n: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.num_tiles = max(1, math.floor((self.high - self.low) / self.acc + 1e-9))
        self.w = np.zeros(self.num_tiles)
        self.n = np.zeros(self.num_tiles)

    def tile(self, x: float) -> int:
        i = math.floor((min(max(x, self.low), self.high) - self.low) / self.acc)
        return min(i, self.num_tiles - 1)

    def _window(self, i: int) -> slice:
        return slice(max(0, i - self.width), min(self.num_tiles, i + self.width + 1))

    def values(self) -> np.ndarray:
        """V_i for every tile (eq. 9)."""
        return tile_values(self.w, np.asarray(self.width))

    def update(self, x: float, g: float) -> None:
        """Eq. 10 for one episode played at x with return g."""
        self.update_tile(self.tile(x), g)

    def update_tile(self, i: int, g: float) -> None:
        v_i = self.w[self._window(i)].mean()
        self.w[self._window(i)] += self.lr * (g - v_i)
        self.n[i] += 1

    def scores(self) -> np.ndarray:
        """Eq. 11."""
        return tile_scores(self.w, self.n, np.asarray(self.width), self.ucb_c, self.normalise)

    def propose(self, rng: np.random.Generator, scores: np.ndarray | None = None) -> np.ndarray:
        """d candidate x values (one per chosen tile, uniform inside it); `scores` where the ensemble has
        taken them for all its bandits at once."""
        scores = self.scores() if scores is None else scores
        d = min(self.candidates, self.num_tiles)
        if self.mode == "argmax":
            order = rng.permutation(self.num_tiles)                 # ties broken at random
            tiles = order[np.argsort(-scores[order], kind="stable")[:d]]
        else:
            p = np.exp(scores - scores.max())
            tiles = rng.choice(self.num_tiles, size=d, replace=False, p=p / p.sum())
        return self.low + (tiles + rng.random(d)) * self.acc

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "width": self.width, "lr": self.lr, "w": self.w.tolist(), "n": self.n.tolist()}

    def load_dict(self, d: dict[str, Any]) -> None:
        w, n = np.asarray(d["w"], float), np.asarray(d["n"], float)
        if w.shape != self.w.shape or n.shape != self.n.shape:
            raise ValueError(f"bandit snapshot has {w.shape[0]} tiles, the configuration {self.num_tiles}")
        self.mode, self.width, self.lr, self.w, self.n = d["mode"], int(d["width"]), float(d["lr"]), w, n


class BanditsVote:
    """Algorithm 2's ensemble: M bandits with mode ~ U{argmax, random}, lr ~ U{0.05, 0.1, 0.2},
    width ~ U{1, 2, 3}; x drawn uniformly among their candidates; all learn from every episode."""

    def __init__(self, low: float, high: float, acc: float, bandits: int, candidates: int, ucb_c: float,
                 normalise: bool, rng: np.random.Generator, learn: bool = True,
                 widths: tuple[int, ...] = (1, 2, 3)) -> None:
        self.rng = rng
        self.learn = learn
        self.bandits = [TileBandit(mode=str(rng.choice(["argmax", "random"])), low=low, high=high, acc=acc,
                                   width=int(rng.choice(widths)), lr=float(rng.choice([0.05, 0.1, 0.2])),
                                   candidates=candidates, ucb_c=ucb_c, normalise=normalise)
                        for _ in range(bandits)]
        self.episodes = 0

    def select(self) -> float:
        bandits = self.bandits
        scores = tile_scores(np.stack([b.w for b in bandits]), np.stack([b.n for b in bandits]),
                             np.array([b.width for b in bandits]), bandits[0].ucb_c, bandits[0].normalise)
        pool = np.concatenate([b.propose(self.rng, row) for b, row in zip(bandits, scores, strict=True)])
        return float(pool[self.rng.integers(len(pool))])

    def update(self, x: float, g: float) -> None:
        """Every bandit learns (x, g); the `random` ablation of DiCE (learn=False) never does."""
        self.update_tile(self.bandits[0].tile(x), g)

    def update_tile(self, tile: int, g: float) -> None:
        """The same, by tile (all bandits share the tiling, and eq. 10 depends on x only through i(x))."""
        self.episodes += 1
        if self.learn:
            for b in self.bandits:
                b.update_tile(tile, g)

    def to_dict(self) -> dict[str, Any]:
        return {"bandits": [b.to_dict() for b in self.bandits], "episodes": self.episodes}

    def load_dict(self, d: dict[str, Any]) -> None:
        if len(d["bandits"]) != len(self.bandits):
            raise ValueError("bandit snapshot has a different ensemble size than the configuration")
        for b, bd in zip(self.bandits, d["bandits"], strict=True):
            b.load_dict(bd)
        self.episodes = int(d["episodes"])


def inverse_temperature(x: float) -> float:
    """lbc's tau (multiplying A) for DiCE's x = log(1 + 1/tau_DiCE): exp(x) - 1."""
    return math.expm1(x)


class BvaController:
    """The bandit service's per-actor controller over BVA ensembles, one per dimension of the search.

    DiCE (one component): x = log(1 + 1/tau_DiCE), psi = (tau_1 = exp(x) - 1, omega_1 = 1).
    GDI (two components, App. G): x_1, x_2 as DiCE's for 1/tau_1, 1/tau_2 and x_3 = eps on [0, 1],
    psi = (tau_1, tau_2, omega = (eps, 1 - eps)). Each dimension has its own ensemble and all learn
    from every episode's return (docs/decisions.md 25).

    A lbc.controllers.Controller: select() gives a Choice whose arms are the tiles
    chosen per dimension; update(arms, g) teaches every bandit."""

    def __init__(self, tau_range: tuple[float, float], accuracy: float, bandits: int, candidates: int,
                 ucb_c: float, normalise: bool, learn: bool, seed: int, components: int = 1,
                 widths: tuple[int, ...] = (1, 2, 3), epsilon_accuracy: float = 0.1) -> None:
        if components not in (1, 2):
            raise ValueError(f"the BVA controls one (DiCE) or two (GDI) behaviour components, not {components}")
        self.rng = np.random.default_rng(seed)
        self.components = components
        self.names = self.dimension_names(components)
        x_range = (math.log1p(tau_range[0]), math.log1p(tau_range[1]), accuracy)
        ranges = [x_range] * components + ([(0.0, 1.0, epsilon_accuracy)] if components == 2 else [])
        self.ensembles = [BanditsVote(lo, hi, acc, bandits, candidates, ucb_c, normalise, self.rng, learn=learn,
                                      widths=widths) for lo, hi, acc in ranges]
        self.selections = [np.zeros(e.bandits[0].num_tiles, np.int64) for e in self.ensembles]

    @staticmethod
    def dimension_names(components: int) -> list[str]:
        return ["tau_1", "omega_1"] if components == 1 else ["tau_1", "tau_2", "epsilon"]

    def select(self) -> Choice:
        xs = [e.select() for e in self.ensembles]
        tiles = [e.bandits[0].tile(x) for e, x in zip(self.ensembles, xs, strict=True)]
        for sel, tile in zip(self.selections, tiles, strict=True):
            sel[tile] += 1
        tau = tuple(inverse_temperature(x) for x in xs[:self.components])
        if self.components == 1:
            return Choice(arms=(tiles[0], 0), tau=tau, omega=(1.0,))
        eps = xs[2]
        return Choice(arms=tuple(tiles), tau=tau, omega=(eps, 1.0 - eps))

    def update(self, arms: tuple[int, ...], episode_return: float) -> None:
        for ensemble, tile in zip(self.ensembles, arms, strict=False):   # DiCE's second arm is omega's constant 0
            ensemble.update_tile(tile, episode_return)

    @property
    def episodes(self) -> int:
        return self.ensembles[0].episodes

    def stats(self) -> list[dict[str, Any]]:
        """Per dimension: selections per tile and the ensemble's average value (DiCE's evaluation)."""
        out = [{"name": name, "selections": sel.tolist(),
                "mean_return": np.mean([b.values() for b in e.bandits], axis=0).tolist()}
               for name, e, sel in zip(self.names, self.ensembles, self.selections, strict=False)]
        if self.components == 1:
            out.append({"name": "omega_1", "selections": [int(self.selections[0].sum())], "mean_return": [0.0]})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"ensembles": [e.to_dict() for e in self.ensembles],
                "selections": [s.tolist() for s in self.selections], "rng": self.rng.bit_generator.state}

    def load_dict(self, d: dict[str, Any]) -> None:
        if len(d["ensembles"]) != len(self.ensembles):
            raise ValueError("bandit snapshot has a different number of dimensions than the configuration")
        for e, ed in zip(self.ensembles, d["ensembles"], strict=True):
            e.load_dict(ed)
        self.selections = [np.asarray(s, np.int64) for s in d["selections"]]
        self.rng.bit_generator.state = d["rng"]
