"""The console streams for ``--no-tui`` (plain), ``--json`` and ``--quiet``.

Plain mode prints one line per interesting event, prefixed ``k<8hex>/inst-<5hex>:``
(the spec's stable format that scripts grep for), then the task's readable key
(as the run summary names it; ``s2/...`` when the run has several strategy
executions) and a coloured tag::

    k7aa12cc/inst-7a3f2: impl/0 [STARTED] → best-of-n_run_20250114_k7aa12cc (sonnet)
    k7aa12cc/inst-7a3f2: impl/0 [COMPLETED] ✓ 3m 24s • $0.42 • 2.5k tokens • → best-of-n_run_20250114_k7aa12cc
    k19bb44a/inst-8b4c1: score/0 [STARTED] (sonnet)
    k4f465253/inst-c1be7: e0001/measure/g1 [STARTED] (command)
    k2f88e01/inst-9d5e3: impl/1 [FAILED] ✗ timeout: Timeout after 60m • 60m 00s • $2.41

A task that makes no branch (a review, a measurement) shows none; a command
task shows no model. Marker lines strategies parse (``@@...``) are never shown.

Strategy executions get ``s1: [STRATEGY] ...`` lines (started, each progress
record they publish, completed). Scheduling and
checkpoint events are not shown: no timestamps, no debug noise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal, NamedTuple, TextIO

import anyio
import msgspec
import orjson

from orchestrator.log import events as E
from orchestrator.log.eventlog import subscribe
from orchestrator.log.events import EventPayload, PayloadMismatch, decode_payload, to_dict
from orchestrator.naming import display_ids

from .model import first_line, fmt_cost, fmt_duration, fmt_progress, fmt_tokens, makes_branch, task_label

RESET = "\x1b[0m"
TAG_COLOR = {
    "STARTED": "\x1b[1;36m",  # bold cyan
    "COMPLETED": "\x1b[1;32m",  # bold green
    "FAILED": "\x1b[1;31m",  # bold red
    "INTERRUPTED": "\x1b[1;33m",  # bold yellow
    "STRATEGY": "\x1b[1;35m",  # bold magenta
}
MESSAGE_LIMIT = 160


def _tag(name: str, color: bool) -> str:
    return f"{TAG_COLOR[name]}[{name}]{RESET}" if color else f"[{name}]"


def _metrics(metrics: E.Metrics | None, *, tokens: bool) -> list[str]:
    duration = None if metrics is None or metrics.duration_s is msgspec.UNSET else metrics.duration_s
    # a finished task's duration is final, so sub-10 s ones keep a decimal ("0.4s", not "0s")
    shown = f"{duration:.1f}s" if duration is not None and duration < 10 else fmt_duration(duration)
    parts = [shown, fmt_cost(metrics.cost_usd if metrics else None)]
    if tokens:
        parts.append(f"{fmt_tokens(metrics.tokens_in + metrics.tokens_out if metrics else 0)} tokens")
    return parts


def params_text(params: dict[str, Any], limit: int) -> str:
    """``k=v, ...`` of the parameters that have a value, cut between two parameters, never mid-name."""
    # A parameter left unset says nothing: "model=None" only takes room.
    shown = ", ".join(f"{k}={v}" for k, v in params.items() if v is not None and not isinstance(v, (dict, list)))
    if len(shown) <= limit:
        return shown
    cut = shown[: limit - 1]
    return (cut[: cut.rfind(", ")] if ", " in cut else cut) + "…"


def _params(params: Any) -> str:
    if not isinstance(params, dict) or not params:
        return ""
    shown = params_text(params, MESSAGE_LIMIT)
    return f" ({shown})" if shown else ""


class Scheduled(NamedTuple):
    """What a task's ``task.scheduled`` said that its ``task.started`` line shows."""

    runs_command: bool  # a command, not an agent: no model to show
    branch_name: str | None  # None for a task that makes no branch


def scheduled_of(p: E.TaskScheduled) -> Scheduled:
    task_input = None if p.input is msgspec.UNSET else p.input
    return Scheduled(p.is_command, p.branch_name if p.branch_name and makes_branch(task_input) else None)


def format_event(event: dict, *, color: bool, several: bool = False) -> str | None:
    """The plain-mode line for one event (a dict in the events.jsonl shape), or None if not shown.

    ``task.started`` payloads may carry ``branch_name`` and ``runs_command``
    (or an older log's ``plugin``), as the task's ``task.scheduled`` event
    records them (the stream takes them from there; the branch only for a task
    that makes one).
    ``several``: the run has more than one strategy execution.
    """
    raw = event.get("payload") or {}
    try:
        payload = decode_payload(str(event.get("type")), raw)
    except PayloadMismatch:
        return None
    copied = E.TaskScheduled(
        plugin=raw.get("plugin", msgspec.UNSET), runs_command=raw.get("runs_command", msgspec.UNSET)
    )
    scheduled = Scheduled(copied.is_command, raw.get("branch_name"))
    sid = event.get("strategy_execution_id") or "?"
    return format_line(payload, key=event.get("key"), sid=sid, color=color, several=several, scheduled=scheduled)


