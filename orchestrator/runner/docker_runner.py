"""The Docker runner: one task through its phases (docs/architecture.md); outcomes: docs/events.md.

Everything written, returned or raised passes through the sanitizer, which knows the
exact credential values. Cancellation (Ctrl+C) is never a result: the agent gets its
grace to exit, the container is stopped in a shielded scope, the workspace kept (for
``resume_workspace``), and the cancellation re-raised.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ..errors import ConfigError, ContainerError, GitError, RunnerError, UsageError
from ..jsonlog import ComponentLog, utc_now_iso
from ..sanitize import Sanitizer, default_sanitizer
from . import git_ops, structured
from .base import RunnerEventCallback
from .docker_agent import AgentExec, Attempt
from .docker_collect import Collector
from .docker_containers import DockerHost, OncePerKey, workspace_read_only
from .docker_core import (
    AGENT_STOP_GRACE_S,
    ContainerStopper,
    TaskEvents,
    TaskFailed,
)
from .docker_exec import ExecOutput
from .docker_workspace import WorkspaceSetup
from .git_cleanup import delete_run_branches
from .git_cmd import in_thread, run_git
from .object_cache import ObjectCache, ObjectCacheSettings
from .plugin import AgentOutcome, RunnerPlugin
from .reaper import WorkspaceReaper
from .registry import check_model, get_plugin
from .seed import SeedCache
from .types import (
    AuthConfig,
    BranchArtifact,
    ErrorCategory,
    Hardening,
    InstanceRequest,
    Metrics,
    RunnerResult,
    Status,
)

IMAGE_HINT = "build it with scripts/setup-docker.sh or `docker build -t claude-code .`"
READ_ONLY_NOTE = (
    "/workspace is mounted read-only for review tasks (import_policy=never, "
    "review_workspace_mode=ro); the agent tried to write to it. Write to /tmp or /home/node instead"
)

Pricing = Mapping[str, tuple[float, float]]


def backoff_delay(attempt: int, *, base: float, factor: float, cap: float) -> float:
    """Delay before retry number ``attempt`` (0-based): base*factor^attempt, capped."""
    return min(base * (factor**attempt), cap)


@dataclass
class _Task:
    """One task on its way through the pipeline: what the failure exit and Ctrl+C need to know."""

    request: InstanceRequest
    on_event: RunnerEventCallback | None
    started_at: str
    t0: float
    workspace: Path | None = None
    # Once set, a failure or Ctrl+C stops the task's container.
    container_known: bool = False
    retry_attempts: int = 0
    # the previous attempt's cumulative usage (for a follow-up turn)
    previous: dict[str, float] | None = None
    metrics: Metrics | None = None  # set once the agent has run
    session_id: str | None = None


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
        object_cache: ObjectCacheSettings | None = None,
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
        self._images = OncePerKey(dict.fromkeys(known_images, True))
        self.seeds = SeedCache(git_ops.workspace_root() / ".seeds")
        # The phases share one emitter and one stopper (which knows the agents that may still run).
        self.emit_event = TaskEvents(self.log, self.sanitizer)
        self.stopper = ContainerStopper(self.host, self.emit_event)
        self.reaper = WorkspaceReaper()
        self.workspace = WorkspaceSetup(
            self.host, self.hardening, self.seeds, self.emit_event, ObjectCache(object_cache), self.reaper
        )
        self.agent = AgentExec(
            self.host,
            self.hardening,
            self.auth,
            self.sanitizer,
            self.emit_event,
            self.stopper,
            self.workspace,
            dry_run=dry_run,
        )
        self.collector = Collector(self.host, self.hardening, self.auth, self.emit_event, self.stopper)

    def stop_log_forwarding(self) -> None:
        """Stop copying the git layer's log lines into this runner's runner.jsonl (another runner does it)."""
        logging.getLogger("orchestrator.runner").removeHandler(self._forward)

    async def aclose(self) -> None:
        try:
            await self.reaper.aclose()
        finally:
            for workspace, why in self.reaper.failures:
                self.log.warning("runner.workspace.not_removed", workspace=str(workspace), error=why)
            self.reaper.failures.clear()
            self.stop_log_forwarding()
            await self.host.aclose()
            self.log.close()

    async def discard_workspace(self, request: InstanceRequest) -> None:
        """Remove the workspace a ``keep_workspace_on_success`` task left, once its result is recorded."""
        workspace = git_ops.workspace_path(request.run_id, request.task_key)
        await self.reaper.discard(workspace, reuse_for=self._reusable(request, workspace))

    async def __aenter__(self) -> DockerRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- the pipeline ---------------------------------------------------------

    async def run(self, request: InstanceRequest, *, on_event: RunnerEventCallback | None = None) -> RunnerResult:
        task = _Task(request, on_event, utc_now_iso(), time.monotonic())
        plugin = None if request.delete_branches else self._validate_request(request)
        try:
            try:
                if plugin is None:
                    return await self._delete_branches(task)
                return await self._pipeline(task, plugin)
            except TaskFailed as failure:
                return await self._failed(task, failure)
        except Exception as exc:
            # A bug or a plugin error (ConfigError) after the container started:
            # do not leave it running, then let the error through.
            if task.container_known:
                with anyio.CancelScope(shield=True), anyio.move_on_after(AGENT_STOP_GRACE_S + 15):
                    await self.stopper.stop_quietly(task.request, on_event)
            self.emit_event(
                task.request, on_event, "runner.instance.error", "error", error=f"{type(exc).__name__}: {exc}"
            )
            raise
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if task.container_known:
                    with anyio.move_on_after(AGENT_STOP_GRACE_S + 15):
                        await self._stop_interrupted(task.request, on_event)
                self.emit_event(
                    task.request,
                    on_event,
                    "runner.instance.interrupted",
                    "warn",
                    workspace_path=str(task.workspace) if task.workspace else None,
                )
            raise

    async def _stop_interrupted(self, request: InstanceRequest, on_event: RunnerEventCallback | None) -> None:
        """Ctrl+C: the container is stopped (kept, with its workspace, for ``--resume``).

        A hook: the Kubernetes runner ends the agent and keeps its Pod running instead.
        """
        await self.stopper.stop_quietly(request, on_event)

    async def _pipeline(self, task: _Task, plugin: RunnerPlugin) -> RunnerResult:
        """validate -> workspace + container -> execute -> output -> collect -> cleanup."""
        request, on_event = task.request, task.on_event
        # 1. validate
        try:
            await self._check_image(request.docker_image)
        except RunnerError as exc:
            raise TaskFailed("validate", exc.category, str(exc), stop=False) from None

        # 2. workspace, while the container starts (3)
        workspace = task.workspace = git_ops.workspace_path(request.run_id, request.task_key)
        task.container_known = True  # from here on a failure or Ctrl+C stops the container
        request, first = await self.workspace.prepare(request, workspace, on_event)
        if "ready" in first:
            request = await self.agent.recover_session(request, plugin, on_event)
        task.request = request
        ws_info = first.pop("ws_info")

        # 3 + 4. container and execution, with retries
        out, output, total = await self._execute(task, plugin, first)
        if out.saw_erofs and workspace_read_only(request):
            # The agent's write failed fast (EROFS) and it carried on; say why.
            self.emit_event(request, on_event, "runner.workspace.read_only_write", "warn", detail=READ_ONLY_NOTE)

        # 5a. what the agent left uncommitted: commit it (default) or count what is discarded
        leftover = await self.agent.uncommitted(request, plugin, on_event, out.uncommitted)

        # 5. collect: import the branch (per policy), the finalize stop alongside
        try:
            artifact = await self.collector.collect(request, workspace, ws_info, on_event)
        except RunnerError as exc:
            raise TaskFailed(
                "import",
                exc.category,
                str(exc),
                stop=not request.finalize,  # the finalize stop has run already
                exit_code=out.exit_code,
                final_message=out.outcome.final_message,
                reported=("error_type",),
            ) from None
        if leftover is not None:
            artifact = msgspec.structs.replace(artifact, uncommitted_files=leftover[0], auto_committed=leftover[1])
        return await self._completed(task, workspace, artifact, out, output, total)

    async def _execute(
        self, task: _Task, plugin: RunnerPlugin, first: dict[str, Any]
    ) -> tuple[ExecOutput, Any, dict[str, Any]]:
        """The agent's run that succeeded (retried as needed), its structured output, and what it all used."""
        request = task.request
        attempt, total, last_exec = await self._execute_with_retries(task, request, plugin, first)
        self._account(task, total)
        if attempt.error is not None:
            raise TaskFailed.of_error(
                "execute",
                attempt.error,
                last_exec.exit_code if last_exec else None,
                reported=("error_type", "status"),
            )
        out = attempt.output
        assert out is not None
        if out.outcome.is_error or (out.exit_code not in (0, None) and plugin.capabilities.exit_code_is_verdict):
            raise self._failure("execute", request, plugin, out, ("error_type", "exit_code"))
        output = None
        if request.output_schema is not None:
            try:
                out, output = await self._structured_output(task, plugin, out, total)
            finally:
                self._account(task, total)  # the repair turn's usage counts, whatever its verdict
        return out, output, total

    async def _completed(
        self,
        task: _Task,
        workspace: Path,
        artifact: BranchArtifact,
        out: ExecOutput,
        output: Any,
        total: dict[str, Any],
    ) -> RunnerResult:
        """6. cleanup: completion event first (it carries the workspace path), then delete."""
        request, on_event = task.request, task.on_event
        metrics = self._metrics(request, total, time.monotonic() - task.t0)
        self.emit_event(
            request,
            on_event,
            "runner.instance.completed",
            workspace_path=str(workspace),
            branch_imported=artifact.branch_final,
            duration_s=metrics.duration_s,
            retry_attempts=task.retry_attempts,
            uncommitted_files=artifact.uncommitted_files,
            auto_committed=artifact.auto_committed,
        )
        if not request.keep_workspace_on_success:
            await self.reaper.discard(workspace, reuse_for=self._reusable(request, workspace))
        return self._result(
            task,
            "success",
            artifact=artifact,
            exit_code=out.exit_code,
            final_message=self.sanitizer.scrub_text(out.outcome.final_message),
            metrics=metrics,
            session_id=task.session_id,
            workspace_path=str(workspace) if request.keep_workspace_on_success else None,
            output=self.sanitizer.scrub(output),
        )  # like final_message: no secret leaves

    def _reusable(self, request: InstanceRequest, workspace: Path) -> Path | None:
        """The run's object store when this finished checkout may serve a later task (workspace_reuse.py):
        only a local ``shared_objects`` checkout whose container was stopped, so no agent writes into it."""
        if request.isolation_mode != "shared_objects" or self.host.archive or not request.finalize:
            return None
        if request.container_name not in self.stopper.stopped:
            return None
        self.stopper.stopped.discard(request.container_name)
        return git_ops.object_store_path(workspace, request.repo_path)

    async def _failed(self, task: _Task, failure: TaskFailed) -> RunnerResult:
        """The one failure exit: stop the container, say so in runner.instance.failed, build the result."""
        if failure.stop:
            await self.stopper.stop_quietly(task.request, task.on_event)
        self.emit_event(task.request, task.on_event, "runner.instance.failed", "error", **failure.event_fields())
        found: dict[str, Any] = {}
        if task.workspace is not None:
            found["workspace_path"] = str(task.workspace)
        if task.metrics is not None:  # the agent ran
            found.update(metrics=task.metrics, session_id=task.session_id)
        if failure.exit_code is not None:
            found["exit_code"] = failure.exit_code
        if failure.final_message is not None:
            found["final_message"] = self.sanitizer.scrub_text(failure.final_message)
        return self._result(task, failure.status, error_type=failure.error_type, error=failure.message, **found)

    def _result(self, task: _Task, status: Status, **fields: Any) -> RunnerResult:
        error = fields.pop("error", None)
        return RunnerResult(
            status=status,
            instance_id=task.request.instance_id,
            started_at=task.started_at,
            completed_at=utc_now_iso(),
            container_name=task.request.container_name,
            log_path=str(self.log_path) if self.log_path else None,
            error=self.sanitizer.scrub_text(error) if error else None,
            retry_attempts=task.retry_attempts,
            **fields,
        )

    def _account(self, task: _Task, total: dict[str, Any]) -> None:
        """The usage so far, as a failure after this point reports it."""
        task.metrics = self._metrics(task.request, total, time.monotonic() - task.t0)
        task.session_id = total.get("session_id")

    # ---- phases -----------------------------------------------------------------

    async def _delete_branches(self, task: _Task) -> RunnerResult:
        """A housekeeping request: no container, only the host repository's refs (see git_cleanup)."""
        request, on_event, started_at = task.request, task.on_event, task.started_at
        try:
            outcome = await delete_run_branches(request.repo_path, request.delete_branches, run_id=request.run_id)
        except (GitError, UsageError) as exc:
            raise TaskFailed("delete_branches", "git", str(exc), stop=False) from None
        self.emit_event(request, on_event, "runner.branches.deleted", outcome=outcome)
        message = "".join(f"@@branch {state}: {name}\n" for name, state in outcome.items())
        # A successful task always has an artifact: this one made no branch, and
        # its commit is the base's, as for any task that changed nothing.
        base = await in_thread(run_git)(
            ["rev-parse", "--verify", "-q", f"{request.base_branch}^{{commit}}"],
            cwd=Path(request.repo_path),
            check=False,
        )
        artifact = BranchArtifact(
            branch_planned=request.branch_name,
            branch_final=None,
            base=request.base_branch,
            commit=base.stdout.strip(),
            has_changes=False,
        )
        return RunnerResult(
            status="success",
            instance_id=request.instance_id,
            artifact=artifact,
            final_message=message,
            started_at=started_at,
            completed_at=utc_now_iso(),
            exit_code=0,
        )

    def _validate_request(self, request: InstanceRequest) -> RunnerPlugin:
        plugin = request.plugin or get_plugin(request.plugin_name)
        # the same check, and the same message, as when the task was scheduled
        check_model(plugin.name, request.model)
        if plugin.capabilities.runs_command and not request.command:
            raise ConfigError(f"the {plugin.name} plugin needs request.command")
        if request.output_schema is not None:
            if not plugin.capabilities.supports_output_schema:
                raise ConfigError(
                    f"plugin {plugin.name!r} cannot enforce output_schema; drop output_schema from the task"
                )
            structured.check_schema(request.output_schema)
        return plugin

    async def _check_image(self, image: str) -> None:
        async def exists() -> bool:
            if not await self.host.image_exists(image):
                raise ContainerError(f"image {image} not found; {IMAGE_HINT}")  # asked again by the next task
            return True

        await self._images.get(image, exists)

    async def _execute_with_retries(
        self,
        task: _Task,
        request: InstanceRequest,
        plugin: RunnerPlugin,
        first: dict[str, Any] | None = None,
        follow_up: bool = False,
    ) -> tuple[Attempt, dict[str, Any], ExecOutput | None]:
        """Phases 3-4 with retries: (last attempt, accumulated usage, last exec output).

        ``first``: the first attempt's container, started alongside the clone.
        ``follow_up``: the output repair turn, in the session of the execution that just finished.
        """
        on_event, workspace = task.on_event, task.workspace
        assert workspace is not None
        total: dict[str, Any] = {"tokens_in": 0, "tokens_out": 0, "cost": None, "session_id": request.session_id}
        previous = task.previous if follow_up else None
        retries_before = task.retry_attempts
        last_exec: ExecOutput | None = None
        max_attempts = max(1, request.retry_config.max_attempts)
        session_reset = False
        n = 0
        while True:
            resume = total["session_id"] if plugin.capabilities.supports_resume else None
            attempt = await self.agent.attempt(
                request,
                plugin,
                workspace,
                on_event,
                resume,
                previous,
                n + 1 if follow_up else n,
                first if n == 0 else None,
            )
            if resume and not session_reset and self._session_corrupted(request, on_event, attempt, resume):
                # The tool cannot resume the recorded session: a new session in the
                # same workspace, once, and at once (nothing transient to wait for).
                session_reset = True
                last_exec = attempt.output
                total["session_id"] = None
                previous = None
                n += 1
                continue
            if attempt.output is not None:
                last_exec = attempt.output
                previous = task.previous = dict(attempt.output.outcome.cumulative) or previous
            retryable, reason = _tally(attempt, total)
            retries_used = n - session_reset  # the fresh-session attempt is not a retry of a failure
            if not retryable or retries_used + 1 >= max_attempts:
                return attempt, total, last_exec
            task.retry_attempts = retries_before + retries_used + 1
            await self._back_off(request, on_event, n + 1, retries_used, reason, total["session_id"])
            n += 1

    async def _back_off(
        self,
        request: InstanceRequest,
        on_event: RunnerEventCallback | None,
        attempt: int,
        retries_used: int,
        reason: str,
        session_id: str | None,
    ) -> None:
        """The wait before retry ``attempt``, announced."""
        rc = request.retry_config
        delay = backoff_delay(retries_used, base=rc.backoff_base_s, factor=rc.backoff_factor, cap=rc.backoff_max_s)
        self.emit_event(
            request,
            on_event,
            "runner.retry.scheduled",
            "warn",
            attempt=attempt,
            delay_s=delay,
            reason=self.sanitizer.scrub_text(str(reason))[:500],
            resume_session_id=session_id,
        )
        await anyio.sleep(delay)

    def _session_corrupted(
        self, request: InstanceRequest, on_event: RunnerEventCallback | None, attempt: Attempt, resume: str
    ) -> bool:
        """Whether the attempt failed because its tool cannot resume ``resume`` (announced when so)."""
        o = attempt.output.outcome if attempt.output is not None else None
        if o is None or not o.is_error or o.error_category != "session_corrupted":
            return False
        self.emit_event(
            request,
            on_event,
            "runner.session.reset",
            "warn",
            reason="session_corrupted",
            detail=self.sanitizer.scrub_text(str(o.error_message or ""))[:500],
            previous_session_id=resume,
        )
        return True

    async def _structured_output(
        self, task: _Task, plugin: RunnerPlugin, out: ExecOutput, total: dict[str, Any]
    ) -> tuple[ExecOutput, Any]:
        """(the execution whose answer is valid, the answer): one repair turn in the same session
        if the first answer does not match ``output_schema``. ``total`` is updated in place."""
        request, on_event = task.request, task.on_event
        schema = request.output_schema
        assert schema is not None
        value, violation = structured.checked_answer(schema, out.outcome.structured_output, out.outcome.final_message)
        if violation is None:
            return out, value
        self.emit_event(request, on_event, "runner.output.invalid", "warn", violation=violation, repair=True)
        repair = msgspec.structs.replace(
            request, prompt=structured.repair_prompt(violation), session_id=total.get("session_id")
        )
        attempt, extra, last = await self._execute_with_retries(task, repair, plugin, follow_up=True)
        _add_usage(total, extra["tokens_in"], extra["tokens_out"], extra["cost"])
        total["session_id"] = extra["session_id"] or total.get("session_id")
        reported = ("error_type", "exit_code")
        if attempt.error is not None:
            raise TaskFailed.of_error(
                "output", attempt.error, last.exit_code if last else None, final_message="", reported=reported
            )
        repaired = attempt.output
        assert repaired is not None
        if repaired.outcome.is_error:
            raise self._failure("output", request, plugin, repaired, reported)
        value, violation = structured.checked_answer(
            schema, repaired.outcome.structured_output, repaired.outcome.final_message
        )
        if violation is None:
            self.emit_event(request, on_event, "runner.output.repaired")
            return repaired, value
        raise TaskFailed(
            "output",
            "output_invalid",
            f"the agent's answer does not match output_schema, even after a repair turn: {violation}",
            exit_code=repaired.exit_code,
            final_message=repaired.outcome.final_message,
            reported=reported,
        )

    def _failure(
        self, phase: str, request: InstanceRequest, plugin: RunnerPlugin, out: ExecOutput, reported: tuple[str, ...]
    ) -> TaskFailed:
        """The failure of a run whose agent said it failed (or whose command's exit code is its verdict)."""
        o: AgentOutcome = out.outcome
        if o.error_category is not None:
            category: ErrorCategory = o.error_category
        elif plugin.capabilities.exit_code_is_verdict:
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
        return TaskFailed(
            phase,
            category,
            self.sanitizer.scrub_text(message),
            exit_code=out.exit_code,
            final_message=o.final_message,
            reported=reported,
        )

    def _metrics(self, request: InstanceRequest, total: dict[str, Any], duration: float) -> Metrics:
        cost = total["cost"]
        if cost is None and (total["tokens_in"] or total["tokens_out"]) and request.model in self.pricing:
            per_in, per_out = self.pricing[request.model]
            cost = round(total["tokens_in"] / 1000 * per_in + total["tokens_out"] / 1000 * per_out, 6)
        return Metrics(
            tokens_in=total["tokens_in"], tokens_out=total["tokens_out"], cost_usd=cost, duration_s=round(duration, 3)
        )


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


def _add_usage(total: dict[str, Any], tokens_in: int, tokens_out: int, cost: float | None) -> None:
    total["tokens_in"] += tokens_in
    total["tokens_out"] += tokens_out
    if cost is not None:
        total["cost"] = (total["cost"] or 0.0) + cost


def _tally(attempt: Attempt, total: dict[str, Any]) -> tuple[bool, str]:
    """Add the attempt's usage and session to ``total``; whether it may be retried, and why it failed."""
    if attempt.output is None:
        if attempt.session_id:  # the agent's stream was lost after it announced its session
            total["session_id"] = attempt.session_id
        return bool(attempt.error and attempt.error.retryable), str(attempt.error)
    o = attempt.output.outcome
    _add_usage(total, o.tokens_in, o.tokens_out, o.cost_usd)
    if o.session_id:
        total["session_id"] = o.session_id
    return o.is_error and o.retryable, o.error_message or o.final_message
