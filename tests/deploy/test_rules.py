"""The PrometheusRule's groups through promtool: syntax (check rules) and the alert unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import K8S

RULE = K8S / "components" / "monitoring" / "prometheusrule.yaml"
UNIT_TESTS = Path(__file__).with_name("rules_test.yaml")


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is needed (Debian package prometheus; `make test` installs it)"
    return found


def write_rules(directory: Path) -> Path:
    """promtool reads plain rule files: the PrometheusRule's spec is one."""
    spec = yaml.safe_load(RULE.read_text())["spec"]
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_promtool_check_rules(tmp_path: Path) -> None:
    out = subprocess.run([promtool(), "check", "rules", str(write_rules(tmp_path))], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 14 rules found" in out.stdout


def test_promtool_alert_unit_tests(tmp_path: Path) -> None:
    write_rules(tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    out = subprocess.run([promtool(), "test", "rules", UNIT_TESTS.name], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_unit_tests_fail_on_a_wrong_expectation(tmp_path: Path) -> None:
    write_rules(tmp_path)
    broken = UNIT_TESTS.read_text().replace("value: 20", "value: 21", 1)
    (tmp_path / UNIT_TESTS.name).write_text(broken)
    out = subprocess.run([promtool(), "test", "rules", UNIT_TESTS.name], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode != 0


# (actors up, inserted/s, sampled/s, share of time actors held, share of time the learner waited, replay ratio)
SCALING_CASES = {
    "balanced-by-halves": (2, 2.0, 4.0, 0.5, 0.0, 2.0),   # actors held half the time: one would do
    "starved-learner": (1, 1.0, 2.0, 0.0, 0.75, 2.0),     # the learner waits 3/4 of the time: 4 actors
    "ratio-one": (3, 1.5, 1.0, 0.2, 0.1, 1.0),
    "nothing-inserted": (3, 0.0, 0.0, 0.0, 1.0, 2.0),     # doubling
    "nothing-sampled": (2, 1.0, 0.0, 0.9, 0.0, 2.0),      # no evidence: stay
}


def _scaling_unit_tests() -> dict:
    """promtool unit tests whose expected values are lbc autoscale's own n* (lbc.scaling.balanced_replicas)
    for the same rates, one run label per case."""
    from lbc.scaling import ReplayRates, balanced_replicas

    series, samples = [], []
    for run, (actors, inserted, sampled, actors_wait, learner_wait, ratio) in SCALING_CASES.items():
        labels = f'namespace="lbc", run="{run}"'
        replay = f'{{{labels}, component="replay", pod="replay-0"}}'
        series += [{"series": name + replay, "values": f"0+{per_s * 60:g}x20"} for name, per_s in (
            ("lbc_replay_inserted_total", inserted), ("lbc_replay_sampled_total", sampled),
            ("lbc_replay_insert_blocked_seconds_total", actors_wait),
            ("lbc_replay_sample_blocked_seconds_total", learner_wait))]
        series.append({"series": "lbc_replay_ratio" + replay, "values": f"{ratio:g}x20"})
        series += [{"series": f'up{{{labels}, component="actor", pod="actor-{i}"}}', "values": "1x20"}
                   for i in range(actors)]
        series.append({"series": f'up{{{labels}, component="evaluator", pod="evaluator-0"}}', "values": "1x20"})
        want = balanced_replicas(actors, ReplayRates(inserted, sampled, actors_wait, learner_wait), ratio)
        samples.append({"labels": f"lbc:actor_balanced_replicas{{{labels}}}", "value": want})
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": "lbc:actor_balanced_replicas", "eval_time": "10m", "exp_samples": samples}]}]}


def _promtool_test(directory: Path, unit_tests: dict) -> subprocess.CompletedProcess:
    (directory / "scaling_test.yaml").write_text(yaml.safe_dump(unit_tests))
    return subprocess.run([promtool(), "test", "rules", "scaling_test.yaml"], cwd=directory, capture_output=True,
                          text=True)


def test_balanced_replicas_rule_is_the_autoscaler_rule(tmp_path: Path) -> None:
    """The recording rule KEDA scales by gives, from the same rates, what `lbc autoscale` computes."""
    write_rules(tmp_path)
    cases = _scaling_unit_tests()
    out = _promtool_test(tmp_path, cases)
    assert out.returncode == 0, out.stdout + out.stderr
    values = [s["value"] for s in cases["tests"][0]["promql_expr_test"][0]["exp_samples"]]
    assert values == [1.0, 4.0, pytest.approx(3 * 1.0 / 0.9 / 1.0 / (1.5 / 0.8)), 6.0, 2.0]   # by hand
    # and the check can fail: a wrong expectation is reported
    cases["tests"][0]["promql_expr_test"][0]["exp_samples"][1]["value"] = 5.0
    out = _promtool_test(tmp_path, cases)
    assert out.returncode != 0 and "starved-learner" in out.stdout + out.stderr


def test_kedas_query_passes_promtool(tmp_path: Path) -> None:
    """The ScaledObject's PromQL, parsed and checked by promtool as a rule expression."""
    scaled = yaml.safe_load((K8S / "components" / "keda" / "scaledobject.yaml").read_text())
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    rules = {"groups": [{"name": "keda", "rules": [{"record": "lbc:keda_query", "expr": query}]}]}
    (tmp_path / "keda.yaml").write_text(yaml.safe_dump(rules))
    out = subprocess.run([promtool(), "check", "rules", str(tmp_path / "keda.yaml")], capture_output=True, text=True)
    assert out.returncode == 0 and "SUCCESS: 1 rules found" in out.stdout, out.stdout + out.stderr
    # promtool does reject a broken expression
    (tmp_path / "keda.yaml").write_text(yaml.safe_dump(rules).replace("round(max(", "round(max(("))
    out = subprocess.run([promtool(), "check", "rules", str(tmp_path / "keda.yaml")], capture_output=True, text=True)
    assert out.returncode != 0
