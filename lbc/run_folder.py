"""Reading a finished or running run folder (`runs/<name>/`) from the tools that use it (`lbc play`,
`lbc evaluate`, `lbc export`, the launcher on --resume): its configuration, one checkpoint (loaded without
unpickling) and the last progress record."""

from __future__ import annotations

import json
from pathlib import Path

from lbc.config import Config


def load_config_of(run_dir: Path, tool: str) -> Config:
    """The run's config.json, validated as at start."""
    path = run_dir / "config.json"
    if not path.exists():
        raise SystemExit(f"lbc {tool}: {path} not found (is {run_dir} a run folder?)")
    return Config(**json.loads(path.read_text()))


def find_checkpoint(run_dir: Path, version: int | None, tool: str = "play") -> tuple[Path, dict]:
    """The newest checkpoint, or the one holding parameter `version`; loaded with weights_only=True."""
    import torch  # here: the launcher reads run folders too, and it starts without torch (tests/unit/test_cli.py)

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


def read_jsonl(path: Path) -> list[dict]:
    """The complete records of a run's JSON-lines log (metrics.jsonl, eval.jsonl); [] when it is missing.
    A line cut short by a kill is skipped: the rest still counts."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def last_record(metrics_log: Path) -> dict | None:
    """The last complete record of a run's metrics log (None for a run that never reported)."""
    records = read_jsonl(metrics_log)
    return records[-1] if records else None
