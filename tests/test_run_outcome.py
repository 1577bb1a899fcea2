"""Every status tells the truth, everywhere, the same way (issue 44).

One function, ``orchestrator.log.state.run_outcome``, decides a run's status
from its fold, and one, ``task_outcome``, a task's. The table runs each outcome
through the real command (real Docker and git, the simulated agent) and reads
it back in every place a user meets it: the summary the run prints, its console
lines, ``--list-runs``, the ``--show-run`` header, ``summary.json``,
``report.html`` and the dashboard (a frame of it, drawn from the run's log). A
run whose strategy failed used to be ``completed`` in all of them, with a ✓ on
the evaluation that failed and a success rate of 100%.

The interrupted run is then resumed to its end: it is the completed row, and
it checks ``run.started``'s ``resumed`` flag and that the duration covers both
sessions (and not the time between them), on the console and in the report.
"""

from __future__ import annotations

import io
import json
import re
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE, make_repo
from reliability_helpers import check_log, events_path, finish, remove_run_docker, start_cli, wait_for
from rich.console import Console

from orchestrator.log.eventlog import read_events
from tui.dashboard import render
from tui.model import RunModel

pytestmark = pytest.mark.docker

DRY = ["--dry-run", "--no-tui", "--docker-image", TEST_IMAGE]

# A strategy with a bug: its one task succeeds, then it raises.
BROKEN = """
async def broken(prompt, base_branch, ctx):
    check = {"plugin": "command", "command": "true", "base_branch": base_branch, "import_policy": "never"}
    await ctx.wait(ctx.run(check, key=ctx.key("check")))
    raise RuntimeError("a bug in the strategy, after its task succeeded")
"""

# name: (the outcome, the command's arguments; "STRATEGY_FILE" is BROKEN's path)
CASES = {
    # the repro: the base's evaluation prints no JSON
    "failed-at-base": (
        "failed",
        ["faster", "--strategy", "tree-beam", "-S", "eval_command=echo hi", "-S", "primary_metric=x"],
    ),
    # review-loop's base check: its test command cannot run there (exit 127)
    "review-loop-base": (
        "failed",
        ["SIM: write f.txt x", "--strategy", "review-loop", "-S", "test_command=no_such_test_runner -q"],
    ),
    "all-tasks-failed": ("failed", ["SIM: fail 1 boom"]),
    "strategy-exception": ("failed", ["SIM: print hi", "--strategy", "STRATEGY_FILE:broken"]),
    # both candidates run at once and pass the cap; every review is refused: gen/0 is kept unscored
    "budget": (
        "budget_reached",
        ["SIM: write f.txt x", "--strategy", "best-of-n", "-S", "n=2", "--max-parallel", "2", "--max-cost", "0.05"],
    ),
    # its generation passes the cap: the review that would judge it is refused, so gen is kept unscored
    "iterative-budget": (
        "budget_reached",
        ["SIM: write f.txt x", "--strategy", "iterative", "-S", "iterations=2", "--max-cost", "0.01"],
    ),
    # Ctrl+C while its one task runs; resumed afterwards (the completed row)
    "interrupted": ("interrupted", ["SIM: sleep 5\nSIM: write f.txt x"]),
}
EXIT_CODES = {"completed": 0, "failed": 1, "budget_reached": 3, "interrupted": 130}
HEADERS = {
    "completed": "Run Complete",
    "failed": "Run Failed",
    "budget_reached": "Run Budget Reached",
    "interrupted": "Run Interrupted",
}


@dataclass(frozen=True)
class Seen:
    """What each of the five places said about one run, read right after the command ended."""

    root: Path
    run_id: str
    rc: int
    console: str  # what the run printed: stdout, then stderr
    listed: str  # its --list-runs row
    shown: str  # --show-run
    summary: dict
    report: str
    manifest: dict
    dashboard: str  # a frame of the dashboard, drawn from the run's log as it ended


def _dashboard(root: Path, run_id: str) -> str:
    model = RunModel(run_id)
    for ev in read_events(events_path(root, run_id)):
        model.feed(ev)
    screen = Console(record=True, width=160, height=40, force_terminal=True, file=io.StringIO())
    screen.print(render(model, width=160, height=40, now=(model.last_ts or 0) + 1))
    return screen.export_text()


def _look(root: Path, repo: Path, run_id: str, rc: int, console: str) -> Seen:
    env = cli_env(root)
    listed = run_cli(["--list-runs"], cwd=repo, env=env)
    assert listed.returncode == 0, listed.stderr
    shown = run_cli(["--show-run", run_id], cwd=repo, env=env)
    summary = root / "results" / run_id / "summary.json"  # (versions before issue 44 wrote none when interrupted)
    return Seen(
        root=root,
        run_id=run_id,
        rc=rc,
        console=console,
        listed=next(line for line in listed.stdout.splitlines() if line.startswith(run_id)),
        shown=shown.stdout,
        summary=json.loads(summary.read_text()) if summary.exists() else {},
        report=(root / "results" / run_id / "report.html").read_text("utf-8"),
        manifest=json.loads((root / "state" / run_id / "run.json").read_text()),
        dashboard=_dashboard(root, run_id),
    )


