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
    assert _child_env(tmp_path) == ["PASSIVE", SERVICE_ENV_DEFAULTS["GLIBC_TUNABLES"]]
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert _child_env(tmp_path)[-2:] == ["ACTIVE", "glibc.malloc.hugetlb=0"]


# a block well above glibc's largest mmap threshold (32 MB), as an `impala` batch's bfloat16 stacks (38 MB)
REUSE_PROBE = """
import resource
import numpy as np
counts = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.empty(40 << 20, np.uint8)
    block.fill(1)
    del block
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*counts)
"""


def test_a_services_malloc_keeps_a_freed_block_for_the_next(tmp_path, monkeypatch):
    """decision 81: a block freed and asked for again comes back without faulting its pages in again (with
    glibc's own defaults each round faults the whole block in afresh, as many faults as the first)."""
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    child = Child("probe", [sys.executable, "-c", REUSE_PROBE], tmp_path / "probe.log")
    child.start()
    assert child.proc is not None and child.proc.wait(timeout=60) == 0
    first, *later = (int(n) for n in child.log_path.read_text().split())
    assert first > 0 and sum(later) < first / 2, (first, later)


@pytest.mark.parametrize("name", sorted(SERVICE_ENV_DEFAULTS))
def test_the_image_sets_what_the_launcher_sets(name):
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^\s+{name}={re.escape(SERVICE_ENV_DEFAULTS[name])} \\$", dockerfile, re.MULTILINE)
