"""The actor autoscaler's decision logic (lbc.scaling), on hand-derived cases."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from lbc.scaling import (
    Autoscaler,
    ReplayCounters,
    ReplayRates,
    ScalePolicy,
    balanced_replicas,
    parse_replay_metrics,
)


def rates(insert: float = 10.0, sample: float = 20.0, actors_wait: float = 0.0,
          learner_wait: float = 0.0) -> ReplayRates:
    return ReplayRates(insert, sample, actors_wait, learner_wait)


def test_balanced_replicas_by_hand() -> None:
    # Learner waits half the time: it could take 40/s, i.e. 20 sequences/s at ratio 2, twice what 4 actors give.
    assert balanced_replicas(4, rates(learner_wait=0.5), replay_ratio=2.0) == pytest.approx(8.0)
    # Actors held back half the time: they could give 20/s where the learner needs 10/s.
    assert balanced_replicas(4, rates(actors_wait=0.5), replay_ratio=2.0) == pytest.approx(2.0)
    # Neither waits: balanced as is.
    assert balanced_replicas(4, rates(), replay_ratio=2.0) == pytest.approx(4.0)
    # Nothing inserted at all: double.
    assert balanced_replicas(3, rates(insert=0.0, sample=0.0), replay_ratio=2.0) == 6.0


def test_rates_between_readings_and_a_replay_restart() -> None:
    a = ReplayCounters(time=10.0, inserted=100, sampled=200, insert_blocked_s=1.0, sample_blocked_s=2.0)
    b = ReplayCounters(time=20.0, inserted=150, sampled=300, insert_blocked_s=3.0, sample_blocked_s=7.0)
    r = ReplayRates.between(a, b)
    assert r == ReplayRates(insert_per_s=5.0, sample_per_s=10.0, actors_wait=0.2, learner_wait=0.5)
    restarted = ReplayCounters(time=30.0, inserted=5, sampled=0, insert_blocked_s=0.0, sample_blocked_s=0.0)
    assert ReplayRates.between(b, restarted) is None
    assert ReplayRates.between(b, b) is None


def test_patience_then_scale_up_with_the_step_capped() -> None:
    scaler = Autoscaler(ScalePolicy(max_replicas=16, patience=3, cooldown_s=0.0, max_step_factor=2.0))
    starving = rates(learner_wait=0.8)          # n* = 5 x n
    assert scaler.observe(2, starving, now=1).replicas == 2
    assert scaler.observe(2, starving, now=2).replicas == 2
    decision = scaler.observe(2, starving, now=3)
    assert decision.replicas == 4 and decision.reason == "scale up"   # capped at x2, not 10
    assert decision.target == pytest.approx(10.0)


def test_direction_change_or_band_resets_the_streak() -> None:
    scaler = Autoscaler(ScalePolicy(patience=2, cooldown_s=0.0))
    assert scaler.observe(4, rates(learner_wait=0.5), now=1).replicas == 4        # up 1/2
    assert scaler.observe(4, rates(actors_wait=0.5), now=2).replicas == 4         # down 1/2: streak restarts
    assert scaler.observe(4, rates(), now=3).reason == "within the band"          # resets
    assert scaler.observe(4, rates(actors_wait=0.5), now=4).replicas == 4         # down 1/2
    assert scaler.observe(4, rates(actors_wait=0.5), now=5).replicas == 2         # down 2/2: 4 -> 2


def test_dead_band_keeps_small_differences() -> None:
    scaler = Autoscaler(ScalePolicy(patience=1, cooldown_s=0.0, rel_band=0.15))
    # n* = 10 / 0.91 = 10.99 -> 11: one replica is under 15 % of 10.
    assert scaler.observe(10, rates(learner_wait=0.09), now=1).reason == "within the band"
    assert scaler.observe(10, rates(learner_wait=0.2), now=2).replicas == 12    # 12.5 -> 12


def test_cooldown_and_bounds() -> None:
    scaler = Autoscaler(ScalePolicy(min_replicas=2, max_replicas=6, patience=1, cooldown_s=100.0))
    assert scaler.observe(4, rates(learner_wait=0.9), now=0).replicas == 6       # n* = 40, bounded to 6
    assert scaler.observe(6, rates(actors_wait=0.9), now=50).reason == "cooling down"
    assert scaler.observe(6, rates(actors_wait=0.9), now=200).replicas == 3      # /2 per step, n* = 0.6 -> min 2
    assert scaler.observe(3, rates(actors_wait=0.9), now=400).replicas == 2
    outside = scaler.observe(9, rates(), now=401)
    assert outside.replicas == 6 and "outside the bounds" in outside.reason


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        ScalePolicy(min_replicas=5, max_replicas=2)
    with pytest.raises(ValueError):
        ScalePolicy(patience=0)


def test_parse_replay_metrics_from_real_exposition() -> None:
    registry = CollectorRegistry()
    values = {"lbc_replay_inserted_total": 12, "lbc_replay_sampled_total": 24,
              "lbc_replay_insert_blocked_seconds_total": 1.5, "lbc_replay_sample_blocked_seconds_total": 0.25}
    for name, value in values.items():
        Counter(name.removesuffix("_total"), "x", registry=registry).inc(value)
    text = generate_latest(registry).decode()
    assert parse_replay_metrics(text, time=3.0) == ReplayCounters(3.0, 12, 24, 1.5, 0.25)
    with pytest.raises(ValueError, match="lack"):
        parse_replay_metrics("# TYPE x counter\nx_total 1\n", time=0.0)
