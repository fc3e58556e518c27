"""One home per algorithm family: how its actors act (`Acting`) and what its learner minimises (`Loss`),
behind the seams of lbc/agents/protocols.py. The acting loop (actor_svc, the evaluator, `lbc play`,
bench/) and the learner step (learner_svc/training.py) are written once; the meta-controllers have their
own seam (lbc/controllers.py, `make_controller`).

- lbc/agents/lbc_family.py: LBC-BM and its ablations, IMPALA, DiCE, GDI-I3/H3 (one family, told apart by
  configuration: behaviour family, target policy, loss scales; presets in lbc/presets.py).
- lbc/agents/ngu.py: NGU and Agent57.

Adding an agent (e.g. R2D2): a module here with its Acting and Loss, its traits in lbc/family.py (network
inputs, sequence fields, evaluation policy), a case in `make_acting`/`make_loss` and a preset in
lbc/presets.py; its maths as pure functions beside the others (lbc/losses.py, lbc/behaviour.py).
"""

from __future__ import annotations

import torch

from lbc.agents.lbc_family import LbcActing, LbcLoss
from lbc.agents.ngu import NguActing, NguLoss
from lbc.agents.protocols import Acting, Loss, LossOutput, Prepared
from lbc.config import Config
from lbc.family import family_of
from lbc.nets import policy_net

__all__ = ["Acting", "Loss", "LossOutput", "Prepared", "family_of", "make_acting", "make_loss"]


def make_acting(cfg: Config, agent: torch.nn.Module, num_envs: int, actor_index: int = 0) -> Acting:
    """The family's acting part for `num_envs` environments; `agent` is what lbc.nets.build_agent made."""
    if family_of(cfg) == "ngu":
        return NguActing(cfg, actor_index, num_envs, agent.aux)
    return LbcActing(cfg, num_envs)


def make_loss(cfg: Config, agent: torch.nn.Module, device: torch.device) -> Loss:
    """The family's learner loss for the model within `agent` (on `device`)."""
    if family_of(cfg) == "ngu":
        return NguLoss(cfg, policy_net(agent), agent.aux, device)
    return LbcLoss(cfg, policy_net(agent), device)
