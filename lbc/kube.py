"""The two Kubernetes API calls lbc makes: read and set the actor Deployment's scale subresource
(GET/PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale), which is all the RBAC in
k8s/base/rbac.yaml grants."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def apps_api(kubeconfig: str | None = None, context: str | None = None) -> client.AppsV1Api:
    """In a pod (no kubeconfig given): the pod's service account; elsewhere: the kubeconfig."""
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.AppsV1Api()
    api = client.ApiClient()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=api.configuration)
    except (config.ConfigException, OSError) as exc:
        raise KubeConfigError(f"no usable Kubernetes configuration ({exc}); give --kubeconfig/--context, set "
                              f"KUBECONFIG, or run in a pod") from None
    return client.AppsV1Api(api)


class KubeConfigError(RuntimeError):
    """No cluster to talk to: a missing or broken kubeconfig, an unknown context."""


def default_namespace() -> str:
    return _SA_NAMESPACE.read_text().strip() if _SA_NAMESPACE.exists() else "lbc"


def read_replicas(api: client.AppsV1Api, namespace: str, deployment: str) -> int:
    scale = api.read_namespaced_deployment_scale(deployment, namespace)
    return int(scale.spec.replicas or 0)


def set_replicas(api: client.AppsV1Api, namespace: str, deployment: str, replicas: int) -> None:
    if replicas < 0:
        raise ValueError(f"replicas must be >= 0, got {replicas}")
    # A JSON merge patch (RFC 7386) of just the replica count: no read-modify-write race with kubectl.
    api.patch_namespaced_deployment_scale(deployment, namespace, {"spec": {"replicas": replicas}},
                                          _content_type="application/merge-patch+json")
