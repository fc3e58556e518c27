"""What the shared parts of lbc need to know about the algorithm family a configuration trains, as data.

The network builder, the sequence layout and its validation, the evaluator's default policy, the
launcher's progress check and the export read a `FamilyTraits`; `family_traits` is the one place that
tells the families apart (their acting and losses live in lbc/agents/).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from lbc.config import Config


@dataclass(frozen=True)
class FamilyTraits:
    name: str                  # "lbc" (LBC-BM, IMPALA, DiCE, GDI) or "ngu" (NGU, Agent57)
    extra_inputs: int          # network inputs besides the frame, previous action and reward
    fields: dict[str, str]     # per-observation fields a sequence records beyond the core ones: name -> dtype
    behaviour: str             # the behaviour family, as an export names it
    evaluation_policy: str     # what eval.policy=auto resolves to (docs/decisions.md 28)
    score: tuple[str, str]     # the progress record's training score and its window (launch --until-return)
    aux_networks: bool         # the networks of its intrinsic rewards travel with the policy network
    check_fields: Callable[[Mapping[str, np.ndarray], Config], str] = field(default=lambda arrays, cfg: "")


def _ngu_field_problem(arrays: Mapping[str, np.ndarray], cfg: Config) -> str:
    mixture, intrinsic = arrays["mixture"], arrays["prev_intrinsic"]
    if mixture.min() < 0 or mixture.max() >= cfg.ngu.num_mixtures:
        return f"mixture outside [0, {cfg.ngu.num_mixtures})"
    if not np.all(np.isfinite(intrinsic) & (intrinsic >= 0.0)):
        return "prev_intrinsic must be finite and non-negative"
    return ""


def family_traits(cfg: Config) -> FamilyTraits:
    if cfg.ngu.enabled:
        # NGU's own measure is its exploitative member's return (its others explore on purpose)
        return FamilyTraits("ngu", extra_inputs=cfg.ngu.num_mixtures + 1,
                            fields={"mixture": "int32", "prev_intrinsic": "float32"},
                            behaviour="ngu_epsilon_greedy", evaluation_policy="greedy",
                            score=("exploit_return_100", "exploit_window"), aux_networks=True,
                            check_fields=_ngu_field_problem)
    fixed_boltzmann = not cfg.behaviour.controlled and cfg.behaviour.family == "boltzmann_mixture"
    return FamilyTraits("lbc", extra_inputs=0, fields={}, behaviour=cfg.behaviour.family,
                        evaluation_policy="sample" if fixed_boltzmann else "greedy",
                        score=("mean_return_100", "return_window"), aux_networks=False)


def family_of(cfg: Config) -> str:
    """The algorithm family a configuration trains: "lbc" or "ngu"."""
    return family_traits(cfg).name
