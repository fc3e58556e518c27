"""Reading a finished or running run folder (`runs/<name>/`) from the tools that use its checkpoints
(`lbc play`, `lbc export`): its configuration and one checkpoint, loaded without unpickling."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lbc.config import Config


def load_config_of(run_dir: Path, tool: str) -> Config:
    """The run's config.json, validated as at start."""
    path = run_dir / "config.json"
    if not path.exists():
        raise SystemExit(f"lbc {tool}: {path} not found (is {run_dir} a run folder?)")
    return Config(**json.loads(path.read_text()))


def find_checkpoint(run_dir: Path, version: int | None, tool: str = "play") -> tuple[Path, dict]:
    """The newest checkpoint, or the one holding parameter `version`; loaded with weights_only=True."""
    found = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
    if not found:
        raise SystemExit(f"lbc {tool}: no checkpoint in {run_dir / 'checkpoints'}")
    candidates = reversed(found) if version is None else found
    seen = []
    for path in candidates:
        state = torch.load(path, weights_only=True, map_location="cpu")
        if version is None or int(state["version"]) == version:
            return path, state
        seen.append(int(state["version"]))
    raise SystemExit(f"lbc {tool}: no checkpoint of version {version} in {run_dir}; versions kept: {seen}")
