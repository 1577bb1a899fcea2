"""The dashboard's in-memory model of one run, fed by events and reconciled from snapshots.

The model is the run's :class:`~orchestrator.log.state.RunState` (the same pure fold
the engine keeps) plus a few display-only extras per task: the activity line,
cached epoch timestamps and the artifact's line counts. Feeding an event never
renders anything; the render loop reads the model on its own clock, so a burst of events costs folds, not frames.

``version`` increases on every change, so a renderer can skip rebuilding a frame
when neither the model nor the displayed second has moved.

Reconciliation (every 3 s) loads ``state.json``: if the snapshot has folded
events this model has not seen (the reader fell behind, or events were missed),
the model adopts it. Events already folded are ignored by ``apply`` by offset,
so a later catch-up of the event stream never double counts.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from orchestrator.log import events as E
from orchestrator.log.events import Event, EventPayload, PayloadMismatch, Progress, decode_payload
from orchestrator.log.state import COMPLETED, FAILED, INTERRUPTED, PENDING, RUNNING, RunState, TaskState, apply

ACTIVITY_LIMIT = 240  # characters of a final message or error kept for the activity line


def parse_ts(ts: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 event timestamp (``...Z``); None when absent or malformed."""
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def first_line(text: Any, limit: int = ACTIVITY_LIMIT) -> str:
    """The first non-blank line a user should read: lines starting ``@@`` are skipped.

    Strategies' command tasks talk to their strategy through marker lines
    (``@@orch-run ...``, ``@@evolve end ...``): the strategy parses them, the
    screen must not show them.
    """
    if not isinstance(text, str):
        return ""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(PROTOCOL_PREFIX):
            return line[:limit]
    return ""


PROTOCOL_PREFIX = "@@"


def without_protocol(text: Any) -> str:
    """``text`` on one line, its ``@@`` marker lines left out."""
    if not isinstance(text, str):
        return ""
    return " ".join(ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(PROTOCOL_PREFIX))


NAMED_COMMAND = "# $ "


def command_line(command: Any, limit: int = ACTIVITY_LIMIT) -> str:
    """What a command task runs, as ``$ <first line>``: shell comments (``# orch-measure {...}``) skipped.

    A strategy's wrapper script names the user's command it runs on a comment
    line ``# $ <command>``, and that is what is shown (not the wrapper's first
    line, ``set -u -f``).
    """
    # (a script that prints marker lines is a strategy's own wrapper: just "command")
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


def task_label(key: str, several: bool = False) -> str:
    """A task's readable key, as the summary names it: ``run/s1/e0001/plan`` -> ``e0001/plan``.

    With several strategy executions (``--runs N``) their tasks may share a
    key, so the execution leads: ``s2/e0001/plan``.
    """
    parts = key.split("/", 2)
    if len(parts) != 3:
        return key
    return f"{parts[1]}/{parts[2]}" if several else parts[2]


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


