"""The manifests really run: every container of the rendered dev overlay is started as a local process
with its command, args and environment (Service names resolved to 127.0.0.1, volumes mapped to
temporary folders), its readiness probe must pass, and trajectories and parameters must flow.
Then a real Prometheus scrapes those processes with the PodMonitor's labels and the rules loaded,
and every query of the dashboard (the central inference service's row aside: this overlay's actors infer
locally) and of the rules must return data, KEDA's among them."""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lbc import dashboard
from lbc.launch import SERVICE_ENV_DEFAULTS
from tests.deploy.manifests import by_kind, config_env, container_env, render, workloads
from tests.deploy.test_rules import RULE, write_rules
from tests.prometheus import Target, bound_queries, bound_to_run, promql, wait_for_data
from tests.prometheus import prometheus as running_prometheus
from tests.support import Service, metric, port_is_free, wait_for, wait_healthy

pytestmark = pytest.mark.slow

OVERLAY = "overlays/dev"
SERVICE_HOSTS = ("lbc-learner", "lbc-replay", "lbc-bandit")
# Pong episodes with a random policy last minutes; cap them so returns and bandit reports appear
# within the test. This is the only setting the test changes from the manifests.
TEST_ENV = {"LBC_ENV__MAX_EPISODE_FRAMES": "2000"}


@dataclass
class Pod:
    component: str
    name: str
    labels: dict[str, str]
    ports: dict[str, int]
    readiness: dict
    service: Service


def _local_env(env: dict[str, str], mounts: dict[str, Path], home: Path) -> dict[str, str]:
    out = {}
    for key, val in env.items():
        for host in SERVICE_HOSTS:
            val = re.sub(rf"\b{host}(?=:\d)", "127.0.0.1", val)
        for mount, local in mounts.items():
            if val == mount or val.startswith(mount + "/"):
                val = str(local) + val[len(mount):]
        out[key] = val
    base = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "HOME": str(home),
            **SERVICE_ENV_DEFAULTS, "PYTHONDONTWRITEBYTECODE": "1"}   # the image's ENV
    return {**base, **out, **TEST_ENV}


