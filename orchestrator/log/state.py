"""Run state as a pure fold of events, and its snapshots (docs/architecture.md, "Durability").

This is the one fold of a run's log: the engine, the dashboard, the console, the report and its
spend chart all read a :class:`RunState`, never fold the events again. Each payload type has one
apply function (:data:`_ON_TASK`, :data:`_ON_RUN`); an older log's payload reaches it through its
type's upcast (:data:`events.UPCASTS`). A task's counters move only on a non-terminal -> terminal
change, and an event at or before ``last_event_start_offset`` is ignored, so replaying events a
snapshot already reflects never double counts (tests/test_state_fold.py checks that a snapshot
plus the rest of the log gives exactly a full replay's state). A snapshot's tasks are decoded
only as they are used (:class:`TaskTable`), so a resume costs the same at ten tasks and at
three hundred thousand.

The fold mutates one state object in place instead of copying a frozen record
per event: replaying a million events must stay well above 200k events/s.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import threading
import zlib
from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, MutableMapping, ValuesView
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET

from ..errors import SnapshotError
from . import events as E
from .eventlog import LogReader
from .events import EventPayload, PayloadMismatch, Progress, decode_payload, ran_command

PENDING, RUNNING, COMPLETED, FAILED, INTERRUPTED = "PENDING", "RUNNING", "COMPLETED", "FAILED", "INTERRUPTED"
TERMINAL = frozenset({COMPLETED, FAILED})


class Attempt(msgspec.Struct, array_like=True, gc=False):
    """One attempt of a task: ``outcome`` is running, completed, failed or interrupted."""

    start: str
    end: str | None = None
    outcome: str = "running"


# gc=False: a run holds one per task, and with hundreds of thousands of them the
# cyclic collector's passes tripled replay and snapshot decode times. A task's
# fields are scalars and JSON-decoded input, which cannot reference it back.
class TaskState(msgspec.Struct, kw_only=True, gc=False):
    key: str
    instance_id: str
    strategy_execution_id: str
    # Scheduling order: snapshots store tasks sorted by key (for lookup without
    # decoding), and this restores the order a full replay gives.
    seq: int = 0
    state: str = PENDING
    fingerprint: str = ""
    input: dict[str, Any] = msgspec.field(default_factory=dict)
    runs_command: bool = False  # a command, not an agent (task.scheduled's, upcast for an older log)
    model: str | None = None
    scheduled_at: str | None = None
    started_at: str | None = None
    completed_at: str | None = None
    interrupted_at: str | None = None
    branch_name: str | None = None
    container_name: str | None = None
    session_id: str | None = None
    session_group_key: str | None = None
    # Offset of the terminal event: its payload is the recorded result, read on demand.
    result_offset: int | None = None
    error_type: str | None = None
    message: str | None = None
    cost_usd: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    duration_s: float = 0.0
    branch_final: str | None = None
    attempts: int = 0
    # Files the agent left uncommitted, and whether the runner committed them.
    uncommitted_files: int = 0
    auto_committed: bool = False
    # Its attempts, each from its task.started (or, failed before it started, its end) to its end:
    # the latest, and those before it (None: there were none; most tasks have one attempt,
    # and a list per task would cost every replay the collector's passes over it).
    attempt: Attempt | None = None
    earlier_attempts: list[Attempt] | None = None
    # The Docker host of its latest start (runner.hosts), and why it moved since to ``host``, if it did.
    host: str | None = None
    moved: str | None = None
    interrupted_reason: str | None = None  # "crash": found running by a resume
    # What the completed task's branch changed, and the line of its final message a person reads first.
    has_changes: bool = False
    lines_added: int = 0
    lines_deleted: int = 0
    final_line: str = ""

    def spans(self) -> list[Attempt]:
        if self.attempt is None:
            return []
        return [*(self.earlier_attempts or ()), self.attempt]

    def _begin_attempt(self, attempt: Attempt) -> None:
        if self.attempt is not None:
            if self.earlier_attempts is None:
                self.earlier_attempts = []
            self.earlier_attempts.append(self.attempt)
        self.attempt = attempt


# Lines a strategy's command task prints for its strategy (``@@orch-run ...``,
# ``@@evolve end ...``): the strategy parses them, a person never reads them.
PROTOCOL_PREFIX = "@@"
FIRST_LINE_LIMIT = 240


def first_line(text: Any, limit: int = FIRST_LINE_LIMIT) -> str:
    """The first non-blank line of ``text`` a person should read (marker lines skipped), cut to ``limit``."""
    if not isinstance(text, str):
        return ""
    one = text.lstrip()
    if len(one) <= limit and one.isprintable():  # one short line (a break is unprintable): the common case
        return "" if one.startswith(PROTOCOL_PREFIX) else one.rstrip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(PROTOCOL_PREFIX):
            return line[:limit]
    return ""


class StrategyState(msgspec.Struct, kw_only=True):
    id: str
    name: str = ""
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    status: str = "running"  # running | success | failed | canceled
    started_at: str | None = None
    completed_at: str | None = None
    result: Any = None
    error: str | None = None
    checkpoints: list[Any] = msgspec.field(default_factory=list)
    # The latest record the strategy published with ctx.progress(): display only.
    progress: Progress | None = None
    # Tasks that completed but whose result the strategy could not use, the reason it failed
    # (a base evaluation that cannot be used): no reader shows them as a success.
    unusable_keys: list[str] = msgspec.field(default_factory=list)


class Counters(msgspec.Struct, kw_only=True):
    scheduled: int = 0
    completed: int = 0
    failed: int = 0
    interrupted: int = 0
    cost_usd: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0


class TaskTable(MutableMapping[str, TaskState]):
    """The run's tasks by key, decoded from a snapshot only as they are used.

    A table loaded from a snapshot keeps the snapshot's task records undecoded
    and decodes one on first lookup, so resuming a run of hundreds of thousands
    of tasks costs the same as resuming one of ten. Iterating decodes the rest
    once (so does a long series of lookups, where one bulk decode is cheaper).
    Decoded and new tasks live in an ordinary dict: those are the objects the
    fold mutates.
    """

    def __init__(self, tasks: dict[str, TaskState] | None = None, *, base: _SnapshotTasks | None = None) -> None:
        self._live: dict[str, TaskState] = tasks if tasks is not None else {}
        self._base = base
        # where each key decoded from the base sits in it: re-encoding copies around them
        self._spans: dict[str, tuple[int, int]] = {}
        self._added = 0  # keys in _live that the base does not hold
        self._lookups = 0
        self._last_miss: str | None = None
        # what the snapshot's tasks are when a record turns out not to decode (set by recover())
        self.fallback: Callable[[], dict[str, TaskState]] | None = None

    def _lookup(self, key: str) -> TaskState | None:
        task = self._live.get(key)
        base = self._base
        if task is not None or base is None:
            return task
        self._lookups += 1
        if self._lookups + self._added > base.bulk_after:
            self.load_all()
            return self._live.get(key)
        try:
            found, start, end = base.locate(_key_encoder.encode(key))
            task = _task_decoder.decode(base.buf[start:end]) if found else None
        except (SnapshotError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._rebuild(exc)
            return self._live.get(key)
        if task is None:
            self._last_miss = key
            return None
        self._live[key] = task
        self._spans[key] = (start, end)
        return task

    def __getitem__(self, key: str) -> TaskState:
        task = self._lookup(key)
        if task is None:
            raise KeyError(key)
        return task

    def get(self, key: str, default: Any = None) -> Any:
        task = self._lookup(key)
        return default if task is None else task

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._lookup(key) is not None

    def __setitem__(self, key: str, task: TaskState) -> None:
        if self._base is not None and key not in self._live and (key == self._last_miss or self._lookup(key) is None):
            self._added += 1
        self._live[key] = task

    def __delitem__(self, key: str) -> None:
        self.load_all()
        del self._live[key]

    def __len__(self) -> int:
        if self._base is None:
            return len(self._live)
        return self._base.count + self._added

    def __iter__(self) -> Iterator[str]:
        self.load_all()
        return iter(self._live)

    def keys(self) -> KeysView[str]:
        self.load_all()
        return self._live.keys()

    def values(self) -> ValuesView[TaskState]:
        self.load_all()
        return self._live.values()

    def items(self) -> ItemsView[str, TaskState]:
        self.load_all()
        return self._live.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TaskTable):
            other.load_all()
            other = other._live
        self.load_all()
        return self._live == other

    def __repr__(self) -> str:
        lazy = f", {self._base.count} in the snapshot" if self._base is not None else ""
        return f"TaskTable({len(self._live)} decoded{lazy})"

    @property
    def lazy(self) -> bool:
        """Whether some tasks are still undecoded in the snapshot."""
        return self._base is not None

    def unfinished(self) -> list[TaskState]:
        """Tasks not COMPLETED or FAILED, in scheduling order."""
        if self._base is not None:
            for key in self._base.open_keys:
                self._lookup(key)
        # an undecoded task is finished: the snapshot lists every other key in open_keys
        return sorted((t for t in self._live.values() if t.state not in TERMINAL), key=_by_seq)

    def load_all(self) -> None:
        """Decode every task the snapshot still holds (once); order is scheduling order."""
        base = self._base
        if base is None:
            return
        try:
            merged = base.decode_all()
        except (SnapshotError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._rebuild(exc)
            return
        self._merge(merged)

    def close(self) -> None:
        """Let go of the snapshot's memory map; tasks still undecoded in it are dropped (a state being discarded)."""
        base, self._base = self._base, None
        if base is not None:
            base.close()

    def _rebuild(self, exc: Exception) -> None:
        """A record passed the load-time check but does not decode: take the tasks from the log."""
        if self.fallback is None:
            raise SnapshotError(
                f"a task record does not decode ({exc}); delete the snapshot to rebuild it from events.jsonl"
            ) from None
        self._merge(self.fallback())

    def _merge(self, merged: dict[str, TaskState]) -> None:
        """Hold every task in ``_live`` from now on: ``merged`` are the snapshot's, and the memory map goes."""
        merged.update(self._live)  # decoded tasks carry every event folded since the load
        self._live = dict(sorted(merged.items(), key=lambda kv: kv[1].seq))
        self._spans = {}
        self._added = 0
        self.close()


