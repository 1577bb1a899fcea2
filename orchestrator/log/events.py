"""The public event record and its one codec.

Every line of ``logs/<run_id>/events.jsonl`` is one :class:`Event`: a frozen,
kw-only envelope ``{id, type, ts, run_id, strategy_execution_id, key?,
start_offset, payload}``. ``start_offset`` is the byte position where the line
starts, so ``f.seek(e.start_offset); f.readline()`` returns exactly that event.

Public types (docs/events.md documents every payload field):

- ``task.scheduled|started|completed|failed|interrupted`` (``key`` required)
- ``task.session``: the agent session a running task is in, written as soon as
  the agent reports it (so a crash cannot lose it), or ``null`` with a
  ``reason`` when the task gives up its session and starts a fresh one
- ``strategy.started|completed`` (``key`` absent)
- ``strategy.checkpoint``: the value a strategy got from ``ctx.now()``,
  ``ctx.rand()`` or ``ctx.sleep()``, replayed on resume.
- ``strategy.progress``: a :class:`Progress` record a strategy published with
  ``ctx.progress(...)``. An output for people watching (the TUI), never an
  input: it is not replayed, and a resumed run may publish it again.
- ``hosts.status`` (``key`` absent, ``strategy_execution_id`` empty): the
  run's Docker hosts (``runner.hosts``) with their slots and whether each is
  down, written when the run (re)starts and whenever a host goes down or
  comes back.
- ``budget.cap``, ``budget.spend``, ``budget.reached`` (``key`` absent,
  ``strategy_execution_id`` empty): the run's spending cap as this process
  started with it; one task's spend so far (``task``, ``tokens``,
  ``cost_usd``: its total, live while it runs); and the moment the run's
  spend reached the cap (``spent_cost_usd``, ``spent_tokens``, the cap).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import msgspec
import orjson

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

TASK_TYPES = frozenset({TASK_SCHEDULED, TASK_STARTED, TASK_COMPLETED, TASK_FAILED, TASK_INTERRUPTED, TASK_SESSION})
STRATEGY_TYPES = frozenset({STRATEGY_STARTED, STRATEGY_COMPLETED, STRATEGY_CHECKPOINT, STRATEGY_PROGRESS})
RUN_TYPES = frozenset({HOSTS_STATUS, RUN_STARTED, BUDGET_CAP, BUDGET_SPEND, BUDGET_REACHED})
EVENT_TYPES = TASK_TYPES | STRATEGY_TYPES | RUN_TYPES
TERMINAL_TASK_TYPES = frozenset({TASK_COMPLETED, TASK_FAILED, TASK_INTERRUPTED})


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    type: str
    ts: str
    run_id: str
    strategy_execution_id: str
    start_offset: int
    payload: dict[str, Any]
    key: str | None = None


_decoder = msgspec.json.Decoder(Event)


class Progress(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where a strategy execution has got to, in terms a person watching understands.

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


def progress_from_payload(payload: dict[str, Any]) -> Progress | None:
    """The record a ``strategy.progress`` payload holds; None for a malformed one (never an error)."""
    try:
        return msgspec.convert(payload, Progress)
    except msgspec.ValidationError:
        return None


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
    """Encode one event as a UTF-8 JSON line (with trailing newline)."""
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


def decode_line(line: bytes) -> Event:
    """Decode one complete line; raises ``msgspec.DecodeError`` on a torn or foreign line."""
    return _decoder.decode(line)


def to_dict(event: Event) -> dict[str, Any]:
    return msgspec.to_builtins(event)
