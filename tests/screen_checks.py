"""What a user sees of a finished run: its console lines and dashboard frames replayed from its log.

Used by the dry-run flow tests: internals (marker lines strategies parse, a
command task's script header) must never reach the screen, and tasks that make
no branch (commands, reviews) must not say they do.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.log.eventlog import read_events
from tui.dashboard import render
from tui.model import RunModel

# (a strategy's wrapper script shown as the command a task runs: "$ set -u -f" was a
# tree-beam measurement's card, not the user's eval command)
INTERNALS = re.compile(r"@@|# orch-measure|\$ set -u|\$ err=\$\(mktemp")
COMMAND = re.compile(r"\$ [^│┃|]*?(?=\s{2,}|\s*[│┃|]|$)")
# A diff's hunk header is output a reader wants (a report card may show a diff).
DIFF_HUNK = re.compile(r"@@ -\d+(,\d+)? \+\d+(,\d+)? @@")


def protocol_lines(text: str) -> list[str]:
    """The lines of ``text`` that are strategies' internals (marker lines, a measure script's header)."""
    return [ln for ln in text.splitlines() if INTERNALS.search(DIFF_HUNK.sub("", ln))]


def check_screen(run_dir: Path, run_id: str, console_text: str) -> dict[str, Any]:
    """Assert the console and every dashboard frame of the run are free of internals; count what was checked.

    ``commands`` holds the ``$ command`` lines the frames showed.
    """
    assert not INTERNALS.search(console_text), [ln for ln in console_text.splitlines() if INTERNALS.search(ln)]
    events = list(read_events(run_dir / "events.jsonl"))
    several = len({e.strategy_execution_id for e in events if e.type == "strategy.started"}) > 1
    no_branch = 0
    for e in events:
        if e.type != "task.scheduled" or e.payload["input"].get("import_policy") != "never":
            continue
        label = e.key.split("/", 2)[2] if not several else e.key.split("/", 1)[1]
        (started,) = {ln for ln in console_text.splitlines() if re.search(rf": {re.escape(label)} \[STARTED\]", ln)}
        assert "→" not in started, started
        if e.payload["plugin"] == "command":
            assert started.endswith("(command)"), started
        no_branch += 1
    model = RunModel(run_id)
    frames = 0
    commands: set[str] = set()
    for ev in events:
        model.feed(ev)
        if not ev.type.startswith("task."):
            continue
        for mode in ("detailed", "compact"):
            console = Console(record=True, width=160, height=60, force_terminal=True, file=io.StringIO())
            console.print(render(model, width=160, height=60, now=(model.last_ts or 0) + 1, mode=mode))
            text = console.export_text()
            assert not INTERNALS.search(text), [ln for ln in text.splitlines() if INTERNALS.search(ln)]
            assert not re.search(r"\bk[0-9a-f]{8}\b", text), text  # cards are named by readable keys
            commands.update(m.group(0).strip() for m in COMMAND.finditer(text))
            frames += 1
    return {"no_branch_tasks": no_branch, "frames": frames, "commands": commands}
