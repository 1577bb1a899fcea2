"""The Kubernetes runner: the Docker runner's pipeline (archive path) with a namespace as its engine,
plus what only a cluster has: the session's claim, a Pod lost mid-task (placed again), and Ctrl+C
keeping the Pod for ``--resume`` (docs/scaling.md, "Sessions" and "Failures, Ctrl+C and resume").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec

from ..errors import RunnerError
from .base import RunnerEventCallback
from .docker_core import session_volume
from .docker_runner import DockerRunner
from .hosts import host_lost, start_afresh
from .kube_client import ClusterSpec, is_conflict
from .kube_host import KubeHost
from .kube_pods import claim_manifest, claim_name
from .object_cache import ObjectCacheSettings
from .types import InstanceRequest, RunnerResult

# A task whose Pod goes away is placed again, this many times in all.
MAX_PLACEMENTS = 3


@dataclass(frozen=True)
class KubeSettings:
    """``runner.kubernetes`` beyond where the cluster is."""

    pending_timeout_s: float = 300
    pull_policy: str = "IfNotPresent"
    storage_class: str | None = None
    session_size: str = "1Gi"
    session_bind_timeout_s: float = 30


class KubernetesRunner(DockerRunner):
    """:class:`~orchestrator.runner.base.TaskRunner` that runs each task in a Pod of one namespace."""

    def __init__(self, *, cluster: ClusterSpec, settings: KubeSettings | None = None, **kwargs: Any) -> None:
        self.settings = settings or KubeSettings()
        self.kube = KubeHost(
            cluster,
            limiter=kwargs.pop("limiter", None),
            pending_timeout_s=self.settings.pending_timeout_s,
            pull_policy=self.settings.pull_policy,
        )
        # No engine-side object cache: every task's clone travels whole (full copy).
        kwargs["object_cache"] = ObjectCacheSettings(max_mb=0)
        super().__init__(host=self.kube, **kwargs)
        self.kube.nofile = self.hardening.nofile
        self._claims: dict[str, tuple[str | None, str]] = {}
        # Claims this process made, and the sessions its tasks have had on each.
        self._made: set[str] = set()
        self._sessions: dict[str, set[str]] = {}
        self._claim_locks: dict[str, anyio.Lock] = {}

    async def reserve(self, request: InstanceRequest) -> str:
        """Where the task runs, for its ``task.started`` record: the cluster (the scheduler picks the node)."""
        return self.kube.name or "kubernetes"

    async def run(self, request: InstanceRequest, *, on_event: RunnerEventCallback | None = None) -> RunnerResult:
        if request.delete_branches:
            return await super().run(request, on_event=on_event)
        request = await self._session_storage(request, on_event)
        placements = 0
        while True:
            placements += 1
            result = await super().run(request, on_event=on_event)
            if result.session_id:
                self._sessions.setdefault(claim_name(session_volume(request)), set()).add(result.session_id)
            why = self.kube.lost.pop(request.container_name, None)
            if result.status == "success" or why is None:
                return result
            message = f"Kubernetes: {why}"
            failed = host_lost(self.emit_event, request, on_event, result, self.kube.name, message)
            if placements >= MAX_PLACEMENTS:
                return failed
            detail = f"{message}; the task starts afresh in a new Pod"
            request = start_afresh(self.emit_event, request, on_event, self.kube.name, detail)

    async def _stop_interrupted(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> None:
        """Ctrl+C: the agent is ended (it spends nothing more) and the Pod kept with its workspace,
        where ``--resume`` continues; deleting it would lose the agent's work."""
        if request.container_name in self.stopper.live_agents:
            self.stopper.live_agents.discard(request.container_name)
            await self.stopper.end_agent(request, on_event)

    # ---- the session claim ----------------------------------------------------

    async def _session_storage(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> InstanceRequest:
        volume = session_volume(request)
        claim = claim_name(volume)
        async with self._claim_locks.setdefault(claim, anyio.Lock()):
            if claim not in self._claims:
                try:
                    self._claims[claim] = await self._claim_usable(request, claim)
                except RunnerError as exc:
                    self._claims[claim] = (None, f"the session claim {claim} cannot be made: {exc}")
        usable, why = self._claims[claim]
        self.kube.claims[request.container_name] = usable
        if usable is not None:
            if not (request.session_id and claim in self._made and request.session_id not in self._sessions[claim]):
                return request
            # The claim was made just now, so the session a resumed task names is not on it.
            reason = "session_claim_missing"
            detail = (
                f"the session claim {claim} no longer existed (deleted since the task last ran); "
                "the agent starts a fresh session on a new, empty one"
            )
        else:
            detail = f"{why}; the agent's session lives only as long as its Pod"
            if not request.session_id:
                self.emit_event(request, on_event, "runner.session.no_storage", "warn", claim=claim, detail=detail)
                return request
            reason = "no_session_storage"
        fields = {"reason": reason, "previous_session_id": request.session_id, "detail": detail}
        self.emit_event(request, on_event, "runner.session.reset", "warn", **fields)
        return msgspec.structs.replace(request, session_id=None)

    async def _claim_usable(self, request: InstanceRequest, claim: str) -> tuple[str | None, str]:
        """(the claim, "") when the task's Pod can mount it, else (None, why not)."""
        host = self.kube
        core = await host.core()
        body = claim_manifest(
            request,
            session_volume(request),
            namespace=host.namespace,
            size=self.settings.session_size,
            storage_class=self.settings.storage_class,
        )
        created = await host.call_unless(
            is_conflict,
            f"create PersistentVolumeClaim {claim}",
            core.create_namespaced_persistent_volume_claim,
            host.namespace,
            body,
        )
        made = created is not None
        if made:
            self._made.add(claim)
            self._sessions.setdefault(claim, set())
        t0 = time.monotonic()
        while True:
            pvc = await host.call(
                f"read PersistentVolumeClaim {claim}",
                core.read_namespaced_persistent_volume_claim,
                claim,
                host.namespace,
            )
            if pvc.status.phase == "Bound":
                elsewhere = await self._volume_unreachable(pvc.spec.volume_name)
                return (None, elsewhere) if elsewhere else (claim, "")
            if await self._binds_with_pod(pvc.spec.storage_class_name):
                return claim, ""
            if time.monotonic() - t0 > self.settings.session_bind_timeout_s:
                why = await self._claim_events(claim) or f"it stayed {pvc.status.phase}"
                if made:
                    await self._delete_claim(claim)
                return (
                    None,
                    f"the session claim {claim} was not bound within {self.settings.session_bind_timeout_s:g} s: {why}",
                )
            await anyio.sleep(1.0)

    async def _binds_with_pod(self, storage_class: str | None) -> bool:
        """A class with ``WaitForFirstConsumer`` binds only once the Pod is scheduled."""
        if not storage_class:
            return False
        from kubernetes import client

        api = client.StorageV1Api(await self.kube.client())
        try:
            sc = await self.kube.call(f"read StorageClass {storage_class}", api.read_storage_class, storage_class)
        except RunnerError:
            return False
        return sc.volume_binding_mode == "WaitForFirstConsumer"

    async def _volume_unreachable(self, volume: str | None) -> str:
        """Why a bound volume cannot be mounted now (its node is gone), or ""."""
        if not volume:
            return ""
        core = await self.kube.core()
        try:
            pv = await self.kube.call(f"read PersistentVolume {volume}", core.read_persistent_volume, volume)
        except RunnerError:
            return ""  # not allowed to look: the Pod will say
        required = ((pv.spec.node_affinity or {}) and pv.spec.node_affinity.required) or None
        nodes = [
            value
            for term in (required.node_selector_terms if required else []) or []
            for expr in term.match_expressions or []
            if expr.key == "kubernetes.io/hostname" and expr.operator == "In"
            for value in expr.values or []
        ]
        if not nodes:
            return ""
        for node in nodes:
            if await self.kube._node_readiness(node) == "True":
                return ""
        return f"its volume {volume} is bound to node {', '.join(nodes)}, which is not Ready"

    async def _claim_events(self, claim: str) -> str:
        core = await self.kube.core()
        try:
            events = await self.kube.call(
                "list events",
                core.list_namespaced_event,
                self.kube.namespace,
                field_selector=f"involvedObject.name={claim},involvedObject.kind=PersistentVolumeClaim",
            )
        except RunnerError:
            return ""
        items = sorted(events.items, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
        return items[-1].message if items else ""

    async def _delete_claim(self, claim: str) -> None:
        try:
            await self.kube.delete_claim(claim)
        except RunnerError as exc:
            self.log.warning("runner.session.claim_not_removed", claim=claim, error=str(exc))
