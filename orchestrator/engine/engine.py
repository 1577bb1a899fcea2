"""The durable engine: schedules tasks, records every step, replays on resume.

Resume is the same code path as a first run (docs/architecture.md, "Durability").
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import traceback
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import msgspec
import orjson

from ..errors import (
    BaseEvaluationFailed,
    BudgetExhausted,
    BudgetReached,
    ConfigError,
    KeyConflictDifferentFingerprint,
    RunnerError,
    StrategyError,
)
from ..jsonlog import ComponentLog
from ..log import events as E
from ..log.eventlog import EventLog
from ..log.events import decode_line
from ..log.state import COMPLETED, FAILED, RunState, apply, encode_snapshot, recover, write_snapshot_bytes
from ..naming import branch_name, container_name, instance_id, short8
from ..runner import check_model
from ..runner.base import TaskRunner
from ..runner.plugin import RunnerPlugin
from ..runner.registry import get_plugin
from ..runner.types import ContainerLimits, InstanceRequest, RunnerResult
from .budget import Budget, BudgetCap, is_agent_task
from .context import Handle, StrategyContext
from .fingerprint import TaskDefaults, fingerprint, normalize_task
from .task_types import RetryPolicy, RetryPolicyDict

StrategyFn = Callable[..., Awaitable[Any]]


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    repo_path: str
    base_branch: str = "main"
    strategy_name: str = "simple"
    logs_dir: str = "logs"
    state_dir: str = "orchestrator_state"
    results_dir: str = "results"
    max_parallel: int = 0  # 0: auto = max(2, min(20, floor(cpus / container_cpu)))
    defaults: TaskDefaults = TaskDefaults()
    flush_policy: str = "interval"
    flush_interval_ms: int = 50
    flush_max_batch: int = 256
    max_final_message_bytes: int = 65536
    snapshot_interval_s: float = 30.0
    resume_fresh: bool = False
    supports_resume: bool = True
    # False for a run recorded before strategies asked for structured answers:
    # ctx.supports_output_schema() then says no, so its tasks keep their inputs.
    structured_outputs: bool = True
    # The run-wide spending cap (None: none), and the per-token prices its live count uses.
    budget: BudgetCap | None = None
    budget_rates: dict[str, tuple[float, float]] = msgspec.field(default_factory=dict)
    # Passed through to every InstanceRequest (docker_image, finalize, retry_config, ...).
    runner_options: dict[str, Any] = msgspec.field(default_factory=dict)


def auto_parallel(container_cpu: float) -> int:
    cpus = os.cpu_count() or 2
    return max(2, min(20, math.floor(cpus / max(container_cpu, 0.001))))


class RunPaths:
    def __init__(self, config: EngineConfig) -> None:
        rid = config.run_id
        self.log_dir = Path(config.logs_dir) / rid
        self.events = self.log_dir / "events.jsonl"
        self.state_primary = Path(config.state_dir) / rid / "state.json"
        self.state_duplicate = self.log_dir / "state.json"
        self.results = Path(config.results_dir) / rid
        self.final_messages = self.log_dir / "final_messages"
        self.snapshots = [self.state_primary, self.state_duplicate]


class Engine:
    def __init__(self, config: EngineConfig, runner: TaskRunner, *, log: ComponentLog | None = None) -> None:
        self.config = config
        self.runner = runner
        self.paths = RunPaths(config)
        self.olog = log or ComponentLog(None, "orchestration", config.run_id)
        self.state = RunState(run_id=config.run_id)
        self.max_parallel = config.max_parallel or auto_parallel(config.defaults.container_cpus)
        self._limiter = anyio.CapacityLimiter(self.max_parallel)
        self._handles: dict[str, Handle] = {}
        self._live_sessions: dict[str, str] = {}
        # a typo in a task's model: one clear message when it is first scheduled, not a container error later
        self._check_model = functools.cache(check_model)
        self._tg: anyio.abc.TaskGroup | None = None
        self._log: EventLog | None = None
        self._reader: BinaryIO | None = None
        self._snapshot_wanted = anyio.Event()
        # Run-level events (hosts.status) told before the log is open wait here.
        self._pending_run_events: list[tuple[str, E.EventPayload]] = []
        self.queued = 0
        self.runner_calls = 0
        self.resumed = False
        self.listeners: list[Callable[[str, str, str | None, E.EventPayload, int, str], None]] = []
        self.on_divergence: Callable[[str, list[str]], None] | None = None
        self.budget: Budget | None = None

    # ------------------------------------------------------------ event plumbing
    def emit(self, etype: str, sid: str, payload: E.EventPayload, key: str | None = None) -> E.EventPayload:
        """Write one event and fold it; returns the payload as written (secrets scrubbed), as a replay reads it."""
        assert self._log is not None, "engine is not running"
        assert E.type_of(payload) == etype, f"a {type(payload).__name__} is not a {etype} event's payload"
        offset, ts, written = self._log.write(payload, strategy_execution_id=sid, key=key)
        apply(self.state, etype, sid, key, written, offset, ts)
        for cb in self.listeners:
            cb(etype, sid, key, written, offset, ts)
        if etype in E.TERMINAL_TASK_TYPES or etype == E.STRATEGY_COMPLETED:
            self._snapshot_wanted.set()
        return written

    def note_run_event(self, etype: str, payload: E.EventPayload) -> None:
        """A run-level event (no strategy, no key): written now, or as soon as the run's log opens."""
        if self._log is None:
            self._pending_run_events.append((etype, payload))
            return
        self.emit(etype, "", payload)
        self._snapshot_wanted.set()  # a reader of state.json alone sees it soon too

    async def snapshot(self) -> None:
        """Write state.json (primary + duplicate) for events that are durable."""
        data = encode_snapshot(self.state)  # no await before this: a consistent fold
        assert self._log is not None, "engine is not running"
        await self._log.flush()  # the snapshot never points past the durable log
        await anyio.to_thread.run_sync(write_snapshot_bytes, data, self.paths.snapshots)

    async def _snapshotter(self) -> None:
        while True:
            with anyio.move_on_after(self.config.snapshot_interval_s):
                await self._snapshot_wanted.wait()
                await anyio.sleep(0.2)  # let a batch of terminal transitions land together
            self._snapshot_wanted = anyio.Event()
            try:
                await self.snapshot()
            except OSError as exc:
                self.olog.error(f"snapshot failed: {exc}")

    # ------------------------------------------------------------ scheduling
    def _recorded_result(self, key: str) -> dict[str, Any]:
        task = self.state.tasks[key]
        assert task.result_offset is not None
        # one handle for the whole re-entry: a resume may read back thousands of results,
        # each one line the log already wrote (page cache, not a blocking disk wait)
        if self._reader is None:
            self._reader = open(self.paths.events, "rb")  # noqa: SIM115 - closed when run() ends
        return result_at(self._reader, task.result_offset)

    def schedule(
        self,
        ctx: StrategyContext,
        key: str,
        task: Mapping[str, Any],
        policy: RetryPolicy | RetryPolicyDict | None,
        *,
        refuse: str | None = None,
    ) -> Handle[Any]:
        normalized = normalize_task(task, self.config.defaults, default_base_branch=ctx.base_branch)
        # The task's plugin is resolved here, once, and travels with the request to the runner.
        plugin = get_plugin(normalized["plugin_name"])
        if normalized["runner"].get("max_turns") is not None and not plugin.capabilities.supports_max_turns:
            # Refused before anything runs: ignoring it would run an agent the strategy did not ask for.
            raise ConfigError(
                f"plugin {plugin.name} has no turn limit: remove max_turns from the task (or runner.max_turns "
                "from the configuration), or use a plugin that has one"
            )
        self._check_model(normalized["plugin_name"], normalized["model"])
        fp = fingerprint(normalized)
        recorded = self.state.tasks.get(key)
        if recorded is not None and recorded.fingerprint and recorded.fingerprint != fp:
            raise KeyConflictDifferentFingerprint(key, recorded.fingerprint, fp)
        handle = self._handles.get(key)
        if handle is not None:
            return handle
        finished = recorded is not None and recorded.state in (COMPLETED, FAILED)
        if not finished and refuse is not None:
            # The strategy's own budget (ctx.open_budget) is spent: only what the run recorded is answered.
            raise BudgetExhausted(refuse)
        if not finished and self._budget_refuses(ctx.strategy_execution_id, plugin):
            assert self.budget is not None
            raise BudgetReached(key, self.budget.message())
        handle = self._handles[key] = Handle(key=key)
        if recorded is not None and recorded.state == COMPLETED:
            handle._resolve(self._recorded_result(key))
            return handle
        if recorded is not None and recorded.state == FAILED:
            handle._fail(recorded.error_type or "unknown", recorded.message or "")
            return handle
        request = self._request(ctx, key, normalized, plugin)
        if recorded is None:
            self.emit(
                E.TASK_SCHEDULED,
                request.strategy_execution_id,
                E.TaskScheduled(
                    key=key,
                    instance_id=request.instance_id,
                    container_name=request.container_name,
                    model=request.model,
                    task_fingerprint_hash=fp,
                    branch_name=request.branch_name,
                    session_group_key=request.session_group_key,
                    plugin=request.plugin_name,
                    runs_command=plugin.capabilities.runs_command,
                    input=normalized,
                ),
                key=key,
            )
        assert self._tg is not None
        self.queued += 1
        self._tg.start_soon(self._execute, handle, request, plugin, RetryPolicy.coerce(policy))
        return handle

    def _budget_refuses(self, sid: str, plugin: RunnerPlugin) -> bool:
        """The spending-cap hook: True when the cap is reached and a task of ``plugin`` would start an agent."""
        if self.budget is None or not self.budget.reached or not is_agent_task(plugin):
            return False
        self.budget.refused.add(sid)
        return True

    def _request(self, ctx: StrategyContext, key: str, norm: dict[str, Any], plugin: RunnerPlugin) -> InstanceRequest:
        """The task's request; each attempt starts from it (:meth:`_resuming`)."""
        runner_cfg = norm["runner"]
        return InstanceRequest(
            prompt=norm["prompt"],
            repo_path=self.config.repo_path,
            base_branch=norm["base_branch"],
            branch_name=branch_name(self.config.strategy_name, self.config.run_id, key),
            run_id=self.config.run_id,
            strategy_execution_id=ctx.strategy_execution_id,
            strategy_index=ctx.strategy_index,
            instance_id=instance_id(self.config.run_id, ctx.strategy_execution_id, key),
            task_key=key,
            container_name=container_name(self.config.run_id, ctx.strategy_index, key),
            model=norm["model"],
            session_id=norm.get("resume_session_id"),
            keep_workspace_on_success=callable(getattr(self.runner, "discard_workspace", None)),
            uncommitted=norm.get("uncommitted", "commit"),
            session_group_key=norm.get("session_group_key"),
            timeout_seconds=norm.get("timeout_seconds", self.config.defaults.timeout_seconds),
            container_limits=ContainerLimits(
                cpus=runner_cfg["container_limits"]["cpus"], memory=runner_cfg["container_limits"]["memory"]
            ),
            plugin_name=norm["plugin_name"],
            plugin=plugin,
            system_prompt=norm.get("system_prompt"),
            output_schema=norm.get("output_schema"),
            append_system_prompt=norm.get("append_system_prompt"),
            max_turns=runner_cfg.get("max_turns"),
            import_policy=norm["import_policy"],
            import_conflict_policy=norm["import_conflict_policy"],
            skip_empty_import=norm["skip_empty_import"],
            command=norm.get("command"),
            include_branches=tuple(norm.get("include_branches") or ()),
            delete_branches=tuple(norm.get("delete_branches") or ()),
            network_egress=runner_cfg["network_egress"],
            **self.config.runner_options,
        )

    def _resuming(self, request: InstanceRequest, plugin: RunnerPlugin) -> InstanceRequest:
        recorded = self.state.tasks.get(request.task_key)
        if (
            recorded is None
            or recorded.attempts == 0
            or self.config.resume_fresh
            or not self.config.supports_resume
            or not plugin.capabilities.supports_resume
        ):
            return request
        # A task that ran before continues in the workspace it left (a fresh
        # clone would hide its agent's edits), with its session when one was
        # reported: the persisted id overrides the one in the task input. A
        # command task has no session to continue and starts afresh.
        return msgspec.structs.replace(
            request, resume_workspace=True, session_id=recorded.session_id or request.session_id
        )

    async def _execute(
        self, handle: Handle, task: InstanceRequest, plugin: RunnerPlugin, policy: RetryPolicy | None
    ) -> None:
        key, sid = handle.key, task.strategy_execution_id
        attempt = 1
        while True:
            request = self._resuming(task, plugin)
            result = await self._attempt(request, plugin, first=attempt == 1)
            if result is None:  # the cap was reached while it waited: it never started, nothing is recorded
                assert self.budget is not None
                handle._fail("budget_reached", self.budget.message())
                return
            if (
                result.status == "success"
                or policy is None
                or attempt >= policy.max_attempts
                or not policy.retries(result.error_type)
                or self._budget_refuses(sid, plugin)  # at the cap a retry is new spend: the failure stands
            ):
                break
            self.olog.warning(
                f"task {key} failed ({result.error_type}); retrying under its policy",
                attempt=attempt,
                delay_s=policy.delay(attempt),
            )
            await anyio.sleep(policy.delay(attempt))
            attempt += 1
        with anyio.CancelScope(shield=True):  # the runner is done: its result must reach the log
            await self._finish(sid, handle, task.instance_id, result)
            # Shielded as the runner's own removal was: the run's end (which cancels
            # the tasks left) must not leave finished tasks' workspaces behind.
            if result.status == "success" and request.keep_workspace_on_success and result.workspace_path:
                await self._discard_workspace(key, request)

    async def _discard_workspace(self, key: str, request: InstanceRequest) -> None:
        """Remove a finished task's workspace only once its ``task.completed`` is on disk.

        Removed before, a crash in between loses the workspace while the log still
        calls the task unfinished: the resume starts it afresh in a new clone and
        a new session, paying for its work twice.
        """
        assert self._log is not None, "engine is not running"
        await self._log.flush()
        try:
            await self.runner.discard_workspace(request)  # type: ignore[attr-defined]
        except Exception as exc:  # only disk space is at stake: retention removes it later
            self.olog.warning(f"could not remove the workspace of finished task {key}: {exc}", key=key)

    async def _attempt(self, request: InstanceRequest, plugin: RunnerPlugin, *, first: bool) -> RunnerResult | None:
        sid, key = request.strategy_execution_id, request.task_key
        inst, cname = request.instance_id, request.container_name
        async with self._limiter:
            self.queued -= 1
            if first and self._budget_refuses(sid, plugin):
                return None
            started = False
            try:
                # A runner over several Docker engines chooses the task's engine first,
                # so the record names where it runs.
                reserve = getattr(self.runner, "reserve", None)
                host = await reserve(request) if reserve is not None else msgspec.UNSET
                self.emit(
                    E.TASK_STARTED,
                    sid,
                    E.TaskStarted(
                        key=key,
                        instance_id=inst,
                        container_name=cname,
                        model=request.model,
                        session_id=request.session_id,
                        host=host,
                    ),
                    key=key,
                )
                started = True
                self.runner_calls += 1
                if self.budget is not None and is_agent_task(plugin):
                    self.budget.begin(key, request.model)
                result = await self.runner.run(request, on_event=lambda ev: self._on_runner_event(sid, key, inst, ev))
            except anyio.get_cancelled_exc_class():
                if started:  # (no await here: the cancellation cannot interrupt the record)
                    if self.budget is not None:
                        self.budget.interrupted(key)
                    session = self._live_sessions.get(key, msgspec.UNSET)
                    self.emit(
                        E.TASK_INTERRUPTED,
                        sid,
                        E.TaskInterrupted(key=key, instance_id=inst, session_id=session),
                        key=key,
                    )
                raise
            except Exception as exc:
                if isinstance(exc, RunnerError):
                    error_type, error = exc.category, str(exc)
                else:  # a bug or an unexpected library error: fail the task, keep the run
                    # "internal", not "container": retrying a bug would only pay for it again
                    self.olog.error(f"runner raised {error_line(exc)}", key=key, traceback=traceback.format_exc())
                    error_type, error = "internal", error_line(exc)
                result = RunnerResult(
                    status="failed", instance_id=inst, error_type=error_type, error=error, container_name=cname
                )
        if self.budget is not None and is_agent_task(plugin):
            self.budget.settle(key, msgspec.to_builtins(result.metrics) if result.metrics else None)
        return result

    def _on_runner_event(self, sid: str, key: str, inst: str, event: dict[str, Any]) -> None:
        """Make the agent's session durable as soon as the tool reports it.

        The first ``init`` line names the session; writing it to the log at once
        (not only in ``task.interrupted``) lets a resume after SIGKILL, OOM or
        power loss continue that session instead of paying for its work again.
        A session the runner gave up (workspace gone, session unreadable) is
        recorded as ``null`` with the reason.
        """
        if not isinstance(event, dict):  # a plugin's callback is not type-checked
            return  # type: ignore[unreachable]
        etype = event.get("type")
        if etype == "runner.usage":
            if self.budget is not None and isinstance(event.get("data"), dict):
                self.budget.usage(key, event["data"])
            return
        if etype == "runner.session.reset":
            self._live_sessions.pop(key, None)
            if self.state.tasks.get(key) is not None:
                reset = E.TaskSession(
                    key=key,
                    instance_id=inst,
                    session_id=None,
                    reason=_text(event.get("reason")),
                    detail=_text(event.get("detail")),
                    previous_session_id=_text(event.get("previous_session_id")),
                    # Several Docker hosts: the host the task starts afresh on (its own went away).
                    host=_text(event.get("host")) or msgspec.UNSET,
                    error_type=_text(event.get("error_type")) or msgspec.UNSET,
                )
                self.emit(E.TASK_SESSION, sid, reset, key=key)
            return
        data = event.get("data")
        if not isinstance(data, dict):
            data = {}
        sid_value = event.get("session_id") or data.get("session_id")
        if isinstance(sid_value, str) and sid_value:
            self._live_sessions[key] = sid_value
            if etype not in ("runner.init", "runner.exec.finished", "runner.session.recovered"):
                return
            task = self.state.tasks.get(key)
            if task is not None and task.session_id != sid_value and task.state == "RUNNING":
                self.emit(E.TASK_SESSION, sid, E.TaskSession(key=key, instance_id=inst, session_id=sid_value), key=key)

    async def _finish(self, sid: str, handle: Handle, inst: str, result: RunnerResult) -> None:
        key = handle.key
        # (a payload's JSON follows its struct's field order, not these arguments')
        common: dict[str, Any] = {
            "key": key,
            "instance_id": inst,
            "metrics": E.Metrics(**msgspec.structs.asdict(result.metrics)),
            "session_id": result.session_id,
            "exit_code": result.exit_code,
            "retry_attempts": result.retry_attempts,
        }
        if result.status == "success":
            message, truncated, path = await self._bound_message(key, result.final_message)
            completed = E.TaskCompleted(
                **common,
                artifact=E.Artifact(**msgspec.structs.asdict(result.artifact)) if result.artifact else None,
                final_message=message,
                final_message_truncated=truncated,
                final_message_path=path,
                output=msgspec.UNSET if result.output is None else result.output,
            )
            written = self.emit(E.TASK_COMPLETED, sid, completed, key=key)
            # The strategy sees exactly what a replay reads back from the log.
            handle._resolve(task_result_from_payload(written))
        else:
            error_type = result.error_type or ("timeout" if result.status == "timeout" else "container")
            message = result.error or f"task ended with status {result.status}"
            failed = E.TaskFailed(**common, error_type=error_type, message=message, status=result.status)
            self.emit(E.TASK_FAILED, sid, failed, key=key)
            recorded = self.state.tasks[key]
            handle._fail(recorded.error_type or error_type, recorded.message or "")

    async def _bound_message(self, key: str, message: str) -> tuple[str, bool, str]:
        limit = self.config.max_final_message_bytes
        data = message.encode("utf-8")
        if len(data) <= limit:
            return message, False, ""
        path = self.paths.final_messages / f"k{short8(key)}.txt"
        assert self._log is not None, "engine is not running"
        scrub = self._log.sanitizer.scrub_text if self._log.sanitizer else (lambda s: s)

        def write() -> str:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(scrub(message), "utf-8")
            return str(path.resolve())

        return data[:limit].decode("utf-8", "ignore"), True, await anyio.to_thread.run_sync(write)

    # ------------------------------------------------------------ recorded nondeterminism
    def checkpoint(self, ctx: StrategyContext, seq: int, kind: str, produce: Callable[[], Any]) -> Any:
        strat = self.state.strategies[ctx.strategy_execution_id]
        if seq < len(strat.checkpoints):
            recorded_kind, value = strat.checkpoints[seq]
            if recorded_kind != kind:
                self.olog.warning(
                    f"strategy asked for ctx.{kind}() where the recorded run asked for "
                    f"ctx.{recorded_kind}() (checkpoint {seq}); the strategy is not deterministic"
                )
            return value
        value = produce()
        self.emit(
            E.STRATEGY_CHECKPOINT,
            ctx.strategy_execution_id,
            E.StrategyCheckpoint(seq=seq, kind=kind, value=[kind, value]),
        )
        return value

    def publish_progress(self, sid: str, record: E.Progress) -> None:
        """Write a strategy's progress record, unless it is the one already folded (a resume re-entering)."""
        strat = self.state.strategies.get(sid)
        if strat is not None and strat.progress == record:
            return
        self.emit(E.STRATEGY_PROGRESS, sid, record)

    # ------------------------------------------------------------ strategies
    async def _run_strategy(self, index: int, fn: StrategyFn, name: str, prompt: str, params: dict[str, Any]) -> None:
        sid = f"s{index}"
        recorded = self.state.strategies.get(sid)
        if recorded is not None and recorded.status not in ("running", "budget_reached"):
            return  # finished in an earlier process: never re-entered (one the cap stopped goes on)
        if recorded is None:
            self.emit(E.STRATEGY_STARTED, sid, E.StrategyStarted(name=name, params=params, index=index))
        ctx = StrategyContext(self, strategy_execution_id=sid, strategy_index=index)
        fields: dict[str, Any]
        try:
            result = await fn(prompt, self.config.base_branch, ctx, **params)
        except StrategyError as exc:
            # A strategy that gave up because the cap refused it a task stopped at the cap, not on a fault.
            status = "budget_reached" if self._capped(sid) or isinstance(exc, BudgetReached) else "failed"
            unusable = list(exc.keys) if isinstance(exc, BaseEvaluationFailed) and exc.keys else msgspec.UNSET
            fields = {"error": error_line(exc), "unusable_keys": unusable}
        except Exception as exc:
            self.olog.error(f"strategy {sid} raised {error_line(exc)}", traceback=traceback.format_exc())
            status, fields = "failed", {"error": error_line(exc)}
        else:
            status = "budget_reached" if self._capped(sid) else "success"
            fields = {"result": to_jsonable(result)}
        completed = E.StrategyCompleted(status=status, unvisited_keys=self._unvisited(ctx), **fields)
        self.emit(E.STRATEGY_COMPLETED, sid, completed)

    def _capped(self, sid: str) -> bool:
        return self.budget is not None and sid in self.budget.refused

    def _unvisited(self, ctx: StrategyContext) -> list[str] | msgspec.UnsetType:
        """Recorded keys the (possibly changed) strategy never asked for again on resume (UNSET: none)."""
        if not self.resumed:
            return msgspec.UNSET
        recorded = {k for k, t in self.state.tasks.items() if t.strategy_execution_id == ctx.strategy_execution_id}
        missing = sorted(recorded - ctx.requested_keys)
        if missing:
            self.olog.warning(
                f"strategy {ctx.strategy_execution_id} no longer asks for recorded keys: " + ", ".join(missing)
            )
            if self.on_divergence is not None:
                self.on_divergence(ctx.strategy_execution_id, missing)
            return missing
        return msgspec.UNSET

    # ------------------------------------------------------------ spending cap
    def _start_budget(self, run_scope: anyio.CancelScope) -> None:
        cap = self.config.budget
        if cap is None or not cap.active:
            return

        def reached() -> None:
            self.olog.warning("spending cap reached", **self.budget.figures() if self.budget else {})
            if cap.on_reached == "stop":
                # Like Ctrl+C: running agent tasks are recorded as interrupted with their
                # sessions, so a resume with a higher cap continues them.
                run_scope.cancel()

        self.budget = Budget(
            cap, rates=self.config.budget_rates, emit=lambda etype, p: self.emit(etype, "", p), on_reached=reached
        )
        if self.state.budget is not None:
            self.budget.seed(self.state.budget.by_task)
        self.budget.announce()

    @property
    def budget_stopped(self) -> bool:
        """Whether this process ended (or stopped taking agent tasks) at the spending cap."""
        return self.budget is not None and self.budget.reached

    # ------------------------------------------------------------ running
    def recover_state(self) -> None:
        self.state = recover(self.config.run_id, self.paths.events, self.paths.snapshots)
        self.resumed = self.state.last_event_start_offset >= 0

    async def run(
        self, fn: StrategyFn, *, prompt: str, params: dict[str, Any], runs: int = 1, name: str | None = None
    ) -> RunState:
        """Run (or resume) ``runs`` executions of ``fn`` to completion; returns the final state.

        Cancelling the surrounding scope interrupts the run: running tasks are
        recorded as interrupted, the log is drained and a snapshot written.
        """
        name = name or self.config.strategy_name
        self.recover_state()
        async with EventLog(
            self.paths.events,
            run_id=self.config.run_id,
            flush_policy=self.config.flush_policy,
            interval_ms=self.config.flush_interval_ms,
            max_batch=self.config.flush_max_batch,
            sanitizer=getattr(self.olog, "sanitizer", None),
        ) as log:
            self._log = log
            # A task the log shows running was cut off by a crash: record it as interrupted so it resumes.
            for task in self.state.running():
                self.emit(
                    E.TASK_INTERRUPTED,
                    task.strategy_execution_id,
                    E.TaskInterrupted(key=task.key, instance_id=task.instance_id, reason="crash"),
                    key=task.key,
                )
            pending, self._pending_run_events = self._pending_run_events, []
            for etype, payload in pending:
                self.emit(etype, "", payload)
            try:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    self._start_budget(tg.cancel_scope)
                    tg.start_soon(self._snapshotter)
                    async with anyio.create_task_group() as strategies:
                        for i in range(1, runs + 1):
                            strategies.start_soon(self._run_strategy, i, fn, name, prompt, params)
                    tg.cancel_scope.cancel()  # strategies done: stop the snapshotter
            finally:
                if self._reader is not None:
                    self._reader.close()
                    self._reader = None
                with anyio.CancelScope(shield=True):
                    await self.snapshot()
            self._log = None
        return self.state


