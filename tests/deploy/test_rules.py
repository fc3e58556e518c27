"""The PrometheusRule's groups through promtool: syntax (check rules) and the alert unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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
    assert "SUCCESS: 13 rules found" in out.stdout


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
