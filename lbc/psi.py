"""psi, one episode's behaviour parameters: its layout in every recorded step (join_psi / split_psi define
it), its names and the checks on its values. Free of torch: the bandit service needs it and nothing else
of the behaviour mappings (lbc.behaviour).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

ArrayT = TypeVar("ArrayT")   # a numpy array or a torch tensor: both slice alike


# What psi's first slot holds, per behaviour family (GDI's two components: tau = 1/tau_1, 1/tau_2)
PSI_FIRST_SLOT = {"boltzmann_mixture": "tau", "epsilon_greedy_mixture": "epsilon"}


@dataclass(frozen=True)
class Psi:
    """One episode's behaviour parameters over the K mixture components: `first` is what the behaviour
    family scales component k by (boltzmann_mixture: the inverse temperature tau_k, GDI's 1/tau_1 and
    1/tau_2; epsilon_greedy_mixture: epsilon_k), `omega` the components' weights (GDI: eps, 1 - eps).
    The bandit's reply carries them as its `tau` and `omega` fields; every step records them packed."""

    first: tuple[float, ...]
    omega: tuple[float, ...]

    @classmethod
    def uniform(cls, first: float, components: int) -> Psi:
        """The same first value for every component, equal weights: the behaviour without control."""
        return cls((first,) * components, (1.0 / components,) * components)

    def packed(self) -> np.ndarray:
        """The float32 [2K] row recorded with every step (join_psi's layout)."""
        return join_psi(self.first, self.omega)

    def named(self, family: str) -> dict[str, float]:
        """{"tau_1": ..., "omega_1": ...} (or epsilon_k) for metrics and logs."""
        first = PSI_FIRST_SLOT[family]
        return {**{f"{first}_{k + 1}": v for k, v in enumerate(self.first)},
                **{f"omega_{k + 1}": v for k, v in enumerate(self.omega)}}


def join_psi(tau: Sequence[float] | np.ndarray, omega: Sequence[float] | np.ndarray) -> np.ndarray:
    """One episode's psi as it is recorded with every step and sent in a sequence: the K values of the
    first slot (tau_i: the inverse temperatures of the Boltzmann mixture; epsilon_i for the epsilon-greedy
    mixture; GDI: 1/tau_1, 1/tau_2), then the K mixture weights omega_i (GDI: eps, 1 - eps), float32 [2K].
    `split_psi` is its inverse; the layout of psi is defined by these two functions only."""
    return np.concatenate([np.asarray(tau, np.float32), np.asarray(omega, np.float32)], axis=-1)


def split_psi(psi: ArrayT, components: int) -> tuple[ArrayT, ArrayT]:
    """(first slot, omega) from psi [..., 2K] (numpy or torch), as views."""
    return psi[..., :components], psi[..., components:]


def psi_width(components: int) -> int:
    return 2 * components


def psi_problem(tau: np.ndarray, omega: np.ndarray, tau_max: float) -> str:
    """Why psi values cannot be a behaviour ('' if they can): tau [..., K] finite in [0, tau_max] and
    omega [..., K] in [0, 1] summing to 1. Checked on the bandit's answer and on every sequence."""
    if not (np.all(np.isfinite(tau)) and np.all(np.isfinite(omega))):
        return "tau and omega must be finite"
    if np.any(tau < 0.0) or np.any(tau > tau_max):
        return f"tau outside [0, {tau_max:g}]"
    if np.any(omega < 0.0) or np.any(omega > 1.0) or np.any(np.abs(omega.sum(-1) - 1.0) > 1e-3):
        return "omega must lie in [0, 1] and sum to 1"
    return ""
