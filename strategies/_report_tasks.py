"""How the built-in strategies' command tasks read in the run report (``report_task(task)``): their wrappers'
marker lines (base_check, evolve_commands, tree_beam_measure) as fields, where the generic card only hides them.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from .base_check import EXIT_LINE, parse_base_run, split_streams
from .evolve_commands import END_LINE, STDERR_MARK, parse_merge
from .tree_beam_measure import DONE_MARK, RUN_MARK, parse_runs

# What the wrappers run, shell-quoted: ``/bin/sh -c <command>`` (base check, evolve's
# measure) or ``CMD=<command>`` (tree-beam's measure). shlex.quote gives one of these shapes.
_QUOTED = r"""('[^']*'(?:"'"'[^']*')*|[^\s;'"<>|&]+)"""
_INNER = re.compile(rf"(?:/bin/sh -c |^CMD=){_QUOTED}", re.M)


def _inner_command(script: str) -> str | None:
    m = _INNER.search(script)
    if m is None:
        return None
    try:
        parts = shlex.split(m.group(1))
    except ValueError:
        return None
    return parts[0] if len(parts) == 1 else None


def _as_json(line: str) -> Any:
    """An evaluation's last line is its JSON metrics: shown as fields, not as JSON text."""
    try:
        value = json.loads(line)
    except ValueError:
        return line
    return value if isinstance(value, dict) else line


def report_task(task: dict[str, Any]) -> dict[str, Any] | None:
    """The card of one of a built-in strategy's command tasks, or None to keep the generic one."""
    if not task.get("runs_command"):
        return None
    script = task.get("command") or ""
    text = task.get("final_message") or ""
    out: dict[str, Any] = {}
    inner = _inner_command(script)
    if inner is not None:
        out["command"] = inner
    if EXIT_LINE.search(text):
        run = parse_base_run(text)
        out.update(fields={"exit status": run.exit_code}, output=run.stdout, stderr=run.stderr)
    elif (split := split_streams(text, END_LINE, STDERR_MARK)) is not None:
        end, stdout, stderr = split
        out.update(
            fields={"exit status": int(end.group(1)), "measured on commit": end.group(2)[:12] or None},
            output=stdout.lstrip("\n"),
            stderr=stderr.lstrip("\n"),
        )
    elif RUN_MARK.strip() in text or DONE_MARK in text:
        runs = parse_runs(text)
        names = ("run", "commit", "exit status", "attempts")
        rows = [
            {**dict(zip(names, p[:4], strict=True)), "last line": _as_json(p[4]) if p[4:] else ""} for p in runs.rows
        ]
        fields: dict[str, Any] = {"runs": rows or None}
        if runs.protected_changed:
            fields["protected paths it changed (put back before measuring)"] = runs.protected_changed
        if not runs.complete:
            fields["complete"] = "no: the script stopped before its last run"
        out.update(fields=fields, output=runs.log, stderr=runs.err_log)
    elif "@@evolve " in text:
        merged = parse_merge(text)
        out["fields"] = {"merged": list(merged.merged) or None, "conflict": merged.conflict}
        out["output"] = "\n".join(ln for ln in text.splitlines() if not ln.startswith("@@"))
    return out or None