def _interrupt_once_the_agent_runs(proc, out: Path, root: Path) -> None:
    def agent_running():
        assert proc.poll() is None, out.with_suffix(".err").read_text()
        logs = list((root / "logs").glob("run_*/runner.jsonl"))
        return logs and '"runner.init"' in logs[0].read_text()

    wait_for(agent_running, timeout=300, interval=0.2)
    time.sleep(1)  # a first session of some length: the resumed run's duration must include it
    proc.send_signal(signal.SIGINT)


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict[str, Seen]:
    """Every case started at once; the interrupted one is then resumed (key "completed")."""
    started = {}
    for name, (_, args) in CASES.items():
        root = tmp_path_factory.mktemp(name)
        repo = make_repo(root / "repo")
        strategy = root / "broken.py"
        strategy.write_text(BROKEN)
        args = [a.replace("STRATEGY_FILE", str(strategy)) for a in args]
        out = root / "out" / "run"
        started[name] = (root, repo, out, start_cli([*args, *DRY], cwd=repo, env=cli_env(root), out=out))
    made: dict[str, Seen] = {}
    try:
        root, repo, out, proc = started["interrupted"]
        _interrupt_once_the_agent_runs(proc, out, root)
        for name, (root, repo, out, proc) in started.items():
            rc, stdout, stderr = finish(proc, out, timeout=300)
            made[name] = _look(root, repo, only_run_id(root), rc, stdout + stderr)
        root, repo, _, _ = started["interrupted"]
        run_id = made["interrupted"].run_id
        time.sleep(2)  # the run stands still between its sessions: that time is no part of its duration
        resumed = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=cli_env(root), timeout=300)
        made["completed"] = _look(root, repo, run_id, resumed.returncode, resumed.stdout + resumed.stderr)
        yield made
    finally:
        for root, _, _, proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            for run in (root / "state").iterdir() if (root / "state").exists() else []:
                remove_run_docker(run.name)


ROWS = [(name, outcome) for name, (outcome, _) in CASES.items()] + [("completed", "completed")]


@pytest.mark.parametrize(("name", "outcome"), ROWS, ids=[name for name, _ in ROWS])
def test_each_outcome_reads_the_same_in_all_five_places(seen, name, outcome):
    s = seen[name]
    header = f"═══ {HEADERS[outcome]}: {s.run_id} ═══"
    assert s.rc == EXIT_CODES[outcome], s.console[-3000:]
    # 1. the summary the run printed (an interrupted run prints how to resume instead)
    if outcome == "interrupted":
        assert f"Run interrupted. Resume with: orchestrator --resume {s.run_id}" in s.console
        assert "═══ Run" not in s.console
    else:
        assert header in s.console, s.console[-3000:]
    # 2. --list-runs
    assert s.listed.split()[1] == outcome, s.listed
    # 3. the --show-run header
    assert s.shown.splitlines()[0] == header, s.shown[:500]
    # 4. summary.json
    assert s.summary["status"] == outcome
    # 5. report.html
    assert f"· status {outcome} ·" in s.report
    assert s.manifest["status"] == outcome  # what --resume reads
    # 6. the dashboard: a run that ended says so in the same word; an interrupted one has its task asleep
    if outcome == "interrupted":
        assert "💤 1 interrupted" in s.dashboard, s.dashboard
        assert not re.search(r"run (completed|failed|budget_reached):", s.dashboard), s.dashboard
    else:
        assert f"run {outcome}: " in s.dashboard, s.dashboard


FAILED = [name for name, (outcome, _) in CASES.items() if outcome == "failed"]


@pytest.mark.parametrize("name", FAILED)
def test_a_failed_run_shows_no_success_on_what_failed_and_no_success_rate(seen, name):
    s = seen[name]
    # only a task that did succeed gets a ✓: the broken strategy's own check ran fine
    succeeded = ["check"] if name == "strategy-exception" else []
    for text in (s.console, s.shown):
        assert "✗ strategy failed: " in text, text[-3000:]
        assert "100%" not in text and "Success Rate" not in text, text[-3000:]
        assert f"  Tasks: {len(succeeded)}/1 succeeded; the run failed\n" in text, text[-3000:]
        ticked = [line.split()[1] for line in text.splitlines() if line.strip().startswith("✓")]
        assert ticked == succeeded, text[-3000:]
    assert s.summary["totals"]["success_rate"] is None
    assert "git merge" not in s.console and "git merge" not in s.report


