"""What every phase of the Docker runner shares: the task's event emitter, its session volume,
stopping its container, and the failure verdict a phase hands back to :meth:`~.docker_runner.DockerRunner.run`."""

from __future__ import annotations

import time
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import anyio
import anyio.to_thread

from ..errors import RunnerError
from ..jsonlog import ComponentLog
from ..naming import ghash, session_volume_name
from ..sanitize import Sanitizer
from .base import RunnerEventCallback
from .docker_containers import DockerHost
from .types import ErrorCategory, InstanceRequest, Status

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
    "  $2 == 0 && $1 != 1 && $1 != s {print $1; if ($0 ~ /# orchestrator-(agent|exec)-wrapper/) w[$1] = 1; next}\n"
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


@dataclass(eq=False)
class TaskFailed(Exception):
    """A phase's verdict that its task failed, handed to the one failure exit (``DockerRunner._failed``).
    ``reported``: the optional fields (``error_type``, ``status``, ``exit_code``) the phase's
    ``runner.instance.failed`` event carries, as it always has."""

    phase: str
    error_type: ErrorCategory
    message: str
    _: KW_ONLY
    status: Status = "failed"
    stop: bool = True
    exit_code: int | None = None
    final_message: str | None = None
    reported: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @classmethod
    def of_error(cls, phase: str, error: RunnerError, exit_code: int | None, **fields: Any) -> TaskFailed:
        """The verdict on a phase whose last attempt ended in ``error`` (a timeout keeps its status)."""
        status: Status = "timeout" if error.category == "timeout" else "failed"
        return cls(phase, error.category, str(error), status=status, exit_code=exit_code, **fields)

    def event_fields(self) -> dict[str, Any]:
        """The fields of this failure's ``runner.instance.failed`` event."""
        extra = {"error_type": self.error_type, "status": self.status, "exit_code": self.exit_code}
        return {"phase": self.phase, "error": self.message, **{k: extra[k] for k in self.reported}}


@dataclass(eq=False)
class TaskEvents:
    """The one emitter of a runner's task events: to runner.jsonl, and scrubbed to the caller."""

    log: ComponentLog
    sanitizer: Sanitizer

    def __call__(
        self,
        request: InstanceRequest,
        on_event: RunnerEventCallback | None,
        type_: str,
        level: str = "info",
        **fields: Any,
    ) -> None:
        ids = {"run_id": request.run_id, "instance_id": request.instance_id, "task_key": request.task_key}
        self.log.log(level, type_, **ids, **fields)
        if on_event is not None:
            try:
                on_event(self.sanitizer.scrub({"type": type_, **ids, **fields}))
            except Exception as exc:  # a broken consumer must not break the task
                self.log.warning("runner.callback_failed", error=f"{type(exc).__name__}: {exc}")


def session_volume(request: InstanceRequest) -> str:
    """The Docker volume that holds this task's agent session."""
    sgk = request.session_group_key or request.task_key
    scope = request.session_volume_scope
    g = ghash(sgk, plugin=request.plugin_name, model=request.model) if scope == "global" else ghash(sgk)
    return session_volume_name(request.run_id, g, scope=scope)


@dataclass(eq=False)
class ContainerStopper:
    """Ends a task's agent and stops its container; knows which agents may still run."""

    host: DockerHost
    emit_event: TaskEvents
    # containers whose agent exec may still be running (cancelled or timed out
    # mid-exec), so a stop first gives that agent its grace
    live_agents: set[str] = field(default_factory=set)
    # Containers whose last stop succeeded: nothing of theirs runs any more, so
    # their workspaces can be given to another task.
    stopped: set[str] = field(default_factory=set)

    async def end_agent(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> bool:
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

    async def end_orphan(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> bool:
        """End the agent of an attempt that lost its output stream; True once no agent runs.

        The agent may still be working, and a retry would start a second one in the same workspace.
        It gets its grace to save its session (which the retry resumes); one that does not exit, or a
        container that cannot be reached to ask, is ended by stopping the container (the retry starts
        it again). While neither works it stays listed as live, and every retry first tries again.
        """
        if not await self.end_agent(request, on_event):
            try:
                await self.host.stop(request.container_name, timeout=STOP_TIMEOUT_S)
            except RunnerError as exc:
                self.emit_event(request, on_event, "runner.container.stop_failed", "warn", error=str(exc))
                return False
            self.emit_event(
                request, on_event, "runner.container.stopped", phase="stop", container=request.container_name
            )
        self.live_agents.discard(request.container_name)
        return True

    async def stop_quietly(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> None:
        """Stop the task's container (its agent first gets its grace); a failure is an event, not an error."""
        if request.container_name in self.live_agents:
            self.live_agents.discard(request.container_name)
            await self.end_agent(request, on_event)
        t = time.monotonic()
        try:
            await self.host.stop(request.container_name, timeout=STOP_TIMEOUT_S)
        except RunnerError as exc:
            self.stopped.discard(request.container_name)
            self.emit_event(request, on_event, "runner.container.stop_failed", "warn", error=str(exc))
            return
        self.stopped.add(request.container_name)
        self.emit_event(
            request,
            on_event,
            "runner.container.stopped",
            phase="stop",
            container=request.container_name,
            duration_s=round(time.monotonic() - t, 4),
        )