def format_line(
    payload: EventPayload | None,
    *,
    key: str | None,
    sid: str,
    color: bool,
    several: bool = False,
    scheduled: Scheduled | None = None,
) -> str | None:
    """The plain-mode line for one event's payload struct, or None if not shown.

    A ``task.started`` line names the branch and plugin the task's
    ``scheduled`` event recorded (the branch only for a task that makes one).
    """
    if isinstance(payload, (E.TaskStarted, E.TaskCompleted, E.TaskFailed, E.TaskInterrupted)) and key:
        prefix = f"{display_ids(key, payload.instance_id or '?????')}: {task_label(key, several)} "
        if isinstance(payload, E.TaskStarted):
            target = scheduled.branch_name if scheduled is not None else None
            line = _tag("STARTED", color) + (f" → {target}" if target else "")
            if scheduled is not None and scheduled.runs_command:
                line += " (command)"
            elif payload.model:
                line += f" ({payload.model})"
            return prefix + line
        if isinstance(payload, E.TaskCompleted):
            artifact = payload.artifact
            parts = ["✓ " + " • ".join(_metrics(payload.metrics, tokens=True))]
            branch = artifact.branch_final if artifact else None
            parts.append(f"→ {branch}" if branch else "no branch")
            if artifact is not None and artifact.has_changes:
                parts.append(f"+{artifact.lines_added}/-{artifact.lines_deleted}")
            return prefix + _tag("COMPLETED", color) + " " + " • ".join(parts)
        if isinstance(payload, E.TaskFailed):
            message = first_line(payload.message, MESSAGE_LIMIT)
            head = f"✗ {payload.error_type or 'error'}" + (f": {message}" if message else "")
            return prefix + _tag("FAILED", color) + " " + " • ".join([head, *_metrics(payload.metrics, tokens=False)])
        reason = payload.reason
        return prefix + _tag("INTERRUPTED", color) + (f" {reason}" if reason else "")
    if isinstance(payload, E.StrategyStarted):
        params = None if payload.params is msgspec.UNSET else payload.params
        return f"{sid}: {_tag('STRATEGY', color)} {payload.name or '?'} started{_params(params)}"
    if isinstance(payload, E.StrategyCompleted):
        status = payload.status or "?"
        tag = _tag("FAILED", color) if status == "failed" else _tag("STRATEGY", color)
        line = f"{sid}: {tag} {status}"
        if payload.error:
            line += f": {first_line(payload.error, MESSAGE_LIMIT)}"
        return line
    if isinstance(payload, E.Progress):
        text = fmt_progress(payload)
        return f"{sid}: {_tag('STRATEGY', color)} {text}" if text else None
    return None


def _use_color(file: TextIO, color: bool | None) -> bool:
    if color is not None:
        return color
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(file, "isatty", None)
    return bool(isatty and isatty())


async def stream_console(
    run_id: str,
    *,
    logs_dir: Path,
    mode: Literal["plain", "json", "quiet"],
    stop: anyio.Event,
    file: TextIO = sys.stdout,
    color: bool | None = None,
    since: int = 0,
) -> None:
    """Follow ``logs/<run_id>/events.jsonl`` from the start until ``stop`` is set and the log is drained.

    Events that start before byte ``since`` (what a resumed run had written
    before) are read for context but not shown.
    """
    if mode not in ("plain", "json", "quiet"):
        raise ValueError(f"console mode must be plain, json or quiet, not {mode!r}")
    path = Path(logs_dir) / run_id / "events.jsonl"
    use_color = _use_color(file, color)
    scheduled: dict[str, Scheduled] = {}
    executions: set[str] = set()
    async for ev in subscribe(path, 0, stop=stop):
        if mode == "quiet":
            continue  # still drained, so the caller's stop/drain contract holds in every mode
        try:
            payload = ev.typed()
        except PayloadMismatch:
            payload = None  # not shown (the JSON stream passes every event through as it is)
        if isinstance(payload, E.StrategyStarted):
            executions.add(ev.strategy_execution_id)
        if isinstance(payload, E.TaskScheduled) and ev.key:
            scheduled[ev.key] = scheduled_of(payload)
        if ev.start_offset < since:
            continue
        if mode == "json":
            file.write(orjson.dumps(to_dict(ev)).decode() + "\n")
        else:
            line = format_line(
                payload,
                key=ev.key,
                sid=ev.strategy_execution_id or "?",
                color=use_color,
                several=len(executions) > 1,
                scheduled=scheduled.get(ev.key) if ev.key else None,
            )
            if line is None:
                continue
            file.write(line + "\n")
        file.flush()
