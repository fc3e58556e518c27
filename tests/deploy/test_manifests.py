"""The rendered manifests: schema-valid for a current Kubernetes, and consistent with what the code
reads (ports, endpoints, environment, health service names), secured and resourced everywhere."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest

from lbc import cli, dashboard
from lbc.config import Config, load_config
from learner_svc import __main__ as learner_main
from tests.deploy.manifests import (
    OVERLAYS,
    REPO,
    by_kind,
    config_env,
    container_env,
    named,
    pod_labels,
    render,
    selects,
    workloads,
)

# custom resources (no schema bundled offline) and their API groups: Prometheus Operator's, KEDA's
CRD_KINDS = {"PodMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
             "ScaledObject": "keda.sh/v1alpha1"}
KUBERNETES = kubernetes_validate.latest_version()
# endpoint field -> (Service, the port name its pods serve it on)
ENDPOINT_SERVICES = {
    "params": ("lbc-learner", "grpc"),
    "bandit": ("lbc-bandit", "grpc"),
    "replay_ingest": ("lbc-replay", "zmq-ingest"),
    "replay_serve": ("lbc-replay", "zmq-serve"),
    "replay_health": ("lbc-replay", "grpc"),
}
# where actors act through the inference service (components/central-inference)
REMOTE_ENDPOINT_SERVICES = {"inference": ("lbc-inference", "zmq")}
SERVICE_MODULES = {"learner": "learner_svc", "replay": "replay_svc", "bandit": "bandit_svc", "actor": "actor_svc",
                   "evaluator": "actor_svc", "inference": "actor_svc"}
# read by the service itself, not by the configuration
SERVICE_ENV = {"actor": {"LBC_ACTOR_ID", "LBC_ACTOR_INDEX"}, "learner": {"LBC_LEARNER_RANK"}}


def component(obj: dict) -> str:
    return obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]


def container(obj: dict) -> dict:
    containers = obj["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{obj['metadata']['name']}: one container per pod expected"
    return containers[0]


def ports(c: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def config_of(objects: tuple[dict, ...], monkeypatch: pytest.MonkeyPatch) -> Config:
    for key, val in config_env(objects).items():
        monkeypatch.setenv(key, val)
    return load_config()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renders_and_passes_strict_schema_validation(overlay: str) -> None:
    objects = render(overlay)
    assert workloads(objects), "no workloads rendered"
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            assert obj["apiVersion"] == CRD_KINDS[obj["kind"]]
            continue
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_strict_validation_catches_a_misspelt_field() -> None:
    obj = json.loads(json.dumps(named(render("overlays/dev"), "Deployment", "lbc-actor")))
    obj["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_match_template_labels(overlay: str) -> None:
    objects = render(overlay)
    made = {w["metadata"]["name"]: pod_labels(w) for w in workloads(objects)}
    pods = {pod: labels for by_pod in made.values() for pod, labels in by_pod.items()}
    for w in workloads(objects):
        selector = w["spec"]["selector"]["matchLabels"]
        assert all(selects(selector, labels) for labels in made[w["metadata"]["name"]].values()), w["metadata"]["name"]
    for svc in by_kind(objects, "Service"):   # each Service reaches the pods of one workload
        matched = [n for n, by_pod in made.items() if any(selects(svc["spec"]["selector"], v) for v in by_pod.values())]
        assert len(matched) == 1, f"Service {svc['metadata']['name']} selects {matched}"
    for pdb in by_kind(objects, "PodDisruptionBudget"):
        assert any(selects(pdb["spec"]["selector"]["matchLabels"], labels) for labels in pods.values())
    for policy in by_kind(objects, "NetworkPolicy"):
        selector = policy["spec"]["podSelector"].get("matchLabels", {})
        assert any(selects(selector, labels) for labels in pods.values()), policy["metadata"]["name"]
        for rule in policy["spec"].get("ingress", []) + policy["spec"].get("egress", []):
            for peer in rule.get("from", []) + rule.get("to", []):
                if "podSelector" in peer:
                    assert any(selects(peer["podSelector"]["matchLabels"], labels) for labels in pods.values()) \
                        or peer["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "autoscaler"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_endpoints_ports_and_services_agree_with_the_configuration(overlay: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(overlay)
    cfg = config_of(objects, monkeypatch)
    by_component = {component(w): w for w in workloads(objects)}
    remote = cfg.actor.inference == "remote"
    assert remote == ("inference" in by_component), "an inference pod exactly where actors act through one"
    endpoint_services = {**ENDPOINT_SERVICES, **(REMOTE_ENDPOINT_SERVICES if remote else {})}
    for field, (service_name, port_name) in endpoint_services.items():
        endpoint = getattr(cfg.endpoints, field).removeprefix("tcp://")
        host, port = endpoint.rsplit(":", 1)
        assert host == service_name, f"endpoints.{field}={endpoint} does not name Service {service_name}"
        svc = named(objects, "Service", service_name)
        svc_port = [p for p in svc["spec"]["ports"] if p["port"] == int(port)]
        assert svc_port and svc_port[0]["targetPort"] == port_name, f"{service_name} exposes no {port} -> {port_name}"
        pod = by_component[svc["spec"]["selector"]["app.kubernetes.io/component"]]
        # the service listens on the endpoint's port (lbc.service.listen_address)
        assert ports(container(pod))[port_name] == int(port), f"{field}: container port differs"
    metrics = {"learner": cfg.endpoints.learner_metrics, "replay": cfg.endpoints.replay_metrics,
               "bandit": cfg.endpoints.bandit_metrics, "actor": cfg.endpoints.actor_metrics_base,
               "evaluator": cfg.endpoints.eval_metrics}
    if remote:
        metrics["inference"] = cfg.endpoints.inference_metrics
    for name, port in metrics.items():
        assert ports(container(by_component[name]))["metrics"] == port, name
    assert ports(container(by_component["actor"]))["grpc"] == cfg.endpoints.actor_health_base
    assert cfg.endpoints.bind_host == "0.0.0.0"   # probes and peers dial the pod's address, not its loopback
    assert ports(container(by_component["evaluator"]))["grpc"] == int(cfg.endpoints.eval_health.rsplit(":", 1)[1])
    if remote:
        assert ports(container(by_component["inference"]))["grpc"] == \
            int(cfg.endpoints.inference_health.rsplit(":", 1)[1])


def _field_exists(model: type, path: list[str]) -> bool:
    field = model.model_fields.get(path[0])
    if field is None:
        return False
    if len(path) == 1:
        return True
    return hasattr(field.annotation, "model_fields") and _field_exists(field.annotation, path[1:])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_environment_variable_is_read_by_the_code(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(overlay)
    config_of(objects, monkeypatch)   # validates
    for w in workloads(objects):
        env = container_env(objects, container(w), "pod-0")
        for key in env:
            if key in SERVICE_ENV.get(component(w), ()):
                assert key in (REPO / SERVICE_MODULES[component(w)] / "__main__.py").read_text(), key
                continue
            assert key.startswith("LBC_"), key
            path = key.removeprefix("LBC_").lower().split("__")
            assert _field_exists(Config, path), f"{w['metadata']['name']}: {key} is no configuration field"


def test_a_configuration_typo_in_the_configmap_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not _field_exists(Config, ["learner", "batchsize"])
    monkeypatch.setenv("LBC_LEARNER__BATCH_SIZE", "many")
    with pytest.raises(ValueError, match="batch_size"):
        load_config()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_point_at_real_ports_and_health_names(overlay: str) -> None:
    for w in workloads(render(overlay)):
        c = container(w)
        declared = ports(c)
        for kind in ("readinessProbe", "livenessProbe"):
            probe = c.get(kind)
            assert probe, f"{w['metadata']['name']}: no {kind}"
            if "grpc" in probe:
                assert probe["grpc"]["port"] == declared["grpc"]
                service = probe["grpc"].get("service")
                if service:   # the name the service marks SERVING when ready
                    source = (REPO / SERVICE_MODULES[component(w)] / "__main__.py").read_text()
                    assert f'"{service}"' in source, f"{service} is not a health name of {component(w)}"
            elif "exec" in probe:   # security: `lbc health` over mutual TLS, on the container's gRPC port
                command = probe["exec"]["command"]
                assert command[:4] == ["python", "-m", "lbc.cli", "health"]
                assert int(command[4].rsplit(":", 1)[1]) == declared["grpc"]
                args = cli.build_parser().parse_args(command[3:])
                assert args.certs == "/certs" and args.wait == 0
            elif "tcpSocket" in probe:
                assert probe["tcpSocket"]["port"] in declared
            else:
                assert probe["httpGet"]["port"] in declared


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_resources_and_security_on_every_container(overlay: str) -> None:
    objects = render(overlay)
    for w in workloads(objects):
        name = w["metadata"]["name"]
        spec = w["spec"]["template"]["spec"]
        pod_sec = spec["securityContext"]
        assert pod_sec["runAsNonRoot"] is True and pod_sec["runAsUser"] > 0, name
        assert pod_sec["seccompProfile"]["type"] == "RuntimeDefault", name
        c = container(w)
        sec = c["securityContext"]
        assert sec["readOnlyRootFilesystem"] is True and sec["allowPrivilegeEscalation"] is False, name
        assert sec["capabilities"]["drop"] == ["ALL"] and not sec.get("privileged"), name
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][part]), f"{name}: {part}"
        assert re.fullmatch(r"localhost/lbc:[\w.-]+", c["image"]), f"{name}: image {c['image']}"
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        assert "/tmp" in mounts, f"{name}: no writable /tmp"
        if component(w) in ("learner", "bandit"):   # state that must survive: checkpoints, bandit snapshots
            claims = [t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])]
            assert w["kind"] == "StatefulSet" and mounts.get("/data") in claims, name
            assert config_env(objects)["LBC_RUN_DIR"].startswith("/data/"), "run_dir must be on the volume"
        token = spec.get("automountServiceAccountToken")
        if component(w) == "autoscaler":
            assert spec["serviceAccountName"] == "lbc-autoscaler"
        else:
            assert token is False and spec["serviceAccountName"] == "lbc", name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_only_the_actor_scale(overlay: str) -> None:
    objects = render(overlay)
    (role,) = by_kind(objects, "Role")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments/scale"],
                              "resourceNames": ["lbc-actor"], "verbs": ["get", "patch"]}]
    (binding,) = by_kind(objects, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "lbc-autoscaler", "namespace": "lbc"}]
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")


def test_autoscaler_args_parse_and_match_the_run() -> None:
    objects = render("overlays/autoscale")
    c = container(named(objects, "Deployment", "lbc-autoscaler"))
    assert c["command"] == ["lbc", "autoscale"]
    args = cli.build_parser().parse_args(["autoscale", *c["args"]])
    assert args.deployment == "lbc-actor"
    replay_metrics = ports(container(named(objects, "Deployment", "lbc-replay")))["metrics"]
    assert args.replay_metrics == f"http://lbc-replay:{replay_metrics}/metrics"
    cfg = load_config(config_env(objects)["LBC_PRESET"])
    assert args.replay_ratio == cfg.replay.replay_ratio
    assert ports(c)["metrics"] == args.metrics_port


def test_gpu_overlay_puts_the_learner_and_the_inference_on_gpus_with_the_paper_preset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render("overlays/gpu")
    env = config_env(objects)
    assert env["LBC_PRESET"] == "paper" and env["LBC_LEARNER__DEVICE"] == "cuda"
    cfg = config_of(objects, monkeypatch)
    assert cfg.actor.inference == "remote" and cfg.inference.device == "cuda"
    for kind, name in (("StatefulSet", "lbc-learner"), ("Deployment", "lbc-inference")):
        c = container(named(objects, kind, name))
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" and c["image"].endswith("-gpu"), name
    assert not any("nvidia.com/gpu" in container(w)["resources"]["limits"]
                   for w in workloads(objects) if component(w) not in ("learner", "inference"))


def test_gpu_overlay_runs_a_learner_group_whose_replicas_can_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render("overlays/gpu")
    cfg = config_of(objects, monkeypatch)
    learner = named(objects, "StatefulSet", "lbc-learner")
    c = container(learner)
    n = learner["spec"]["replicas"]
    assert n == cfg.learner.replicas > 1, "the StatefulSet's pods and learner.replicas must agree"
    assert learner["spec"]["podManagementPolicy"] == "Parallel"   # they wait for each other at the rendezvous
    # replica 0 is pod 0, under the headless Service that governs the StatefulSet (stable DNS before readiness)
    host, port = cfg.endpoints.learner_group.rsplit(":", 1)
    governing = learner["spec"]["serviceName"]
    assert host == f"lbc-learner-0.{governing}"
    headless = named(objects, "Service", governing)["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    pods = pod_labels(learner)
    assert all(selects(headless["selector"], labels) for labels in pods.values())
    (rendezvous,) = [p for p in headless["ports"] if p["port"] == int(port)]
    assert ports(c)[rendezvous["targetPort"]] == int(port)
    # each pod's rank is its index; the parameter Service reaches replica 0 only (the others serve none)
    params = named(objects, "Service", cfg.endpoints.params.rsplit(":", 1)[0])["spec"]["selector"]
    assert [pod for pod, labels in pods.items() if selects(params, labels)] == ["lbc-learner-0"]
    for pod in pods:
        env = container_env(objects, c, pod)
        monkeypatch.setenv("LBC_LEARNER_RANK", env["LBC_LEARNER_RANK"])
        args = learner_main.build_parser().parse_args(c["args"])
        assert f"lbc-learner-{args.rank}" == pod and args.rank < cfg.learner.replicas
        assert args.metrics_port == ports(c)["metrics"] and args.resume
    # the collective library's connections (ports of its own choosing) pass between learner pods
    group_rules = [rule for policy in by_kind(objects, "NetworkPolicy")
                   if selects(policy["spec"]["podSelector"].get("matchLabels", {}), pods["lbc-learner-1"])
                   for rule in policy["spec"].get("ingress", [])
                   if "ports" not in rule and any(selects(peer.get("podSelector", {}).get("matchLabels", {"": ""}),
                                                          pods["lbc-learner-0"]) for peer in rule["from"])]
    assert group_rules, "no NetworkPolicy lets learner replicas reach each other on every port"


# What KEDA documents for keda.sh/v1alpha1 ScaledObject (keda.sh/docs/2.x/reference/scaledobject-spec) and its
# prometheus trigger (keda.sh/docs/2.x/scalers/prometheus): the fields that exist, those that must be given.
KEDA_SPEC_FIELDS = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount",
                    "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers"}
KEDA_TARGET_FIELDS = {"apiVersion", "kind", "name", "envSourceContainerName"}
KEDA_ADVANCED_FIELDS = {"restoreToOriginalReplicaCount", "horizontalPodAutoscalerConfig", "scalingModifiers"}
KEDA_TRIGGER_FIELDS = {"type", "name", "metadata", "metricType", "authenticationRef", "useCachedMetrics"}
KEDA_METRIC_TYPES = {"AverageValue", "Value", "Utilization"}
PROMETHEUS_TRIGGER_REQUIRED = {"serverAddress", "query", "threshold"}
PROMETHEUS_TRIGGER_FIELDS = PROMETHEUS_TRIGGER_REQUIRED | {
    "activationThreshold", "namespace", "customHeaders", "ignoreNullValues", "queryParameters", "unsafeSsl", "timeout",
    "authModes"}


def test_keda_scaled_object_follows_kedas_spec_and_the_autoscalers_rule() -> None:
    objects = render("overlays/keda")
    assert not [w for w in workloads(objects) if w["metadata"]["name"] == "lbc-autoscaler"], \
        "KEDA and lbc autoscale would both scale the actors"
    (scaled,) = by_kind(objects, "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["metadata"]["namespace"] == "lbc"
    spec = scaled["spec"]
    assert set(spec) <= KEDA_SPEC_FIELDS and {"scaleTargetRef", "triggers"} <= set(spec)
    target = spec["scaleTargetRef"]
    assert set(target) <= KEDA_TARGET_FIELDS
    actor = named(objects, target.get("kind", "Deployment"), target["name"])
    assert component(actor) == "actor" and target.get("apiVersion", "apps/v1") == actor["apiVersion"]
    for field in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec[field], int) and spec[field] >= 0, field
    # bounds, polling and cool-down: lbc autoscale's defaults, as components/autoscaler runs it
    auto = cli.build_parser().parse_args(["autoscale", *container(named(render("overlays/autoscale"), "Deployment",
                                                                               "lbc-autoscaler"))["args"]])
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (auto.min_replicas, auto.max_replicas)
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (auto.interval, auto.cooldown)
    # the hysteresis as the HPA's behaviour: schema-checked inside a real autoscaling/v2 HPA object
    assert set(spec["advanced"]) <= KEDA_ADVANCED_FIELDS
    hpa_config = spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert set(hpa_config) <= {"name", "behavior"}
    behavior = hpa_config["behavior"]
    kubernetes_validate.validate({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "keda-hpa-lbc-actor"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target["name"]},
                 "minReplicas": spec["minReplicaCount"], "maxReplicas": spec["maxReplicaCount"],
                 "behavior": behavior}}, KUBERNETES, strict=True)
    for direction in ("scaleUp", "scaleDown"):
        assert behavior[direction]["stabilizationWindowSeconds"] == auto.patience * auto.interval
        (policy,) = behavior[direction]["policies"]
        assert policy["type"] == "Percent" and policy["periodSeconds"] == auto.cooldown
    assert behavior["scaleUp"]["policies"][0]["value"] == 100 and behavior["scaleDown"]["policies"][0]["value"] == 50
    (trigger,) = spec["triggers"]
    assert set(trigger) <= KEDA_TRIGGER_FIELDS and trigger["type"] == "prometheus"
    assert trigger["metricType"] in KEDA_METRIC_TYPES
    meta = trigger["metadata"]
    assert PROMETHEUS_TRIGGER_REQUIRED <= set(meta) <= PROMETHEUS_TRIGGER_FIELDS
    assert all(isinstance(v, str) for v in meta.values()), "KEDA's trigger metadata is a map of strings"
    assert re.fullmatch(r"https?://[a-z0-9.-]+(:\d+)?", meta["serverAddress"])
    # AverageValue with threshold 1: the HPA asks for ceil(value / 1) replicas, the rounded n* itself
    assert trigger["metricType"] == "AverageValue" and float(meta["threshold"]) == 1.0
    assert meta["ignoreNullValues"] == "false"
    assert "lbc:actor_balanced_replicas" in meta["query"] and 'namespace="lbc"' in meta["query"]


@pytest.mark.parametrize("overlay", ["overlays/monitoring", "overlays/autoscale", "overlays/keda", "overlays/gpu"])
def test_monitoring_objects(overlay: str) -> None:
    objects = render(overlay)
    (monitor,) = by_kind(objects, "PodMonitor")
    for w in workloads(objects):
        assert selects(monitor["spec"]["selector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])
        assert "metrics" in ports(container(w))
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    assert {r["targetLabel"] for r in endpoint["relabelings"]} == {"component", "run"}
    (board,) = [m for m in by_kind(objects, "ConfigMap") if m["metadata"]["name"] == "lbc-grafana-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["lbc-training.json"]) == dashboard.build()


def test_committed_dashboard_is_what_the_builder_makes() -> None:
    assert dashboard.OUTPUT.read_text() == dashboard.render(), "run: python -m lbc.dashboard"


def test_dev_replay_keeps_its_snapshot_on_a_claim_under_the_run_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render("overlays/dev")
    replay = next(w for w in workloads(objects) if component(w) == "replay")
    c = container(replay)
    env = container_env(objects, c, "pod-0")
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    cfg = load_config()
    assert cfg.replay.snapshot_every_s > 0
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in replay["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] in claims]
    assert cfg.run_dir.startswith(mount["mountPath"].rstrip("/") + "/")   # the snapshot lands on the claim
    assert named(objects, "PersistentVolumeClaim", claims[mount["name"]])["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_secure_overlay_gives_every_service_the_certificates(tmp_path) -> None:
    from lbc.security import check_certificates, make_certificates

    objects = render("overlays/secure")
    made = tmp_path / "made"
    make_certificates(made)
    for w in workloads(objects):
        c = container(w)
        env = container_env(objects, c, "pod-0")
        assert env["LBC_SECURITY__ENABLED"] == "true", w["metadata"]["name"]
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "certs"]
        (volume,) = [v for v in w["spec"]["template"]["spec"]["volumes"] if v["name"] == "certs"]
        assert mount["readOnly"] and mount["mountPath"] == env["LBC_SECURITY__CERTS_DIR"]
        assert volume["secret"]["secretName"] == "lbc-certs" and volume["secret"]["defaultMode"] == 0o440
        # lay the Secret out as the kubelet would, from `lbc certs` output named as the component's
        # kubectl command names it (curve-X is curve/X): a service must find everything it checks for
        pod = tmp_path / w["metadata"]["name"]
        for item in volume["secret"]["items"]:
            assert item["path"] != "ca.key"   # the CA's key never enters the cluster
            target = pod / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((made / item["key"].replace("curve-", "curve/", 1)).read_bytes())
        check_certificates(pod)


def test_dashboard_panels_fit_grafanas_24_columns_without_overlapping() -> None:
    cells: set[tuple[int, int]] = set()
    for panel in dashboard.build()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, (panel["title"], pos)
        covered = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not covered & cells, (panel["title"], pos)
        cells |= covered
