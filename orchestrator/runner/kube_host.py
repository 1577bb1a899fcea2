"""A Kubernetes namespace as the engine of the task pipeline: one Pod per task.

:class:`KubeHost` has the surface the pipeline uses of a Docker engine
(:class:`~.docker_containers.DockerHost`): the container is a Pod, an exec the
Pod's ``exec`` subresource, the copy-in ``tar -xf -`` through an exec. "Stopping"
a Pod deletes it (a Pod cannot be started again).
"""

from __future__ import annotations

import functools
import io
import tarfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from ..errors import ContainerError, HostDownError, RunnerError
from .docker_containers import DEFAULT_THREADS, ContainerReady, DockerHost, workspace_read_only
from .docker_core import END_AGENT_SCRIPT
from .docker_exec import ExecOutput
from .kube_client import ClusterSpec, is_conflict, is_not_found, load_configuration, translate
from .kube_exec import ExecStream, stream_exec
from .kube_pods import (
    LOADER_CONTAINER,
    NAME_ANNOTATION,
    TASK_CONTAINER,
    claim_name,
    offline_policy,
    original_labels,
    pod_manifest,
    pod_name,
    run_selector,
)
from .plugin import AgentOutcome
from .registry import get_plugin
from .types import Hardening, InstanceRequest

POLL_S = 0.5
# How long a new Pod waits for one of its name that is still being deleted (a
# replaced or stopped Pod takes seconds; one held by a finalizer may never go).
TERMINATING_WAIT_S = 60.0
# Waiting reasons that no wait will cure: the task fails at once with the cluster's words.
HOPELESS = ("ErrImageNeverPull", "InvalidImageName", "ImagePullBackOff", "CreateContainerConfigError")
NODE_CACHE_S = 5.0


class PodLostError(HostDownError):
    """The task's Pod was deleted, evicted or lost with its node while the task ran ("docker")."""


