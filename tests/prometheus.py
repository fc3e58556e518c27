"""A real Prometheus scraping local service processes, and the dashboard's queries bound to one run: what the
tests that check lbc's dashboard and rules against real data share."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from lbc.service import signal_on_parent_death
from tests.support import free_port, wait_for

NAMESPACE = "lbc"


@dataclass(frozen=True)
class Target:
    """One process to scrape, with the labels the PodMonitor gives its series on a cluster."""
    component: str
    pod: str
    run: str
    metrics_port: int


@contextmanager
def prometheus(root: Path, targets: list[Target], rule_files: tuple[str, ...] = (),
               interval: str = "2s") -> Iterator[str]:
    """Prometheus on a free port under `root`, scraping `targets` every `interval` (rules evaluated as often);
    yields its URL once every target is up. `rule_files` are paths relative to `root`, written by the caller."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is needed (Debian package prometheus; `make test` installs it)"
    scrape_configs = [{
        "job_name": target.component,
        "scrape_interval": interval,
        "static_configs": [{"targets": [f"127.0.0.1:{target.metrics_port}"],
                            "labels": {"namespace": NAMESPACE, "pod": target.pod, "component": target.component,
                                       "run": target.run}}],
    } for target in targets]
    config = {"global": {"evaluation_interval": interval}, "rule_files": list(rule_files),
              "scrape_configs": scrape_configs}
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (root / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], cwd=root, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=signal_on_parent_death)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(promql(url, "up == 1")) == len(targets), 60, "Prometheus scraping every service")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def promql(url: str, expr: str, at: float | None = None) -> list[dict]:
    """The instant vector `expr` evaluates to (now, or at the Unix time `at`); empty while Prometheus is not up."""
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=5) as resp:
            body = json.load(resp)
    except OSError:
        return []
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for_data(url: str, exprs: list[str], timeout: float, interval: float = 3) -> None:
    """Wait until every expression returns data; AssertionError naming those that still return none."""
    def missing() -> list[str]:
        return [e for e in exprs if not promql(url, e)]

    try:
        wait_for(lambda: not missing(), timeout, "data for every expression", interval=interval)
    except AssertionError:
        raise AssertionError(f"no data for: {missing()}") from None


def bound_queries(panels: list[dict], run: str, rate_interval: str = "20s") -> list[str]:
    """Every target expression of `panels` (lbc.dashboard's built JSON), bound_to_run."""
    return [bound_to_run(t["expr"], run, rate_interval) for p in panels for t in p.get("targets", [])]


def bound_to_run(expr: str, run: str, rate_interval: str = "20s") -> str:
    """`expr` with the dashboard's variables bound to one run in NAMESPACE, every ψ dimension, `rate_interval`."""
    bind = {"$namespace": NAMESPACE, "$run": run, "$dimension": ".*", "$__rate_interval": rate_interval}
    for var, val in bind.items():
        expr = expr.replace(var, val)
    assert "$" not in expr, f"unbound variable in {expr}"
    return expr
