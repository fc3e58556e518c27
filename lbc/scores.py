"""Human-normalised scores: (score - random) / (human - random), from the table shipped in lbc/data."""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

import numpy as np

_TABLE = Path(__file__).parent / "data" / "atari_baselines.tsv"


@cache
def baselines() -> dict[str, tuple[float, float, float]]:
    """game -> (random, human average, human world record)."""
    with _TABLE.open() as f:
        rows = csv.DictReader(f, delimiter="\t")
        return {r["game"]: (float(r["random"]), float(r["human_avg"]), float(r["human_world_record"]))
                for r in rows}


def _normalised(game: str, score: float, reference: int) -> float | None:
    """(score - random) / (reference - random), the reference a column of the table (1: human average,
    2: human world record); None for games outside the table (e.g. Catch)."""
    found = baselines().get(game.lower())
    if found is None:
        return None
    random = found[0]
    return (score - random) / (found[reference] - random)


def human_normalised(game: str, score: float) -> float | None:
    """HNS: (score - random) / (human - random); None for games outside the table (e.g. Catch)."""
    return _normalised(game, score, 1)


def human_world_record_normalised(game: str, score: float) -> float | None:
    """HWRNS (GDI, LBC): (score - random) / (human world record - random); None outside the table."""
    return _normalised(game, score, 2)


SABER_CAP = 2.0


def saber(game: str, score: float) -> float | None:
    """SABER (Toromanoff et al. 2019, as LBC and GDI report it): HWRNS capped at 200%."""
    hwrns = human_world_record_normalised(game, score)
    return None if hwrns is None else min(hwrns, SABER_CAP)


def breaks_world_record(game: str, score: float) -> bool | None:
    """HWRB: does the score reach the human world record (the papers count G >= HWR, ties included)?"""
    found = baselines().get(game.lower())
    return None if found is None else score >= found[2]


def summarise(game: str, scores: list[float]) -> dict[str, float | bool | None]:
    """One evaluation's episode scores: raw mean, median and std, and the mean's HNS, HWRNS, SABER and
    whether it beats the human world record (None for games outside the table, e.g. Catch)."""
    arr = np.asarray(scores, dtype=np.float64)
    mean = float(arr.mean())
    return {"mean": mean, "median": float(np.median(arr)), "std": float(arr.std()),
            "min": float(arr.min()), "max": float(arr.max()), "episodes": len(scores),
            "hns": human_normalised(game, mean), "hwrns": human_world_record_normalised(game, mean),
            "saber": saber(game, mean), "hwrb": breaks_world_record(game, mean)}


def aggregate(scores: dict[str, float]) -> dict[str, float]:
    """The papers' aggregates over games (game -> raw score, one per game): mean and median HNS, HWRNS
    and SABER (each in %), and the count of games above the human world record."""
    hns = np.array([human_normalised(g, s) for g, s in scores.items()], dtype=np.float64)
    hwrns = np.array([human_world_record_normalised(g, s) for g, s in scores.items()], dtype=np.float64)
    sab = np.minimum(hwrns, SABER_CAP)
    return {"games": len(scores),
            "mean_hns": 100 * float(hns.mean()), "median_hns": 100 * float(np.median(hns)),
            "mean_hwrns": 100 * float(hwrns.mean()), "median_hwrns": 100 * float(np.median(hwrns)),
            "mean_saber": 100 * float(sab.mean()), "median_saber": 100 * float(np.median(sab)),
            "hwrb": int(sum(bool(breaks_world_record(g, s)) for g, s in scores.items()))}


def iqm(values: np.ndarray) -> float:
    """Interquartile mean (Agarwal et al. 2021): the mean of the middle 50% of the values, via scipy's
    trim_mean with a quarter cut from each end."""
    from scipy.stats import trim_mean

    return float(trim_mean(np.asarray(values, dtype=np.float64).ravel(), 0.25))


def iqm_with_ci(normalised: np.ndarray, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """IQM of normalised scores [runs, games] with a 95% stratified bootstrap interval (rliable's
    recipe: runs are resampled with replacement within each game), by scipy.stats.bootstrap's
    percentile method. Returns (iqm, low, high); with one run per game the interval is the point."""
    from scipy.stats import bootstrap

    data = np.asarray(normalised, dtype=np.float64)
    point = iqm(data)
    if data.shape[0] < 2:
        return point, point, point
    # each game is one sample along axis 0 (its runs): bootstrap resamples runs of every game together
    per_game = [data[:, g] for g in range(data.shape[1])]

    def statistic(*columns: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.apply_along_axis(iqm, axis, np.concatenate(columns, axis=axis))

    res = bootstrap(per_game, statistic, n_resamples=resamples, method="percentile", vectorized=True,
                    random_state=np.random.default_rng(seed), paired=False)
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)
