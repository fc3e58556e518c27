"""How many actors keep the learner fed: the actor autoscaler's decision, a pure function of what
replay reports.

Replay's rate limiter holds inserts and samples to the replay ratio r, so the two rates always
agree (sampled ~ r x inserted) and cannot say on their own which side is short. What differs is
who waits: while the learner waits for data (fraction w_l of the time) the actors are too few;
while the limiter holds the actors back (fraction w_a) they are too many. With n actors each
inserting I/n sequences/s, the learner could consume S / (1 - w_l) samples/s and the actors could
produce I / (1 - w_a) sequences/s, so the replicas at which production meets r-fold consumption are

    n* = n * (S / (1 - w_l) / r) / (I / (1 - w_a)).

Hysteresis: a change is made only when n* differs from n by at least `min_change` replicas and
`rel_band` of n, in the same direction for `patience` observations in a row, and not within
`cooldown_s` of the last change; one change moves at most a factor `max_step_factor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class ScalePolicy:
    """Bounds and hysteresis of the actor autoscaler (see the module docstring for the rule)."""

    min_replicas: int = 1
    max_replicas: int = 16
    replay_ratio: float = 2.0
    rel_band: float = 0.15
    min_change: int = 1
    patience: int = 3
    cooldown_s: float = 120.0
    max_step_factor: float = 2.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.replay_ratio <= 0 or self.patience < 1 or self.max_step_factor <= 1 or self.min_change < 1:
            raise ValueError("replay_ratio > 0, patience >= 1, min_change >= 1 and max_step_factor > 1 are required")


@dataclass(frozen=True)
class ReplayCounters:
    """Cumulative counters read from replay's /metrics at one time."""

    time: float
    inserted: float
    sampled: float
    insert_blocked_s: float
    sample_blocked_s: float


@dataclass(frozen=True)
class ReplayRates:
    """What happened between two readings."""

    insert_per_s: float
    sample_per_s: float
    actors_wait: float    # w_a: fraction of the time the limiter held actors back
    learner_wait: float   # w_l: fraction of the time a learner request waited

    @staticmethod
    def between(old: ReplayCounters, new: ReplayCounters) -> ReplayRates | None:
        """None when the window is empty or a counter went back (replay restarted)."""
        dt = new.time - old.time
        deltas = (new.inserted - old.inserted, new.sampled - old.sampled,
                  new.insert_blocked_s - old.insert_blocked_s, new.sample_blocked_s - old.sample_blocked_s)
        if dt <= 0 or min(deltas) < 0:
            return None
        inserted, sampled, insert_blocked, sample_blocked = deltas
        return ReplayRates(inserted / dt, sampled / dt, min(1.0, insert_blocked / dt), min(1.0, sample_blocked / dt))


def balanced_replicas(current: int, rates: ReplayRates, replay_ratio: float) -> float:
    """n* of the module docstring (not rounded, not clamped)."""
    if rates.insert_per_s <= 0:
        # Nothing inserted: the actors produce nothing the learner could use; more of them is the only move.
        return current * 2.0
    produce_free = rates.insert_per_s / max(1e-3, 1.0 - rates.actors_wait)     # actors' rate if never held
    consume_free = rates.sample_per_s / max(1e-3, 1.0 - rates.learner_wait)    # learner's rate if never waiting
    if consume_free <= 0:
        return float(current)   # the learner took nothing: no evidence either way
    return current * (consume_free / replay_ratio) / produce_free


@dataclass(frozen=True)
class Decision:
    replicas: int          # what the Deployment should have after this step
    target: float          # n* as computed
    reason: str


class Autoscaler:
    """Remembers the streak and the last change; `observe` returns the decision for one window."""

    def __init__(self, policy: ScalePolicy) -> None:
        self.policy = policy
        self._streak_direction = 0
        self._streak = 0
        self._last_change = -math.inf

    def observe(self, current: int, rates: ReplayRates, now: float) -> Decision:
        p = self.policy
        target = balanced_replicas(current, rates, p.replay_ratio)
        bounded = min(p.max_replicas, max(p.min_replicas, target))
        wanted = round(bounded)
        if current < p.min_replicas or current > p.max_replicas:
            self._reset()
            self._last_change = now
            fixed = min(p.max_replicas, max(p.min_replicas, current))
            return Decision(fixed, target, f"outside the bounds [{p.min_replicas}, {p.max_replicas}]")

        diff = wanted - current
        if abs(diff) < p.min_change or abs(diff) < p.rel_band * current:
            self._reset()
            return Decision(current, target, "within the band")
        direction = 1 if diff > 0 else -1
        if direction != self._streak_direction:
            self._streak_direction, self._streak = direction, 0
        self._streak += 1
        if self._streak < p.patience:
            return Decision(current, target, f"{'up' if direction > 0 else 'down'} {self._streak}/{p.patience}")
        if now - self._last_change < p.cooldown_s:
            return Decision(current, target, "cooling down")
        step_max = max(current + p.min_change, math.floor(current * p.max_step_factor))
        step_min = min(current - p.min_change, math.ceil(current / p.max_step_factor))
        replicas = min(step_max, max(step_min, wanted))
        self._reset()
        self._last_change = now
        return Decision(replicas, target, "scale up" if replicas > current else "scale down")

    def _reset(self) -> None:
        self._streak_direction, self._streak = 0, 0


_COUNTERS = {
    "lbc_replay_inserted": "inserted",
    "lbc_replay_sampled": "sampled",
    "lbc_replay_insert_blocked_seconds": "insert_blocked_s",
    "lbc_replay_sample_blocked_seconds": "sample_blocked_s",
}


def parse_replay_metrics(text: str, time: float) -> ReplayCounters:
    """Read the four counters from replay's Prometheus exposition text."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        key = _COUNTERS.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                found[key] = sample.value
    missing = sorted(set(_COUNTERS.values()) - set(found))
    if missing:
        raise ValueError(f"replay metrics lack {', '.join(missing)}; is this replay_svc's /metrics?")
    return ReplayCounters(time=time, **found)
