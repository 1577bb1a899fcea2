"""What a run report shows, gathered from the run's fold, the manifest and git.

Everything comes from recorded facts: the fold of the events (tasks,
attempts, interruptions, results: :class:`~orchestrator.log.state.RunState`),
the manifest (prompt, parameters) and the branches the run imported into the
repository. Nothing is read from the strategy's
output files, so ``--show-run RUN_ID --html`` rebuilds the same report from the
event log alone, and a regenerated report has the same bytes as the first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..log import events as E
from ..log.eventlog import LogReader
from ..log.runs import RunDirs, RunManifest
from ..log.state import UNUSABLE, RunState, parse_ts, task_label, task_outcome
from ..runner import run_git

# A report must open quickly and stay small: one diff over this is cut with a
# note, and once all diffs together pass the run budget the rest are left out.
DIFF_CHARS = 60_000
DIFF_LINES = 1_200
RUN_DIFF_BUDGET = 2_500_000
# Highlighted HTML is about 1.5x its diff text; this keeps a 200-task run's page under 5 MB.
RUN_DIFF_HTML_BUDGET = 3_000_000
MESSAGE_CHARS = 8_000
RUN_MESSAGE_BUDGET = 800_000
SHORT_MESSAGE_CHARS = 600

_SHA = re.compile(r"^[0-9a-f]{7,64}$")


def _clip(text: str | None, limit: int) -> tuple[str, bool]:
    text = text or ""
    return (text, False) if len(text) <= limit else (text[:limit], True)


def _diff(repo: Path, base: str, commit: str) -> dict[str, Any]:
    """The change a branch holds against the base it started from (three-dot: from their merge base)."""
    proc = run_git(["diff", "--no-color", "--no-ext-diff", "-M", f"{base}...{commit}"], cwd=repo, check=False)
    if proc.returncode != 0:
        return {
            "available": False,
            "note": "the commit is no longer in the repository (branch deleted and "
            "garbage-collected), so its diff cannot be shown",
        }
    text = proc.stdout
    files: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(.*) b/(.*)$", line)
            files.append({"path": m.group(2) if m else line[11:], "added": 0, "deleted": 0})
        elif files and line.startswith("+") and not line.startswith("+++"):
            files[-1]["added"] += 1
        elif files and line.startswith("-") and not line.startswith("---"):
            files[-1]["deleted"] += 1
    lines = text.splitlines(keepends=True)
    truncated = len(text) > DIFF_CHARS or len(lines) > DIFF_LINES
    if truncated:
        text = "".join(lines[:DIFF_LINES])[:DIFF_CHARS]
    return {
        "available": True,
        "text": text,
        "truncated": truncated,
        "files": files,
        "added": sum(f["added"] for f in files),
        "deleted": sum(f["deleted"] for f in files),
        "full_command": f"git diff {base}...{commit}",
    }


def left_out(base: str, commit: str) -> dict[str, Any]:
    """What stands for a diff once the report's budget for diffs is spent."""
    return {
        "available": False,
        "note": f"left out: the report's size budget for diffs is spent; run git diff {base}...{commit}",
    }


def collect_diffs(repo: Path, base: str, commits: Iterable[str]) -> dict[str, dict[str, Any]]:
    """One diff per distinct commit, cut to the run's budget (later ones get a note instead)."""
    diffs: dict[str, dict[str, Any]] = {}
    used = 0
    for commit in commits:
        if commit in diffs or not _SHA.match(commit):
            continue
        if used >= RUN_DIFF_BUDGET:
            diffs[commit] = left_out(base, commit)
            continue
        d = _diff(repo, base, commit)
        used += len(d.get("text", ""))
        diffs[commit] = d
    return diffs


