"""Human-normalised scores: (score - random) / (human - random), from the table shipped in lbc/data."""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

_TABLE = Path(__file__).parent / "data" / "atari_baselines.tsv"


@cache
def baselines() -> dict[str, tuple[float, float, float]]:
    """game -> (random, human average, human world record)."""
    with _TABLE.open() as f:
        rows = csv.DictReader(f, delimiter="\t")
        return {r["game"]: (float(r["random"]), float(r["human_avg"]), float(r["human_world_record"]))
                for r in rows}


def human_normalised(game: str, score: float) -> float | None:
    """None for games outside the table (e.g. Catch)."""
    found = baselines().get(game.lower())
    if found is None:
        return None
    random, human, _ = found
    return (score - random) / (human - random)
