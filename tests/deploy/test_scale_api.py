"""`lbc scale` and `lbc autoscale` against a fake Kubernetes API server: the exact paths, verbs,
content types and bodies, and nothing else (the RBAC in k8s/base/rbac.yaml allows only these)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from lbc import cli

SCALE_PATH = "/apis/apps/v1/namespaces/lbc/deployments/lbc-actor/scale"


def scale_object(replicas: int) -> dict:
    return {"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": "lbc-actor", "namespace": "lbc"},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas}}


@pytest.fixture()
def kubeconfig(httpserver: HTTPServer, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": httpserver.url_for("").rstrip("/")}}],
        "users": [{"name": "u", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
    }))
    return path


def test_scale_reads_then_patches_the_scale_subresource(httpserver: HTTPServer, kubeconfig: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    httpserver.expect_ordered_request(
        SCALE_PATH, method="GET", headers={"Authorization": "Bearer secret-token"},
    ).respond_with_json(scale_object(2))
    httpserver.expect_ordered_request(
        SCALE_PATH, method="PATCH", json={"spec": {"replicas": 16}},
        headers={"Content-Type": "application/merge-patch+json", "Authorization": "Bearer secret-token"},
    ).respond_with_json(scale_object(16))
    assert cli.main(["scale", "actors", "16", "--namespace", "lbc", "--kubeconfig", str(kubeconfig)]) == 0
    httpserver.check_assertions()
    assert "lbc/lbc-actor: 2 -> 16 replicas" in capsys.readouterr().out


def test_scale_reports_a_refusal_clearly(httpserver: HTTPServer, kubeconfig: Path) -> None:
    httpserver.expect_request(SCALE_PATH, method="GET").respond_with_json(
        {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}, status=403)
    with pytest.raises(SystemExit, match="cannot scale lbc/lbc-actor: 403"):
        cli.main(["scale", "actors", "3", "--namespace", "lbc", "--kubeconfig", str(kubeconfig)])


def test_scale_rejects_negative_replicas() -> None:
    with pytest.raises(SystemExit):
        cli.main(["scale", "actors", "-1"])


def _replay_metrics(inserted: float, sampled: float, insert_blocked: float, sample_blocked: float) -> str:
    return (f"# TYPE lbc_replay_inserted_total counter\nlbc_replay_inserted_total {inserted}\n"
            f"# TYPE lbc_replay_sampled_total counter\nlbc_replay_sampled_total {sampled}\n"
            "# TYPE lbc_replay_insert_blocked_seconds_total counter\n"
            f"lbc_replay_insert_blocked_seconds_total {insert_blocked}\n"
            "# TYPE lbc_replay_sample_blocked_seconds_total counter\n"
            f"lbc_replay_sample_blocked_seconds_total {sample_blocked}\n")


def test_autoscaler_scales_up_a_starved_learner(httpserver: HTTPServer, kubeconfig: Path) -> None:
    """The learner waits 60% of the time: after `patience` windows the autoscaler patches 2 -> 4."""
    state: dict[str, float] = {"t": 0, "start": 0.0}

    def metrics_handler(_request):  # noqa: ANN001 - werkzeug request
        from werkzeug import Response
        now = time.monotonic()
        state["start"] = state["start"] or now
        state["t"] += 1
        t = state["t"]
        # the learner blocked 60% of the wall time the autoscaler measures between its reads: counted by the
        # clock, not per read, so that a busy machine stretching the interval does not change the share
        return Response(_replay_metrics(100 * t, 200 * t, 0.0, 0.6 * (now - state["start"])),
                        content_type="text/plain")

    httpserver.expect_request("/metrics").respond_with_handler(metrics_handler)
    httpserver.expect_request(SCALE_PATH, method="GET").respond_with_json(scale_object(2))
    httpserver.expect_request(SCALE_PATH, method="PATCH", json={"spec": {"replicas": 4}}).respond_with_json(
        scale_object(4))
    args = cli.build_parser().parse_args([
        "autoscale", "--namespace", "lbc", "--kubeconfig", str(kubeconfig),
        "--replay-metrics", httpserver.url_for("/metrics"), "--interval", "0.5", "--patience", "2",
        "--cooldown", "0", "--iterations", "2", "--metrics-port", "0", "--min", "1", "--max", "8"])
    cli.autoscale(args, stop=threading.Event())
    patches = [req for req, _ in httpserver.log if req.method == "PATCH"]
    assert len(patches) == 1
    assert patches[0].path == SCALE_PATH
    assert patches[0].get_json() == {"spec": {"replicas": 4}}
    assert not [req for req, _ in httpserver.log if req.method not in ("GET", "PATCH")]
