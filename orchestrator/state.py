"""Run state as a pure fold of events, and its snapshots.

:func:`apply` moves a :class:`RunState` forward by one event. Transitions are
guarded: a task's counters move only on a non-terminal -> terminal change, and
an event at or before ``last_event_start_offset`` is ignored, so replaying
events that a snapshot already reflects never double counts. A snapshot is the
state's JSON encoding; loading a snapshot and folding the rest of the log gives
exactly the state a full replay gives (tests/test_state.py checks this).

The fold mutates one state object in place instead of copying a frozen record
per event: replaying a million events must stay well above 200k events/s.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import msgspec

from .eventlog import iter_lines
from .events import (
    STRATEGY_CHECKPOINT,
    STRATEGY_COMPLETED,
    STRATEGY_STARTED,
    TASK_COMPLETED,
    TASK_FAILED,
    TASK_INTERRUPTED,
    TASK_SCHEDULED,
    TASK_STARTED,
    Event,
    decode_line,
)

PENDING, RUNNING, COMPLETED, FAILED, INTERRUPTED = "PENDING", "RUNNING", "COMPLETED", "FAILED", "INTERRUPTED"
TERMINAL = frozenset({COMPLETED, FAILED})


class TaskState(msgspec.Struct, kw_only=True):
    key: str
    instance_id: str
    strategy_execution_id: str
    state: str = PENDING
    fingerprint: str = ""
    input: dict[str, Any] = msgspec.field(default_factory=dict)
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


class Counters(msgspec.Struct, kw_only=True):
    scheduled: int = 0
    completed: int = 0
    failed: int = 0
    interrupted: int = 0
    cost_usd: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0


class RunState(msgspec.Struct, kw_only=True):
    run_id: str
    last_event_start_offset: int = -1
    tasks: dict[str, TaskState] = msgspec.field(default_factory=dict)
    strategies: dict[str, StrategyState] = msgspec.field(default_factory=dict)
    counters: Counters = msgspec.field(default_factory=Counters)
    schema: int = 1

    # -- convenience views
    def running(self) -> list[TaskState]:
        return [t for t in self.tasks.values() if t.state == RUNNING]

    def unfinished_strategies(self) -> list[StrategyState]:
        return [s for s in self.strategies.values() if s.status == "running"]


def apply(state: RunState, etype: str, sid: str, key: str | None, payload: dict[str, Any],
          offset: int, ts: str) -> None:
    """Fold one event into ``state`` (idempotent for offsets already applied)."""
    if offset <= state.last_event_start_offset:
        return
    state.last_event_start_offset = offset
    if key is not None:
        task = state.tasks.get(key)
        if etype == TASK_SCHEDULED:
            if task is None:
                task = state.tasks[key] = TaskState(key=key, instance_id=payload["instance_id"],
                                                    strategy_execution_id=sid)
                state.counters.scheduled += 1
            task.fingerprint = payload.get("task_fingerprint_hash", "")
            task.input = payload.get("input", task.input)
            task.model = payload.get("model")
            task.container_name = payload.get("container_name")
            task.branch_name = payload.get("branch_name")
            task.session_group_key = payload.get("session_group_key")
            task.scheduled_at = task.scheduled_at or ts
            if task.state == INTERRUPTED:
                task.state = PENDING
            return
        if task is None:  # a task event without its scheduled event: not ours to invent
            return
        if etype == TASK_STARTED:
            if task.state not in TERMINAL:
                task.state = RUNNING
                task.started_at = ts
                task.interrupted_at = None
                task.attempts += 1
                if payload.get("session_id"):
                    task.session_id = payload["session_id"]
        elif etype == TASK_COMPLETED:
            if task.state not in TERMINAL:
                task.state = COMPLETED
                task.completed_at = ts
                task.result_offset = offset
                metrics = payload.get("metrics") or {}
                artifact = payload.get("artifact") or {}
                task.cost_usd = metrics.get("cost_usd")
                task.tokens_in = metrics.get("tokens_in", 0) or 0
                task.tokens_out = metrics.get("tokens_out", 0) or 0
                task.duration_s = metrics.get("duration_s", 0.0) or 0.0
                task.branch_final = artifact.get("branch_final")
                if payload.get("session_id"):
                    task.session_id = payload["session_id"]
                c = state.counters
                c.completed += 1
                c.cost_usd += task.cost_usd or 0.0
                c.tokens_in += task.tokens_in
                c.tokens_out += task.tokens_out
        elif etype == TASK_FAILED:
            if task.state not in TERMINAL:
                task.state = FAILED
                task.completed_at = ts
                task.result_offset = offset
                task.error_type = payload.get("error_type")
                task.message = payload.get("message")
                metrics = payload.get("metrics") or {}
                task.cost_usd = metrics.get("cost_usd")
                task.duration_s = metrics.get("duration_s", 0.0) or 0.0
                if payload.get("session_id"):
                    task.session_id = payload["session_id"]
                state.counters.failed += 1
                state.counters.cost_usd += task.cost_usd or 0.0
        elif etype == TASK_INTERRUPTED:
            if task.state not in TERMINAL and task.state != INTERRUPTED:
                task.state = INTERRUPTED
                task.interrupted_at = ts
                if payload.get("session_id"):
                    task.session_id = payload["session_id"]
                state.counters.interrupted += 1
        return
    strat = state.strategies.get(sid)
    if etype == STRATEGY_STARTED:
        if strat is None:
            strat = state.strategies[sid] = StrategyState(id=sid)
        strat.name = payload.get("name", strat.name)
        strat.params = payload.get("params", strat.params)
        strat.started_at = strat.started_at or ts
    elif strat is None:
        return
    elif etype == STRATEGY_CHECKPOINT:
        seq = payload.get("seq", len(strat.checkpoints))
        if seq == len(strat.checkpoints):
            strat.checkpoints.append(payload.get("value"))
    elif etype == STRATEGY_COMPLETED:
        if strat.status == "running":
            strat.status = payload.get("status", "success")
            strat.completed_at = ts
            strat.result = payload.get("result")
            strat.error = payload.get("error")


def apply_event(state: RunState, ev: Event) -> None:
    apply(state, ev.type, ev.strategy_execution_id, ev.key, ev.payload, ev.start_offset, ev.ts)


def replay(path: Path, state: RunState | None = None, *, run_id: str = "") -> RunState:
    """Fold every complete event of ``path`` after the state's offset into ``state``."""
    state = state or RunState(run_id=run_id)
    if not Path(path).exists():
        return state
    start = state.last_event_start_offset + 1 if state.last_event_start_offset >= 0 else 0
    for offset, line in iter_lines(Path(path), start):
        try:
            ev = decode_line(line)
        except msgspec.DecodeError:
            continue
        apply(state, ev.type, ev.strategy_execution_id, ev.key, ev.payload, offset, ev.ts)
    return state


# ---------------------------------------------------------------- snapshots

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RunState)


def encode_snapshot(state: RunState) -> bytes:
    return _encoder.encode(state)


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
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_snapshot(paths: list[Path], *, log_size: int | None = None) -> RunState | None:
    """The first snapshot that decodes (and does not point past the log's end)."""
    for path in paths:
        try:
            state = _decoder.decode(path.read_bytes())
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            continue
        if log_size is not None and state.last_event_start_offset >= log_size:
            continue  # points at events the log does not have: not trustworthy
        return state
    return None


def recover(run_id: str, events_path: Path, snapshot_paths: list[Path]) -> RunState:
    """Snapshot (primary, then duplicate) plus the log tail; full replay if neither loads."""
    size = events_path.stat().st_size if events_path.exists() else 0
    state = load_snapshot(snapshot_paths, log_size=size) or RunState(run_id=run_id)
    return replay(events_path, state, run_id=run_id)