def _by_seq(task: TaskState) -> int:
    return task.seq


class HostState(msgspec.Struct, kw_only=True):
    """One Docker host of ``runner.hosts``, as the latest ``hosts.status`` described it."""

    max_parallel: int = 0
    down: bool = False
    reason: str | None = None


class BudgetState(msgspec.Struct, kw_only=True):
    """The run's spending cap and what it has spent, folded from ``budget.*`` events."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None
    on_reached: str = "finish"
    spent_cost_usd: float = 0.0
    spent_tokens: int = 0
    # task key -> [tokens, cost_usd]: its spend so far (live while it runs)
    by_task: dict[str, list[float]] = msgspec.field(default_factory=dict)
    reached: bool = False
    reached_at: str | None = None
    # Over time, for the report's chart: when the first budget event was written, the USD spent
    # after each task's spend changed, and each USD cap a start or resume set.
    first_at: str | None = None
    spent_over_time: list[tuple[str, float]] = msgspec.field(default_factory=list)
    caps_over_time: list[tuple[str, float]] = msgspec.field(default_factory=list)


class RunState(msgspec.Struct, kw_only=True):
    run_id: str
    last_event_start_offset: int = -1
    tasks: TaskTable = msgspec.field(default_factory=TaskTable)
    strategies: dict[str, StrategyState] = msgspec.field(default_factory=dict)
    counters: Counters = msgspec.field(default_factory=Counters)
    # The Docker hosts of the current process, by name (empty without runner.hosts).
    hosts: dict[str, HostState] = msgspec.field(default_factory=dict)
    # From run.started: a dry run, and the start-up warnings of every start and resume.
    dry_run: bool = False
    warnings: list[str] = msgspec.field(default_factory=list)
    # The spending cap and the spend (None: the run has no cap and never had one).
    budget: BudgetState | None = None
    # How long the run has run, over all its sessions (a start and each resume): the seconds of
    # the sessions before the current one, when the current one started, and its latest event.
    earlier_sessions_s: float = 0.0
    session_started_at: str | None = None
    last_event_at: str | None = None

    # -- convenience views
    def unfinished(self) -> list[TaskState]:
        """Tasks not COMPLETED or FAILED, in scheduling order (decodes only those)."""
        return self.tasks.unfinished()

    def running(self) -> list[TaskState]:
        return [t for t in self.tasks.unfinished() if t.state == RUNNING]

    def duration_s(self) -> float:
        """Seconds the run has run: each session from its start to its last event, summed.

        A resume a day later adds its own time, not the day between. Every
        reader (the console summary, ``summary.json``, the report) quotes this.
        """
        current = _seconds_between(self.session_started_at, self.last_event_at)
        return round(self.earlier_sessions_s + current, 3)


# What a run came to, in the one word every reader uses: --list-runs, the --show-run header,
# summary.json, report.html and the summary the run prints.
LIVE, OUTCOME_INTERRUPTED, OUTCOME_BUDGET_REACHED, OUTCOME_FAILED, OUTCOME_COMPLETED = (
    "live",
    "interrupted",
    "budget_reached",
    "failed",
    "completed",
)
# The outcomes of a run that ended and cannot go on: --resume has nothing to do for them.
FINISHED_OUTCOMES = (OUTCOME_COMPLETED, OUTCOME_FAILED)


def run_outcome(state: RunState, *, live: bool = False) -> str:
    """The run's status, decided from the fold alone (``live``: a process is writing its log now).

    - ``live``: a process is running it;
    - ``interrupted``: a strategy execution has not finished and nothing stopped it
      on purpose (Ctrl+C, kill -9, a full disk): ``--resume`` goes on;
    - ``budget_reached``: the spending cap stopped an execution (or, with
      ``on_reached: stop``, the whole run): ``--resume`` with a higher cap goes on;
    - ``failed``: every execution ended and one failed (a base evaluation that cannot be
      used, no viable candidate because every task failed, an exception);
    - ``completed``: every execution ended and succeeded.
    """
    if live:
        return LIVE
    statuses = [s.status for s in state.strategies.values()]
    if not statuses or "running" in statuses:
        budget = state.budget
        if statuses and budget is not None and budget.reached and budget.on_reached == "stop":
            return OUTCOME_BUDGET_REACHED
        return OUTCOME_INTERRUPTED
    if OUTCOME_BUDGET_REACHED in statuses:
        return OUTCOME_BUDGET_REACHED
    if any(s != "success" for s in statuses):
        return OUTCOME_FAILED
    return OUTCOME_COMPLETED


# A task that completed but whose result its strategy could not use (a base evaluation that
# printed no metric, a base whose tests fail): the reason its strategy failed, so no reader shows
# it as a success. UNUSABLE_WORDS is how every reader says it.
UNUSABLE = "UNUSABLE"
UNUSABLE_WORDS = "ran, but its result cannot be used"


def task_outcome(state: RunState, task: TaskState) -> str:
    """The task's status as every reader shows it: its state, or :data:`UNUSABLE` for a completed
    task its strategy judged unusable (known once the strategy completed: until then it is COMPLETED).
    """
    if task.state == COMPLETED:
        strat = state.strategies.get(task.strategy_execution_id)
        if strat is not None and task.key in strat.unusable_keys:
            return UNUSABLE
    return task.state


def task_label(key: str, several: bool = False) -> str:
    """A task's readable key, as every reader names it: ``run/s1/e0001/plan`` -> ``e0001/plan``.

    With several strategy executions (``--runs N``) their tasks may share a
    key, so the execution leads: ``s2/e0001/plan``.
    """
    parts = key.split("/", 2)
    if len(parts) != 3:
        return key
    return f"{parts[1]}/{parts[2]}" if several else parts[2]


# Every dashboard frame asks when each task started and ended: the same few thousand timestamps, parsed once.
@functools.lru_cache(maxsize=1 << 14)
def parse_ts(ts: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 event timestamp (``...Z``); None when absent or malformed."""
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _seconds_between(start: str | None, end: str | None) -> float:
    if not start or not end:
        return 0.0
    try:
        a = datetime.fromisoformat(start.replace("Z", "+00:00"))
        b = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, (b - a).total_seconds())