def task_rows(state: RunState, events_path: Path, run_start: float | None) -> list[dict[str, Any]]:
    """Tasks in scheduling order, with what the table and the timeline show: a view of the run's fold.

    A task's attempts are the fold's, each from its ``task.started`` to the
    terminal or ``task.interrupted`` event that ended it, so a resumed task
    shows as an interrupted bar followed by a new one. Its result is the
    payload of its terminal event, read from ``events_path`` at the offset the
    fold recorded (the one read of the log here: no event is folded again).
    """
    tasks = sorted(state.tasks.values(), key=lambda t: t.seq)
    offsets = sorted(t.result_offset for t in tasks if t.result_offset is not None)
    # the recorded payload as JSON: the report's data is plain JSON-like values
    results = {
        offset: E.payload_dict(payload)
        for offset, _, payload in LogReader(events_path).records_at(offsets)
        if payload is not None
    }
    rows = []
    message_chars = 0
    for task in tasks:
        # completed, but what the strategy failed on: shown as such (its timeline bar too), never as a success
        unusable = task_outcome(state, task) == UNUSABLE
        attempts = [(a.start, a.end, a.outcome) for a in task.spans()]
        if unusable and attempts:
            attempts[-1] = (*attempts[-1][:2], "unusable")
        stored = None if task.result_offset is None else results.get(task.result_offset)
        result = stored or {}
        artifact = result.get("artifact") or {}
        metrics = result.get("metrics") or {}
        limit = MESSAGE_CHARS if message_chars < RUN_MESSAGE_BUDGET else SHORT_MESSAGE_CHARS
        message, cut = _clip(result.get("final_message"), limit)
        prompt, prompt_cut = _clip(task.input.get("prompt", ""), limit)
        message_chars += len(message) + len(prompt)
        if result.get("final_message_truncated"):
            cut = True
        rows.append(
            {
                "key": task.key,
                "short_key": task_label(task.key),
                "execution": task.strategy_execution_id,
                "state": task.state,
                "unusable": unusable,
                "instance_id": task.instance_id,
                "plugin": task.input.get("plugin_name"),
                "runs_command": task.runs_command,
                "model": task.model,
                "prompt": prompt,
                "prompt_cut": prompt_cut,
                "command": _clip(task.input.get("command"), limit)[0] if task.runs_command else None,
                "branch": artifact.get("branch_final"),
                "commit": artifact.get("commit") if artifact.get("branch_final") else None,
                "base": artifact.get("base"),
                "lines_added": artifact.get("lines_added"),
                "lines_deleted": artifact.get("lines_deleted"),
                "commit_count": artifact.get("commit_count"),
                "cost_usd": metrics.get("cost_usd"),
                "tokens_in": metrics.get("tokens_in") or 0,
                "tokens_out": metrics.get("tokens_out") or 0,
                "duration_s": metrics.get("duration_s"),
                "final_message": message,
                "final_message_cut": cut,
                "error_type": task.error_type,
                "error": task.message,
                "attempts": len(attempts),
                "interruptions": sum(1 for a in attempts if a[2] == "interrupted"),
                "retries": result.get("retry_attempts") or 0,
                "spans": _spans(attempts, run_start),
                "result": stored,
            }
        )
    return rows


def _spans(attempts: list[tuple[str, str | None, str]], run_start: float | None) -> list[dict[str, Any]]:
    """The timeline's bars: each attempt in seconds from the run's start (one whose start is unknown left out)."""
    spans = []
    for start, end, outcome in attempts:
        s, e = parse_ts(start), parse_ts(end)
        if s is not None and run_start is not None:
            spans.append(
                {
                    "start": round(s - run_start, 3),
                    "end": None if e is None else round(e - run_start, 3),
                    "outcome": outcome,
                }
            )
    return spans


def header(manifest: RunManifest, tasks: list[dict[str, Any]], *, status: str, duration_s: float) -> dict[str, Any]:
    costs = [t["cost_usd"] for t in tasks if t["cost_usd"] is not None]
    return {
        "run_id": manifest.run_id,
        "prompt": manifest.prompt,
        "strategy": manifest.strategy_name,
        "params": manifest.params,
        "runs": manifest.runs,
        "status": status,
        "dry_run": manifest.dry_run,
        "repo": manifest.repo_path,
        "base_branch": manifest.base_branch,
        "model": manifest.model,
        "plugin": manifest.plugin,
        "created_at": manifest.created_at,
        "finished_at": manifest.finished_at,
        "duration_s": duration_s,
        "cost_usd": round(sum(costs), 6) if costs else None,
        "tokens_in": sum(t["tokens_in"] for t in tasks),
        "tokens_out": sum(t["tokens_out"] for t in tasks),
        "tasks": len(tasks),
        "completed": sum(1 for t in tasks if t["state"] == "COMPLETED"),
        "failed": sum(1 for t in tasks if t["state"] == "FAILED"),
        "interrupted": sum(1 for t in tasks if t["interruptions"]),
    }


def gather(dirs: RunDirs, manifest: RunManifest, state: RunState, *, status: str, duration_s: float) -> dict[str, Any]:
    """Everything but the strategy sections, as plain JSON-like data, from the run's fold ``state``.

    ``status`` and ``duration_s`` are the run's, from its fold (:func:`orchestrator.log.state.run_outcome`,
    :meth:`RunState.duration_s`): the summary says the same.
    """
    tasks = state.tasks.values()
    strategies = state.strategies.values()
    starts = [parse_ts(a.start) for t in tasks for a in t.spans()]
    ends = [parse_ts(a.end) for t in tasks for a in t.spans()]
    starts += [parse_ts(t.scheduled_at) for t in tasks]
    starts += [parse_ts(s.started_at) for s in strategies]
    ends += [parse_ts(s.completed_at) for s in strategies]
    known_starts = [s for s in starts if s is not None]
    known_ends = [e for e in ends + known_starts if e is not None]
    run_start = min(known_starts) if known_starts else None
    run_end = max(known_ends) if known_ends else None
    rows = task_rows(state, dirs.events(manifest.run_id), run_start)
    return {
        "header": header(manifest, rows, status=status, duration_s=duration_s),
        "tasks": rows,
        "executions": {
            sid: {
                "id": sid,
                "name": strat.name,
                "params": strat.params,
                "status": strat.status,
                "result": strat.result,
                "error": strat.error,
                "started_at": strat.started_at,
                "completed_at": strat.completed_at,
            }
            for sid, strat in state.strategies.items()
        },
        "span_s": 0.0 if run_start is None or run_end is None else round(run_end - run_start, 3),
    }
