"""What environment the launcher gives its services, and that the image gives its pods the same."""

import re
import sys
from pathlib import Path

import pytest

from lbc.launch import SERVICE_ENV_DEFAULTS, Child

ROOT = Path(__file__).resolve().parents[2]
PRINT_ENV = "import os; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GLIBC_TUNABLES'))"


def _child_env(tmp_path: Path) -> list[str]:
    child = Child("probe", [sys.executable, "-c", PRINT_ENV], tmp_path / "probe.log")
    child.start()
    assert child.proc is not None and child.proc.wait(timeout=30) == 0
    return child.log_path.read_text().split()


def test_services_get_the_defaults_and_a_callers_setting_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert _child_env(tmp_path) == ["PASSIVE", "glibc.malloc.hugetlb=1"]
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert _child_env(tmp_path)[-2:] == ["ACTIVE", "glibc.malloc.hugetlb=0"]


@pytest.mark.parametrize("name", sorted(SERVICE_ENV_DEFAULTS))
def test_the_image_sets_what_the_launcher_sets(name):
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^\s+{name}={re.escape(SERVICE_ENV_DEFAULTS[name])} \\$", dockerfile, re.MULTILINE)