class TaskExtra(msgspec.Struct, kw_only=True):
    """Display-only facts about a task that the state fold does not keep."""

    activity: str = ""
    prompt: str = ""  # first line of the task's prompt: what a queued or running task is doing
    started: float | None = None
    ended: float | None = None
    runs_command: bool = False  # a command, not an agent: no model to show
    has_changes: bool | None = None
    lines_added: int = 0
    lines_deleted: int = 0
    retry_attempts: int = 0
    host: str | None = None  # the Docker host of its latest start (runner.hosts)
    makes_branch: bool = True


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
        self.extras: dict[str, TaskExtra] = {}
        self.version = 0
        self.events = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.reconciled = 0  # how many times a snapshot was adopted
        self.skipped = 0  # events whose payload does not match their type: not folded
        self._summary_cache: tuple[int, dict[str, Any]] | None = None

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
                self.skipped += 1
                return
        epoch = parse_ts(ts)
        if epoch is not None:
            if self.first_ts is None or epoch < self.first_ts:
                self.first_ts = epoch
            if self.last_ts is None or epoch > self.last_ts:
                self.last_ts = epoch
        self.events += 1
        self.version += 1
        apply(self.state, etype, sid, key, payload, offset, ts)
        if key is not None:
            self._note_task(key, payload, epoch)
        elif isinstance(payload, E.StrategyStarted) and self.first_ts is None:
            self.first_ts = epoch

    def _note_task(self, key: str, p: EventPayload | None, epoch: float | None) -> None:
        extra = self.extras.get(key)
        if extra is None:
            extra = self.extras[key] = TaskExtra()
        if isinstance(p, E.TaskScheduled):
            task_input = None if p.input is msgspec.UNSET else p.input
            extra.runs_command = p.is_command
            extra.prompt = task_doing(task_input, p.is_command)
            extra.makes_branch = makes_branch(task_input)
            extra.activity = f"queued: {extra.prompt}" if extra.prompt else "queued"
        elif isinstance(p, E.TaskStarted):
            extra.started = epoch
            extra.ended = None
            extra.host = p.host or None
            task = self.state.tasks.get(key)
            attempt = task.attempts if task is not None else 1
            doing = extra.prompt or f"running {p.model or ''}".rstrip()
            extra.activity = (f"attempt {attempt}: " if attempt > 1 else "") + doing
        elif isinstance(p, E.TaskCompleted):
            extra.ended = epoch
            artifact = p.artifact
            extra.has_changes = artifact.has_changes if artifact else None
            extra.lines_added = artifact.lines_added if artifact else 0
            extra.lines_deleted = artifact.lines_deleted if artifact else 0
            extra.retry_attempts = p.retry_attempts
            extra.activity = first_line(p.final_message) or "done"
        elif isinstance(p, E.TaskFailed):
            extra.ended = epoch
            extra.retry_attempts = p.retry_attempts
            extra.activity = f"{p.error_type or 'error'}: {first_line(p.message)}"
        elif isinstance(p, E.TaskSession) and p.host:
            # Its host went away: the task started afresh on this one.
            extra.host = p.host
            reason = p.reason or "session reset"
            extra.activity = f"moved to host {p.host} ({reason})"
        elif isinstance(p, E.TaskInterrupted):
            extra.ended = epoch
            extra.activity = f"interrupted ({p.reason})" if p.reason else "interrupted"

    def hosts_running(self) -> dict[str, int]:
        """Running tasks per Docker host, in the order hosts first appear; {} without hosts."""
        out: dict[str, int] = {}
        for key, extra in self.extras.items():
            if extra.host is None:
                continue
            out.setdefault(extra.host, 0)
            task = self.state.tasks.get(key)
            if task is not None and task.state == RUNNING:
                out[extra.host] += 1
        return out

    def hosts(self) -> list[HostLine]:
        """One line per Docker host: running tasks, free slots, down; [] without hosts.

        The hosts, their slots and which are down come from the latest
        ``hosts.status`` (folded into the state); the running tasks from where
        each task was last placed (``task.started``, or ``task.session`` when
        its host went away). A log without ``hosts.status`` (a run from before
        it existed) still shows the running tasks per host.
        """
        running = self.hosts_running()
        if not self.state.hosts:
            return [HostLine(name, n, None, False) for name, n in running.items()]
        out = []
        for name, host in self.state.hosts.items():
            n = running.get(name, 0)
            out.append(HostLine(name, n, 0 if host.down else max(0, host.max_parallel - n), host.down))
        return out

    # ---------------------------------------------------------------- reconciliation
    def reconcile(self, snapshot: RunState | None) -> bool:
        """Adopt ``snapshot`` when it has folded events this model has not; True if adopted."""
        if snapshot is None or snapshot.run_id != self.run_id:
            return False
        if snapshot.last_event_start_offset <= self.state.last_event_start_offset:
            return False
        self.state = snapshot
        for key, task in snapshot.tasks.items():
            extra = self.extras.get(key)
            if extra is None:
                extra = self.extras[key] = TaskExtra()
            if extra.started is None:
                extra.started = parse_ts(task.started_at)
            if extra.ended is None and task.state in (COMPLETED, FAILED):
                extra.ended = parse_ts(task.completed_at)
            extra.runs_command = task.runs_command
            if not extra.prompt:
                extra.prompt = task_doing(task.input, task.runs_command)
            extra.makes_branch = makes_branch(task.input)
            if not extra.activity or extra.activity.startswith("queued"):
                extra.activity = _activity_from_state(task, extra.prompt)
        stamps = [ts for t in snapshot.tasks.values() for ts in (t.scheduled_at, t.completed_at)]
        stamps += [ts for st in snapshot.strategies.values() for ts in (st.started_at, st.completed_at)]
        for epoch in filter(None, map(parse_ts, stamps)):
            self.first_ts = epoch if self.first_ts is None else min(self.first_ts, epoch)
            self.last_ts = epoch if self.last_ts is None else max(self.last_ts, epoch)
        self.reconciled += 1
        self.version += 1
        return True

    # ---------------------------------------------------------------- views
    def label(self, key: str) -> str:
        """The task's readable key (see :func:`task_label`)."""
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

    def task_runtime(self, task: TaskState, now: float) -> float | None:
        extra = self.extras.get(task.key)
        if task.state in (COMPLETED, FAILED) and task.duration_s:
            return task.duration_s
        started = extra.started if extra is not None else parse_ts(task.started_at)
        if started is None:
            return None
        if task.state == RUNNING:
            return max(0.0, now - started)
        ended = extra.ended if extra is not None else None
        return max(0.0, ended - started) if ended is not None else None

    def summary(self, now: float) -> Summary:
        counts = self._counts()
        state = self.state
        if self.first_ts is None:
            runtime = 0.0
        elif self.finished and self.last_ts is not None:
            runtime = self.last_ts - self.first_ts
        else:
            runtime = max(0.0, now - self.first_ts)
        c = state.counters
        minutes = runtime / 60
        cost_per_min = c.cost_usd / minutes if minutes >= 1 / 60 and counts["cost_known"] else None
        stale = None
        if not self.finished and self.last_ts is not None:
            stale = max(0.0, now - self.last_ts)
        return Summary(
            total=len(state.tasks),
            pending=counts[PENDING],
            running=counts[RUNNING],
            completed=counts[COMPLETED],
            failed=counts[FAILED],
            interrupted=counts[INTERRUPTED],
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
        counts: dict[str, Any] = {PENDING: 0, RUNNING: 0, COMPLETED: 0, FAILED: 0, INTERRUPTED: 0}
        durations: list[float] = []
        cost_known = False
        for task in self.state.tasks.values():
            counts[task.state] = counts.get(task.state, 0) + 1
            if task.state in (COMPLETED, FAILED):
                if task.duration_s:
                    durations.append(task.duration_s)
                if task.cost_usd is not None:
                    cost_known = True
        counts["avg"] = statistics.fmean(durations) if durations else None
        counts["cost_known"] = cost_known
        self._summary_cache = (self.version, counts)
        return counts


def _activity_from_state(task: TaskState, prompt: str) -> str:
    if task.state == FAILED:
        return f"{task.error_type or 'error'}: {first_line(task.message)}"
    if task.state == COMPLETED:
        return f"done → {task.branch_final}" if task.branch_final else "done (no branch)"
    if task.state == RUNNING:
        return prompt or f"running {task.model or ''}".rstrip()
    if task.state == INTERRUPTED:
        return "interrupted"
    return f"queued: {prompt}" if prompt else "queued"


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
