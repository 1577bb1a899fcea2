"""The shell commands evolve runs in containers, and how their output (marker lines ``@@evolve ...``) is read.

Both exit 0 when they could do their job: a failing check or a merge conflict is data, and a *failed task*
means the container or the runner broke. Only task results are read, so a replay reads the same values.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import msgspec

from ._json import extract_json
from .base_check import could_not_run, split_streams
from .evolve_goals import Goal

STDOUT_TAIL = 6000
STDERR_TAIL = 3000
END_LINE = re.compile(r"^@@evolve end exit=(-?\d+) head=([0-9a-f]*)\s*$", re.M)
STDERR_MARK = "\n@@evolve stderr\n"
_MERGE_LINE = re.compile(r"^@@evolve (merged|already|conflict) (\S+)\s*$", re.M)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class Measurement(msgspec.Struct, frozen=True, kw_only=True):
    """One goal measured on one commit."""

    goal_id: str
    passed: bool
    exit_code: int | None
    value: float | None = None
    head: str = ""
    output: str = ""  # stdout tail + stderr tail, what a fixer is shown
    error: str | None = None  # the task itself failed (container, timeout): counts as failing


def measure_command(goal: Goal) -> str:
    run = f"/bin/sh -c {shlex.quote(goal.check)}"
    return (
        "out=$(mktemp /tmp/evolve-out.XXXXXX); err=$(mktemp /tmp/evolve-err.XXXXXX); "
        f'if command -v timeout >/dev/null 2>&1; then timeout -k 5 {goal.timeout} {run} >"$out" 2>"$err" </dev/null; '
        f'else {run} >"$out" 2>"$err" </dev/null; fi; rc=$?; '
        f'[ "$rc" = 124 ] && echo "check timed out after {goal.timeout}s" >>"$err"; '
        f'tail -c {STDOUT_TAIL} "$out"; printf "\\n@@evolve stderr\\n"; tail -c {STDERR_TAIL} "$err"; '
        'printf "\\n@@evolve end exit=%s head=%s\\n" "$rc" "$(git rev-parse HEAD 2>/dev/null)"; exit 0'
    )


def measure_task(goal: Goal, base_branch: str) -> dict[str, Any]:
    return {
        "prompt": f"evolve: measure goal {goal.id}",
        "plugin": "command",
        "command": measure_command(goal),
        "base_branch": base_branch,
        "import_policy": "never",
        "timeout_seconds": goal.timeout + 60,
    }


def parse_metric(goal: Goal, stdout: str) -> float | None:
    assert goal.metric is not None
    if goal.metric.json_key:
        value: Any = extract_json(stdout)
        for part in goal.metric.json_key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    else:
        lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
        match = _NUMBER.fullmatch(lines[-1].rstrip("%").strip()) if lines else None
        value = float(match.group(0)) if match else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def parse_measurement(goal: Goal, final_message: str) -> Measurement:
    """Read a measure task's stdout; output without the end marker counts as a failing check."""
    if (split := split_streams(final_message or "", END_LINE, STDERR_MARK)) is None:
        return Measurement(
            goal_id=goal.id,
            passed=False,
            exit_code=None,
            output=(final_message or "")[-STDOUT_TAIL:],
            error="the check's output has no end marker (output cut short?)",
        )
    end, stdout, stderr = split
    exit_code = int(end.group(1))
    output = stdout + (("\n[stderr]\n" + stderr) if stderr.strip() else "")
    if goal.metric is not None:
        value = parse_metric(goal, stdout)
        passed = goal.metric.meets(value)
    else:
        value, passed = None, exit_code == 0
    return Measurement(
        goal_id=goal.id, passed=passed, exit_code=exit_code, value=value, head=end.group(2), output=output
    )


def cannot_run(goal: Goal, m: Measurement) -> str | None:
    """Why ``goal``'s check measured nothing on this commit, or None when it ran: anything else, a crash included,
    is a failing check (fixing a broken program is evolve's job)."""
    if m.error is not None:
        return f"its measuring task ended without a result: {(m.error.splitlines() or [''])[0][:300]}"
    if (why := could_not_run(m.exit_code, m.output)) is not None:
        return why
    if goal.metric is not None and m.value is None:
        where = f"key {goal.metric.json_key!r} of its JSON" if goal.metric.json_key else "its last stdout line"
        return f"its metric has no number ({where}), so better or worse cannot be told"
    return None


def failed_measurement(goal: Goal, message: str) -> Measurement:
    return Measurement(goal_id=goal.id, passed=False, exit_code=None, output=message[-STDOUT_TAIL:], error=message)


def merge_command(branches: list[str]) -> str:
    lines = ["set -u"]
    for b in branches:
        q = shlex.quote(b)
        lines.append(
            f"if git merge-base --is-ancestor {q} HEAD; then echo '@@evolve already {b}'; "
            f"elif git merge --no-edit {q} >/tmp/evolve-merge.log 2>&1; then echo '@@evolve merged {b}'; "
            f"else cat /tmp/evolve-merge.log; git merge --abort >/dev/null 2>&1 || git reset -q --hard HEAD; "
            f"echo '@@evolve conflict {b}'; exit 0; fi"
        )
    return "\n".join(lines)


def merge_task(base_branch: str, branches: list[str]) -> dict[str, Any]:
    return {
        "prompt": "evolve: merge the wave's fix branches",
        "plugin": "command",
        "command": merge_command(branches),
        "base_branch": base_branch,
        "include_branches": list(branches),
        "import_policy": "auto",
        "timeout_seconds": 600,
    }


class MergeReport(msgspec.Struct, frozen=True, kw_only=True):
    merged: tuple[str, ...]  # merged now or already contained
    conflict: str | None


def parse_merge(final_message: str) -> MergeReport:
    merged: list[str] = []
    conflict = None
    for kind, branch in _MERGE_LINE.findall(final_message or ""):
        if kind == "conflict":
            conflict = branch
        else:
            merged.append(branch)
    return MergeReport(merged=tuple(merged), conflict=conflict)
