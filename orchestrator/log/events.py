"""The public event record and its one codec (every type and payload field: docs/events.md).

Every line of ``logs/<run_id>/events.jsonl`` is one :class:`Event`; ``start_offset`` is the byte
position where the line starts, so ``f.seek(e.start_offset); f.readline()`` returns exactly that
event. A ``strategy.progress`` record is an output for people watching, never an input: it is
not replayed, and a resumed run may publish it again.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import msgspec
import orjson
from msgspec import UNSET, UnsetType

TASK_SCHEDULED = "task.scheduled"
TASK_STARTED = "task.started"
TASK_COMPLETED = "task.completed"
TASK_FAILED = "task.failed"
TASK_INTERRUPTED = "task.interrupted"
TASK_SESSION = "task.session"
STRATEGY_STARTED = "strategy.started"
STRATEGY_COMPLETED = "strategy.completed"
STRATEGY_CHECKPOINT = "strategy.checkpoint"
STRATEGY_PROGRESS = "strategy.progress"
HOSTS_STATUS = "hosts.status"
RUN_STARTED = "run.started"
BUDGET_CAP = "budget.cap"
BUDGET_SPEND = "budget.spend"
BUDGET_REACHED = "budget.reached"

TERMINAL_TASK_TYPES = frozenset({TASK_COMPLETED, TASK_FAILED, TASK_INTERRUPTED})


P = TypeVar("P", dict[str, Any], msgspec.Raw)


class Event(msgspec.Struct, Generic[P], frozen=True, kw_only=True, omit_defaults=True):
    id: str
    type: str
    ts: str
    run_id: str
    strategy_execution_id: str
    start_offset: int
    payload: P
    key: str | None = None

    def typed(self) -> EventPayload | None:
        """This event's payload as its type's struct (see :func:`decode_payload`)."""
        return decode_payload(self.type, self.payload)


# An event whose payload is still JSON: the log's consumers decode it straight into its struct.
# (Decoding the payload to a dict and then converting it costs a third more when a resume folds
# a million events.)
Envelope = Event[msgspec.Raw]
_decoder = msgspec.json.Decoder(Event[dict[str, Any]])
_envelope_decoder = msgspec.json.Decoder(Envelope)
_object_decoder = msgspec.json.Decoder(dict[str, Any])


# ---------------------------------------------------------------- payloads
#
# One frozen struct per event type (PAYLOAD_TYPES maps each type to it). The
# producers build these and the fold, the dashboard, the report and replay read
# them, so a field's name and type are written down once. The JSON is what it
# was when payloads were dicts: fields are declared in the order the engine
# writes them, a field some payloads leave out is UNSET when absent (so it is
# left out again, and an old log's payload re-encodes to the same JSON), and
# every field has a default, so a payload from an older version, a hand-written
# one or one a test builds with only the fields it needs still decodes.


class EventPayload(msgspec.Struct, frozen=True, kw_only=True):
    """The base of every payload struct."""


class TaskPayload(EventPayload, frozen=True, kw_only=True):
    """The base of a task event's payload: the task it is about (its fields come first in the JSON)."""

    key: str = ""
    instance_id: str = ""


class TaskScheduled(TaskPayload, frozen=True, kw_only=True):
    container_name: str | None = None
    model: str | None = None
    task_fingerprint_hash: str = ""
    branch_name: str | None = None
    session_group_key: str | None = None
    plugin: str | UnsetType = UNSET
    # It runs a command, not an agent (its plugin's ``runs_command``): nothing to price, no model to show.
    runs_command: bool | UnsetType = UNSET
    input: dict[str, Any] | UnsetType = UNSET  # the normalized task input that was fingerprinted


class TaskStarted(TaskPayload, frozen=True, kw_only=True):
    container_name: str | None = None
    model: str | None = None
    session_id: str | None = None  # the agent session it resumes
    host: str | UnsetType = UNSET  # with runner.hosts: the Docker host it was placed on


