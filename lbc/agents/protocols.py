"""The two seams an algorithm family fills: how its actors act (`Acting`) and what its learner minimises
(`Loss`). The acting loop (actor, evaluator, `lbc play`, `bench/`) and the learner step
(learner_svc/training.py) are written once against these; lbc/agents/__init__.py picks the family."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
import torch

from lbc.behaviour import EpisodeBehaviour
from lbc.nets import Frames, LBCNet, NetOutput
from lbc.target_cache import Outputs, TargetOutputCache


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


class Prepared(NamedTuple):
    """What a loss reads of a batch that the online network's parameters do not change: computed by
    Loss.prepare, possibly in another thread while the step before trains (learner.prepare_ahead)."""

    batch: dict[str, torch.Tensor]      # time-major [T, B, ...]; h0/c0 [B, H]
    frames: torch.Tensor | Frames       # the batch's observations as the torso reads them (LBCNet.sequence_input)
    extra: torch.Tensor | None          # the family's extra network inputs [T, B, X], or None
    target: Outputs | None              # the target network's (adv, value) over the learning steps, or None
    target_version: int                 # the loss's target_version when the target outputs were computed


class Loss(Protocol):
    """An algorithm's learner loss over a batch of sequences, time-major ([T, B, ...]; h0/c0 [B, H])."""

    TERMS: tuple[str, ...]   # the names of LossOutput.terms' columns
    target_cache: TargetOutputCache | None   # a target network's outputs kept per sequence (lbc.target_cache)
    target_version: int      # copies into the target network so far: a Prepared from an older one is stale

    def prepare(self, model: LBCNet, batch: dict[str, torch.Tensor]) -> Prepared:
        """The frames read, the extra inputs and the target network's outputs: nothing the online network's
        parameters change, so it may run while the step before trains (not across after_step)."""

    def __call__(self, model: LBCNet, prepared: Prepared) -> LossOutput:
        """Burn-in from the stored state, forward, and the loss of every policy."""

    def param_groups(self) -> list[dict]:
        """Optimiser parameter groups besides the model's (a group with fixed_lr=True keeps its rate)."""

    def clipped_apart(self) -> list[list[torch.nn.Parameter]]:
        """Parameters whose gradient norm is clipped apart from the model's (unrelated losses)."""

    def checkpointed(self) -> dict[str, torch.nn.Module]:
        """Modules besides the published agent whose state a checkpoint must keep."""

    def after_step(self, step: int) -> None:
        """Called after optimiser step number `step` (1-based)."""
