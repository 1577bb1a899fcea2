"""What the Kubernetes backend asks the cluster for: Pod, claim and policy manifests, and their names.

Pure functions of the task's request (no client, no I/O), so a resumed run
derives the same names and a test can read the manifests. What a task's Pod
gets and why: docs/scaling.md, "What each task gets".
"""

from __future__ import annotations

import re
from typing import Any

from ..naming import short8
from .docker_containers import HOME_MOUNT, WORKSPACE_MOUNT, base_environment, host_labels, workspace_read_only
from .types import InstanceRequest

TASK_CONTAINER = "task"
LOADER_CONTAINER = "loader"
CONTAINER_UID = 1000
TMP_SIZE = "256Mi"
# Everything the backend creates carries it, so listing and clean-up find them by label.
MANAGED_LABEL = "orchestrator"
# The original (not DNS-safe) label values, for whoever reads a Pod's labels back.
ANNOTATION_PREFIX = "orchestrator.io/"
# The container name a Pod stands for (a Pod's name is a DNS-safe form of it).
NAME_ANNOTATION = ANNOTATION_PREFIX + "container"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def dns_name(text: str, *, limit: int = 63) -> str:
    """A DNS-1123 label for ``text``: lowercase, ``-`` for anything else, and a hash of the
    original, so two names that differ only in case or punctuation stay apart."""
    body = _NOT_DNS.sub("-", text.lower()).strip("-")
    suffix = short8(text)
    body = body[: limit - len(suffix) - 1].rstrip("-")
    return f"{body}-{suffix}" if body else f"x-{suffix}"


def pod_name(container_name: str) -> str:
    return dns_name(container_name)


def claim_name(session_volume: str) -> str:
    """The session's PersistentVolumeClaim: the Docker session volume's name, DNS-safe."""
    return dns_name(session_volume)


def label_value(value: str) -> str:
    """``value`` when Kubernetes takes it as a label value, else a safe form with a hash of it."""
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return value
    body = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)
    body = re.sub(r"^[^A-Za-z0-9]+", "", body)[:54]
    body = re.sub(r"[^A-Za-z0-9]+$", "", body)
    return f"{body}-{short8(value)}" if body else f"h{short8(value)}"


def labels_and_annotations(labels: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Today's container labels as Pod labels (DNS-safe) plus annotations holding every original value."""
    out: dict[str, str] = {}
    notes: dict[str, str] = {}
    for key, value in labels.items():
        name = key if _LABEL_NAME.match(key) and len(key) <= 63 else f"k{short8(key)}"
        out[name] = label_value(value)
        if out[name] != value or name != key:
            notes[ANNOTATION_PREFIX + name] = f"{key}={value}"
    return out, notes


def original_labels(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, str]:
    """Inverse of :func:`labels_and_annotations`: the labels as the Docker runner writes them."""
    out = dict(labels)
    for key, text in (annotations or {}).items():
        if key.startswith(ANNOTATION_PREFIX) and "=" in text:
            name = key[len(ANNOTATION_PREFIX) :]
            original, _, value = text.partition("=")
            out.pop(name, None)
            out[original] = value
    return out


def run_selector(run_id: str | None = None) -> str:
    return f"{MANAGED_LABEL}=true" + (f",run_id={label_value(run_id)}" if run_id else "")


def cpu_quantity(cpus: float) -> str:
    milli = round(float(cpus) * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(memory: str) -> str:
    """Docker's ``4g``/``512m``/``1024k``/bytes as a Kubernetes quantity (``4Gi``...)."""
    text = str(memory).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmgt]?)b?", text)
    if not m:
        return str(memory)  # already a quantity (4Gi), or the server says what is wrong
    number, unit = m.groups()
    suffix = {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti"}[unit]
    if "." in number:
        scale = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[suffix]
        return str(int(float(number) * scale))
    return f"{number}{suffix}"


def _metadata(name: str, namespace: str, labels: dict[str, str], more: dict[str, str]) -> dict[str, Any]:
    """``labels`` as Kubernetes takes them; their originals and ``more`` as annotations."""
    safe, annotations = labels_and_annotations(labels)
    return {"name": name, "namespace": namespace, "labels": safe, "annotations": annotations | more}


def pod_manifest(request: InstanceRequest, *, namespace: str, claim: str | None, pull_policy: str) -> dict[str, Any]:
    """The task's Pod. ``claim``: the session's PersistentVolumeClaim, or None for a
    session that lives only as long as the Pod (no storage for one)."""
    resources = {
        "cpu": cpu_quantity(request.container_limits.cpus),
        "memory": memory_quantity(request.container_limits.memory),
    }
    read_only = workspace_read_only(request)
    name = pod_name(request.container_name)
    mounts = [
        {"name": "workspace", "mountPath": WORKSPACE_MOUNT, "readOnly": read_only},
        {"name": "home", "mountPath": HOME_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    task = {
        "name": TASK_CONTAINER,
        "image": request.docker_image,
        "imagePullPolicy": pull_policy,
        # args, not command: the image's entrypoint (tini) stays PID 1, as in Docker.
        "args": ["sleep", "infinity"],
        "workingDir": WORKSPACE_MOUNT,
        "env": [{"name": k, "value": v} for k, v in base_environment(request).items()],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {
            "runAsUser": CONTAINER_UID,
            "runAsGroup": CONTAINER_UID,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
    }
    containers = [task]
    if read_only:
        small = {"cpu": "50m", "memory": "64Mi"}
        # The task's container without its environment, small, with the workspace writable.
        loader = {key: value for key, value in task.items() if key != "env"}
        loader |= {
            "name": LOADER_CONTAINER,
            "resources": {"requests": dict(small), "limits": dict(small)},
            "volumeMounts": [
                {"name": "workspace", "mountPath": WORKSPACE_MOUNT},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
        }
        containers.append(loader)
    home: dict[str, Any] = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(name, namespace, host_labels(request, None), {NAME_ANNOTATION: request.container_name}),
        "spec": {
            "restartPolicy": "Never",
            # No cluster credentials inside: the agent must not reach the API server as the Pod.
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 10,
            "securityContext": {
                "runAsUser": CONTAINER_UID,
                "runAsGroup": CONTAINER_UID,
                "runAsNonRoot": True,
                "fsGroup": CONTAINER_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": containers,
            "volumes": [
                {"name": "workspace", "emptyDir": {}},
                {"name": "home", **home},
                {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": TMP_SIZE}},
            ],
        },
    }


def claim_manifest(
    request: InstanceRequest, volume: str, *, namespace: str, size: str, storage_class: str | None
) -> dict[str, Any]:
    """The claim of the session volume ``volume`` (the Docker volume's name, annotated)."""
    labels = {MANAGED_LABEL: "true", "run_id": request.run_id}
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(claim_name(volume), namespace, labels, {ANNOTATION_PREFIX + "volume": volume}),
        "spec": spec,
    }


def offline_policy(request: InstanceRequest, *, namespace: str) -> dict[str, Any]:
    """No traffic in or out of an offline task's Pod (where the cluster's network enforces policies)."""
    name = pod_name(request.container_name)
    labels, _ = labels_and_annotations({MANAGED_LABEL: "true", "run_id": request.run_id})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": {"instance_id": label_value(request.instance_id)}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }
