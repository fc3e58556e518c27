"""The learner step of the configured algorithm: the one place that picks it."""

from __future__ import annotations

from lbc.config import Config
from learner_svc.ngu_training import NguTrainer
from learner_svc.training import Trainer


def make_trainer(cfg: Config) -> Trainer:
    """NGU's and Agent57's transformed-Retrace learner with its auxiliary networks, or the learner of the
    LBC family (LBC-BM, IMPALA, DiCE, GDI), which differ by configuration only."""
    return NguTrainer(cfg) if cfg.ngu.enabled else Trainer(cfg)