def _argv(container: dict) -> list[str]:
    command = [*container["command"], *container.get("args", [])]
    executable = {"python": sys.executable, "lbc": str(Path(sys.executable).parent / "lbc")}
    return [executable.get(command[0], command[0]), *command[1:]]


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Pod]]:
    objects = render(OVERLAY)
    root = tmp_path_factory.mktemp("cluster")
    started: dict[str, Pod] = {}
    for workload in workloads(objects):
        spec = workload["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        component = workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        name = f"{workload['metadata']['name']}-0"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        busy = [p for p in ports.values() if not port_is_free(p)]
        assert not busy, f"ports {busy} of {name} are taken on this machine; stop what uses them (a `make run`?)"
        mounts = {m["mountPath"]: root / name / m["name"] for m in container.get("volumeMounts", [])}
        for local in mounts.values():
            local.mkdir(parents=True, exist_ok=True)
        env = _local_env(container_env(objects, container, name), mounts, mounts.get("/tmp", root))
        service = Service.from_argv(name, _argv(container), root / "logs", env=env, cwd=root)
        started[component] = Pod(component, name, workload["spec"]["template"]["metadata"]["labels"], ports,
                                 container["readinessProbe"], service)
    # Start in the order Kubernetes would leave to chance: actors first, so they must wait for peers.
    order = sorted(started, key=lambda c: {"actor": 0, "learner": 1, "replay": 2, "bandit": 3}.get(c, 4))
    for component in order:
        started[component].service.start()
    yield started
    for pod in started.values():
        pod.service.stop()


def test_pods_become_ready_by_their_readiness_probes(pods: dict[str, Pod]) -> None:
    assert set(pods) == {"actor", "learner", "replay", "bandit", "evaluator"}
    for pod in pods.values():
        probe = pod.readiness["grpc"]
        try:
            wait_healthy(f"127.0.0.1:{probe['port']}", probe.get("service", ""), timeout=120)
        except AssertionError:
            raise AssertionError(f"{pod.name} not ready; log:\n{pod.service.log()[-3000:]}") from None


def test_trajectories_and_parameters_flow(pods: dict[str, Pod]) -> None:
    actor, replay, learner, bandit = (pods[c].ports["metrics"] for c in ("actor", "replay", "learner", "bandit"))
    wait_for(lambda: metric(replay, "lbc_replay_inserted_total") >= 64, 120, "sequences in replay")
    wait_for(lambda: metric(learner, "lbc_learner_steps_total") >= 30, 180, "learner steps")
    wait_for(lambda: metric(learner, "lbc_learner_param_version") >= 1, 60, "a pushed version")
    wait_for(lambda: metric(actor, "lbc_actor_param_version") >= 1, 60, "the actor pulling a new version")
    wait_for(lambda: metric(bandit, "lbc_bandit_episodes_total") >= 1, 120, "an episode return at the bandit")
    for pod in pods.values():
        assert pod.service.alive(), f"{pod.name} exited; log:\n{pod.service.log()[-3000:]}"


# --- a real Prometheus over the same processes ---------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(pods: dict[str, Pod], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("prometheus")
    write_rules(root)
    targets = [Target(pod.component, pod.name, pod.labels["lbc.dev/run"], pod.ports["metrics"])
               for pod in pods.values()]
    with running_prometheus(root, targets, rule_files=("rules.yaml",)) as url:
        yield url


def _dashboard_queries() -> list[str]:
    """Every panel target and variable query, with the variables bound to this run; the central inference
    service's panels aside (this overlay's actors infer locally; tests/integration/test_inference_service.py
    checks those against the service)."""
    board = dashboard.build()
    rows = dashboard.panels_by_row(board)
    assert dashboard.INFERENCE_ROW in rows
    panels = [p for title, row in rows.items() if title != dashboard.INFERENCE_ROW for p in row]
    exprs = bound_queries(panels, "dev")
    for var in board["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, str) and query.startswith("label_values("):
            series = query[len("label_values("):].rsplit(",", 1)[0]   # the series behind label_values
            exprs.append(bound_to_run(series, "dev"))
    return exprs


def _rule_queries() -> list[str]:
    """Recording rules as written; alerts without their threshold, so a healthy run still returns data."""
    out = []
    for group in yaml.safe_load(RULE.read_text())["spec"]["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"]
            if "alert" in rule:
                expr = re.sub(r"\s*(==|!=|>=|<=|>|<)\s*[-\d.e+]+\s*$", "", expr)
            out.append(expr)
    return out


def test_every_dashboard_and_rule_expression_returns_data(pods: dict[str, Pod], prometheus: str) -> None:
    test_trajectories_and_parameters_flow(pods)   # training is under way and episodes have ended
    exprs = _dashboard_queries() + _rule_queries()
    assert len(exprs) > 30
    wait_for_data(prometheus, exprs, 90)
    # the labels the dashboard groups by are really there
    assert {r["metric"]["component"] for r in promql(prometheus, dashboard_cpu_query())} == set(pods)
    heat = promql(prometheus, 'sum by (arm) (lbc_bandit_selections_total{namespace="lbc", run="dev"})')
    assert len(heat) >= 1 and all("arm" in r["metric"] for r in heat)


def test_kedas_query_returns_what_lbc_autoscale_would_compute(pods: dict[str, Pod], prometheus: str) -> None:
    """The ScaledObject's query returns one whole replica count on the running system, and the rule behind
    it equals lbc.scaling's n* computed from the same Prometheus's rates at the same instant."""
    from lbc.scaling import ReplayRates, balanced_replicas

    test_trajectories_and_parameters_flow(pods)
    (scaled,) = by_kind(render("overlays/keda"), "ScaledObject")
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    wait_for(lambda: promql(prometheus, query), 90, "KEDA's query returning data", interval=3)
    (sample,) = promql(prometheus, query)
    count = float(sample["value"][1])
    assert math.isfinite(count) and count >= 1 and count == round(count)

    (rule,) = [r for g in yaml.safe_load(RULE.read_text())["spec"]["groups"] for r in g["rules"]
               if r.get("record") == "lbc:actor_balanced_replicas"]
    replay = '{namespace="lbc", run="dev", component="replay"}'
    rate_names = ("lbc_replay_inserted_total", "lbc_replay_sampled_total", "lbc_replay_insert_blocked_seconds_total",
                  "lbc_replay_sample_blocked_seconds_total")
    exprs = [*(f"sum(rate({name}{replay}[2m]))" for name in rate_names),
             'count(up{namespace="lbc", run="dev", component="actor"} == 1)', f"max(lbc_replay_ratio{replay})",
             rule["expr"]]

    found: list[float] = []

    def at_one_instant() -> bool:
        """Every input and the rule itself at one evaluation time, kept in `found`; False while some series
        has no data there yet (a scrape behind under load)."""
        at = time.time() - 3
        results = [promql(prometheus, expr, at) for expr in exprs]
        found[:] = [] if any(len(r) != 1 for r in results) else [float(r[0]["value"][1]) for r in results]
        return bool(found)

    wait_for(at_one_instant, 60, "replay's rates, the actors and the rule at one instant")
    *rates, actors, ratio, rule_value = found
    want = balanced_replicas(int(actors), ReplayRates(*rates), ratio)
    assert rule_value == pytest.approx(want, rel=1e-6), (rates, actors, ratio)


def dashboard_cpu_query() -> str:
    return 'sum by (component) (rate(process_cpu_seconds_total{namespace="lbc", run="dev"}[20s]))'


def test_no_alert_fires_on_a_healthy_run(prometheus: str) -> None:
    firing = [a for a in promql(prometheus, "ALERTS") if a["metric"].get("alertstate") == "firing"]
    assert not firing, firing


def test_configmap_preset_is_the_cpu_embedded_default() -> None:
    assert config_env(render(OVERLAY))["LBC_PRESET"] == "cpu"
    assert len(by_kind(render(OVERLAY), "ConfigMap")) == 1
