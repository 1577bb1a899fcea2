"""The dashboard's model of one run: the run's fold, fed by events and reconciled from snapshots.

The model is the run's :class:`~orchestrator.log.state.RunState`, the same fold the engine keeps,
and nothing folded beside it: what a card shows is a view of the task's state. ``version``
increases on every change, so a renderer can skip a frame when nothing moved (docs/tui.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import msgspec

from orchestrator.log.events import Event, EventPayload, PayloadMismatch, Progress, decode_payload
from orchestrator.log.state import (
    COMPLETED,
    FAILED,
    FIRST_LINE_LIMIT,
    INTERRUPTED,
    PENDING,
    PROTOCOL_PREFIX,
    RUNNING,
    UNUSABLE,
    UNUSABLE_WORDS,
    RunState,
    TaskState,
    apply,
    first_line,
    parse_ts,
    task_label,
    task_outcome,
)


def without_protocol(text: Any) -> str:
    """``text`` on one line, its ``@@`` marker lines left out."""
    if not isinstance(text, str):
        return ""
    return " ".join(ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(PROTOCOL_PREFIX))


NAMED_COMMAND = "# $ "


def command_line(command: Any, limit: int = FIRST_LINE_LIMIT) -> str:
    """What a command task runs, as ``$ <first line>``: shell comments (``# orch-measure {...}``) skipped.

    A strategy's wrapper script names the user's command it runs on a comment
    line ``# $ <command>``, and that is what is shown (not the wrapper's first
    line, ``set -u -f``).
    """
    if not isinstance(command, str):
        return ""
    for line in command.splitlines():
        if line.startswith(NAMED_COMMAND) and line[len(NAMED_COMMAND) :].strip():
            return f"$ {line[len(NAMED_COMMAND) :].strip()}"[:limit]
    for line in command.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", PROTOCOL_PREFIX)):
            # A strategy's wrapper script (it prints markers for its strategy) is no
            # command a user typed: it is named, not shown.
            return "command" if PROTOCOL_PREFIX in line else f"$ {line}"[:limit]
    return "command"


def makes_branch(task_input: Any) -> bool:
    """False for a task that never imports its work (reviews, measurements): it makes no branch."""
    return not (isinstance(task_input, dict) and task_input.get("import_policy") == "never")


def task_doing(task_input: Any, runs_command: bool) -> str:
    """One line saying what a task does: its prompt, or for a bare command task its command."""
    if not isinstance(task_input, dict):
        return ""
    prompt = task_input.get("prompt")
    if runs_command and (not prompt or prompt == task_input.get("command")):
        return command_line(task_input.get("command"))
    return first_line(prompt)


class HostLine(msgspec.Struct, frozen=True):
    name: str
    running: int
    free: int | None  # None when the host's slots are not known
    down: bool


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    """Aggregates the header, health line and footer show."""

    total: int
    pending: int
    running: int
    completed: int
    failed: int
    interrupted: int
    unusable: int  # completed, but its strategy could not use the result (why it failed)
    cost_usd: float
    cost_known: bool  # False when every finished task reported cost N/A
    tokens_in: int
    tokens_out: int
    runtime_s: float
    cost_per_min: float | None
    avg_duration_s: float | None
    stale_s: float | None  # seconds since the last event, while the run is unfinished


class RunModel:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.state = RunState(run_id=run_id)
        self.version = 0
        self.events = 0
        self._summary_cache: tuple[int, dict[str, Any]] | None = None
        self._doing: dict[str, str] = {}  # what each task does, by key (its input never changes)

    # ---------------------------------------------------------------- feeding
    def feed(self, ev: Event) -> None:
        self.feed_raw(ev.type, ev.strategy_execution_id, ev.key, ev.payload, ev.start_offset, ev.ts)

    def feed_raw(
        self,
        etype: str,
        sid: str,
        key: str | None,
        payload: EventPayload | Mapping[str, Any] | None,
        offset: int,
        ts: str,
    ) -> None:
        """Fold one event; ``payload`` is its struct, or the JSON object (decoded here, as the fold does)."""
        if payload is not None and not isinstance(payload, EventPayload):
            try:
                payload = decode_payload(etype, payload)
            except PayloadMismatch:
                return  # not folded, as a replay's LogReader skips it
        self.events += 1
        self.version += 1
        apply(self.state, etype, sid, key, payload, offset, ts)

    # ---------------------------------------------------------------- reconciliation
    def reconcile(self, snapshot: RunState | None) -> bool:
        """Adopt ``snapshot`` when it has folded events this model has not; True if adopted."""
        if snapshot is None or snapshot.run_id != self.run_id:
            return False
        if snapshot.last_event_start_offset <= self.state.last_event_start_offset:
            return False
        self.state = snapshot
        self.version += 1
        return True

    # ---------------------------------------------------------------- views of a task
    def doing(self, task: TaskState) -> str:
        doing = self._doing.get(task.key)
        if doing is None:
            doing = self._doing[task.key] = task_doing(task.input, task.runs_command)
        return doing

    def status(self, task: TaskState) -> str:
        """The task's status as every reader shows it (:func:`~orchestrator.log.state.task_outcome`)."""
        return task_outcome(self.state, task)

    def activity(self, task: TaskState) -> str:
        """The task's activity line: what it does, or what last happened to it."""
        state = self.status(task)
        if state == UNUSABLE:
            return UNUSABLE_WORDS
        if state == FAILED:
            return f"{task.error_type or 'error'}: {first_line(task.message)}"
        if state == COMPLETED:
            return task.final_line or "done"
        if state == INTERRUPTED:
            return f"interrupted ({task.interrupted_reason})" if task.interrupted_reason else "interrupted"
        doing = self.doing(task)
        if state == RUNNING:
            if task.moved is not None:
                return f"moved to host {task.host} ({task.moved})"
            return (f"attempt {task.attempts}: " if task.attempts > 1 else "") + (
                doing or f"running {task.model or ''}".rstrip()
            )
        return f"queued: {doing}" if doing else "queued"

    @staticmethod
    def started(task: TaskState) -> float | None:
        """When its latest attempt started (epoch seconds)."""
        return parse_ts(task.started_at)

    @staticmethod
    def ended(task: TaskState) -> float | None:
        """When it finished, or was last interrupted; None while it runs."""
        if task.state == RUNNING:
            return None
        return parse_ts(task.completed_at if task.state in (COMPLETED, FAILED) else task.interrupted_at)

    def hosts(self) -> list[HostLine]:
        """One line per Docker host: running tasks (where each was last placed), free slots, down; [] without hosts.

        A log without ``hosts.status`` (a run from before it existed) still shows the running tasks per host.
        """
        running: dict[str, int] = {}  # in the order hosts first appear
        for task in self.state.tasks.values():
            if task.host is None:
                continue
            running.setdefault(task.host, 0)
            if task.state == RUNNING:
                running[task.host] += 1
        if not self.state.hosts:
            return [HostLine(name, n, None, False) for name, n in running.items()]
        out = []
        for name, host in self.state.hosts.items():
            n = running.get(name, 0)
            out.append(HostLine(name, n, 0 if host.down else max(0, host.max_parallel - n), host.down))
        return out

    # ---------------------------------------------------------------- views
    def label(self, key: str) -> str:
        return task_label(key, several=len(self.state.strategies) > 1)

    @property
    def empty(self) -> bool:
        """Nothing known about the run yet (no event read, no snapshot adopted)."""
        return self.events == 0 and not self.state.strategies and not self.state.tasks

    @property
    def finished(self) -> bool:
        """True once at least one strategy ran and none is still running."""
        strategies = self.state.strategies
        return bool(strategies) and all(s.status != "running" for s in strategies.values())

    @property
    def last_ts(self) -> float | None:
        """When the latest event was written (epoch seconds)."""
        return parse_ts(self.state.last_event_at)

    def task_runtime(self, task: TaskState, now: float) -> float | None:
        if task.state in (COMPLETED, FAILED) and task.duration_s:
            return task.duration_s
        started = self.started(task)
        if started is None:
            return None
        if task.state == RUNNING:
            return max(0.0, now - started)
        ended = self.ended(task)
        return max(0.0, ended - started) if ended is not None else None

    def runtime_s(self, now: float) -> float:
        """How long the run has run: its sessions' time (as every reader says it), the current one to ``now``."""
        state = self.state
        if self.finished:
            return state.duration_s()
        started = parse_ts(state.session_started_at)
        return state.earlier_sessions_s + (max(0.0, now - started) if started is not None else 0.0)

    def summary(self, now: float) -> Summary:
        counts = self._counts()
        state = self.state
        runtime = self.runtime_s(now)
        c = state.counters
        minutes = runtime / 60
        cost_per_min = c.cost_usd / minutes if minutes >= 1 / 60 and counts["cost_known"] else None
        stale = None
        last = self.last_ts
        if not self.finished and last is not None:
            stale = max(0.0, now - last)
        return Summary(
            total=len(state.tasks),
            pending=counts[PENDING],
            running=counts[RUNNING],
            completed=counts[COMPLETED],
            failed=counts[FAILED],
            interrupted=counts[INTERRUPTED],
            unusable=counts[UNUSABLE],
            cost_usd=c.cost_usd,
            cost_known=counts["cost_known"],
            tokens_in=c.tokens_in,
            tokens_out=c.tokens_out,
            runtime_s=runtime,
            cost_per_min=cost_per_min,
            avg_duration_s=counts["avg"],
            stale_s=stale,
        )

    def _counts(self) -> dict[str, Any]:
        """Per-state counts and the mean duration, recomputed only when the model changed."""
        if self._summary_cache is not None and self._summary_cache[0] == self.version:
            return self._summary_cache[1]
        counts: dict[str, Any] = {PENDING: 0, RUNNING: 0, COMPLETED: 0, FAILED: 0, INTERRUPTED: 0, UNUSABLE: 0}
        durations: list[float] = []
        cost_known = False
        for task in self.state.tasks.values():
            status = self.status(task)
            counts[status] = counts.get(status, 0) + 1
            if task.state in (COMPLETED, FAILED):
                if task.duration_s:
                    durations.append(task.duration_s)
                if task.cost_usd is not None:
                    cost_known = True
        counts["avg"] = statistics.fmean(durations) if durations else None
        counts["cost_known"] = cost_known
        self._summary_cache = (self.version, counts)
        return counts


