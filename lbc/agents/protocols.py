"""The two seams an algorithm family fills: how its actors act (`Acting`) and what its learner minimises
(`Loss`). The acting loop (actor, evaluator, `lbc play`, `bench/`) and the learner step
(learner_svc/training.py) are written once against these; lbc/agents/__init__.py picks the family."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
import torch

from lbc.behaviour import EpisodeBehaviour
from lbc.nets import LBCNet, NetOutput
from lbc.target_cache import TargetOutputCache


class Acting(Protocol):
    """An algorithm's part of one vector step of E environments, around the shared network forward pass
    (lbc.acting.forward)."""

    psi: np.ndarray
    """[E, P] float32: each environment's behaviour parameters psi for its current episode (the layout of
    lbc.psi.join_psi), recorded with every step."""

    def begin_episode(self, env: int, chosen: EpisodeBehaviour) -> None:
        """The behaviour the meta-controller (or the local default) chose for `env`'s next episode."""

    def for_evaluation(self) -> None:
        """From now on every environment plays the family's exploiting policy (the evaluator)."""

    def observe(self, obs: np.ndarray, reset: np.ndarray) -> dict[str, np.ndarray]:
        """The family's per-observation fields of x_t (stored in the sequence beside the frame; {} if none).
        `reset` [E] marks the environments where x_t starts an episode."""

    def extra_inputs(self, fields: dict[str, np.ndarray]) -> torch.Tensor | None:
        """What the network reads besides frame, previous action and reward, [1, E, X], or None."""

    def behaviour(self, out: NetOutput) -> torch.Tensor:
        """mu [E, A]: the behaviour policy of this step from the network's output."""

    def exploits(self, env: int) -> bool:
        """Whether `env`'s episode is played by the exploiting member (NGU: j = 0), whose returns are
        reported apart."""


class LossOutput(NamedTuple):
    total: torch.Tensor        # scalar: mean over time and batch, what backward() is called on
    terms: torch.Tensor        # [N, len(TERMS)]: each term per policy (detached), for the metrics
    priorities: torch.Tensor   # [B]: each sequence's replay priority (lbc.losses.sequence_priorities)


class Loss(Protocol):
    """An algorithm's learner loss over a batch of sequences, time-major ([T, B, ...]; h0/c0 [B, H])."""

    TERMS: tuple[str, ...]   # the names of LossOutput.terms' columns
    target_cache: TargetOutputCache | None   # a target network's outputs kept per sequence (lbc.target_cache)

    def __call__(self, model: LBCNet, batch: dict[str, torch.Tensor]) -> LossOutput:
        """Burn-in from the stored state, forward, and the loss of every policy."""

    def param_groups(self) -> list[dict]:
        """Optimiser parameter groups besides the model's (a group with fixed_lr=True keeps its rate)."""

    def clipped_apart(self) -> list[list[torch.nn.Parameter]]:
        """Parameters whose gradient norm is clipped apart from the model's (unrelated losses)."""

    def checkpointed(self) -> dict[str, torch.nn.Module]:
        """Modules besides the published agent whose state a checkpoint must keep."""

    def after_step(self, step: int) -> None:
        """Called after optimiser step number `step` (1-based)."""