class TaskSession(TaskPayload, frozen=True, kw_only=True):
    """The agent session of a running task; ``session_id`` None: it starts a fresh one, for ``reason``."""

    session_id: str | None = None
    reason: str | UnsetType | None = UNSET
    detail: str | UnsetType | None = UNSET
    previous_session_id: str | UnsetType | None = UNSET
    host: str | UnsetType = UNSET  # where the task runs now (host_down, host_gone)
    error_type: str | UnsetType = UNSET


class Artifact(msgspec.Struct, frozen=True, kw_only=True):
    """What a completed task left: its branch and the change on it."""

    type: str = "branch"
    branch_planned: str | None = None
    branch_final: str | None = None
    base: str | None = None
    commit: str | None = None
    has_changes: bool = False
    commit_count: int = 0
    lines_added: int = 0
    lines_deleted: int = 0
    # (UNSET: a log from before they were recorded)
    uncommitted_files: int | UnsetType = UNSET
    auto_committed: bool | UnsetType = UNSET


class Metrics(msgspec.Struct, frozen=True, kw_only=True):
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None  # None: unknown
    duration_s: float | UnsetType = UNSET  # (UNSET: not recorded, which the console shows as unknown)


class TaskCompleted(TaskPayload, frozen=True, kw_only=True):
    artifact: Artifact | None = None
    metrics: Metrics | None = None
    final_message: str = ""
    final_message_truncated: bool = False
    final_message_path: str = ""
    session_id: str | None = None
    exit_code: int | None = None
    retry_attempts: int = 0
    output: Any = UNSET  # with an output_schema: the validated answer


class TaskFailed(TaskPayload, frozen=True, kw_only=True):
    error_type: str | None = None
    message: str | None = None
    metrics: Metrics | None = None
    session_id: str | None = None
    exit_code: int | None = None
    status: str | None = None
    retry_attempts: int = 0


class TaskInterrupted(TaskPayload, frozen=True, kw_only=True):
    session_id: str | UnsetType | None = UNSET  # when known
    reason: str | UnsetType = UNSET  # "crash": inferred on resume


class StrategyStarted(EventPayload, frozen=True, kw_only=True):
    name: str = ""
    params: dict[str, Any] | UnsetType = UNSET
    index: int | UnsetType = UNSET


class StrategyCheckpoint(EventPayload, frozen=True, kw_only=True):
    seq: int | UnsetType = UNSET
    kind: str = ""
    value: Any = None  # [kind, value]


class StrategyCompleted(EventPayload, frozen=True, kw_only=True):
    status: str = "success"
    result: Any = UNSET  # what the strategy returned (success)
    error: str | UnsetType | None = UNSET  # why it did not (failed, budget_reached)
    unvisited_keys: list[str] | UnsetType = UNSET
    # failed: tasks that completed but whose result could not be used, the reason it failed
    unusable_keys: list[str] | UnsetType = UNSET


class Progress(EventPayload, frozen=True, kw_only=True, omit_defaults=True):
    """Where a strategy execution has got to, in terms a person watching understands (``strategy.progress``).

    Every field is optional; a strategy fills the ones that mean something for
    it (tree-beam: depth of max depth, frontier, best score, evaluations done
    of this depth's; evolve: cycle of max cycles, goals passing of total).
    ``text`` is one free line saying it in words; the TUI shows it.
    """

    phase: str = ""  # what the step counts: "depth", "cycle", "round", ...
    step: int | None = None  # the current one, from 1
    of_total: int | None = None  # the most there can be
    best: float | None = None  # the best score so far
    frontier: int | None = None  # candidates still being expanded
    done: int | None = None  # items done (or passing) ...
    total: int | None = None  # ... out of this many
    text: str = ""


class RunStarted(EventPayload, frozen=True, kw_only=True):
    dry_run: bool = False
    resumed: bool = False
    warnings: list[str] = msgspec.field(default_factory=list)


class HostStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One Docker host of ``runner.hosts``."""

    name: str = ""
    max_parallel: int = 0
    down: bool = False
    reason: str | UnsetType = UNSET  # when down


class HostsStatus(EventPayload, frozen=True, kw_only=True):
    hosts: list[HostStatus] = msgspec.field(default_factory=list)


class BudgetCap(EventPayload, frozen=True, kw_only=True):
    """The run's spending cap as this start or resume has it (None: no limit on it)."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None
    on_reached: str = "finish"


class BudgetSpend(EventPayload, frozen=True, kw_only=True):
    """One task's spend so far, all attempts together."""

    task: str | None = None
    tokens: int = 0
    cost_usd: float = 0.0


class BudgetReached(EventPayload, frozen=True, kw_only=True):
    spent_cost_usd: float = 0.0
    spent_tokens: int = 0
    max_cost_usd: float | None = None
    max_tokens: int | None = None
    on_reached: str = "finish"


PAYLOAD_TYPES: dict[str, type[EventPayload]] = {
    TASK_SCHEDULED: TaskScheduled,
    TASK_STARTED: TaskStarted,
    TASK_COMPLETED: TaskCompleted,
    TASK_FAILED: TaskFailed,
    TASK_INTERRUPTED: TaskInterrupted,
    TASK_SESSION: TaskSession,
    STRATEGY_STARTED: StrategyStarted,
    STRATEGY_COMPLETED: StrategyCompleted,
    STRATEGY_CHECKPOINT: StrategyCheckpoint,
    STRATEGY_PROGRESS: Progress,
    HOSTS_STATUS: HostsStatus,
    RUN_STARTED: RunStarted,
    BUDGET_CAP: BudgetCap,
    BUDGET_SPEND: BudgetSpend,
    BUDGET_REACHED: BudgetReached,
}
EVENT_TYPES = frozenset(PAYLOAD_TYPES)
_TYPE_OF = {cls: etype for etype, cls in PAYLOAD_TYPES.items()}


class PayloadMismatch(ValueError):
    """A payload that does not match its event type's struct (a hand-edited or foreign line)."""


def decode_payload(event_type: str, payload: Mapping[str, Any] | msgspec.Raw) -> EventPayload | None:
    """The struct of ``payload`` (a JSON object, or its encoded bytes); None for a type this version
    does not know (a later version's event).

    The one place a payload is decoded: as it was written, so it re-encodes to
    the same JSON (the fold reads an older shape through :data:`UPCASTS`).
    Raises :class:`PayloadMismatch` (naming the type and the field) when it
    does not match its struct.
    """
    try:
        if isinstance(payload, msgspec.Raw):
            return _raw_decoders.get(event_type, _decode_unknown)(payload)
        cls = PAYLOAD_TYPES.get(event_type)
        return None if cls is None else msgspec.convert(payload, cls)
    except msgspec.DecodeError as exc:  # (ValidationError is one)
        raise PayloadMismatch(f"the payload of this {event_type} event does not match its schema: {exc}") from None


_raw_decoders = {etype: msgspec.json.Decoder(cls).decode for etype, cls in PAYLOAD_TYPES.items()}


def _decode_unknown(raw: msgspec.Raw) -> None:
    _object_decoder.decode(raw)  # still a JSON object, as every payload is


# ---------------------------------------------------------------- upcasts
#
# A payload an earlier version wrote lacks what the current version records.
# Each function here turns one type's older shape into the current one; the
# fold (log/state.py) reads every payload of that type through it, and every
# reader of a run reads the fold, so none of them carries a default for an
# older log. (A field absent because it is unknown, such as a task's
# duration, is not an older shape: it stays UNSET.)


