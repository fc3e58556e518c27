import math
import os
import sys

import pytest

from lbc.config import load_config
from lbc.launch import build_children, parse_args
from lbc.procs import rss_mb, service_name, services


def test_service_names_are_the_launchers(tmp_path):
    args = parse_args(["--preset", "catch", "--actors", "2", "--runs-dir", str(tmp_path)])
    children = build_children(args, [], tmp_path / "run", load_config("catch"))
    assert {c.name: service_name(c.argv) for c in children} == {c.name: c.name for c in children}
    assert service_name([sys.executable, "-m", "http.server"]) is None
    assert service_name([sys.executable, "-m"]) is None and service_name(["bash"]) is None


def test_rss_and_children_of_this_process():
    assert 1 < rss_mb(os.getpid()) < 100_000
    assert rss_mb(2**22 + 12345) is None
    assert services(os.getpid()) == {}


def test_soak_slope_by_hand():
    from bench.soak import slope_mb_per_min
    assert slope_mb_per_min([0, 60, 120], [100.0, 101.0, 102.0]) == pytest.approx(1.0)      # 1 MB a minute
    assert slope_mb_per_min([0, 30, 60, 90], [50.0, 52.0, 50.0, 52.0]) == pytest.approx(0.8)  # 1.0 / 1.25, by hand
    assert math.isnan(slope_mb_per_min([10], [5.0]))