# ---------------------------------------------------------------- the fold
#
# One apply function per payload type: the whole of that event type's effect
# on the state. Task events (those with a key) go through _ON_TASK, the rest
# through _ON_RUN; a type in neither changes nothing but the offset.

_Apply = Callable[["RunState", str, Any, Any, int, str], None]  # (state, sid, key, payload, offset, ts)
_ON_TASK: dict[type[EventPayload], _Apply] = {}
_ON_RUN: dict[type[EventPayload], _Apply] = {}


def _on(table: dict[type[EventPayload], _Apply], payload_type: type[EventPayload]) -> Callable[[_Apply], _Apply]:
    """Register ``fn`` as the apply function of ``payload_type``; it gets the payload in the current shape."""

    def register(fn: _Apply) -> _Apply:
        upcast = E.UPCASTS.get(payload_type)
        if upcast is None:
            table[payload_type] = fn
        else:  # an older log's payload of this type is read through its upcast

            def apply_current(state: RunState, sid: str, key: Any, p: Any, offset: int, ts: str) -> None:
                fn(state, sid, key, upcast(p), offset, ts)

            table[payload_type] = apply_current
        return fn

    return register


def apply(
    state: RunState,
    etype: str,
    sid: str,
    key: str | None,
    payload: EventPayload | Mapping[str, Any] | None,
    offset: int,
    ts: str,
) -> None:
    """Fold one event into ``state`` (idempotent for offsets already applied).

    ``payload`` is the event's struct (None: a type this version does not
    know). A plain mapping (a test's, a tool's) is decoded into its struct
    first; one that does not match its type changes nothing but the offset,
    as an unknown type does.
    """
    if offset <= state.last_event_start_offset:
        return
    state.last_event_start_offset = offset
    if state.session_started_at is None:
        state.session_started_at = ts  # a log from before run.started: one session from its first event
    if payload is not None and not isinstance(payload, EventPayload):
        try:
            payload = decode_payload(etype, payload)
        except PayloadMismatch:
            payload = None
    if payload is not None:
        fn = (_ON_RUN if key is None else _ON_TASK).get(type(payload))
        if fn is not None:
            fn(state, sid, key, payload, offset, ts)  # (key: None for the run's events)
    state.last_event_at = ts  # (after the apply: run.started reads the one before)