def result_at(log: BinaryIO, offset: int) -> dict[str, Any]:
    """The TaskResult of the ``task.completed`` event at ``offset`` of an open event log."""
    log.seek(offset)
    return task_result_from_payload(decode_line(log.readline()).typed())


def task_result_from_payload(payload: E.EventPayload | None) -> dict[str, Any]:
    """The TaskResult a strategy sees, rebuilt from a ``task.completed`` payload.

    Live completions and replays both go through here, so a strategy gets
    byte-identical results whether a task just finished or was read back.
    """
    assert isinstance(payload, E.TaskCompleted), "a completed task's result offset points at its task.completed"
    message = payload.final_message
    if payload.final_message_truncated and payload.final_message_path:
        with contextlib.suppress(OSError):
            message = Path(payload.final_message_path).read_text("utf-8")
    return {
        "key": payload.key,
        "instance_id": payload.instance_id,
        "status": "success",
        # as recorded: an artifact from an older log keeps the fields it had
        "artifact": msgspec.to_builtins(payload.artifact),
        "final_message": message,
        "metrics": msgspec.to_builtins(payload.metrics),
        "session_id": payload.session_id,
        "exit_code": payload.exit_code,
        # The answer validated against the task's output_schema (None without one).
        "output": None if payload.output is msgspec.UNSET else payload.output,
    }


def error_line(exc: BaseException) -> str:
    """How a strategy's exception is recorded (``strategy.completed``'s error); a replay matches it."""
    return f"{type(exc).__name__}: {exc}"


def _text(value: Any) -> str | None:
    """A runner event's field as the event schema's string (a plugin's callback is not type-checked)."""
    return value if value is None or isinstance(value, str) else str(value)


def to_jsonable(value: Any) -> Any:
    """What a strategy returned, as JSON (results, lists of results, plain data)."""
    try:
        return orjson.loads(orjson.dumps(value, default=lambda o: msgspec.to_builtins(o)))
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)
