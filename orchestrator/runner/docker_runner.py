"""The Docker runner: one task through six phases.

    validate -> workspace -> container -> execute (with retries) -> collect -> cleanup

Runner-internal events (phase timings, agent events, ``runner.container.replaced``,
``runner.instance.completed``) go to ``<logs_dir>/runner.jsonl`` and to the
caller's ``on_event``; never to ``events.jsonl``. Everything written, returned or
raised passes through the sanitizer, which knows the exact credential values.

Outcomes: ``success``; ``failed`` with ``error_type`` timeout|api|container|git|
command|session_corrupted; ``timeout``. Cancellation (Ctrl+C) is never a
result: a still-running agent gets its grace to exit, the container is stopped
in a shielded scope, the workspace kept, and the cancellation re-raised. A
request with ``resume_workspace`` continues in that kept workspace. Transient
failures (the plugin says retryable, or a Docker error matching the transient
patterns in :mod:`.docker_containers`) are retried with exponential backoff, resuming the agent session on
the same session volume; a session the agent cannot resume is replaced by a
fresh one in the same workspace, once.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec

from ..errors import (
    ConfigError,
    ContainerError,
    GitError,
    PreflightError,
    ResourceLimitError,
    RunnerError,
    SecretLeakError,
    TaskTimeoutError,
    UsageError,
)
from ..jsonlog import ComponentLog, utc_now_iso
from ..naming import ghash, session_volume_name
from ..sanitize import SECRET_ENV_VARS, Sanitizer, default_sanitizer
from . import archive, git_cmd, git_ops, secret_scan, structured, watchdog
from .base import RunnerEventCallback
from .docker_containers import DockerHost, ensure_container, selinux_enabled, workspace_read_only
from .docker_exec import ExecOutput, run_exec
from .git_cleanup import delete_run_branches
from .plugin import AgentEvent, AgentOutcome, RunnerPlugin, get_plugin
from .types import AuthConfig, BranchArtifact, ErrorCategory, Hardening, InstanceRequest, Metrics, RunnerResult

IMAGE_HINT = "build it with scripts/setup-docker.sh or `docker build -t claude-code .`"
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
READ_ONLY_NOTE = (
    "/workspace is mounted read-only for review tasks (import_policy=never, "
    "review_workspace_mode=ro); the agent tried to write to it. Write to /tmp or /home/node instead"
)
EVENT_STRING_LIMIT = 4000
MIN_FREE_BYTES = 200 << 20

Pricing = Mapping[str, tuple[float, float]]

# Run in the task's container after the agent exits: $1 is the policy, $2 the
# commit message. Counts changed and untracked files (the repository's
# .gitignore applies) and, under "commit", commits them. --no-verify: the
# agent's hooks must not veto the commit that keeps its work.
UNCOMMITTED_SCRIPT = (
    "n=$(git status --porcelain --untracked-files=all | wc -l) || exit 3\n"
    'echo "uncommitted=$n"\n'
    'if [ "$n" -gt 0 ] && [ "$1" = commit ]; then\n'
    '  git add -A && git commit -q --no-verify -m "$2" && echo committed\n'
    "fi\n"
)
# The agent of a task whose uncommitted work is looked at runs under this
# wrapper, so that the look costs no `docker exec` of its own: once the agent
# exits, the wrapper counts what it left (as UNCOMMITTED_SCRIPT does, without
# taking git's optional index lock), writes the count as its last stderr line
# (taken out of the stream by run_exec) and exits with the agent's status.
# Only when there is something to commit does a second exec follow.
AGENT_WRAPPER_SCRIPT = (
    "# orchestrator-agent-wrapper\n"
    '"$@"\n'
    "rc=$?\n"
    "n=$(GIT_OPTIONAL_LOCKS=0 git status --porcelain --untracked-files=all 2>/dev/null | wc -l)\n"
    "printf '\\n@@orchestrator-uncommitted=%s\\n' \"$n\" >&2\n"
    'exit "$rc"\n'
)
UNCOMMITTED_MESSAGE = (
    "Changes the agent left uncommitted\n\n"
    "The agent exited without committing these files; the orchestrator committed them "
    "(uncommitted: commit) so that its work reaches the task's branch."
)


def backoff_delay(attempt: int, *, base: float, factor: float, cap: float) -> float:
    """Delay before retry number ``attempt`` (0-based): base*factor^attempt, capped."""
    return min(base * (factor**attempt), cap)


def _check_disk_space(workspace: Path) -> None:
    """Fail before cloning when the workspace filesystem is nearly full."""
    probe = workspace
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        raise GitError(
            f"insufficient disk space for the workspace: {free // (1 << 20)} MiB free under {probe} "
            f"(need at least {MIN_FREE_BYTES >> 20} MiB); free space or set ORCHESTRATOR_WORKSPACE_ROOT"
        )


def _reset_workspace(workspace: Path) -> None:
    _check_disk_space(workspace)
    git_ops.reset_workspace(workspace)


def _clip(obj: Any) -> Any:
    """Bound the size of strings in agent events written to runner.jsonl."""
    if isinstance(obj, str):
        return obj if len(obj) <= EVENT_STRING_LIMIT else obj[:EVENT_STRING_LIMIT] + f"...[{len(obj)} chars]"
    if isinstance(obj, dict):
        return {k: _clip(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clip(v) for v in obj]
    return obj


class _Failure(NamedTuple):
    """A task failure found after the agent's execution ended (its answer did not validate)."""

    status: str
    error_type: ErrorCategory
    message: str
    exit_code: int | None
    final_message: str


class _Attempt:
    """What one execution attempt produced (an exec output or an error)."""

    def __init__(self, output: ExecOutput | None = None, error: RunnerError | None = None) -> None:
        self.output = output
        self.error = error


_STANDARD_RECORD_FIELDS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class _ForwardToComponentLog(logging.Handler):
    """Sends ``orchestrator.runner`` log records, with their extra fields, to runner.jsonl."""

    def __init__(self, log: ComponentLog) -> None:
        super().__init__(logging.DEBUG)
        self.target = log

    def emit(self, record: logging.LogRecord) -> None:
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD_RECORD_FIELDS}
        level = {"WARNING": "warn", "CRITICAL": "error"}.get(record.levelname, record.levelname.lower())
        self.target.log(level, record.getMessage(), **extra)


