"""Learner checkpoints: weights, optimiser, step counters and RNG, written atomically and loaded
with weights_only=True (no code runs on load)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from lbc.files import write_atomically

KEEP = 3


@dataclass
class Counters:
    step: int = 0
    version: int = 0
    samples: int = 0


def save(directory: Path, trainer_model: torch.nn.Module, optimiser: torch.optim.Optimizer,
         counters: Counters, extra: dict[str, torch.nn.Module] | None = None) -> Path:
    """Write a checkpoint; `extra` names further modules whose state matters (NGU's target network)."""
    path = directory / f"ckpt-{counters.step:09d}.pt"
    state = {"model": trainer_model.state_dict(), "optimiser": optimiser.state_dict(),
             "step": counters.step, "version": counters.version, "samples": counters.samples,
             "torch_rng": torch.get_rng_state(),
             "extra": {name: module.state_dict() for name, module in (extra or {}).items()}}
    write_atomically(path, lambda f: torch.save(state, f))
    for old in sorted(directory.glob("ckpt-*.pt"))[:-KEEP]:
        old.unlink()
    return path


def latest(directory: Path) -> Path | None:
    found = sorted(directory.glob("ckpt-*.pt"))
    return found[-1] if found else None


def load(path: Path, trainer_model: torch.nn.Module, optimiser: torch.optim.Optimizer,
         extra: dict[str, torch.nn.Module] | None = None) -> Counters:
    state = torch.load(path, weights_only=True, map_location="cpu")
    saved_extra = state.get("extra", {})
    missing = set(extra or {}) - set(saved_extra)
    if missing:
        raise ValueError(f"checkpoint {path} lacks {sorted(missing)}")
    trainer_model.load_state_dict(state["model"])
    for name, module in (extra or {}).items():
        module.load_state_dict(saved_extra[name])
    optimiser.load_state_dict(state["optimiser"])
    torch.set_rng_state(state["torch_rng"])
    return Counters(step=int(state["step"]), version=int(state["version"]), samples=int(state["samples"]))


def load_newest(directory: Path, trainer_model: torch.nn.Module, optimiser: torch.optim.Optimizer,
                extra: dict[str, torch.nn.Module] | None = None,
                log: logging.Logger | None = None) -> tuple[Path, Counters] | None:
    """Load the newest checkpoint that loads: one cut short or corrupted (a full disk, a killed copy) is
    skipped with a warning naming it, and the previous one restores the run. None when none loads."""
    for path in sorted(directory.glob("ckpt-*.pt"), reverse=True):
        try:
            return path, load(path, trainer_model, optimiser, extra)
        except Exception as exc:   # torch raises several kinds for a damaged file; each means "not this one"
            (log or logging.getLogger("learner")).warning("checkpoint %s does not load (%s: %s); trying the one "
                                                          "before", path, type(exc).__name__, exc)
    return None


def record_version(directory: Path, version: int) -> None:
    """Remember the last published version, so a learner that died between checkpoints resumes
    above it and versions never repeat."""
    write_atomically(directory / "published_version", lambda f: f.write(str(version).encode()))


def published_version(directory: Path) -> int:
    path = directory / "published_version"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return -1
