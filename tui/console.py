"""The console streams for ``--no-tui`` (plain), ``--json`` and ``--quiet``: docs/tui.md, "Console streams".

The stream keeps the run's fold (:class:`~orchestrator.log.state.RunState`) as it reads: what a
line says of its task beyond the event itself (its branch, whether it runs a command) and whether
the run has several executions come from there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TextIO

import anyio
import msgspec
import orjson

from orchestrator.log import events as E
from orchestrator.log.eventlog import subscribe
from orchestrator.log.events import EventPayload, PayloadMismatch, decode_payload
from orchestrator.log.state import UNUSABLE, UNUSABLE_WORDS, RunState, TaskState, apply, first_line, task_outcome
from orchestrator.naming import display_ids

from .model import fmt_cost, fmt_duration, fmt_progress, fmt_tokens, makes_branch, task_label

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


def format_event(event: dict, *, color: bool, several: bool = False) -> str | None:
    """The plain-mode line for one event (a dict in the events.jsonl shape), or None if not shown.

    ``task.started`` payloads may carry ``branch_name`` and ``runs_command``
    (or an older log's ``plugin``), as the task's ``task.scheduled`` event
    records them (the stream takes them from the fold; the branch only for a
    task that makes one): they are folded as that event would be.
    ``several``: the run has more than one strategy execution.
    """
    raw = event.get("payload") or {}
    etype, key = str(event.get("type")), event.get("key")
    try:
        payload = decode_payload(etype, raw)
    except PayloadMismatch:
        return None
    task = None
    if key:
        state = RunState(run_id="")
        recorded = {k: raw[k] for k in ("instance_id", "branch_name", "plugin", "runs_command") if k in raw}
        apply(state, E.TASK_SCHEDULED, "", key, recorded, 0, "")
        task = state.tasks.get(key)
    sid = event.get("strategy_execution_id") or "?"
    return format_line(payload, key=key, sid=sid, color=color, several=several, task=task)


def format_line(
    payload: EventPayload | None,
    *,
    key: str | None,
    sid: str,
    color: bool,
    several: bool = False,
    task: TaskState | None = None,
) -> str | None:
    """The plain-mode line for one event's payload struct, or None if not shown.

    ``task`` is the event's task as the run's fold has it: a ``task.started``
    line names its branch (only for a task that makes one), and its model
    unless it runs a command.
    """
    task_line = _TASK_LINES.get(type(payload))
    if task_line is not None:
        if not key:
            return None
        instance_id = getattr(payload, "instance_id", "") or "?????"
        return f"{display_ids(key, instance_id)}: {task_label(key, several)} " + task_line(payload, task, color)
    strategy_line = _STRATEGY_LINES.get(type(payload))
    return None if strategy_line is None else strategy_line(payload, sid, color)


def _started(p: E.TaskStarted, task: TaskState | None, color: bool) -> str:
    target = task.branch_name if task is not None and makes_branch(task.input) else None
    line = _tag("STARTED", color) + (f" → {target}" if target else "")
    if task is not None and task.runs_command:
        return line + " (command)"
    return line + (f" ({p.model})" if p.model else "")


def _completed(p: E.TaskCompleted, task: TaskState | None, color: bool) -> str:
    artifact = p.artifact
    parts = ["✓ " + " • ".join(_metrics(p.metrics, tokens=True))]
    branch = artifact.branch_final if artifact else None
    parts.append(f"→ {branch}" if branch else "no branch")
    if artifact is not None and artifact.has_changes:
        parts.append(f"+{artifact.lines_added}/-{artifact.lines_deleted}")
    return _tag("COMPLETED", color) + " " + " • ".join(parts)


def _failed(p: E.TaskFailed, task: TaskState | None, color: bool) -> str:
    message = first_line(p.message, MESSAGE_LIMIT)
    head = f"✗ {p.error_type or 'error'}" + (f": {message}" if message else "")
    return _tag("FAILED", color) + " " + " • ".join([head, *_metrics(p.metrics, tokens=False)])


def _interrupted(p: E.TaskInterrupted, task: TaskState | None, color: bool) -> str:
    return _tag("INTERRUPTED", color) + (f" {p.reason}" if p.reason else "")


def _strategy_started(p: E.StrategyStarted, sid: str, color: bool) -> str:
    shown = params_text(p.params, MESSAGE_LIMIT) if isinstance(p.params, dict) else ""
    return f"{sid}: {_tag('STRATEGY', color)} {p.name or '?'} started" + (f" ({shown})" if shown else "")


def _strategy_completed(p: E.StrategyCompleted, sid: str, color: bool) -> str:
    status = p.status or "?"
    tag = _tag("FAILED", color) if status == "failed" else _tag("STRATEGY", color)
    line = f"{sid}: {tag} {status}"
    if p.error:
        line += f": {first_line(p.error, MESSAGE_LIMIT)}"
    return line


def _progress(p: E.Progress, sid: str, color: bool) -> str | None:
    text = fmt_progress(p)
    return f"{sid}: {_tag('STRATEGY', color)} {text}" if text else None


# The line of each event type that is shown, after the task's ids (scheduling, sessions, checkpoints
# and the run's own events are not shown). A line formats one event; the fold says what it knows of its task.
_TASK_LINES: dict[type, Callable[[Any, TaskState | None, bool], str]] = {
    E.TaskStarted: _started,
    E.TaskCompleted: _completed,
    E.TaskFailed: _failed,
    E.TaskInterrupted: _interrupted,
}
_STRATEGY_LINES: dict[type, Callable[[Any, str, bool], str | None]] = {
    E.StrategyStarted: _strategy_started,
    E.StrategyCompleted: _strategy_completed,
    E.Progress: _progress,
}


def unusable_lines(state: RunState, sid: str, *, color: bool) -> list[str]:
    """Once strategy execution ``sid`` completed: a ``[FAILED]`` line for each task it judged unusable.

    Their ``[COMPLETED]`` line came earlier: the strategy judged their result
    afterwards (the fold has it), and this line corrects it, in the summary's words.
    """
    strat = state.strategies.get(sid)
    if strat is None:
        return []
    several = len(state.strategies) > 1
    out = []
    for key in strat.unusable_keys:
        task = state.tasks.get(key)
        if task is not None and task_outcome(state, task) == UNUSABLE:
            head = f"{display_ids(key, task.instance_id)}: {task_label(key, several)}"
            out.append(f"{head} {_tag('FAILED', color)} ✗ {UNUSABLE_WORDS}")
    return out


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
    """Follow ``logs/<run_id>/events.jsonl`` until ``stop`` is set and the log is drained (docs/tui.md).

    Events that start before byte ``since`` (what a resumed run had written before) are read for context but not shown.
    """
    if mode not in ("plain", "json", "quiet"):
        raise ValueError(f"console mode must be plain, json or quiet, not {mode!r}")
    path = Path(logs_dir) / run_id / "events.jsonl"
    use_color = _use_color(file, color)
    state = RunState(run_id=run_id)  # the run's fold: what a line says of its task comes from there
    async for ev in subscribe(path, 0, stop=stop):
        if mode == "quiet":
            continue  # still drained, so the caller's stop/drain contract holds in every mode
        try:
            payload = ev.typed()
        except PayloadMismatch:
            payload = None  # not shown (the JSON stream passes every event through as it is)
        apply(state, ev.type, ev.strategy_execution_id, ev.key, payload, ev.start_offset, ev.ts)
        if ev.start_offset < since:
            continue
        if mode == "json":
            file.write(orjson.dumps(msgspec.to_builtins(ev)).decode() + "\n")
        else:
            if ev.type == E.STRATEGY_COMPLETED:
                for unusable in unusable_lines(state, ev.strategy_execution_id, color=use_color):
                    file.write(unusable + "\n")
            line = format_line(
                payload,
                key=ev.key,
                sid=ev.strategy_execution_id or "?",
                color=use_color,
                several=len(state.strategies) > 1,
                task=state.tasks.get(ev.key) if ev.key else None,
            )
            if line is None:
                continue
            file.write(line + "\n")
        file.flush()