class DockerRunner:
    """:class:`~orchestrator.runner.base.TaskRunner` that runs each task in its own container."""

    def __init__(
        self,
        *,
        auth: AuthConfig | None = None,
        logs_dir: Path | str | None = None,
        sanitizer: Sanitizer | None = None,
        client_factory=None,
        limiter: anyio.CapacityLimiter | None = None,
        pricing: Pricing | None = None,
        host: DockerHost | None = None,
        dry_run: bool = False,
        known_images: tuple[str, ...] = (),
        hardening: Hardening | None = None,
    ) -> None:
        self.auth = auth or AuthConfig()
        self.hardening = hardening or Hardening()
        self.dry_run = dry_run
        self.sanitizer = sanitizer or default_sanitizer()
        self.sanitizer.add_secrets(self.auth.secret_values())
        self.logs_dir = Path(logs_dir) if logs_dir else None
        self.log_path = self.logs_dir / "runner.jsonl" if self.logs_dir else None
        self.log = ComponentLog(self.log_path, "runner", sanitizer=self.sanitizer)
        self.host = host or DockerHost(client_factory, limiter)
        # The git layer logs through the standard logger (import audit lines,
        # isolation warnings); they belong in runner.jsonl with their fields.
        self._forward = _ForwardToComponentLog(self.log)
        git_logger = logging.getLogger("orchestrator.runner")
        git_logger.addHandler(self._forward)
        if git_logger.level == logging.NOTSET:
            git_logger.setLevel(logging.INFO)  # the audit lines are INFO; the root default would drop them
        self.pricing = dict(pricing or {})
        # Images known to exist (the CLI's pre-flight has just checked its image).
        self._images_seen: set[str] = set(known_images)
        # Containers whose agent exec may still be running (cancelled or timed out mid-exec).
        self._live_agents: set[str] = set()
        self._image_locks: dict[str, anyio.Lock] = {}

    async def aclose(self) -> None:
        logging.getLogger("orchestrator.runner").removeHandler(self._forward)
        await self.host.aclose()
        self.log.close()

    async def __aenter__(self) -> DockerRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- events -------------------------------------------------------------

    def _emit(
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

    # ---- the pipeline ---------------------------------------------------------

    async def run(self, request: InstanceRequest, *, on_event: RunnerEventCallback | None = None) -> RunnerResult:
        if request.delete_branches:
            return await self._delete_branches(request, on_event)
        started_at, t0 = utc_now_iso(), time.monotonic()
        plugin = self._validate_request(request)
        workspace: Path | None = None
        container_known = False
        state: dict[str, Any] = {"retry_attempts": 0}

        def finish(status, **kw) -> RunnerResult:
            err = kw.pop("error", None)
            return RunnerResult(
                status=status,
                instance_id=request.instance_id,
                started_at=started_at,
                completed_at=utc_now_iso(),
                container_name=request.container_name,
                log_path=str(self.log_path) if self.log_path else None,
                error=self.sanitizer.scrub_text(err) if err else None,
                retry_attempts=state["retry_attempts"],
                **kw,
            )

        try:
            # 1. validate
            try:
                await self._check_image(request.docker_image)
            except RunnerError as exc:
                self._emit(request, on_event, "runner.instance.failed", "error", phase="validate", error=str(exc))
                return finish("failed", error_type=exc.category, error=str(exc))

            # 2. workspace, while the container starts (3); an interrupted task
            # continues in the workspace it left, with its session
            workspace = git_ops.workspace_path(request.run_id, request.task_key)
            container_known = True  # from here on a failure or Ctrl+C stops the container
            kept: git_ops.WorkspaceInfo | None = None
            if request.resume_workspace:
                found = await anyio.to_thread.run_sync(git_ops.kept_workspace, workspace)
                if isinstance(found, str):
                    # Its session refers to files that are gone: both start afresh.
                    self._emit(
                        request,
                        on_event,
                        "runner.session.reset",
                        "warn",
                        reason="workspace_missing",
                        detail=found,
                        previous_session_id=request.session_id,
                    )
                    request = msgspec.structs.replace(request, session_id=None, resume_workspace=False)
                else:
                    kept = found
            if kept is not None:
                first, failure = await self._kept_workspace_and_container(request, kept, on_event)
            else:
                first, failure = await self._workspace_and_container(request, workspace, on_event)
            if failure is not None:
                return finish("failed", error_type=failure.category, error=str(failure), workspace_path=str(workspace))
            ws_info = first.pop("ws_info")

            # 3 + 4. container and execution, with retries
            attempt, outcome_total, last_exec = await self._execute_with_retries(
                request, plugin, workspace, on_event, state, first
            )
            metrics = self._metrics(request, outcome_total, time.monotonic() - t0)
            session_id = outcome_total.get("session_id")
            common = dict(metrics=metrics, session_id=session_id, workspace_path=str(workspace))

            if attempt.error is not None:
                status = "timeout" if attempt.error.category == "timeout" else "failed"
                await self._stop_quietly(request, on_event)
                self._emit(
                    request,
                    on_event,
                    "runner.instance.failed",
                    "error",
                    phase="execute",
                    error=str(attempt.error),
                    error_type=attempt.error.category,
                    status=status,
                )
                return finish(
                    status,
                    error_type=attempt.error.category,
                    error=str(attempt.error),
                    exit_code=last_exec.exit_code if last_exec else None,
                    **common,
                )

            out = attempt.output
            assert out is not None
            outcome = out.outcome
            if outcome.is_error or (out.exit_code not in (0, None) and plugin.name == "command"):
                error_type, message = self._failure(request, plugin, out)
                await self._stop_quietly(request, on_event)
                self._emit(
                    request,
                    on_event,
                    "runner.instance.failed",
                    "error",
                    phase="execute",
                    error=message,
                    error_type=error_type,
                    exit_code=out.exit_code,
                )
                return finish(
                    "failed",
                    error_type=error_type,
                    error=message,
                    exit_code=out.exit_code,
                    final_message=self.sanitizer.scrub_text(outcome.final_message),
                    **common,
                )

            output = None
            if request.output_schema is not None:
                checked = await self._structured_output(request, plugin, workspace, on_event, state, out, outcome_total)
                metrics = self._metrics(request, outcome_total, time.monotonic() - t0)
                session_id = outcome_total.get("session_id")
                common = dict(metrics=metrics, session_id=session_id, workspace_path=str(workspace))
                if isinstance(checked, _Failure):
                    await self._stop_quietly(request, on_event)
                    self._emit(
                        request,
                        on_event,
                        "runner.instance.failed",
                        "error",
                        phase="output",
                        error=checked.message,
                        error_type=checked.error_type,
                        exit_code=checked.exit_code,
                    )
                    return finish(
                        checked.status,
                        error_type=checked.error_type,
                        error=checked.message,
                        exit_code=checked.exit_code,
                        final_message=self.sanitizer.scrub_text(checked.final_message),
                        **common,
                    )
                out, output = checked
                outcome = out.outcome

            if out.saw_erofs and workspace_read_only(request):
                # The agent's write failed fast (EROFS) and it carried on; say why.
                self._emit(request, on_event, "runner.workspace.read_only_write", "warn", detail=READ_ONLY_NOTE)

            # 5a. what the agent left uncommitted: commit it (default) or count what is discarded
            leftover = await self._uncommitted(request, plugin, on_event, out.uncommitted)

            # 5. collect: import the branch (per policy). The agent has finished, so
            # the finalize stop does not wait for the import: both take a tenth of a
            # second or so, and the task's end is the later of the two.
            try:
                if self.host.archive and request.import_policy != "never":
                    await self._archive_bundle_out(request, workspace, ws_info, on_event)
                artifact = await self._import_while_stopping(request, workspace, ws_info, on_event)
            except RunnerError as exc:
                if not request.finalize:
                    await self._stop_quietly(request, on_event)
                self._emit(
                    request,
                    on_event,
                    "runner.instance.failed",
                    "error",
                    phase="import",
                    error=str(exc),
                    error_type=exc.category,
                )
                return finish(
                    "failed",
                    error_type=exc.category,
                    error=str(exc),
                    exit_code=out.exit_code,
                    final_message=self.sanitizer.scrub_text(outcome.final_message),
                    **common,
                )

            if leftover is not None:
                artifact = msgspec.structs.replace(artifact, uncommitted_files=leftover[0], auto_committed=leftover[1])

            # 6. cleanup: completion event first (it carries the workspace path), then delete
            metrics = self._metrics(request, outcome_total, time.monotonic() - t0)
            self._emit(
                request,
                on_event,
                "runner.instance.completed",
                workspace_path=str(workspace),
                branch_imported=artifact.branch_final,
                duration_s=metrics.duration_s,
                retry_attempts=state["retry_attempts"],
                uncommitted_files=artifact.uncommitted_files,
                auto_committed=artifact.auto_committed,
            )
            await self._remove_workspace(workspace)
            return finish(
                "success",
                artifact=artifact,
                exit_code=out.exit_code,
                final_message=self.sanitizer.scrub_text(outcome.final_message),
                metrics=metrics,
                session_id=session_id,
                workspace_path=None,
                output=self.sanitizer.scrub(output),
            )  # like final_message: no secret leaves
        except Exception as exc:
            # A bug or a plugin error (ConfigError) after the container started:
            # do not leave it running, then let the error through.
            if container_known:
                with anyio.CancelScope(shield=True), anyio.move_on_after(AGENT_STOP_GRACE_S + 15):
                    await self._stop_quietly(request, on_event)
            self._emit(request, on_event, "runner.instance.error", "error", error=f"{type(exc).__name__}: {exc}")
            raise
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if container_known:
                    with anyio.move_on_after(AGENT_STOP_GRACE_S + 15):
                        await self._stop_quietly(request, on_event)
                self._emit(
                    request,
                    on_event,
                    "runner.instance.interrupted",
                    "warn",
                    workspace_path=str(workspace) if workspace else None,
                )
            raise

    # ---- phases -----------------------------------------------------------------

    async def _delete_branches(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> RunnerResult:
        """A housekeeping request: no container, only the host repository's refs (see git_cleanup)."""
        started_at = utc_now_iso()
        try:
            outcome = await delete_run_branches(request.repo_path, request.delete_branches, run_id=request.run_id)
        except (GitError, UsageError) as exc:
            self._emit(request, on_event, "runner.instance.failed", "error", phase="delete_branches", error=str(exc))
            return RunnerResult(
                status="failed",
                instance_id=request.instance_id,
                error_type="git",
                error=str(exc),
                started_at=started_at,
                completed_at=utc_now_iso(),
            )
        self._emit(request, on_event, "runner.branches.deleted", outcome=outcome)
        message = "".join(f"@@branch {state}: {name}\n" for name, state in outcome.items())
        return RunnerResult(
            status="success",
            instance_id=request.instance_id,
            final_message=message,
            started_at=started_at,
            completed_at=utc_now_iso(),
            exit_code=0,
        )

    def _validate_request(self, request: InstanceRequest) -> RunnerPlugin:
        plugin = get_plugin(request.plugin_name)
        models = plugin.known_models()
        if models is not None and request.model not in models:
            raise ConfigError(
                f"model {request.model!r} is not known to plugin {plugin.name}; "
                f"choose one of: {', '.join(sorted(models))}"
            )
        if request.plugin_name == "command" and not request.command:
            raise ConfigError("the command plugin needs request.command")
        if request.output_schema is not None:
            if not plugin.capabilities.supports_output_schema:
                raise ConfigError(
                    f"plugin {plugin.name} cannot enforce output_schema; drop output_schema "
                    "or use an agent plugin (claude-code, codex)"
                )
            structured.check_schema(request.output_schema)
        return plugin

    async def _check_image(self, image: str) -> None:
        if image in self._images_seen:
            return
        # The tasks of a run start together: one of them asks, the others wait for it.
        async with self._image_locks.setdefault(image, anyio.Lock()):
            if image in self._images_seen:
                return
            if not await self.host.image_exists(image):
                raise ContainerError(f"image {image} not found; {IMAGE_HINT}")
            self._images_seen.add(image)

    async def _workspace_and_container(
        self, request: InstanceRequest, workspace: Path, on_event: RunnerEventCallback | None
    ) -> tuple[dict[str, Any], RunnerError | None]:
        """Clone the workspace and create/start the first attempt's container at the same time.

        Creating and starting the container is the slowest step before the agent
        runs (about 0.2 s of daemon, runc and kernel work), so it does not wait
        for the clone: the workspace is first replaced by an empty directory, the
        container bind-mounts that directory, and the clone fills the same
        directory (same inode, so the container sees it). The agent's exec waits
        for both. On SELinux hosts the ``z`` relabel
        happens when the container is created, so there the clone comes first.

        Returns ``({"ws_info", "ready" | "error", "duration_s"}, None)`` or the
        workspace failure (the container, if it was started, is stopped again).
        """
        t = time.monotonic()
        first: dict[str, Any] = {}
        failure: RunnerError | None = None
        unexpected: list[BaseException] = []

        async def clone() -> None:
            nonlocal failure
            try:
                first["ws_info"] = await git_ops.prepare_workspace(
                    request.repo_path,
                    request.base_branch,
                    workspace,
                    isolation_mode=request.isolation_mode,
                    include_branches=request.include_branches,
                    into_empty_dir=True,
                )
            except RunnerError as exc:
                failure = exc
            except Exception as exc:  # re-raised below, outside the task group, unwrapped
                unexpected.append(exc)
            first["clone_s"] = round(time.monotonic() - t, 4)

        async def container() -> None:
            tc = time.monotonic()
            try:
                first["ready"] = await ensure_container(
                    self.host,
                    request,
                    workspace=workspace,
                    volume=self._volume_name(request),
                    fresh_workspace=True,
                    hardening=self.hardening,
                )
            except RunnerError as exc:
                first["error"] = exc
            except Exception as exc:
                unexpected.append(exc)
            first["duration_s"] = round(time.monotonic() - tc, 4)

        try:
            await anyio.to_thread.run_sync(_reset_workspace, workspace, limiter=self.host.limiter)
        except RunnerError as exc:
            failure = exc
        else:
            if selinux_enabled():
                await clone()
                if failure is None and not unexpected:
                    await container()
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(container)
                    await clone()
        # Ctrl+C while the clone's thread finished: the container task was cancelled
        # and the group exits without raising, so the cancellation is only pending.
        # Deliver it here; going on would find no container and fail the task
        # (a KeyError), recording an interrupted task as failed for good.
        await anyio.lowlevel.checkpoint_if_cancelled()
        if unexpected:
            raise unexpected[0]
        if failure is None and self.host.archive and first.get("ready") is not None:
            failure = await self._archive_copy_in(request, workspace, first["ready"], on_event)
        if failure is not None:
            if "ready" in first:
                await self._stop_quietly(request, on_event)
            self._emit(request, on_event, "runner.instance.failed", "error", phase="workspace", error=str(failure))
            return first, failure
        # duration_s: the workspace's own time (reset + clone), not the wait for the container
        self._emit(
            request,
            on_event,
            "runner.workspace.prepared",
            phase="workspace",
            workspace_path=str(workspace),
            base_commit=first["ws_info"].base_commit,
            duration_s=first.pop("clone_s"),
        )
        return first, None

    async def _uncommitted(
        self, request: InstanceRequest, plugin: RunnerPlugin, on_event: RunnerEventCallback | None, counted: int | None
    ) -> tuple[int, bool] | None:
        """Changes the agent left uncommitted: (file count, committed?), or None when not looked at.

        Agents in non-interactive mode often edit files and finish without
        committing, and the import transfers commits only. Status and commit run
        inside the task's container, as the agent's user: git there may run
        filters and hooks the agent configured, which must never run on the
        host. Review tasks (import_policy=never) and command tasks are left as
        they are. ``counted``: the agent wrapper's count, taken when the agent
        exited; with nothing to commit it is the answer, and no exec is needed.
        """
        if not _looks_at_uncommitted(request, plugin):
            return None
        t = time.monotonic()
        if counted is not None and (counted == 0 or request.uncommitted != "commit"):
            self._emit(
                request,
                on_event,
                "runner.uncommitted",
                "warn" if counted else "debug",
                phase="collect",
                files=counted,
                policy=request.uncommitted,
                auto_committed=False,
                duration_s=round(time.monotonic() - t, 4),
            )
            return counted, False
        try:
            code, raw = await self.host.exec_simple(
                request.container_name,
                ["sh", "-c", UNCOMMITTED_SCRIPT, "uncommitted", request.uncommitted, UNCOMMITTED_MESSAGE],
            )
        except RunnerError as exc:
            self._emit(request, on_event, "runner.uncommitted.failed", "warn", error=str(exc))
            return None
        text = raw.decode("utf-8", "replace")
        found = [ln for ln in text.splitlines() if ln.startswith("uncommitted=")]
        if not found:
            self._emit(
                request,
                on_event,
                "runner.uncommitted.failed",
                "warn",
                exit_code=code,
                error=self.sanitizer.scrub_text(text.strip()[-500:]),
            )
            return None
        count = int(found[0].split("=", 1)[1].strip() or 0)
        committed = code == 0 and "committed" in text.splitlines()
        if count and request.uncommitted == "commit" and not committed:
            self._emit(
                request,
                on_event,
                "runner.uncommitted.failed",
                "warn",
                exit_code=code,
                error=self.sanitizer.scrub_text(text.strip()[-500:]),
            )
        level = "warn" if count and not committed else "info" if count else "debug"
        self._emit(
            request,
            on_event,
            "runner.uncommitted",
            level,
            phase="collect",
            files=count,
            policy=request.uncommitted,
            auto_committed=committed,
            duration_s=round(time.monotonic() - t, 4),
        )
        return count, committed

    async def _kept_workspace_and_container(
        self, request: InstanceRequest, kept: git_ops.WorkspaceInfo, on_event: RunnerEventCallback | None
    ) -> tuple[dict[str, Any], RunnerError | None]:
        """The container for a task that continues in the workspace it left.

        A container still running there belongs to the process that died: it is
        restarted, which ends that process's agent, before any stale git lock
        the agent left is cleared.
        """
        t = time.monotonic()
        first: dict[str, Any] = {"ws_info": kept}
        try:
            first["ready"] = await ensure_container(
                self.host,
                request,
                workspace=kept.path,
                volume=self._volume_name(request),
                fresh_workspace=True,
                hardening=self.hardening,
            )
        except RunnerError as exc:
            first["error"] = exc
        first["duration_s"] = round(time.monotonic() - t, 4)
        if self.host.archive and first.get("ready") is not None:
            # A remote engine: a container that still exists keeps the work in its
            # workspace volume; a new one gets the kept clone through the archive API.
            failure = await self._archive_copy_in(request, kept.path, first["ready"], on_event)
            if failure is not None:
                await self._stop_quietly(request, on_event)
                return first, failure
        removed = []
        if "ready" in first:
            removed = await anyio.to_thread.run_sync(
                git_ops.clear_stale_git_locks, kept.path, limiter=self.host.limiter
            )
        self._emit(
            request,
            on_event,
            "runner.workspace.kept",
            phase="workspace",
            workspace_path=str(kept.path),
            base_commit=kept.base_commit,
            session_id=request.session_id,
            stale_locks_removed=removed,
        )
        return first, None

    async def _import_while_stopping(
        self, request: InstanceRequest, workspace: Path, ws_info: Any, on_event: RunnerEventCallback | None
    ) -> BranchArtifact:
        """Phase 5 (import per policy) with the finalize stop running alongside."""
        result: dict[str, Any] = {}

        async def collect() -> None:
            t = time.monotonic()
            try:
                if request.import_policy == "never":
                    artifact = BranchArtifact(
                        branch_planned=request.branch_name,
                        branch_final=None,
                        base=request.base_branch,
                        commit=ws_info.base_commit,
                        has_changes=False,
                    )
                else:
                    await self._scan_for_secrets(request, workspace, ws_info, on_event)
                    artifact = await git_ops.import_branch(
                        request.repo_path,
                        workspace,
                        branch_name=request.branch_name,
                        task_key=request.task_key,
                        run_id=request.run_id,
                        import_policy=request.import_policy,
                        import_conflict_policy=request.import_conflict_policy,
                        skip_empty_import=request.skip_empty_import,
                    )
            except Exception as exc:  # raised below, outside the task group, unwrapped
                result["error"] = exc
                return
            result["artifact"] = artifact
            self._emit(
                request,
                on_event,
                "runner.import.finished",
                phase="import",
                branch=artifact.branch_final,
                has_changes=artifact.has_changes,
                commit_count=artifact.commit_count,
                duration_s=round(time.monotonic() - t, 4),
            )

        if request.finalize:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._stop_quietly, request, on_event)
                await collect()
        else:
            await collect()
        if "error" in result:
            raise result["error"]
        return result["artifact"]

    async def _probe(
        self, request: InstanceRequest, workspace: Path, on_event: RunnerEventCallback | None = None
    ) -> watchdog.Probe | None:
        """Where the watchdog reads this container's numbers (None when the container cannot be inspected)."""
        if self.host.archive:
            # Another machine's engine: its container's pid, cgroup and /tmp are not
            # on this machine (a pid here would be some other process), and the agent
            # writes a volume there, not the local clone. Only the container's own
            # limits apply.
            self._emit(
                request,
                on_event,
                "runner.watchdog.skipped",
                host=self.host.name,
                reason="remote engine: only the container's limits apply",
            )
            return None
        try:
            info = await self.host.api(
                f"inspect container {request.container_name}", "inspect_container", request.container_name
            )
        except RunnerError:
            return None
        return await anyio.to_thread.run_sync(
            lambda: watchdog.make_probe(
                info,
                workspace=workspace,
                pids_limit=self.hardening.pids_limit,
                max_workspace_mb=self.hardening.max_workspace_mb,
            )
        )

    async def _watch(
        self,
        request: InstanceRequest,
        probe: watchdog.Probe | None,
        tripped: list[str],
        on_event: RunnerEventCallback | None,
    ) -> None:
        """Stop the container when the agent runs away; the exec then ends and the attempt reports why."""
        if probe is None:
            return
        looks = 0
        while True:
            await anyio.sleep(watchdog.WATCH_INTERVAL_S)
            looks += 1
            walk = looks % watchdog.WORKSPACE_EVERY == 0
            reason = await anyio.to_thread.run_sync(functools.partial(watchdog.check, probe, workspace=walk))
            if reason:
                tripped.append(reason)
                self._live_agents.discard(request.container_name)  # killed, not given a grace to save a session
                self._emit(request, on_event, "runner.limit.hit", "error", reason=reason)
                # kill, not a graceful stop: a fork bomb has no session worth saving
                try:
                    await self.host.api(f"kill container {request.container_name}", "kill", request.container_name)
                except RunnerError:
                    await self._stop_quietly(request, on_event)
                return

    async def _scan_for_secrets(
        self, request: InstanceRequest, workspace: Path, ws_info: Any, on_event: RunnerEventCallback | None
    ) -> None:
        """Refuse (or report) a branch whose commits contain a credential, before it reaches the repository."""
        if self.hardening.secret_scan == "off":
            return
        t = time.monotonic()

        def scan() -> list[Any]:
            head = git_cmd.ws_git(workspace, ["rev-parse", "--verify", "HEAD^{commit}"]).stdout.strip()
            return secret_scan.scan_commits(workspace, ws_info.base_commit, head, self.auth.labelled_secrets())

        findings = await anyio.to_thread.run_sync(scan)
        self._emit(
            request,
            on_event,
            "runner.secret_scan.finished",
            phase="import",
            findings=len(findings),
            duration_s=round(time.monotonic() - t, 4),
        )
        if not findings:
            return
        where = "; ".join(f.describe() for f in findings[:10]) + (
            f"; and {len(findings) - 10} more" if len(findings) > 10 else ""
        )
        if self.hardening.secret_scan == "warn":
            self._emit(
                request,
                on_event,
                "runner.secret_scan.warning",
                "warn",
                findings=where,
                detail="imported anyway (runner.secret_scan: warn)",
            )
            return
        raise SecretLeakError(
            f"the agent committed what looks like a credential, so its branch was not imported: "
            f"{where}. The workspace {workspace} is kept for inspection; set "
            f"runner.secret_scan: warn to import such branches anyway"
        )

    async def _archive_copy_in(
        self, request: InstanceRequest, workspace: Path, ready: Any, on_event: RunnerEventCallback | None
    ) -> RunnerError | None:
        """Remote engine: the clone travels into the container's /workspace volume.

        A container that already existed (a resumed task) keeps the workspace its
        volume holds, as a kept bind-mounted workspace would."""
        if ready.action not in ("created", "replaced"):
            return None
        t = time.monotonic()
        try:
            sent = await archive.copy_in(
                self.host, request.container_name, workspace, read_only=workspace_read_only(request)
            )
        except RunnerError as exc:
            return exc
        self._emit(
            request,
            on_event,
            "runner.archive.copied_in",
            phase="workspace",
            host=self.host.name,
            bytes=sent,
            duration_s=round(time.monotonic() - t, 4),
        )
        return None

    async def _archive_bundle_out(
        self, request: InstanceRequest, workspace: Path, ws_info: Any, on_event: RunnerEventCallback | None
    ) -> None:
        """Remote engine: the agent's commits come back as a git bundle into the local clone."""
        t = time.monotonic()
        got = await archive.bundle_out(self.host, request.container_name, workspace, ws_info.base_commit)
        self._emit(
            request,
            on_event,
            "runner.archive.bundle_read",
            phase="import",
            host=self.host.name,
            bytes=got["bytes"],
            head=got["head"],
            duration_s=round(time.monotonic() - t, 4),
        )

    def _volume_name(self, request: InstanceRequest) -> str:
        sgk = request.session_group_key or request.task_key
        if request.session_volume_scope == "global":
            g = ghash(sgk, plugin=request.plugin_name, model=request.model)
        else:
            g = ghash(sgk)
        return session_volume_name(request.run_id, g, scope=request.session_volume_scope)

    async def _execute_with_retries(
        self, request, plugin, workspace, on_event, state, first=None, follow_up: bool = False
    ):
        """Phases 3-4 with retries. Returns (last attempt, accumulated usage, last exec output).

        ``first``: the outcome of the first attempt's container start, made
        alongside the clone (see :meth:`_workspace_and_container`).
        ``follow_up``: another turn in the workspace and session of an execution
        that just finished (the output repair turn), not a fresh start.
        """
        rc = request.retry_config
        total: dict[str, Any] = {"tokens_in": 0, "tokens_out": 0, "cost": None, "session_id": request.session_id}
        previous: dict[str, float] | None = state.get("previous") if follow_up else None
        retries_before = state["retry_attempts"]
        last_exec: ExecOutput | None = None
        max_attempts = max(1, rc.max_attempts)
        session_reset = False
        n = 0
        while True:
            resume = total["session_id"] if plugin.capabilities.supports_resume else None
            attempt = await self._attempt(
                request,
                plugin,
                workspace,
                on_event,
                resume,
                previous,
                n + 1 if follow_up else n,
                first if n == 0 else None,
            )
            o = attempt.output.outcome if attempt.output is not None else None
            if (
                o is not None
                and o.is_error
                and o.error_category == "session_corrupted"
                and resume
                and not session_reset
            ):
                # The tool cannot resume the recorded session: a new session in the
                # same workspace, once, and at once (nothing transient to wait for).
                session_reset = True
                last_exec = attempt.output
                total["session_id"] = None
                previous = None
                self._emit(
                    request,
                    on_event,
                    "runner.session.reset",
                    "warn",
                    reason="session_corrupted",
                    detail=self.sanitizer.scrub_text(str(o.error_message or ""))[:500],
                    previous_session_id=resume,
                )
                n += 1
                continue
            if attempt.output is not None:
                last_exec = attempt.output
                o = attempt.output.outcome
                total["tokens_in"] += o.tokens_in
                total["tokens_out"] += o.tokens_out
                if o.cost_usd is not None:
                    total["cost"] = (total["cost"] or 0.0) + o.cost_usd
                if o.session_id:
                    total["session_id"] = o.session_id
                previous = dict(o.cumulative) or previous
                state["previous"] = previous
                retryable = o.is_error and o.retryable
                reason = o.error_message or o.final_message
            else:
                retryable = bool(attempt.error and attempt.error.retryable)
                reason = str(attempt.error)
            retries_used = n - session_reset  # the fresh-session attempt is not a retry of a failure
            if not retryable or retries_used + 1 >= max_attempts:
                return attempt, total, last_exec
            delay = backoff_delay(retries_used, base=rc.backoff_base_s, factor=rc.backoff_factor, cap=rc.backoff_max_s)
            state["retry_attempts"] = retries_before + retries_used + 1
            self._emit(
                request,
                on_event,
                "runner.retry.scheduled",
                "warn",
                attempt=n + 1,
                delay_s=delay,
                reason=self.sanitizer.scrub_text(str(reason))[:500],
                resume_session_id=total["session_id"],
            )
            await anyio.sleep(delay)
            n += 1

    async def _attempt(self, request, plugin, workspace, on_event, resume, previous, n, first=None) -> _Attempt:
        if first is not None:  # started alongside the clone
            if "error" in first:
                return _Attempt(error=first["error"])
            ready, duration = first["ready"], first["duration_s"]
        else:
            t = time.monotonic()
            try:
                # attempt 0 follows a fresh clone; retries reuse the same workspace and container
                ready = await ensure_container(
                    self.host,
                    request,
                    workspace=workspace,
                    volume=self._volume_name(request),
                    fresh_workspace=n == 0,
                    hardening=self.hardening,
                )
            except RunnerError as exc:
                return _Attempt(error=exc)
            duration = round(time.monotonic() - t, 4)
        if ready.action == "replaced":
            self._emit(
                request,
                on_event,
                "runner.container.replaced",
                "warn",
                container=ready.name,
                reason=ready.reason,
                volume=ready.volume,
            )
        self._emit(
            request,
            on_event,
            "runner.container.ready",
            phase="container",
            action=ready.action,
            container=ready.name,
            volume=ready.volume,
            attempt=n,
            duration_s=duration,
        )

        if "auth" in inspect.signature(plugin.build_command).parameters:
            argv = plugin.build_command(request, resume_session_id=resume, auth=self.auth)
        else:
            argv = plugin.build_command(request, resume_session_id=resume)
        if self.dry_run and request.plugin_name != "command":
            # Dry run: the deterministic simulated agent answers in the same container, at no cost.
            argv = ["orchestrator-sim-agent", "--as", "codex" if argv[0] == "codex" else "claude", *argv[1:]]
        wrapped = _looks_at_uncommitted(request, plugin)
        if wrapped:
            argv = ["sh", "-c", AGENT_WRAPPER_SCRIPT, "orchestrator-agent", *argv]
        env = dict(request.env)
        try:
            env.update(plugin.prepare_environment(self.auth, request))
        except PreflightError:
            if not self.dry_run:
                raise
            # the simulated agent needs no credentials
        self.sanitizer.add_secrets(v for k, v in env.items() if k in SECRET_ENV_VARS)
        stdin_fn = getattr(plugin, "stdin_payload", None)
        payload = stdin_fn(request) if stdin_fn is not None else None
        files_fn = getattr(plugin, "container_files", None)
        for path, content in (files_fn(request) if files_fn is not None else {}).items():
            failure = await self._write_container_file(request.container_name, path, content)
            if failure is not None:
                return _Attempt(error=failure)
        parser = plugin.new_parser(previous=previous)

        def forward(event: AgentEvent) -> None:
            self._emit(request, on_event, f"runner.{event.kind}", "debug", data=_clip(event.data))

        t = time.monotonic()
        self._emit(
            request,
            on_event,
            "runner.exec.started",
            phase="execute",
            attempt=n,
            resume_session_id=resume,
            prompt_via_stdin=payload is not None,
        )
        probe = await self._probe(request, workspace, on_event)
        tripped: list[str] = []
        self._live_agents.add(request.container_name)
        ran: dict[str, Any] = {}
        try:
            with anyio.fail_after(request.timeout_seconds):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watch, request, probe, tripped, on_event)
                    try:
                        ran["output"] = await run_exec(
                            self.host,
                            request.container_name,
                            argv,
                            env=env,
                            parser=parser,
                            stdin_payload=payload,
                            on_event=forward,
                            wrapped=wrapped,
                        )
                    except RunnerError as exc:
                        # Kept inside the group: leaving it would wrap the error in an
                        # ExceptionGroup, and a Docker failure would pass for a bug of ours.
                        ran["error"] = exc
                    finally:
                        tg.cancel_scope.cancel()
            if "error" in ran:
                raise ran["error"]
            output = ran["output"]
        except TimeoutError:
            return _Attempt(
                error=TaskTimeoutError(
                    f"task exceeded its timeout of {request.timeout_seconds:g}s; container stopped and kept for resume"
                )
            )
        except RunnerError as exc:
            self._live_agents.discard(request.container_name)
            if tripped:
                return _Attempt(error=ResourceLimitError(tripped[0]))
            return _Attempt(error=exc)
        self._live_agents.discard(request.container_name)
        # once more at the end: a runaway that finished between two looks still counts
        reason = tripped[0] if tripped else (await anyio.to_thread.run_sync(watchdog.check, probe) if probe else None)
        if reason:
            self._emit(request, on_event, "runner.limit.hit", "error", reason=reason)
            return _Attempt(error=ResourceLimitError(reason))
        self._emit(
            request,
            on_event,
            "runner.exec.finished",
            phase="execute",
            attempt=n,
            exit_code=output.exit_code,
            is_error=output.outcome.is_error,
            session_id=output.outcome.session_id,
            events=output.events,
            duration_s=round(time.monotonic() - t, 4),
        )
        return _Attempt(output=output)

    async def _write_container_file(self, container: str, path: str, content: bytes) -> RunnerError | None:
        """Write ``content`` to ``path`` inside the container (as node, so the tool can read it)."""
        argv = ["/bin/sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path]
        try:
            out = await run_exec(
                self.host,
                container,
                argv,
                env={},
                parser=get_plugin("command").new_parser(),
                stdin_payload=content,
                on_event=lambda event: None,
            )
        except RunnerError as exc:
            return exc
        if out.exit_code != 0:
            detail = out.stderr_tail.decode("utf-8", "replace").strip()[-500:]
            return ContainerError(
                f"could not write {path} in container {container} (exit {out.exit_code}): {detail}", retryable=False
            )
        return None

    async def _structured_output(
        self,
        request: InstanceRequest,
        plugin: RunnerPlugin,
        workspace: Path,
        on_event: RunnerEventCallback | None,
        state: dict[str, Any],
        out: ExecOutput,
        total: dict[str, Any],
    ) -> tuple[ExecOutput, Any] | _Failure:
        """Validate the answer against ``output_schema``; one repair turn in the same session if it fails.

        Returns (the execution whose answer is valid, the parsed answer), or the
        failure to report. ``total`` (usage, session id) is updated in place.
        """
        schema = request.output_schema
        assert schema is not None
        value, violation = structured.checked_answer(schema, out.outcome.structured_output, out.outcome.final_message)
        if violation is None:
            return out, value
        self._emit(request, on_event, "runner.output.invalid", "warn", violation=violation, repair=True)
        repair = msgspec.structs.replace(
            request, prompt=structured.repair_prompt(violation), session_id=total.get("session_id")
        )
        attempt, extra, last = await self._execute_with_retries(
            repair, plugin, workspace, on_event, state, follow_up=True
        )
        total["tokens_in"] += extra["tokens_in"]
        total["tokens_out"] += extra["tokens_out"]
        if extra["cost"] is not None:
            total["cost"] = (total["cost"] or 0.0) + extra["cost"]
        total["session_id"] = extra["session_id"] or total.get("session_id")
        if attempt.error is not None:
            status = "timeout" if attempt.error.category == "timeout" else "failed"
            return _Failure(status, attempt.error.category, str(attempt.error), last.exit_code if last else None, "")
        repaired = attempt.output
        assert repaired is not None
        if repaired.outcome.is_error:
            error_type, message = self._failure(request, plugin, repaired)
            return _Failure("failed", error_type, message, repaired.exit_code, repaired.outcome.final_message)
        value, violation = structured.checked_answer(
            schema, repaired.outcome.structured_output, repaired.outcome.final_message
        )
        if violation is None:
            self._emit(request, on_event, "runner.output.repaired")
            return repaired, value
        return _Failure(
            "failed",
            "output_invalid",
            f"the agent's answer does not match output_schema, even after a repair turn: {violation}",
            repaired.exit_code,
            repaired.outcome.final_message,
        )

    def _failure(self, request: InstanceRequest, plugin: RunnerPlugin, out: ExecOutput) -> tuple[ErrorCategory, str]:
        o: AgentOutcome = out.outcome
        if o.error_category is not None:
            category: ErrorCategory = o.error_category
        elif plugin.name == "command":
            category = "command"
        else:
            category = "api"
        message = o.error_message or o.final_message or ""
        if not message:
            tail = (out.stderr_tail or out.stdout_tail).decode("utf-8", "replace").strip()
            message = f"exit code {out.exit_code}" + (f": {tail[-2000:]}" if tail else "")
        if out.saw_erofs and workspace_read_only(request):
            message = f"{READ_ONLY_NOTE}. Agent error: {message}"
        if out.exit_code == 137:
            # SIGKILL from inside the container is nearly always the kernel's OOM killer
            message = (
                f"{message} (killed by SIGKILL: most likely out of memory under the container limit of "
                f"{request.container_limits.memory}; raise runner.container_memory)"
            )
        return category, self.sanitizer.scrub_text(message)

    def _metrics(self, request: InstanceRequest, total: dict[str, Any], duration: float) -> Metrics:
        cost = total["cost"]
        if cost is None and (total["tokens_in"] or total["tokens_out"]) and request.model in self.pricing:
            per_in, per_out = self.pricing[request.model]
            cost = round(total["tokens_in"] / 1000 * per_in + total["tokens_out"] / 1000 * per_out, 6)
        return Metrics(
            tokens_in=total["tokens_in"], tokens_out=total["tokens_out"], cost_usd=cost, duration_s=round(duration, 3)
        )

    async def _remove_workspace(self, workspace: Path) -> None:
        await anyio.to_thread.run_sync(git_ops.remove_workspace, workspace, limiter=self.host.limiter)

    async def _end_agent(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> None:
        """SIGTERM a still-running agent and wait up to the grace for it to exit."""
        t = time.monotonic()
        try:
            with anyio.move_on_after(AGENT_STOP_GRACE_S + 3):
                code, _ = await self.host.exec_simple(
                    request.container_name, ["sh", "-c", END_AGENT_SCRIPT, "end-agent", str(AGENT_STOP_GRACE_S * 10)]
                )
                self._emit(
                    request,
                    on_event,
                    "runner.agent.stopped",
                    phase="stop",
                    exited=code == 0,
                    duration_s=round(time.monotonic() - t, 4),
                )
        except RunnerError as exc:  # the container is gone or stopping: the stop below still runs
            self._emit(request, on_event, "runner.agent.stop_failed", "warn", error=str(exc))

    async def _stop_quietly(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> None:
        if request.container_name in self._live_agents:
            self._live_agents.discard(request.container_name)
            await self._end_agent(request, on_event)
        t = time.monotonic()
        try:
            await self.host.stop(request.container_name, timeout=STOP_TIMEOUT_S)
        except RunnerError as exc:
            self._emit(request, on_event, "runner.container.stop_failed", "warn", error=str(exc))
            return
        self._emit(
            request,
            on_event,
            "runner.container.stopped",
            phase="stop",
            container=request.container_name,
            duration_s=round(time.monotonic() - t, 4),
        )


def _looks_at_uncommitted(request: InstanceRequest, plugin: RunnerPlugin) -> bool:
    """Whether what the agent leaves uncommitted is counted (and, per policy, committed) after it exits."""
    return request.import_policy != "never" and plugin.name != "command"


def _auth_from_env() -> AuthConfig:
    return AuthConfig(
        oauth_token=os.environ.get("CLAUDE_CODE_OAUTH_TOKEN"),
        api_key=os.environ.get("ANTHROPIC_API_KEY"),
        base_url=os.environ.get("ANTHROPIC_BASE_URL"),
        openai_api_key=os.environ.get("OPENAI_API_KEY"),
        openai_base_url=os.environ.get("OPENAI_BASE_URL"),
    )


async def run_instance(
    prompt: str,
    repo_path: str | Path,
    *,
    event_callback: RunnerEventCallback | None = None,
    auth_config: AuthConfig | None = None,
    logs_dir: Path | str | None = None,
    runner: DockerRunner | None = None,
    **fields: Any,
) -> RunnerResult:
    """Run one task without the orchestration layer: ``await run_instance("fix bug", repo)``.

    ``fields`` are :class:`InstanceRequest` fields. Orchestration passes all
    names; for ad-hoc use the missing ones are derived from ``run_id`` (default
    ``adhoc_<UTC time>``) and ``task_key`` (default ``"task"``). A ``session_id``
    resumes a previous agent session. Credentials default to the usual
    environment variables. ``runner`` lets many calls share one client.
    """
    from .. import naming

    run_id = fields.pop("run_id", None) or "adhoc_" + time.strftime("%Y%m%d_%H%M%S", time.gmtime())
    task_key = fields.pop("task_key", None) or "task"
    sid = fields.pop("strategy_execution_id", None) or "adhoc"
    sidx = fields.pop("strategy_index", 1)
    fields.setdefault("instance_id", naming.instance_id(run_id, sid, task_key))
    fields.setdefault("container_name", naming.container_name(run_id, sidx, task_key))
    fields.setdefault("branch_name", naming.branch_name("adhoc", run_id, task_key))
    request = InstanceRequest(
        prompt=prompt,
        repo_path=str(repo_path),
        run_id=run_id,
        task_key=task_key,
        strategy_execution_id=sid,
        strategy_index=sidx,
        **fields,
    )
    if runner is not None:
        return await runner.run(request, on_event=event_callback)
    async with DockerRunner(auth=auth_config or _auth_from_env(), logs_dir=logs_dir) as own:
        return await own.run(request, on_event=event_callback)


__all__ = ["DockerRunner", "backoff_delay", "run_instance"]