# ---------------------------------------------------------------- formatting shared by the views


def fmt_progress(progress: Progress | None) -> str:
    """A strategy's latest ``strategy.progress`` record as one line: ``depth 2/3 · frontier 2 · best 8.5 · ...``."""
    if progress is None:
        return ""
    parts = []
    if progress.phase and progress.step is not None:
        parts.append(f"{progress.phase} {progress.step}" + (f"/{progress.of_total}" if progress.of_total else ""))
    if progress.frontier is not None:
        parts.append(f"frontier {progress.frontier}")
    if progress.best is not None:
        parts.append(f"best {progress.best:g}")
    if progress.text:
        parts.append(progress.text)
    elif progress.done is not None and progress.total is not None:
        parts.append(f"{progress.done}/{progress.total} done")
    return " · ".join(parts)


def fmt_duration(seconds: float | None) -> str:
    """``45s``, ``3m 24s``, ``1h 02m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def fmt_cost(cost: float | None) -> str:
    """Dollars with cents (sub-cent costs keep three digits); ``N/A`` when the agent reported none."""
    if cost is None:
        return "N/A"
    return f"${cost:.3f}" if 0 < cost < 0.01 else f"${cost:.2f}"


def fmt_tokens(n: int | None) -> str:
    if not n:
        return "0"
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.2f}M"
