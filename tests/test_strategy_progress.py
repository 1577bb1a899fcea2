"""Strategies' progress records through the real ``orchestrator`` command: the log, the console, the dashboard."""

from __future__ import annotations

import io
import json
import time

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE, make_repo
from rich.console import Console

from orchestrator.log.eventlog import read_events
from tui.dashboard import Dashboard
from tui.model import fmt_progress

pytestmark = pytest.mark.docker

IMG = ["--docker-image", TEST_IMAGE]

BENCH = """import json, os
n = len(os.listdir("sim")) if os.path.isdir("sim") else 0
print(json.dumps({"metrics": {"throughput": 100 + 10 * n}}))
"""

GOALS = """\
version: 1
goals:
  - id: work
    description: the project records simulated work under sim/
    check: test -n "$(ls sim 2>/dev/null)"
    weight: 1
"""


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


def test_tree_beam_run_publishes_its_progress_to_the_log_console_and_dashboard(tmp_path):
    repo = make_repo(tmp_path / "repo", {"bench.py": BENCH})
    result = run_cli(
        [
            "raise the benchmark",
            "--strategy",
            "tree-beam",
            "--dry-run",
            "--no-tui",
            *IMG,
            "-S",
            "eval_command=python3 bench.py",
            "-S",
            "primary_metric=throughput",
            "-S",
            "ideas_per_node=2",
            "-S",
            "max_depth=2",
            "-S",
            "beam_width=1",
            "-S",
            "max_total_evals=4",
            "-S",
            "confirm_pairs=0",
        ],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_id = only_run_id(tmp_path)
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


def test_evolve_run_publishes_its_progress_to_the_log_console_and_dashboard(tmp_path):
    repo = make_repo(tmp_path / "repo", {"keep.txt": "keep\n", "GOALS.yaml": GOALS})
    result = run_cli(
        [
            "keep the project healthy",
            "--strategy",
            "evolve",
            "-S",
            "goals=GOALS.yaml",
            "-S",
            "max_cycles=3",
            "--dry-run",
            "--no-tui",
            *IMG,
        ],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_id = only_run_id(tmp_path)
    records = progress_of(tmp_path, run_id)
    assert records[0] == {
        "phase": "cycle",
        "step": 0,
        "of_total": 3,
        "done": 0,
        "total": 1,
        "text": "goals 0/1 passing",
    }
    assert records[-1] == {
        "phase": "cycle",
        "step": 1,
        "of_total": 3,
        "done": 1,
        "total": 1,
        "text": "goals 1/1 passing · stopped: all-passing",
    }
    assert "s1: [STRATEGY] cycle 1/3 · goals 1/1 passing · stopped: all-passing" in result.stdout
    assert "cycle 1/3 · goals 1/1 passing · stopped: all-passing" in dashboard_text(tmp_path, run_id)
    from orchestrator.log.events import Progress

    assert fmt_progress(Progress(**records[-1])) == "cycle 1/3 · goals 1/1 passing · stopped: all-passing"
