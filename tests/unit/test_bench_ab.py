"""bench.ab: arms parsed as --set takes them, windows in turn, and the comparison a drifting host cannot fake."""

import math
import sys

import pytest

from bench.ab import (
    SYSTEM_FIGURES,
    main,
    parse_arm,
    schedule,
    sign_test_p,
    summarise,
    summary_lines,
    window_figures,
)
from bench.throughput import stage_figures


def test_an_arm_is_a_label_and_settings_whose_values_may_hold_commas():
    arm = parse_arm("on: actor.frame_ring=true,bandit.bva_widths=(1,2,3), learner.threads=1")
    assert arm.label == "on"
    assert arm.settings == ("actor.frame_ring=true", "bandit.bva_widths=(1,2,3)", "learner.threads=1")
    assert parse_arm("preset:").settings == ()
    for bad in ("no-colon", ":actor.threads=1", "x:actor.threads"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_arm(bad)


def test_an_arm_may_run_from_another_checkout_of_lbc(tmp_path):
    """LABEL@DIR: the arm's system runs from the checkout at DIR, which must hold lbc and its generated lbcproto."""
    (tmp_path / "lbc").mkdir()
    (tmp_path / "lbc" / "launch.py").write_text("")
    with pytest.raises(ValueError, match="no generated lbcproto"):
        parse_arm(f"before@{tmp_path}:")
    (tmp_path / "lbcproto").mkdir()
    (tmp_path / "lbcproto" / "lbc_pb2.py").write_text("")
    arm = parse_arm(f"before@{tmp_path}: learner.threads=1")
    assert (arm.label, arm.settings, arm.checkout) == ("before", ("learner.threads=1",), tmp_path)
    assert parse_arm("after:").checkout is None
    with pytest.raises(ValueError, match="not a checkout of lbc"):
        parse_arm(f"before@{tmp_path / 'lbc'}:")
    with pytest.raises(ValueError, match="LABEL"):
        parse_arm("before@:")


def test_rounds_alternate_so_each_arms_mean_time_is_the_same():
    assert schedule(2, 2) == [(0, 0), (0, 1), (1, 1), (1, 0)]
    assert schedule(3, 1) == [(0, 0), (0, 1), (0, 2)]
    for arms, rounds in ((2, 4), (3, 2), (4, 6)):
        order = schedule(arms, rounds)
        assert sorted(order) == [(r, a) for r in range(rounds) for a in range(arms)]
        times = [[t for t, (_, a) in enumerate(order) if a == arm] for arm in range(arms)]
        assert len({sum(ts) / len(ts) for ts in times}) == 1


def _windows(gain: float, drift: float, arms: int = 2, rounds: int = 2) -> list[dict]:
    """Windows of a host that speeds up by `drift` of its first window's rate each window, the second arm `gain`
    times the first; every other figure 1."""
    out = []
    for t, (r, a) in enumerate(schedule(arms, rounds)):
        fps = 1000.0 * (1 + drift * t) * (gain if a == 1 else 1.0)
        out.append({"round": r, "arm": a, **dict.fromkeys(SYSTEM_FIGURES, 1.0), "frames_per_s": fps})
    return out


def test_the_means_cancel_a_linear_drift_and_the_rounds_say_whether_it_hid_the_gain():
    s = summarise(["off", "on"], _windows(gain=1.05, drift=0.02), tuple(SYSTEM_FIGURES))
    assert s["arms"]["on"]["ratio_of_means"]["frames_per_s"] == pytest.approx(1.05)
    assert (s["arms"]["on"]["above"], s["arms"]["on"]["decided"]) == (2, 2)
    # a drift larger than the gain: the first round says +12%, the second -6%; the means still say +2%
    s = summarise(["off", "on"], _windows(gain=1.02, drift=0.1), tuple(SYSTEM_FIGURES))
    on = s["arms"]["on"]
    assert on["ratio_of_means"]["frames_per_s"] == pytest.approx(1.02)
    assert on["ratio_by_round"] == pytest.approx([1.02 * 1.1, 1.02 * 1.2 / 1.3])
    assert (on["above"], on["decided"], on["sign_p"]) == (1, 2, 1.0)
    assert s["arms"]["off"]["ratio_of_means"]["frames_per_s"] == 1.0
    table = summary_lines(s, SYSTEM_FIGURES)
    assert table[1].split()[:3] == ["off", "1,150", "1.000"] and "(base)" in table[1]
    assert table[2].split()[:5] == ["on", "1,173", "1.020", "1.122,", "0.942"]
    assert table[2].endswith("1 of 2 rounds above, sign test p 1.00")


def test_the_sign_test_is_the_binomial_tail_on_both_sides():
    assert sign_test_p(8, 8) == sign_test_p(0, 8) == pytest.approx(2 / 256)
    assert sign_test_p(7, 8) == pytest.approx(2 * 9 / 256)
    assert sign_test_p(2, 2) == 0.5 and sign_test_p(4, 8) == 1.0 and sign_test_p(0, 0) == 1.0
    # a brute-force count of the 2^n outcomes as far from half as the one seen
    n, k = 11, 3
    far = sum(1 for bits in range(2 ** n) if abs(bin(bits).count("1") - n / 2) >= abs(k - n / 2))
    assert sign_test_p(k, n) == pytest.approx(far / 2 ** n)


def test_a_stage_block_counts_the_steps_cpu_after_one_to_warm_up():
    spent = iter([9.0, 0.25, 0.25, 0.25, 0.25, 0.25])   # the first step (after the other arm's block) not counted
    w = stage_figures(lambda: next(spent), samples=32, block_seconds=1.0)
    assert w == {"samples_per_cpu_s": 32 * 4 / 1.0, "cpu_ms_per_step": 250.0}


def test_a_window_counts_cpu_per_agent_step_by_service():
    e2e = {"frames_per_s": 8000.0, "seconds": 10.0, "actor_loop_ms": {"games": 9.0, "inference": 3.5},
           "cpu": ({"actor_svc 0": 1.0, "actor_svc eval": 0.0, "learner_svc": 2.0, "replay_svc": 0.0},
                   {"actor_svc 0": 11.0, "actor_svc eval": 1.0, "learner_svc": 10.0, "replay_svc": 0.5}),
           "stolen_cores": 0.1}
    w = window_figures(e2e, frames_per_step=4)   # 2,000 agent steps/s: a core is 0.5 ms an agent step
    assert w["actors_ms_per_agent_step"] == pytest.approx(0.5)
    assert w["learner_ms_per_agent_step"] == pytest.approx(0.4)
    assert w["evaluator_ms_per_agent_step"] == pytest.approx(0.05)   # apart from the actors
    assert w["cpu_ms_per_agent_step"] == pytest.approx(0.5 + 0.05 + 0.4 + 0.025)
    assert w["inference_ms_per_loop"] == 3.5
    assert w["stolen_cores"] == 0.1


def test_a_figure_the_first_arm_never_had_compares_as_nan_not_a_crash():
    # bare metal: no steal time in any window, so no ratio of means for it
    windows = [{**w, "stolen_cores": 0.0} for w in _windows(gain=1.05, drift=0.0)]
    on = summarise(["off", "on"], windows, tuple(SYSTEM_FIGURES))["arms"]["on"]
    assert on["ratio_of_means"]["frames_per_s"] == pytest.approx(1.05)
    assert math.isnan(on["ratio_of_means"]["stolen_cores"])


@pytest.mark.parametrize("argv, says", [
    (["--actors", "1", "--arm", "a:"], "two or more arms"),
    (["--arm", "a:", "--arm", "b:"], "needs --actors"),
    (["--actors", "1", "--arm", "a:", "--arm", "a:actor.threads=1"], "different labels"),
    (["--actors", "1", "--arm", "a:", "--arm", "b:actor.no_such=1"], "no_such"),
    (["--actors", "1", "--arm", "a:", "--arm", "b=actor.threads=1"], "LABEL[@DIR]:KEY=VALUE"),
    (["--stage", "learner", "--arm", "a:", "--arm", "b@.:"], "--stage system"),
])
def test_bad_arms_are_refused_before_any_window(monkeypatch, capsys, argv, says):
    monkeypatch.setattr(sys, "argv", ["bench.ab", *argv])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    assert says in capsys.readouterr().err