@pytest.mark.parametrize(("name", "task"), [("failed-at-base", "root/eval"), ("review-loop-base", "baseline/tests")])
def test_the_evaluation_that_failed_is_named_as_unusable_everywhere(seen, name, task):
    s = seen[name]
    assert f"✗ {task}" in s.console and "ran, but its result cannot be used" in s.console
    # the console lines: its [COMPLETED] line is followed, once the strategy judged it, by a [FAILED] one
    line = rf"^k\w+/inst-\w+: {task} \[FAILED\] ✗ ran, but its result cannot be used$"
    assert re.search(line, s.console, re.M), s.console[-3000:]
    # the dashboard: no ✅ on it, nothing counted done
    assert "❌ unusable" in s.dashboard and "ran, but its result cannot be used" in s.dashboard, s.dashboard
    assert "✅ 0 done" in s.dashboard and "❌ 1 unusable" in s.dashboard, s.dashboard
    # the report's timeline: its bar is a failure's, not a success's
    assert re.search(rf'fill="#dc2626"><title>[^<]*{task.split("/")[-1]}: unusable, ', s.report), s.report
    ((task,),) = [st["tasks"] for st in s.summary["strategies"]]
    assert task["state"] == "COMPLETED" and task["unusable"] is True, task
    assert s.summary["totals"]["unusable"] == 1
    assert "completed, but its result cannot be used" in s.report
    assert "0 done · 0 failed · 1 unusable / 1" in s.report


UNSCORED = {
    "budget": "gen/0 kept unscored: the spending cap was reached before any review",
    "iterative-budget": "gen kept unscored: the spending cap was reached before its review",
}


@pytest.mark.parametrize("name", sorted(UNSCORED))
def test_an_unscored_pick_at_the_cap_is_named_unreviewed_with_the_command_to_compare_it(seen, name):
    s = seen[name]
    (strat,) = s.summary["strategies"]
    assert strat["verdict"] == UNSCORED[name]
    branch = strat["selected_branch"]
    assert branch and strat["selection_reviewed"] is False
    assert s.summary["final_branches"] == [] and s.summary["unreviewed_branches"] == [branch]
    for text in (s.console, s.shown):
        assert f"  → Picked without review: {branch}\n" in text, text[-3000:]
        assert f"  git diff main...{branch}\n" in text
        assert "To merge" not in text and "git merge" not in text and "Final branches" not in text
    assert "git merge" not in s.report and f"git diff main...{branch}</code>" in s.report
    assert "Picked without review" in s.report


def test_an_interrupted_run_names_what_it_keeps_for_resume_and_the_command_that_gives_it_up(seen):
    s = seen["interrupted"]
    left = s.summary["leftovers"]
    # the container its task ran in, stopped, is what the resume continues in
    assert left["containers"] >= 1 and left["running"] == 0, left
    kept = (
        f"Kept for orchestrator --resume {s.run_id}: {left['branches']} branch{'' if left['branches'] == 1 else 'es'}, "
        f"{left['containers']} stopped container{'' if left['containers'] == 1 else 's'} "
        f"and {left['volumes']} volume{'' if left['volumes'] == 1 else 's'}"
    )
    resume = f"Run interrupted. Resume with: orchestrator --resume {s.run_id}"
    give_up = f"To give the run up instead (the branches stay): orchestrator --cleanup-run {s.run_id}"
    assert f"{resume}\n{kept}\n{give_up}\n" in s.console, s.console[-2000:]


def _seconds(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _shown_seconds(text: str) -> float:
    """``7.3s``, ``12s`` or ``1m 05s`` back to seconds."""
    m = re.fullmatch(r"(?:(\d+)m )?(\d+(?:\.\d)?)s", text)
    assert m, text
    return int(m.group(1) or 0) * 60 + float(m.group(2))


def test_run_started_says_resumed_only_on_a_resume(seen):
    s = seen["completed"]
    starts = [e for e in check_log(events_path(s.root, s.run_id)) if e.type == "run.started"]
    assert [e.payload["resumed"] for e in starts] == [False, True]  # docs/events.md


def test_a_resumed_runs_duration_covers_both_sessions_on_the_console_and_in_the_report(seen):
    s = seen["completed"]
    events = check_log(events_path(s.root, s.run_id))
    # each session: from its run.started to its last event
    sessions: list[list[float]] = []
    for e in events:
        if e.type == "run.started" or not sessions:
            sessions.append([_seconds(e.ts), _seconds(e.ts)])
        sessions[-1][1] = _seconds(e.ts)
    assert len(sessions) == 2
    both = sum(end - start for start, end in sessions)
    span = sessions[-1][1] - sessions[0][0]
    assert span > both + 1.5  # the time between the sessions, which is no part of the duration
    (console,) = re.findall(r"Total Duration: (\S+)", s.console)
    (report,) = re.findall(r'<div class="k">Duration</div><div class="v">([^<]+)</div>', s.report)
    assert console == report, (console, report)
    # tenths of a second under 10 s, whole seconds above
    assert abs(_shown_seconds(console) - both) <= (0.051 if both < 10 else 0.501), (console, sessions)
    assert s.summary["duration_s"] == pytest.approx(both, abs=0.01)
