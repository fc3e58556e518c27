"""TensorBoard event files of a run (`tensorboard --logdir runs`), written by the launcher from each
progress record: returns, evaluation scores, speed, lag, every loss term per policy and the bandit's
most chosen region of each psi dimension. The step axis is emulator frames, as in `lbc report`."""

from __future__ import annotations

import re
from pathlib import Path

_REGION = re.compile(r"^\[(-?[\d.]+),(-?[\d.]+)\)$")

SCALARS = {   # progress-record key -> TensorBoard tag
    "mean_return_100": "train/return100",
    "exploit_return_100": "train/return100_j0",
    "hns": "train/hns100",
    "eval_score": "eval/score",
    "eval_version": "eval/version",
    "fps": "speed/frames_per_s",
    "learner_sps": "speed/learner_steps_per_s",
    "lag": "learner/policy_lag",
    "version": "learner/version",
    "grad_norm": "learner/grad_norm",
    "replay_fill": "replay/fill",
}


def region_value(text: str) -> float | None:
    """The middle of a bandit region as the progress record names it ('[9.0,9.2)' -> 9.1, '=j3' -> 3)."""
    if text.startswith("=j"):
        return float(text[2:])
    found = _REGION.match(text)
    return None if found is None else (float(found.group(1)) + float(found.group(2))) / 2


class TensorBoardLog:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(str(log_dir))

    def write(self, record: dict) -> None:
        step = int(record.get("frames") or 0)
        for key, tag in SCALARS.items():
            if record.get(key) is not None:
                self.writer.add_scalar(tag, record[key], step)
        for name, value in (record.get("losses") or {}).items():   # "policy/term"
            policy, term = name.split("/", 1)
            self.writer.add_scalar(f"loss/{term}/policy_{policy}", value, step)
        for layer, share in (record.get("dead_units") or {}).items():
            self.writer.add_scalar(f"torso/dead_units/{layer}", share, step)
        for dim, region in (record.get("bandit_top") or {}).items():
            value = region_value(region)
            if value is not None:
                self.writer.add_scalar(f"bandit/{dim}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