def _task(state: RunState, key: str) -> TaskState | None:
    """``state.tasks.get(key)`` in one call: every task event looks its task up, a million times in a long replay."""
    tasks = state.tasks
    task = tasks._live.get(key)
    return task if task is not None or tasks._base is None else tasks._lookup(key)


def _end_attempt(task: TaskState, ts: str, outcome: str) -> None:
    """The open attempt ends; a task that ends without one (failed before it started) gets a zero-length one."""
    attempt = task.attempt
    if attempt is not None and attempt.end is None:
        attempt.end, attempt.outcome = ts, outcome
    else:
        task._begin_attempt(Attempt(ts, ts, outcome))


def _finish(
    state: RunState, task: TaskState, p: E.TaskCompleted | E.TaskFailed, offset: int, ts: str, outcome: str
) -> None:
    """What a terminal event records of a task, success or failure alike: when, where, what it cost."""
    task.state = outcome
    _end_attempt(task, ts, outcome.lower())
    task.completed_at = ts
    task.result_offset = offset
    metrics = p.metrics or _NO_METRICS
    task.cost_usd = metrics.cost_usd
    task.tokens_in = metrics.tokens_in
    task.tokens_out = metrics.tokens_out
    task.duration_s = metrics.duration_s or 0.0
    if p.session_id:
        task.session_id = p.session_id
    c = state.counters
    c.cost_usd += task.cost_usd or 0.0
    c.tokens_in += task.tokens_in
    c.tokens_out += task.tokens_out
    if outcome == COMPLETED:
        c.completed += 1
    else:
        c.failed += 1


_NO_METRICS = E.Metrics()


@_on(_ON_TASK, E.TaskScheduled)
def _task_scheduled(state: RunState, sid: str, key: str, p: E.TaskScheduled, offset: int, ts: str) -> None:
    task = _task(state, key)
    if task is None:
        task = state.tasks[key] = TaskState(
            key=key, instance_id=p.instance_id, strategy_execution_id=sid, seq=state.counters.scheduled
        )
        state.counters.scheduled += 1
    task.fingerprint = p.task_fingerprint_hash
    if p.input is not UNSET:
        task.input = p.input
    task.runs_command = p.runs_command is True  # (an older log's is upcast: events.UPCASTS)
    task.model = p.model
    task.container_name = p.container_name
    task.branch_name = p.branch_name
    task.session_group_key = p.session_group_key
    task.scheduled_at = task.scheduled_at or ts
    if task.state == INTERRUPTED:
        task.state = PENDING


# A task event without its scheduled event is not ours to invent; none moves a finished task.


@_on(_ON_TASK, E.TaskStarted)
def _task_started(state: RunState, sid: str, key: str, p: E.TaskStarted, offset: int, ts: str) -> None:
    task = _task(state, key)
    if task is None or task.state in TERMINAL:
        return
    task.state = RUNNING
    task.started_at = ts
    task.interrupted_at = None
    task.attempts += 1
    task._begin_attempt(Attempt(ts))
    task.host = p.host or None
    task.moved = None
    if p.session_id:
        task.session_id = p.session_id


@_on(_ON_TASK, E.TaskCompleted)
def _task_completed(state: RunState, sid: str, key: str, p: E.TaskCompleted, offset: int, ts: str) -> None:
    task = _task(state, key)
    if task is None or task.state in TERMINAL:
        return
    artifact = p.artifact
    if artifact is not None:
        task.branch_final = artifact.branch_final
        task.uncommitted_files = artifact.uncommitted_files or 0
        task.auto_committed = artifact.auto_committed is True
        task.has_changes = artifact.has_changes
        task.lines_added = artifact.lines_added
        task.lines_deleted = artifact.lines_deleted
    task.final_line = first_line(p.final_message)
    _finish(state, task, p, offset, ts, COMPLETED)


@_on(_ON_TASK, E.TaskFailed)
def _task_failed(state: RunState, sid: str, key: str, p: E.TaskFailed, offset: int, ts: str) -> None:
    task = _task(state, key)
    if task is None or task.state in TERMINAL:
        return
    task.error_type = p.error_type
    task.message = p.message
    # a failed agent was paid for what it read and wrote: its tokens count as its cost does
    _finish(state, task, p, offset, ts, FAILED)


@_on(_ON_TASK, E.TaskSession)
def _task_session(state: RunState, sid: str, key: str, p: E.TaskSession, offset: int, ts: str) -> None:
    # Only a task that can still run again has a session worth keeping:
    # a finished task's session is the one its terminal event recorded.
    task = _task(state, key)
    if task is None or task.state in TERMINAL:
        return
    task.session_id = p.session_id or None
    if p.host:  # its host went away: it started afresh on this one
        task.host = p.host
        task.moved = p.reason or "session reset"


@_on(_ON_TASK, E.TaskInterrupted)
def _task_interrupted(state: RunState, sid: str, key: str, p: E.TaskInterrupted, offset: int, ts: str) -> None:
    task = _task(state, key)
    if task is None or task.state in TERMINAL or task.state == INTERRUPTED:
        return
    task.state = INTERRUPTED
    task.interrupted_at = ts
    task.interrupted_reason = p.reason or None
    _end_attempt(task, ts, "interrupted")
    if p.session_id:
        task.session_id = p.session_id
    state.counters.interrupted += 1


@_on(_ON_RUN, E.RunStarted)
def _run_started(state: RunState, sid: str, key: str, p: E.RunStarted, offset: int, ts: str) -> None:
    # A new session: the one before ended with its last event, and the time the run
    # was stopped in between counts for nothing. (Not read from ``resumed``, which
    # older versions wrote as true on a first start too.)
    state.earlier_sessions_s += _seconds_between(state.session_started_at, state.last_event_at)
    state.session_started_at = ts
    state.dry_run = p.dry_run
    for warning in p.warnings:
        if warning not in state.warnings:
            state.warnings.append(warning)


def _budget(state: RunState, ts: str) -> BudgetState:
    budget = state.budget
    if budget is None:
        budget = state.budget = BudgetState(first_at=ts)
    return budget


@_on(_ON_RUN, E.BudgetCap)
def _budget_cap(state: RunState, sid: str, key: str, p: E.BudgetCap, offset: int, ts: str) -> None:
    budget = _budget(state, ts)
    budget.max_cost_usd = p.max_cost_usd
    budget.max_tokens = p.max_tokens
    budget.on_reached = p.on_reached or "finish"
    budget.reached, budget.reached_at = False, None  # a new cap: the engine says again if it is reached
    if p.max_cost_usd is not None:
        budget.caps_over_time.append((ts, float(p.max_cost_usd)))


@_on(_ON_RUN, E.BudgetSpend)
def _budget_spend(state: RunState, sid: str, key: str, p: E.BudgetSpend, offset: int, ts: str) -> None:
    budget = _budget(state, ts)
    if p.task is None:
        return
    tokens, cost = p.tokens, float(p.cost_usd)
    old = budget.by_task.get(p.task) or [0, 0.0]
    budget.by_task[p.task] = [tokens, cost]
    budget.spent_tokens += tokens - int(old[0])
    budget.spent_cost_usd = round(budget.spent_cost_usd + cost - float(old[1]), 6)
    budget.spent_over_time.append((ts, budget.spent_cost_usd))


