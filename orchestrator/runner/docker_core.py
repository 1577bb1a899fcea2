"""What every step of the Docker runner shares: its state, its event log, and stopping a task's container.

:class:`RunnerCore` is the base of :class:`~.docker_runner.DockerRunner` and of
the step classes it is assembled from (:mod:`.docker_workspace`,
:mod:`.docker_agent`, :mod:`.docker_collect`); :class:`DockerRunner` sets the
attributes declared here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from ..errors import RunnerError
from ..jsonlog import ComponentLog
from ..naming import ghash, session_volume_name
from ..sanitize import Sanitizer
from . import archive, git_ops
from .base import RunnerEventCallback
from .docker_containers import ContainerReady, DockerHost, workspace_read_only
from .object_cache import CACHE_ALTERNATE, ObjectCache
from .seed import SeedCache
from .types import AuthConfig, Hardening, InstanceRequest

STOP_TIMEOUT_S = 1
# How long an agent still running when its task is stopped (Ctrl+C, timeout)
# gets to exit after SIGTERM, so it can save its session. tini as PID 1 would
# end the container (and the agent with it) at once on `docker stop`, so the
# agent is signalled itself first; one that exits promptly costs nothing more.
AGENT_STOP_GRACE_S = 10
# Run in the container: SIGTERM every exec'd process (parent outside the
# container, so ppid 0; PID 1 is tini, and this shell is excluded), and the
# agent under an agent wrapper (AGENT_WRAPPER_SCRIPT, named by its first
# line), then wait for them to exit, at most $1 tenths of a second.
END_AGENT_SCRIPT = (
    "self=$$\n"
    'pids=$(ps -eo pid=,ppid=,args= | awk -v s="$self" \'\n'
    '  $2 == 0 && $1 != 1 && $1 != s {print $1; if (index($0, "# orchestrator-agent-wrapper")) w[$1] = 1; next}\n'
    "  {pid[NR] = $1; parent[NR] = $2}\n"
    "  END {for (i in pid) if (parent[i] in w) print pid[i]}')\n"
    '[ -n "$pids" ] || exit 0\n'
    "kill -TERM $pids 2>/dev/null\n"
    "i=0\n"
    'while [ "$i" -lt "$1" ]; do\n'
    '  alive=""\n'
    '  for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done\n'
    '  [ -n "$alive" ] || exit 0\n'
    "  pids=$alive; sleep 0.1; i=$((i + 1))\n"
    "done\n"
    "exit 1\n"
)


class RunnerCore:
    """State and helpers shared by the Docker runner's steps."""

    auth: AuthConfig
    hardening: Hardening
    dry_run: bool
    sanitizer: Sanitizer
    log: ComponentLog
    log_path: Path | None
    host: DockerHost
    # Containers whose agent exec may still be running (cancelled or timed out mid-exec).
    _live_agents: set[str]
    seeds: SeedCache
    object_cache: ObjectCache

    # ---- events -------------------------------------------------------------

    def emit_event(
        self,
        request: InstanceRequest,
        on_event: RunnerEventCallback | None,
        type_: str,
        level: str = "info",
        **fields: Any,
    ) -> None:
        """One runner event of a task: to runner.jsonl, and scrubbed to the caller (the only copy of this)."""
        ids = {"run_id": request.run_id, "instance_id": request.instance_id, "task_key": request.task_key}
        self.log.log(level, type_, **ids, **fields)
        if on_event is not None:
            try:
                on_event(self.sanitizer.scrub({"type": type_, **ids, **fields}))
            except Exception as exc:  # a broken consumer must not break the task
                self.log.warning("runner.callback_failed", error=f"{type(exc).__name__}: {exc}")

    def session_volume(self, request: InstanceRequest) -> str:
        """The Docker volume that holds this task's agent session."""
        sgk = request.session_group_key or request.task_key
        if request.session_volume_scope == "global":
            g = ghash(sgk, plugin=request.plugin_name, model=request.model)
        else:
            g = ghash(sgk)
        return session_volume_name(request.run_id, g, scope=request.session_volume_scope)

    async def _remove_workspace(self, workspace: Path) -> None:
        await anyio.to_thread.run_sync(git_ops.remove_workspace, workspace, limiter=self.host.limiter)

    # ---- stopping -------------------------------------------------------------

    async def _end_agent(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> bool:
        """SIGTERM a still-running agent and wait up to the grace for it to exit; True once it has."""
        t = time.monotonic()
        try:
            with anyio.move_on_after(AGENT_STOP_GRACE_S + 3):
                code, _ = await self.host.exec_simple(
                    request.container_name, ["sh", "-c", END_AGENT_SCRIPT, "end-agent", str(AGENT_STOP_GRACE_S * 10)]
                )
                self.emit_event(
                    request,
                    on_event,
                    "runner.agent.stopped",
                    phase="stop",
                    exited=code == 0,
                    duration_s=round(time.monotonic() - t, 4),
                )
                return code == 0
        except RunnerError as exc:  # the container is gone or stopping: the stop below still runs
            self.emit_event(request, on_event, "runner.agent.stop_failed", "warn", error=str(exc))
        return False

    async def _end_orphan(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> bool:
        """End the agent of an attempt that lost its output stream; True once no agent runs.

        The agent may still be working in its container, and a retry would start
        a second one in the same workspace. It gets its grace to save its
        session (which the retry resumes); one that does not exit, or a container
        that cannot be reached to ask, is ended by stopping the container (the
        retry starts it again). While neither works the agent stays listed as
        live, and every retry first tries again.
        """
        if not await self._end_agent(request, on_event):
            try:
                await self.host.stop(request.container_name, timeout=STOP_TIMEOUT_S)
            except RunnerError as exc:
                self.emit_event(request, on_event, "runner.container.stop_failed", "warn", error=str(exc))
                return False
            self.emit_event(
                request, on_event, "runner.container.stopped", phase="stop", container=request.container_name
            )
        self._live_agents.discard(request.container_name)
        return True

    async def _stop_quietly(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> None:
        if request.container_name in self._live_agents:
            self._live_agents.discard(request.container_name)
            await self._end_agent(request, on_event)
        t = time.monotonic()
        try:
            await self.host.stop(request.container_name, timeout=STOP_TIMEOUT_S)
        except RunnerError as exc:
            self.emit_event(request, on_event, "runner.container.stop_failed", "warn", error=str(exc))
            return
        self.emit_event(
            request,
            on_event,
            "runner.container.stopped",
            phase="stop",
            container=request.container_name,
            duration_s=round(time.monotonic() - t, 4),
        )

    async def _archive_copy_in(
        self,
        request: InstanceRequest,
        workspace: Path,
        ready: ContainerReady,
        on_event: RunnerEventCallback | None,
        *,
        fresh: bool,
    ) -> RunnerError | None:
        """Remote engine: the clone travels into the container's /workspace volume.

        ``fresh``: the first attempt on a fresh clone, so the volume must hold that
        clone and nothing else; a volume an existing container kept is emptied
        first. Otherwise (a retry, or a resumed task's kept workspace) the volume
        keeps the agent's work when it holds a whole clone; an earlier attempt may
        have failed before its copy-in or in the middle of it (a link to the
        engine that broke), and an agent must never run in an empty or half-copied
        workspace, so then the clone is copied in again."""
        name = request.container_name
        try:
            if not fresh and await archive.workspace_holds_a_clone(self.host, name):
                return None
            read_only = workspace_read_only(request)
            if not (fresh and ready.action == "created"):
                await archive.empty_workspace(self.host, name, read_only=read_only)
            t = time.monotonic()
            cached = self.object_cache.applies(self.host, request.isolation_mode)
            sent = await archive.copy_in(
                self.host,
                name,
                workspace,
                read_only=read_only,
                alternates=CACHE_ALTERNATE if cached else None,
                # A fresh clone's files are the base's: checked out there, from the cache.
                checkout=cached and fresh,
            )
        except RunnerError as exc:
            return exc
        self.emit_event(
            request,
            on_event,
            "runner.archive.copied_in",
            phase="workspace",
            host=self.host.name,
            bytes=sent,
            duration_s=round(time.monotonic() - t, 4),
        )
        return None