def ran_command(plugin: str | None) -> bool:
    """Whether a task recorded before ``runs_command`` was ran a command: the upcast of an older log.

    Those logs name only the plugin, and of the plugins then only the one named
    ``command`` ran a command, not an agent: that name is the whole upcast.
    """
    return plugin == "command"


def _upcast_task_scheduled(p: Any) -> TaskScheduled:
    """``runs_command`` from the plugin a log from before it names (older still: the input's ``plugin_name``)."""
    if p.runs_command is not UNSET:
        return p
    plugin = p.plugin
    if plugin is UNSET and p.input is not UNSET and isinstance(p.input.get("plugin_name"), str):
        plugin = p.input["plugin_name"]
    return msgspec.structs.replace(p, plugin=plugin, runs_command=ran_command(plugin or None))


UPCASTS: dict[type[EventPayload], Callable[[Any], EventPayload]] = {TaskScheduled: _upcast_task_scheduled}


def type_of(payload: EventPayload) -> str:
    return _TYPE_OF[type(payload)]


def payload_dict(payload: EventPayload | Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object a payload is written as (UNSET fields left out)."""
    if isinstance(payload, EventPayload):
        return msgspec.to_builtins(payload)
    return dict(payload)


def progress_record(fields: dict[str, Any]) -> Progress:
    """A checked :class:`Progress` from ``ctx.progress(**fields)``; TypeError names a wrong field."""
    unknown = sorted(set(fields) - set(Progress.__struct_fields__))
    if unknown:
        raise TypeError(
            f"ctx.progress() got unknown field(s) {', '.join(unknown)}; known: {', '.join(Progress.__struct_fields__)}"
        )
    try:
        record = msgspec.convert(fields, Progress)
    except msgspec.ValidationError as exc:
        raise TypeError(f"ctx.progress(): {exc}") from None
    if record.best is not None and not math.isfinite(record.best):
        # JSON has no NaN: the log would say null, so say it here too (the live fold must equal a replay's)
        record = msgspec.structs.replace(record, best=None)
    return record


_ts_cache: list = [None, ""]


def utc_ts() -> str:
    """RFC 3339 UTC with milliseconds and a ``Z`` suffix (the second's prefix is cached: hot path)."""
    t = time.time()
    sec = int(t)
    if _ts_cache[0] != sec:
        _ts_cache[0] = sec
        _ts_cache[1] = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(sec))
    return f"{_ts_cache[1]}{int((t - sec) * 1000):03d}Z"


_id_pool = bytearray()


def new_event_id() -> str:
    """A UUIDv4 string from a pool of OS randomness (``uuid.uuid4()`` per event is a hot spot)."""
    global _id_pool
    if len(_id_pool) < 16:
        _id_pool = bytearray(os.urandom(16 * 1024))
    raw = _id_pool[-16:]
    del _id_pool[-16:]
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def encode_line(
    event_type: str,
    *,
    ts: str,
    run_id: str,
    strategy_execution_id: str,
    start_offset: int,
    payload: dict[str, Any],
    key: str | None = None,
    event_id: str | None = None,
) -> bytes:
    record: dict[str, Any] = {
        "id": event_id or new_event_id(),
        "type": event_type,
        "ts": ts,
        "run_id": run_id,
        "strategy_execution_id": strategy_execution_id,
    }
    if key is not None:
        record["key"] = key
    record["start_offset"] = start_offset
    record["payload"] = payload
    try:
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        # orjson refuses integers beyond 64 bits and exotic objects; the stdlib
        # encoder keeps big integers exact and stringifies the rest.
        return (json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8")


def decode_line(line: bytes) -> Event[dict[str, Any]]:
    """Decode one complete line; raises ``msgspec.DecodeError`` on a torn or foreign line."""
    return _decoder.decode(line)


def decode_envelope(line: bytes) -> Envelope:
    """Decode one complete line, leaving its payload encoded; raises ``msgspec.DecodeError`` as :func:`decode_line`."""
    return _envelope_decoder.decode(line)