@_on(_ON_RUN, E.BudgetReached)
def _budget_reached(state: RunState, sid: str, key: str, p: E.BudgetReached, offset: int, ts: str) -> None:
    budget = _budget(state, ts)
    budget.reached, budget.reached_at = True, ts


@_on(_ON_RUN, E.HostsStatus)
def _hosts_status(state: RunState, sid: str, key: str, p: E.HostsStatus, offset: int, ts: str) -> None:
    # The whole table each time: a resume with other hosts replaces the old set.
    state.hosts = {
        h.name: HostState(max_parallel=h.max_parallel, down=h.down, reason=None if h.reason is UNSET else h.reason)
        for h in p.hosts
        if h.name
    }


@_on(_ON_RUN, E.StrategyStarted)
def _strategy_started(state: RunState, sid: str, key: str, p: E.StrategyStarted, offset: int, ts: str) -> None:
    strat = state.strategies.get(sid)
    if strat is None:
        strat = state.strategies[sid] = StrategyState(id=sid)
    strat.name = p.name or strat.name
    if p.params is not UNSET:
        strat.params = p.params
    strat.started_at = strat.started_at or ts


# A strategy event without its strategy.started is not ours to invent.


@_on(_ON_RUN, E.StrategyCheckpoint)
def _strategy_checkpoint(state: RunState, sid: str, key: str, p: E.StrategyCheckpoint, offset: int, ts: str) -> None:
    strat = state.strategies.get(sid)
    if strat is None:
        return
    # (a log from before checkpoints were numbered: each is the next one)
    seq = len(strat.checkpoints) if p.seq is UNSET else p.seq
    if seq == len(strat.checkpoints):
        strat.checkpoints.append(p.value)


@_on(_ON_RUN, E.Progress)
def _strategy_progress(state: RunState, sid: str, key: str, p: E.Progress, offset: int, ts: str) -> None:
    strat = state.strategies.get(sid)
    if strat is not None:
        strat.progress = p


@_on(_ON_RUN, E.StrategyCompleted)
def _strategy_completed(state: RunState, sid: str, key: str, p: E.StrategyCompleted, offset: int, ts: str) -> None:
    strat = state.strategies.get(sid)
    # budget_reached is final only until a resume with a higher cap finishes it
    if strat is None or strat.status not in ("running", "budget_reached"):
        return
    strat.status = p.status
    strat.completed_at = ts
    strat.result = None if p.result is UNSET else p.result
    strat.error = None if p.error is UNSET else p.error
    strat.unusable_keys = [] if p.unusable_keys is UNSET else list(p.unusable_keys)


def replay(
    path: Path,
    state: RunState | None = None,
    *,
    run_id: str = "",
    until: int | None = None,
    reader: LogReader | None = None,
) -> RunState:
    """Fold every complete event of ``path`` after the state's offset (up to ``until``) into ``state``.

    ``reader`` keeps the lines that were skipped (one is made if not given):
    those that are not events and those whose payload does not match its type.
    """
    state = state or RunState(run_id=run_id)
    start = state.last_event_start_offset + 1 if state.last_event_start_offset >= 0 else 0
    for offset, ev, payload in (reader or LogReader(path)).records(start, until=until):
        apply(state, ev.type, ev.strategy_execution_id, ev.key, payload, offset, ev.ts)
    return state


# ---------------------------------------------------------------- snapshots
#
# state.json is one JSON document laid out so that loading it does not decode
# every task. Line 1 holds everything but the tasks and ends in `"tasks":[`;
# then one task record per line, sorted by the JSON encoding of its key (each
# record starts with its key), joined by ",\n"; then `]}`. The header gives
# the byte length and CRC-32 of the task lines and the keys not yet finished.
# A load reads line 1 and checks the length and the closing bytes; a lookup
# bisects the lines of a memory map and decodes one. Snapshots are only ever
# replaced by rename, never rewritten in place, so a map of an old one stays
# valid.

# 3: tasks record runs_command; 4: their attempts, host, changes and final line, and the
# budget its spend over time. An older snapshot is not read (it lacks what the fold now
# keeps): the run is folded again from its log, which upcasts.
SNAPSHOT_SCHEMA = 4
_HEADER_END = b',"tasks":['
_TRAILER = b"]}\n"
_RECORD_START = b'{"key":'
# what follows the key in a record; a JSON string escapes `"`, so a key cannot contain it
_AFTER_KEY = b',"instance_id":'


class _SnapshotHeader(msgspec.Struct, kw_only=True):
    run_id: str
    last_event_start_offset: int = -1
    strategies: dict[str, StrategyState] = msgspec.field(default_factory=dict)
    counters: Counters = msgspec.field(default_factory=Counters)
    schema: int = SNAPSHOT_SCHEMA
    task_count: int = 0
    task_bytes: int = 0
    task_crc32: int = 0
    open_keys: list[str] = msgspec.field(default_factory=list)
    hosts: dict[str, HostState] = msgspec.field(default_factory=dict)
    budget: BudgetState | None = None
    earlier_sessions_s: float = 0.0
    session_started_at: str | None = None
    last_event_at: str | None = None


