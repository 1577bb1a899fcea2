"""Strategies' progress records through the real ``orchestrator`` command: the log, the console, the dashboard.

The runs are tests/shared_runs.py's dry runs, which other files read too.
"""

from __future__ import annotations

import io
import json
import time

import pytest
from rich.console import Console

from orchestrator.log.eventlog import read_events
from tui.dashboard import Dashboard
from tui.model import fmt_progress

pytestmark = pytest.mark.docker


def progress_of(tmp_path, run_id):
    return [
        e.payload
        for e in read_events(tmp_path / "logs" / run_id / "events.jsonl")
        if e.type == "strategy.progress" and e.strategy_execution_id == "s1"
    ]


def dashboard_text(tmp_path, run_id) -> str:
    """The dashboard a user would open on the finished run, fed from its log like the live one."""
    dash = Dashboard(
        run_id,
        logs_dir=tmp_path / "logs",
        state_dir=tmp_path / "state",
        results_dir=tmp_path / "results",
        console=Console(record=True, width=160, height=40, file=io.StringIO()),
    )
    for ev in read_events(dash.events_path):
        dash.model.feed(ev)
    console = Console(record=True, width=160, height=40, file=io.StringIO())
    console.print(dash.frame(time.time()))
    return console.export_text()


def test_tree_beam_run_publishes_its_progress_to_the_log_console_and_dashboard(dry_runs):
    run = dry_runs["tree-beam"]  # tests/shared_runs.py: depth 2, beam 1, two ideas a node
    tmp_path, run_id, result = run.root, run.run_id, run
    records = progress_of(tmp_path, run_id)
    assert records[0] == {
        "phase": "depth",
        "step": 0,
        "of_total": 2,
        "frontier": 0,
        "done": 0,
        "total": 0,
        "text": "measuring the base",
    }
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)  # depth only goes up
    assert {r["step"] for r in records} == {0, 1, 2}
    last = records[-1]
    tree = json.loads((tmp_path / "results" / run_id / "strategy_output" / "tree.json").read_text())
    assert last["text"] == f"stopped: {tree['stop_reason']}" and last["best"] == max(
        n["rank_score"] for n in tree["nodes"] if n["rank_score"] is not None
    )
    assert any(r.get("done", 0) < r.get("total", 0) for r in records)  # published while a depth was evaluated
    line = f"s1: [STRATEGY] depth 2/2 · frontier {last['frontier']} · best {last['best']:g} · {last['text']}"
    assert line in result.stdout, result.stdout[-3000:]
    assert f"depth 2/2 · frontier {last['frontier']} · best {last['best']:g}" in dashboard_text(tmp_path, run_id)


def test_evolve_run_publishes_its_progress_to_the_log_console_and_dashboard(dry_runs):
    run = dry_runs["evolve"]  # tests/shared_runs.py: two goals, "keep" passing from the start
    tmp_path, run_id, result = run.root, run.run_id, run
    records = progress_of(tmp_path, run_id)
    assert records[0] == {
        "phase": "cycle",
        "step": 0,
        "of_total": 3,
        "done": 1,
        "total": 2,
        "text": "goals 1/2 passing",
    }
    assert records[-1] == {
        "phase": "cycle",
        "step": 1,
        "of_total": 3,
        "done": 2,
        "total": 2,
        "text": "goals 2/2 passing · stopped: all-passing",
    }
    assert "s1: [STRATEGY] cycle 1/3 · goals 2/2 passing · stopped: all-passing" in result.stdout
    assert "cycle 1/3 · goals 2/2 passing · stopped: all-passing" in dashboard_text(tmp_path, run_id)
    from orchestrator.log.events import Progress

    assert fmt_progress(Progress(**records[-1])) == "cycle 1/3 · goals 2/2 passing · stopped: all-passing"