class KubeHost(DockerHost):
    """One namespace of one cluster, reached through the official client."""

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        limiter: anyio.CapacityLimiter | None = None,
        pending_timeout_s: float = 300,
        pull_policy: str = "IfNotPresent",
        name: str = "kubernetes",
    ) -> None:
        super().__init__(self._make_client, limiter or anyio.CapacityLimiter(DEFAULT_THREADS), name=name, archive=True)
        self.cluster = cluster
        self.namespace = cluster.namespace
        self.pending_timeout_s = pending_timeout_s
        self.pull_policy = pull_policy
        # container name -> the session claim its Pod mounts (None: an emptyDir), as
        # the runner decided before the task's pipeline started.
        self.claims: dict[str, str | None] = {}
        # container name -> why its Pod went away while the task ran
        self.lost: dict[str, str] = {}
        self._read_only: dict[str, bool] = {}
        self._nodes: dict[str, tuple[float, str]] = {}
        # Open files per process of every exec (runner.container_limits.nofile); None: the runtime's.
        self.nofile: int | None = None
        # Images the pipeline's seed lookup reads from this machine's engine, where
        # the run's image was built (or pulled) before it reached the cluster.
        self.local = DockerHost(limiter=self.limiter)

    @property
    def image_source(self) -> DockerHost:
        return self.local

    def _make_client(self) -> Any:
        from kubernetes import client

        return client.ApiClient(load_configuration(self.cluster))

    def _unreachable(self, exc: Exception) -> RunnerError:
        return ContainerError(f"cannot reach the Kubernetes cluster ({self.cluster.shown}): {exc}")

    _translate = staticmethod(translate)

    async def call_unless(
        self, expected: Callable[[Exception], bool], what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """:meth:`call`, None instead of an error ``expected`` accepts (already there, already gone)."""

        def run() -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if expected(exc):
                    return None
                raise

        return await self.call(what, run)

    async def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(await self.client())

    async def aclose(self) -> None:
        api, self._client = self._client, None
        if api is not None:
            await anyio.to_thread.run_sync(api.close, limiter=self.limiter)
        await self.local.aclose()

    # ---- queries ------------------------------------------------------------

    async def ping(self) -> str:
        """The server's version (``v1.20.2``); raises ContainerError when it does not answer."""
        from kubernetes import client

        api = await self.client()
        info = await self.call("ask the API server its version", client.VersionApi(api).get_code)
        version = str(info.git_version)
        # A server built from source without release stamping says v0.0.0-master.
        return f"v{info.major}.{info.minor}" if version.startswith("v0.0.0") and info.major else version

    async def read_pod(self, name: str) -> Any | None:
        core = await self.core()
        return await self.call_unless(
            is_not_found, f"read Pod of {name}", core.read_namespaced_pod, pod_name(name), self.namespace
        )

    async def inspect_container(self, name: str) -> dict | None:
        pod = await self.read_pod(name)
        return None if pod is None else (await self.client()).sanitize_for_serialization(pod)

    async def image_exists(self, image: str) -> bool:
        # The nodes' image lists need a cluster-wide permission; a Pod says the rest.
        from .kube_images import nodes_lacking

        try:
            missing, nodes = await nodes_lacking(self, image)
        except RunnerError:
            return True
        return len(missing) < nodes or nodes == 0

    async def list_containers(self, run_id: str | None = None) -> list[dict]:
        core = await self.core()
        pods = await self.call(
            "list Pods", core.list_namespaced_pod, self.namespace, label_selector=run_selector(run_id)
        )
        rows = []
        for pod in pods.items:
            meta = pod.metadata
            annotations = meta.annotations or {}
            phase = pod.status.phase if pod.status else None
            rows.append(
                {
                    "name": annotations.get(NAME_ANNOTATION, meta.name),
                    "labels": original_labels(meta.labels or {}, annotations),
                    "status": "running"
                    if phase in ("Running", "Pending") and not meta.deletion_timestamp
                    else "exited",
                    "created": meta.creation_timestamp.timestamp() if meta.creation_timestamp else None,
                }
            )
        return rows

    # ---- the Pod ------------------------------------------------------------

    async def ensure_container(
        self,
        request: InstanceRequest,
        *,
        workspace: Path,
        volume: str,
        fresh_workspace: bool = False,
        hardening: Hardening | None = None,
        object_cache: str | None = None,
    ) -> ContainerReady:
        """The task's Pod, Running: reused, or created (again) and waited for. ``fresh_workspace`` with
        a running Pod: one a killed process left, whose agent is ended first (the workspace stays)."""
        name = request.container_name
        claim = self.claims.get(name, claim_name(volume))
        manifest = pod_manifest(request, namespace=self.namespace, claim=claim, pull_policy=self.pull_policy)
        self._read_only[name] = workspace_read_only(request)
        if request.network_egress == "offline":
            await self._ensure_policy(request)
        existing = await self.read_pod(name)
        action, reason = "created", ""
        if existing is not None:
            why = _unusable(existing, manifest) or ("" if request.reuse_container else "reuse_container is false")
            if not why:
                if existing.status.phase == "Running":
                    if not fresh_workspace:
                        return ContainerReady(name, "reused", volume)
                    await self.exec_simple(name, ["sh", "-c", END_AGENT_SCRIPT, "end-agent", "30"])
                    return ContainerReady(name, "restarted", volume, "left running by a process that exited")
                await self._wait_running(request)
                return ContainerReady(name, "started", volume)
            await self._delete(name, grace=0)
            await self._wait_gone(name)
            action, reason = "replaced", why
        await self._create(manifest)
        await self._wait_running(request)
        return ContainerReady(name, action, volume, reason)

    async def _create(self, manifest: dict[str, Any]) -> None:
        core = await self.core()
        name = manifest["metadata"]["name"]
        deadline = anyio.current_time() + TERMINATING_WAIT_S
        # A name still terminating (a replaced or stopped Pod) answers with a conflict: wait
        # for it here, not on a worker thread, whose limiter slot other tasks' calls need.
        while (
            await self.call_unless(
                is_conflict, f"create Pod {name}", core.create_namespaced_pod, self.namespace, manifest
            )
            is None
        ):
            if anyio.current_time() >= deadline:
                raise ContainerError(
                    f"Pod {name} is still being deleted after {TERMINATING_WAIT_S:g} s, so the task's "
                    f"new Pod cannot take its name; a finalizer may hold it (kubectl get pod {name} "
                    f"-n {self.namespace} -o jsonpath='{{.metadata.finalizers}}'); once it is gone, "
                    "--resume the run"
                )
            await anyio.sleep(POLL_S)

    async def _ensure_policy(self, request: InstanceRequest) -> None:
        from kubernetes import client

        api = client.NetworkingV1Api(await self.client())
        body: Any = offline_policy(request, namespace=self.namespace)
        await self.call_unless(
            is_conflict,
            f"create NetworkPolicy {body['metadata']['name']}",
            api.create_namespaced_network_policy,
            self.namespace,
            body,
        )

    async def _wait_running(self, request: InstanceRequest) -> None:
        """Until every container of the Pod runs; a Pod Pending past the bound, or one the
        cluster cannot start, is deleted and fails the task with the cluster's reason."""
        name = request.container_name
        t0 = time.monotonic()
        last = "not scheduled yet"
        while True:
            pod = await self.read_pod(name)
            if pod is None:
                raise ContainerError(f"Pod {pod_name(name)} disappeared while it was starting")
            phase = pod.status.phase
            statuses = pod.status.container_statuses or []
            if phase == "Running" and statuses and all(s.state and s.state.running for s in statuses):
                return
            if phase in ("Failed", "Succeeded"):
                await self._delete(name, grace=0)
                raise ContainerError(f"Pod {pod_name(name)} ended before the task started: {_pod_reason(pod)}")
            last = _pod_reason(pod) or last
            hopeless = next(
                (s for s in statuses if s.state and s.state.waiting and s.state.waiting.reason in HOPELESS), None
            )
            if hopeless is not None:
                await self._delete(name, grace=0)
                raise ContainerError(f"Pod {pod_name(name)} cannot start: {last}")
            if time.monotonic() - t0 > self.pending_timeout_s:
                await self._delete(name, grace=0)
                raise ContainerError(
                    f"Pod {pod_name(name)} stayed Pending for {self.pending_timeout_s:g} s "
                    f"(runner.kubernetes.pending_timeout_s): {last}"
                )
            await anyio.sleep(POLL_S)

    async def _delete(self, name: str, *, grace: int) -> None:
        core = await self.core()
        await self.call_unless(
            is_not_found,
            f"delete Pod {pod_name(name)}",
            core.delete_namespaced_pod,
            pod_name(name),
            self.namespace,
            grace_period_seconds=grace,
        )

    async def _wait_gone(self, name: str, within_s: float = 60) -> None:
        deadline = time.monotonic() + within_s
        # Polled: the client's watch would hold a worker thread for the whole wait.
        while time.monotonic() < deadline and await self.read_pod(name) is not None:  # noqa: ASYNC110
            await anyio.sleep(POLL_S)

    async def _delete_policy(self, name: str) -> None:
        from kubernetes import client

        api = client.NetworkingV1Api(await self.client())
        await self.call_unless(
            lambda exc: is_not_found(exc) or getattr(exc, "status", None) == 403,
            f"delete NetworkPolicy {pod_name(name)}",
            api.delete_namespaced_network_policy,
            pod_name(name),
            self.namespace,
        )

    # `timeout` is the Pod's grace period, as it is Docker's for a stop.
    async def stop(self, name: str, *, timeout: float = 2) -> None:  # noqa: ASYNC109
        """A Pod cannot be stopped and started again: it is deleted (its agent was given its grace)."""
        await self._delete(name, grace=max(0, int(timeout)))
        await self._delete_policy(name)

    async def remove(self, name: str) -> None:
        await self._delete(name, grace=0)
        await self._delete_policy(name)

    async def kill(self, name: str) -> None:
        await self._delete(name, grace=0)

    async def remove_run_volumes(self, run_id: str) -> list[str]:
        """Delete the session claims of ``run_id``; returns their names."""
        core = await self.core()
        claims = await self.call(
            "list PersistentVolumeClaims",
            core.list_namespaced_persistent_volume_claim,
            self.namespace,
            label_selector=run_selector(run_id),
        )
        names = [c.metadata.name for c in claims.items]
        for claim in names:
            await self.delete_claim(claim)
        return names

    async def delete_claim(self, claim: str) -> None:
        core = await self.core()
        await self.call_unless(
            is_not_found,
            f"delete PersistentVolumeClaim {claim}",
            core.delete_namespaced_persistent_volume_claim,
            claim,
            self.namespace,
        )

    # ---- exec ---------------------------------------------------------------

    def _starter(self, name: str, container: str) -> Callable[[list[str]], ExecStream]:
        if name in self.lost:
            # Its node stopped answering: an exec there would wait on it, not fail.
            raise PodLostError(self.lost[name])
        configuration = self._client.configuration
        # the exec's three pipes as raw bytes, no terminal: ExecStream reads them as they come
        streams = {"container": container, "stdin": True, "stdout": True, "stderr": True, "tty": False, "binary": True}

        def start(command: list[str]) -> ExecStream:
            from kubernetes import client
            from kubernetes.stream import stream

            # A client of its own: stream() swaps the client's call_api while it
            # connects, and any other thread's request through the shared client
            # would go out as a websocket handshake meanwhile.
            api = client.ApiClient(configuration)
            core = client.CoreV1Api(api)
            try:
                connect = core.connect_get_namespaced_pod_exec
                ws = stream(connect, pod_name(name), self.namespace, command=command, _preload_content=False, **streams)
            except Exception as exc:
                raise translate(exc, f"exec in Pod {pod_name(name)}") from exc
            finally:
                api.close()
            return ExecStream(ws)

        return start

    def _container_for(self, name: str, user: str) -> str:
        # A review task's workspace is read-only in the task's container: what must
        # write it (the copy-in, emptying it) runs in the loader beside it.
        return LOADER_CONTAINER if user in ("root", "0") and self._read_only.get(name) else TASK_CONTAINER

    async def _pod_lost(self, name: str) -> None:
        """Raise :class:`PodLostError` when the task's Pod is gone, going or on a lost node."""
        why = await self._lost_reason(name)
        if why:
            self.lost[name] = why
            raise PodLostError(why)

    async def _lost_reason(self, name: str) -> str:
        try:
            pod = await self.read_pod(name)
        except RunnerError:
            return ""
        if pod is None or pod.metadata.deletion_timestamp:
            return f"Pod {pod_name(name)} was deleted while the task ran"
        if pod.status.phase in ("Failed", "Succeeded", "Unknown"):
            return f"Pod {pod_name(name)} ended while the task ran: {_pod_reason(pod)}"
        node = pod.spec.node_name
        ready = await self._node_readiness(node) if node else "True"
        if ready == "gone":
            return f"node {node} of Pod {pod_name(name)} is lost (removed from the cluster)"
        if ready == "Unknown":
            # What the node controller writes once the kubelet stopped answering for its
            # grace period; a kubelet that says False (restarting, runtime busy) still runs its Pods.
            return f"node {node} of Pod {pod_name(name)} is lost (its kubelet stopped answering: Ready Unknown)"
        return ""

    async def _node_readiness(self, node: str) -> str:
        """The node's Ready condition (True, False, Unknown), "gone" when it was removed, "True" when
        this account may not look; read at most every few seconds per node, as every running exec asks."""
        cached = self._nodes.get(node)
        if cached is not None and time.monotonic() - cached[0] < NODE_CACHE_S:
            return cached[1]
        core = await self.core()
        try:
            info = await self.call(f"read node {node}", core.read_node_status, node)
            ready = next((str(c.status) for c in info.status.conditions or [] if c.type == "Ready"), "Unknown")
        except RunnerError as exc:
            ready = "gone" if "404" in str(exc) else "True"  # forbidden or unreachable: cannot tell, so not lost
        self._nodes[node] = (time.monotonic(), ready)
        return ready

    async def _exec(self, name: str, container: str, argv: list[str], **kwargs: Any) -> ExecOutput:
        """``argv`` in one container of the task's Pod, under the task's open-files limit, the Pod watched."""
        await self.client()
        kwargs.setdefault("parser", get_plugin("command").new_parser())
        return await stream_exec(
            self._starter(name, container),
            self.limiter,
            argv,
            lost=functools.partial(self._pod_lost, name),
            nofile=self.nofile,
            **kwargs,
        )

    async def exec_simple(self, name: str, cmd: list[str], *, user: str = "node") -> tuple[int, bytes]:
        out = await self._exec(name, self._container_for(name, user), cmd)
        return (out.exit_code if out.exit_code is not None else -1), out.stdout_tail + out.stderr_tail

    async def run_exec(self, container: str, argv: list[str], **kwargs: Any) -> Any:
        output = await self._exec(container, TASK_CONTAINER, argv, **kwargs)
        if output.exit_code is not None and output.exit_code >= 128:
            # Killed: by the OOM killer, or because the Pod is being deleted under it.
            await self._pod_lost(container)
        return output

    async def put_archive(self, container: str, path: str, chunks: Iterable[bytes], *, read_only: bool = False) -> bool:
        """``tar -xf -`` through an exec, the tar on its stdin (as ``kubectl cp`` does)."""
        data = await anyio.to_thread.run_sync(_without_root, b"".join(chunks), limiter=self.limiter)
        script = 'head -c "$1" | tar --no-overwrite-dir --warning=no-timestamp -xf - -C "$2" 2>&1'
        out = await self._exec(
            container,
            LOADER_CONTAINER if read_only else TASK_CONTAINER,
            ["sh", "-c", script, "copy-in", str(len(data)), path],
            stdin_payload=data,
            payload_size=len(data),
            pipe=True,
        )
        if out.exit_code != 0:
            detail = (out.stdout_tail + out.stderr_tail).decode("utf-8", "replace").strip()[-500:]
            raise ContainerError(f"copying the workspace into Pod {pod_name(container)} failed: {detail}")
        return True

    async def read_file(self, container: str, path: str) -> bytes:
        """The file's bytes, from an exec's stdout."""
        chunks: list[bytes] = []

        class Collect:
            def feed(self, data: bytes) -> list[Any]:
                chunks.append(data)
                return []

            def finish(self, exit_code: int | None) -> Any:
                return AgentOutcome(exit_code=exit_code)

        out = await self._exec(container, TASK_CONTAINER, ["cat", path], parser=Collect())
        if out.exit_code != 0:
            raise ContainerError(
                f"reading {path} from Pod {pod_name(container)} failed: "
                f"{out.stderr_tail.decode('utf-8', 'replace').strip()[-300:]}"
            )
        return b"".join(chunks)


def _without_root(data: bytes) -> bytes:
    """The tar without its ``.`` member: /workspace is the emptyDir's root, which uid 1000
    may write into but, not owning it, neither re-mode nor re-date (tar fails on that)."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as src,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst,
    ):
        for member in src:
            if member.name in (".", "./"):
                continue
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def _unusable(pod: Any, manifest: dict[str, Any]) -> str:
    """Why an existing Pod cannot serve the request (empty: it can)."""
    if pod.metadata.deletion_timestamp:
        return "being deleted"
    if pod.status.phase in ("Failed", "Succeeded", "Unknown"):
        return f"Pod {pod.status.phase}"
    want = manifest["spec"]
    have_images = [c.image for c in pod.spec.containers]
    if have_images != [c["image"] for c in want["containers"]]:
        return "image or containers changed"
    home = next((v for v in pod.spec.volumes or [] if v.name == "home"), None)
    claim = home.persistent_volume_claim.claim_name if home is not None and home.persistent_volume_claim else None
    want_home = next(v for v in want["volumes"] if v["name"] == "home")
    if claim != (want_home.get("persistentVolumeClaim") or {}).get("claimName"):
        return "session volume changed"
    mounts = {m.mount_path: m for m in pod.spec.containers[0].volume_mounts or []}
    want_ro = want["containers"][0]["volumeMounts"][0]["readOnly"]
    ws = mounts.get("/workspace")
    if ws is None or bool(ws.read_only) != want_ro:
        return "workspace must be read-only" if want_ro else "workspace must be writable"
    return ""


def _pod_reason(pod: Any) -> str:
    """The cluster's own words for why a Pod is not running (scheduling, image, container)."""
    parts: list[str] = []
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            parts.append(f"{cond.reason or 'Unschedulable'}: {cond.message or ''}".strip(": "))
    for status in pod.status.container_statuses or []:
        state = status.state
        if state and state.waiting and state.waiting.reason not in (None, "ContainerCreating"):
            parts.append(f"{state.waiting.reason}: {state.waiting.message or ''}".strip(": "))
        if state and state.terminated:
            parts.append(
                f"container {status.name} {state.terminated.reason or 'terminated'} "
                f"(exit {state.terminated.exit_code}){': ' + state.terminated.message if state.terminated.message else ''}"
            )
    if not parts and pod.status.reason:
        parts.append(f"{pod.status.reason}: {pod.status.message or ''}".strip(": "))
    return "; ".join(parts)
