"""``--doctor`` on a cluster: reachable, its version, the namespace, each permission the backend uses, the image.

Permissions are asked with ``SelfSubjectAccessReview`` (nothing is created): :data:`NEEDED` is what
the backend calls (the Role in docs/scaling.md), :data:`HELPFUL` cluster-wide reads it uses if allowed.
"""

from __future__ import annotations

from typing import Any

from ..errors import OrchestratorError, RunnerError
from .kube_client import ClusterSpec
from .kube_host import KubeHost
from .kube_images import nodes_lacking, reference

_CRUD = ("create", "get", "list", "delete")
# (API group, resource, subresource, verb)
NEEDED: tuple[tuple[str, str, str, str], ...] = (
    *(("", "pods", "", verb) for verb in _CRUD),
    # The client's exec is a websocket GET; servers before 1.30 authorize it as "get",
    # later ones as "create" (what kubectl's POST always needed).
    ("", "pods", "exec", "get"),
    ("", "pods", "exec", "create"),
    *(("", "persistentvolumeclaims", "", verb) for verb in _CRUD),
    ("networking.k8s.io", "networkpolicies", "", "create"),
    ("networking.k8s.io", "networkpolicies", "", "delete"),
    ("", "events", "", "list"),
)
HELPFUL: tuple[tuple[str, str, str, str, str], ...] = (
    ("", "nodes", "", "list", "the image is looked for on the nodes"),
    ("", "nodes", "", "get", "a task whose node is lost is placed again at once"),
    ("", "persistentvolumes", "", "get", "a session volume bound to a lost node is noticed"),
    ("storage.k8s.io", "storageclasses", "", "get", "a claim that binds only with its Pod is told apart"),
    ("", "namespaces", "", "get", "a missing namespace is named at pre-flight"),
)


def _what(group: str, resource: str, sub: str, verb: str) -> str:
    name = resource + (f"/{sub}" if sub else "")
    return f"{verb} {name}" + (f" ({group})" if group else "")


async def cluster_checks(spec: ClusterSpec, image: str) -> list[tuple[str, str, str, str]]:
    """(status, name, detail, fix) rows for the doctor."""
    out: list[tuple[str, str, str, str]] = []
    host = KubeHost(spec)
    namespace, perms, on_cluster = "kubernetes namespace", "kubernetes permissions", f"image {image} on the cluster"
    try:
        try:
            version = await host.ping()
        except OrchestratorError as exc:
            return [("fail", "kubernetes", f"{spec.shown}: {exc}", "check the kubeconfig and that the API server runs")]
        out.append(("ok", "kubernetes", f"{spec.shown}: server {version}", ""))
        core = await host.core()
        try:
            await host.call(f"read namespace {spec.namespace}", core.read_namespace, spec.namespace)
            out.append(("ok", namespace, spec.namespace, ""))
        except RunnerError as exc:
            if "404" in str(exc):
                fix = f"kubectl create namespace {spec.namespace}"
                out.append(("fail", namespace, f"{spec.namespace} does not exist", fix))
            else:
                out.append(("warn", namespace, f"cannot be read ({exc})", ""))
        allowed = await _reviews(host, spec.namespace, [*NEEDED, *(h[:4] for h in HELPFUL)])
        missing = [_what(*n) for n in NEEDED if not allowed[n]]
        if missing:
            fix = "grant the Role in docs/scaling.md (Kubernetes: permissions) to this identity"
            out.append(("fail", perms, f"not allowed in namespace {spec.namespace}: {', '.join(missing)}", fix))
        else:
            out.append(("ok", perms, f"all {len(NEEDED)} the backend uses", ""))
        for group, resource, sub, verb, why in HELPFUL:
            if not allowed[(group, resource, sub, verb)]:
                detail = f"not allowed: {_what(group, resource, sub, verb)} (cluster-wide), so not: {why}"
                out.append(("warn", perms, detail, "a ClusterRole with it, if you want that"))
        try:
            lacking, total = await nodes_lacking(host, image)
        except RunnerError as exc:
            out.append(("warn", on_cluster, f"cannot list nodes ({exc})", ""))
        else:
            if lacking:
                fix = "--sync-image with runner.kubernetes.load_command, or push it where the nodes pull from"
                detail = f"{reference(image)} missing on node(s) {', '.join(lacking)} of {total}"
                out.append(("fail", on_cluster, detail, fix))
            else:
                out.append(("ok", on_cluster, f"on all {total} Ready node(s)", ""))
    finally:
        await host.aclose()
    return out


async def _reviews(host: Any, namespace: str, asks: list[tuple[str, str, str, str]]) -> dict[Any, bool]:
    from kubernetes import client

    api = client.AuthorizationV1Api(await host.client())
    result: dict[Any, bool] = {}
    for group, resource, sub, verb in asks:
        attrs: dict[str, Any] = {"group": group, "resource": resource, "verb": verb}
        if sub:
            attrs["subresource"] = sub
        if resource not in ("nodes", "persistentvolumes", "storageclasses", "namespaces"):
            attrs["namespace"] = namespace
        body: Any = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        try:
            review = await host.call(
                f"ask whether {verb} {resource} is allowed", api.create_self_subject_access_review, body
            )
            result[(group, resource, sub, verb)] = bool(review.status.allowed)
        except RunnerError:
            result[(group, resource, sub, verb)] = False
    return result