# The fields of a RunState its snapshot's header holds, beside the tasks.
_STATE_IN_HEADER = tuple(f for f in RunState.__struct_fields__ if f in _SnapshotHeader.__struct_fields__)


class _SnapshotDocument(msgspec.Struct, kw_only=True):
    """A snapshot of this schema decoded in one go."""

    tasks: list[TaskState] = msgspec.field(default_factory=list)


class _WholeSnapshot(msgspec.Struct, kw_only=True):
    """The layout before schema 2: a plain document with tasks by key."""

    run_id: str
    last_event_start_offset: int = -1
    tasks: dict[str, TaskState] = msgspec.field(default_factory=dict)
    strategies: dict[str, StrategyState] = msgspec.field(default_factory=dict)
    counters: Counters = msgspec.field(default_factory=Counters)


_encoder = msgspec.json.Encoder()
_key_encoder = msgspec.json.Encoder()
_header_decoder = msgspec.json.Decoder(_SnapshotHeader)
_document_decoder = msgspec.json.Decoder(_SnapshotDocument)
_whole_decoder = msgspec.json.Decoder(_WholeSnapshot)
_task_decoder = msgspec.json.Decoder(TaskState)


class _SnapshotTasks:
    """The task lines of one snapshot, in a memory map (or bytes), read on demand."""

    def __init__(
        self, buf: mmap.mmap | bytes, start: int, end: int, count: int, open_keys: list[str], crc32: int
    ) -> None:
        self.buf = buf
        self.start, self.end = start, end  # the task lines: buf[start:end], ending in "\n"
        self.count = count
        self.open_keys = open_keys
        self.crc32 = crc32
        self.intact: bool | None = None  # checksum not yet computed
        # past this many lookups the caller is walking the table: one bulk decode is cheaper
        self.bulk_after = max(1024, count // 64)

    def locate(self, ek: bytes) -> tuple[bool, int, int]:
        """(found, start, end) of the record whose encoded key is ``ek``; else where it would go."""
        buf = self.buf
        lo, hi = self.start, self.end
        while lo < hi:
            mid = (lo + hi) // 2
            ls = buf.rfind(b"\n", lo - 1, mid) + 1
            nl = buf.find(b"\n", mid)
            sep = buf.find(_AFTER_KEY, ls, nl)
            if sep < 0 or buf[ls : ls + len(_RECORD_START)] != _RECORD_START:
                raise SnapshotError(f"the task record at byte {ls} does not start with its key")
            k = buf[ls + len(_RECORD_START) : sep]
            if k == ek:
                return True, ls, nl - 1 if buf[nl - 1] == 0x2C else nl  # without the "," separator
            if k < ek:
                lo = nl + 1
            else:
                hi = ls
        return False, lo, lo

    def check(self) -> None:
        """Checksum the task lines (once): before they are copied into a new snapshot or decoded.

        Not at load: that would cost as much as decoding. A record looked up
        before this is only as sure as the load-time structural check.
        """
        if self.intact is None:
            with memoryview(self.buf) as view:
                self.intact = zlib.crc32(view[self.start : self.end]) == self.crc32
        if not self.intact:
            raise SnapshotError("the task lines do not match their checksum")

    def decode_all(self) -> dict[str, TaskState]:
        self.check()
        with memoryview(self.buf) as view:
            tasks = _document_decoder.decode(view).tasks
        tasks.sort(key=_by_seq)
        return {t.key: t for t in tasks}

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap):
            self.buf.close()


def _task_lines(tasks: list[TaskState]) -> list[bytes | memoryview]:
    """Records one per line, joined by ",\n" (a JSON encoding has no raw newline inside)."""
    if not tasks:
        return []
    body = _encoder.encode_lines(tasks).replace(b"\n", b",\n")
    return [memoryview(body)[:-2], b"\n"]  # the last ",\n" becomes "\n" without a copy


def encode_snapshot(state: RunState) -> bytes:
    """state.json's bytes for ``state``; tasks still undecoded are copied, not re-encoded."""
    try:
        return _encode_snapshot(state)
    except SnapshotError as exc:  # the base fails its checksum, or a record near an insertion
        state.tasks._rebuild(exc)
        return _encode_snapshot(state)


def _encode_snapshot(state: RunState) -> bytes:
    table = state.tasks
    base = table._base
    live = table._live
    if base is None:
        pieces = _task_lines(sorted(live.values(), key=lambda t: _key_encoder.encode(t.key)))
        open_keys = sorted(k for k, t in live.items() if t.state not in TERMINAL)
    else:
        base.check()
        buf = base.buf
        pieces = []
        pos = base.start
        for ek, k in sorted((_key_encoder.encode(k), k) for k in live):
            line = _encoder.encode(live[k])
            span = table._spans.get(k)
            if span is not None:  # decoded from the base: replace its line in place
                pieces += (buf[pos : span[0]], line)
                pos = span[1]
                continue
            _, at, _ = base.locate(ek)  # new: insert before the first greater key
            if at < base.end:
                pieces += (buf[pos:at], line + b",\n")
                pos = at
            else:
                pieces += (buf[pos : base.end - 1], b",\n" + line)
                pos = base.end - 1
        pieces.append(buf[pos : base.end])
        still_open = {k for k in base.open_keys if k not in live}
        still_open.update(k for k, t in live.items() if t.state not in TERMINAL)
        open_keys = sorted(still_open)
    crc = 0
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    header = _encoder.encode(
        _SnapshotHeader(
            **{name: getattr(state, name) for name in _STATE_IN_HEADER},
            task_count=len(table),
            task_bytes=sum(len(p) for p in pieces),
            task_crc32=crc,
            open_keys=open_keys,
        )
    )
    return b"".join((header[:-1], _HEADER_END, b"\n", *pieces, _TRAILER))


