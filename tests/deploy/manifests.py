"""Rendering the kustomize overlays and reading what the tests need from the objects."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = ["overlays/dev", "overlays/monitoring", "overlays/autoscale", "overlays/keda", "overlays/gpu",
            "overlays/secure", "."]
WORKLOADS = ("Deployment", "StatefulSet")


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise RuntimeError("kubectl (with kustomize) is needed to render k8s/; see README 'Run on Kubernetes'")
    return found


@cache
def render(overlay: str) -> tuple[dict, ...]:
    out = subprocess.run([kubectl(), "kustomize", str(K8S / overlay)], check=True, capture_output=True, text=True)
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def by_kind(objects: tuple[dict, ...], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: tuple[dict, ...], kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def workloads(objects: tuple[dict, ...]) -> list[dict]:
    return [o for o in objects if o["kind"] in WORKLOADS]


def config_env(objects: tuple[dict, ...]) -> dict[str, str]:
    """The LBC_* variables of the lbc-config ConfigMap (its generated name has a hash suffix)."""
    maps = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].startswith("lbc-config")]
    assert len(maps) == 1, "one lbc-config ConfigMap expected"
    return dict(maps[0]["data"])


def container_env(objects: tuple[dict, ...], container: dict, pod_name: str) -> dict[str, str]:
    """What a container sees: envFrom ConfigMaps, then env (literals, ConfigMap keys, the pod name)."""
    maps = {o["metadata"]["name"]: o.get("data", {}) for o in by_kind(objects, "ConfigMap")}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "configMapKeyRef" in item.get("valueFrom", {}):
            ref = item["valueFrom"]["configMapKeyRef"]
            env[item["name"]] = maps[ref["name"]][ref["key"]]
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = pod_name
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == POD_INDEX_FIELD:
            env[item["name"]] = pod_name.rsplit("-", 1)[1]   # a StatefulSet's pod <name>-<index>
        else:
            raise AssertionError(f"unsupported env source {item}")
    return env


POD_INDEX_FIELD = "metadata.labels['apps.kubernetes.io/pod-index']"


def pod_labels(workload: dict) -> dict[str, dict[str, str]]:
    """Each pod the workload's controller makes, by name, with its labels: the template's, and for a
    StatefulSet's pod <name>-<i> also the two its controller adds (pod-name and, Kubernetes >= 1.28,
    pod-index). A Deployment's pods are told apart by no label: one stands for all."""
    name = workload["metadata"]["name"]
    labels = workload["spec"]["template"]["metadata"]["labels"]
    if workload["kind"] != "StatefulSet":
        return {f"{name}-pod": labels}
    return {f"{name}-{i}": {**labels, "statefulset.kubernetes.io/pod-name": f"{name}-{i}",
                            "apps.kubernetes.io/pod-index": str(i)}
            for i in range(workload["spec"].get("replicas", 1))}


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
