"""The meta-controllers that choose each episode's behaviour, behind one interface and one factory.

A controller belongs to one actor: `select()` gives the episode's Choice (arms, and the psi or NGU
mixture index they stand for), `update(arms, return)` learns from the episode's raw return. Which
algorithm serves is decided here only, from `bandit.algorithm`:
- `population_ucb`: LBC's populations of UCB bandits, one per dimension of psi (lbc.bandit);
- `bva`: DiCE's and GDI's Bandits Vote Algorithm over tile-coded ensembles (lbc.bva);
- `sliding_window_ucb`: Agent57's choice of NGU's mixture index j (lbc.bandit.MixtureController).
"""

from __future__ import annotations

from typing import Any, Protocol

from lbc.bandit import BehaviourController, Choice, Discretisation, MixtureController
from lbc.bva import BvaController
from lbc.config import Config


class Controller(Protocol):
    """What the bandit service asks of every meta-controller."""

    @property
    def episodes(self) -> int: ...   # episodes learned from

    def select(self) -> Choice: ...
    def update(self, arms: tuple[int, ...], episode_return: float) -> None: ...
    def stats(self) -> list[dict[str, Any]]: ...   # per dimension: name, selections, mean_return
    def to_dict(self) -> dict[str, Any]: ...
    def load_dict(self, d: dict[str, Any]) -> None: ...


def dimensions(cfg: Config) -> tuple[Discretisation, Discretisation]:
    """The tau and omega discretisations of LBC's bandits (their arm counts are part of a snapshot's layout)."""
    b = cfg.behaviour
    return Discretisation(*b.tau_range, b.tau_accuracy), Discretisation(*b.omega_range, b.omega_accuracy)


def dimension_names(cfg: Config) -> list[str]:
    """The names of the dimensions a controller chooses, in the order of Choice.arms."""
    if cfg.bandit.algorithm == "bva":
        return BvaController.dimension_names(cfg.num_components)
    if cfg.bandit.algorithm == "sliding_window_ucb":
        return MixtureController.dimension_names()
    return BehaviourController.dimension_names(cfg.num_components)


def make_controller(cfg: Config, seed: int) -> Controller:
    """A fresh controller for one actor, of the configured algorithm."""
    bc, b = cfg.bandit, cfg.behaviour
    if bc.algorithm == "bva":
        return BvaController(b.tau_range, bc.bva_accuracy, bc.population, bc.top_d, bc.bva_ucb_c,
                             bc.normalise_values, bc.learn, seed, components=cfg.num_components,
                             widths=bc.bva_widths, epsilon_accuracy=bc.bva_epsilon_accuracy)
    if bc.algorithm == "sliding_window_ucb":
        ng = cfg.ngu
        return MixtureController(ng.num_mixtures, ng.window, ng.ucb_beta, ng.ucb_epsilon, b.fixed_tau, seed,
                                 learn=bc.learn)
    tau, omega = dimensions(cfg)
    return BehaviourController(cfg.num_components, tau, omega, bc.population, bc.c_range, bc.top_d,
                               bc.replace_every, bc.normalise_values, seed, learn=bc.learn)