# A torn write can end inside a multibyte character: invalid UTF-8 is
# UnicodeDecodeError, not msgspec's DecodeError, and is just as unreadable.
_UNREADABLE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)


def decode_snapshot(buf: mmap.mmap | bytes) -> RunState:
    """A :class:`RunState` over snapshot bytes; tasks are decoded as they are used.

    Raises :class:`SnapshotError` when the layout does not check out: the
    header, the byte length it declares, the closing bytes, and the first and
    last task records.
    """
    nl = buf.find(b"\n")
    if nl < 0 or buf[nl - len(_HEADER_END) : nl] != _HEADER_END:
        return _decode_whole(bytes(buf))
    try:
        header = _header_decoder.decode(buf[: nl - len(_HEADER_END)] + b"}")
    except _UNREADABLE as exc:
        raise SnapshotError(f"header: {exc}") from None
    start, end = nl + 1, nl + 1 + header.task_bytes
    if header.schema != SNAPSHOT_SCHEMA:
        raise SnapshotError(f"written by another version (schema {header.schema}, not {SNAPSHOT_SCHEMA})")
    if len(buf) != end + len(_TRAILER) or buf[end:] != _TRAILER:
        raise SnapshotError("the length or closing bytes do not match the header (torn or edited)")
    if (header.task_count == 0) != (header.task_bytes == 0) or (header.task_bytes and buf[end - 1] != 0x0A):
        raise SnapshotError("the task lines do not match the header")
    state = RunState(**{name: getattr(header, name) for name in _STATE_IN_HEADER})
    if not header.task_count:
        return state
    try:  # the ends of the task lines: the cheap part of a structural check
        _task_decoder.decode(buf[start : buf.find(b"\n", start)].rstrip(b","))
        _task_decoder.decode(buf[buf.rfind(b"\n", start - 1, end - 1) + 1 : end - 1])
    except _UNREADABLE as exc:
        raise SnapshotError(f"task records: {exc}") from None
    state.tasks = TaskTable(
        base=_SnapshotTasks(buf, start, end, header.task_count, header.open_keys, header.task_crc32)
    )
    return state


def _decode_whole(data: bytes) -> RunState:
    try:
        whole = _whole_decoder.decode(data)
    except _UNREADABLE as exc:
        raise SnapshotError(str(exc)) from None
    for i, task in enumerate(whole.tasks.values()):
        task.seq = i
        task.runs_command = ran_command(task.input.get("plugin_name"))  # (not recorded then)
    return RunState(
        run_id=whole.run_id,
        last_event_start_offset=whole.last_event_start_offset,
        tasks=TaskTable(whole.tasks),
        strategies=whole.strategies,
        counters=whole.counters,
    )


def write_snapshot_bytes(data: bytes, paths: list[Path]) -> None:
    """Atomic write (temp file + fsync + rename) to each path; the first is primary."""
    for i, path in enumerate(paths):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # unique per writer: two processes (say, two --resume racing for the lock) may
            # write the same file, and a shared temp name would make one rename fail
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            if i == 0:
                _fsync_dir(path.parent)
        except OSError:
            if i == 0:
                raise  # the duplicate is best-effort, the primary is not


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load_snapshot(paths: list[Path], *, log_size: int | None = None) -> RunState | None:
    """The first snapshot that checks out (and does not point past the log's end)."""
    for path in paths:
        try:
            state = _open_snapshot(path)
        except (OSError, ValueError):
            continue
        if log_size is not None and state.last_event_start_offset >= log_size:
            state.tasks.close()
            continue  # points at events the log does not have: not trustworthy
        return state
    return None


def _open_snapshot(path: Path) -> RunState:
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            raise SnapshotError("empty")
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        state = decode_snapshot(buf)
    except BaseException:
        buf.close()
        raise
    if not state.tasks.lazy:
        buf.close()
    return state


def recover(run_id: str, events_path: Path, snapshot_paths: list[Path]) -> RunState:
    """Snapshot (primary, then duplicate) plus the log tail; full replay if neither loads."""
    size = events_path.stat().st_size if events_path.exists() else 0
    state = load_snapshot(snapshot_paths, log_size=size) or RunState(run_id=run_id)
    if state.tasks.lazy:
        upto = state.last_event_start_offset
        state.tasks.fallback = lambda: replay(events_path, run_id=run_id, until=upto).tasks._live
    return replay(events_path, state, run_id=run_id)
