"""Built-in strategies end to end: real engine, real DockerRunner, the sim agent, real git.

Steering the sim agent through a strategy's own prompts: it obeys ``SIM:`` lines
in the prompt it receives, and best-of-n's reviewer prompt quotes the
candidate's final message while the repair prompt also quotes the reviewer's
previous answer. So a candidate that *prints* a SIM line makes its reviewer run
that line:

* ``SIM: print SIM: print-json {"score": 7, ...}`` -> the candidate says
  ``SIM: print-json {...}`` -> its reviewer answers that JSON (attempt 1).
* ``SIM: print SIM: print-json {"score": 42, ...}`` -> the reviewer's answer
  breaks the score schema (``output_schema``) -> the runner's repair turn, in
  the reviewer's own session, gets a valid instance of the schema (attempt 1).
* ``SIM: print SIM: bad-output`` -> the reviewer answers in prose, and again in
  the repair turn -> its task fails with ``output_invalid``: unscorable.

The strategy-level repair (a second reviewer with a stricter prompt) is for
plugins that cannot enforce a schema; tests/test_strategies_builtin.py covers it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter

import anyio
import pytest
from conftest import TEST_IMAGE, git
from docker_harness import run_with_docker

from orchestrator.log.eventlog import read_events
from orchestrator.runner.docker_containers import list_containers, remove_containers, remove_run_volumes
from strategies.best_of_n import best_of_n
from strategies.iterative import iterative
from strategies.plan_score_implement import plan_score_implement

pytestmark = pytest.mark.docker


async def remove_run_leftovers(run_id: str) -> None:
    """Containers and session volumes are kept for resume by design; a test removes its own."""
    await remove_containers([c["name"] for c in await list_containers(run_id)])
    await remove_run_volumes(run_id)


@pytest.fixture
async def rid():
    """A run id of this test alone: session volumes are per run, so a fixed id would leak state between tests."""
    run_id = f"run_{uuid.uuid4().hex[:10]}"
    yield run_id
    await remove_run_leftovers(run_id)


def sim_print(text: str) -> str:
    """A prompt line that makes the sim agent's final message exactly ``text``."""
    return "SIM: print " + text.replace("\\", "\\\\")


SCORED_7 = "SIM: write a.txt from candidate zero\nSIM: commit add a\n" + sim_print(
    'SIM: print-json {"score": 7, "rationale": "solid"}'
)
NEEDS_REPAIR = "SIM: write b.txt from candidate one\nSIM: commit add b\n" + sim_print(
    'SIM: print-json {"score": 42, "rationale": "out of range"}'
)
FAILS = "SIM: fail 1 boom"
UNSCORABLE = sim_print("SIM: bad-output")


def events_by_type(engine, etype):
    return [e for e in read_events(engine.paths.events) if e.type == etype]


def report(engine, name):
    return json.loads((engine.paths.results / "strategy_output" / name).read_text())


async def test_best_of_n_scores_repairs_excludes_failures_and_picks_the_best(tmp_path, git_repo, workspace_root, rid):
    engine = await run_with_docker(
        tmp_path,
        git_repo,
        run_id=rid,
        fn=best_of_n,
        prompt="add a greeting file",
        params={"n": 3, "approaches": [SCORED_7, NEEDS_REPAIR, FAILS]},
    )
    s1 = engine.state.strategies["s1"]
    assert s1.status == "success", s1.error
    scores = report(engine, "scores.json")
    rows = scores["candidates"]
    assert [(r["status"], r.get("attempts")) for r in rows] == [("scored", 1), ("scored", 1), ("failed", None)]
    assert rows[0]["score"] == 7 and "boom" in rows[2]["error"]
    repaired = rows[1]
    assert 0 <= repaired["score"] <= 10 and repaired["rationale"] != "out of range"
    runner_log = [json.loads(line) for line in (tmp_path / "logs" / rid / "runner.jsonl").read_text().splitlines()]
    invalid = [e for e in runner_log if e["message"] == "runner.output.invalid"]
    assert [e["task_key"].split("/s1/")[1] for e in invalid] == [f"score/{repaired['instance_id']}/attempt-1"]
    assert "42" in invalid[0]["violation"]
    index = 0 if rows[0]["score"] >= repaired["score"] else 1  # highest score, ties to the lower index
    best = s1.result["artifact"]["branch_final"]
    assert scores["selected"] == {
        "index": index,
        "instance_id": s1.result["instance_id"],
        "branch": best,
        "score": rows[index]["score"],
    }
    assert (engine.paths.results / "strategy_output" / "best_branch.txt").read_text() == best + "\n"
    assert git(git_repo, "show", f"{best}:{'ab'[index]}.txt") == f"from candidate {['zero', 'one'][index]}"
    # reviewers ran read-only: no branch was imported for any score task; the repair was no extra task
    completed = {e.key: e.payload for e in events_by_type(engine, "task.completed")}
    score_keys = sorted(k.split("/s1/")[1] for k in completed if "/score/" in k)
    assert score_keys == sorted(f"score/{r['instance_id']}/attempt-1" for r in rows[:2])
    assert all(completed[k]["artifact"]["branch_final"] is None for k in completed if "/score/" in k)
    assert completed[f"{rid}/s1/score/{repaired['instance_id']}/attempt-1"]["output"]["score"] == repaired["score"]


async def test_best_of_n_with_only_unscorable_candidates_fails(tmp_path, git_repo, workspace_root, rid):
    engine = await run_with_docker(
        tmp_path, git_repo, run_id=rid, fn=best_of_n, prompt="add a file", params={"n": 2, "approaches": [UNSCORABLE]}
    )
    s1 = engine.state.strategies["s1"]
    assert s1.status == "failed" and s1.error.startswith("NoViableCandidates"), s1.error
    rows = report(engine, "scores.json")["candidates"]
    # the reviewer's prose failed the schema twice (answer and repair turn): output_invalid, no second reviewer
    assert [(r["status"], r["attempts"]) for r in rows] == [("unscorable", 1), ("unscorable", 1)]
    assert all("output_invalid" in r["error"] for r in rows)


async def test_best_of_n_survives_interruption_and_resume_through_docker(tmp_path, git_repo, workspace_root, rid):
    # Candidate 1 blocks in its first execution only: the marker lives in the
    # task's session volume, which the resumed execution mounts again.
    slow_once = "SIM: exec test -f ~/.slept || { touch ~/.slept; sleep 120; }\n" + sim_print(
        'SIM: print-json {"score": 9, "rationale": "late but good"}'
    )
    params = {"n": 2, "approaches": [sim_print('SIM: print-json {"score": 5, "rationale": "ok"}'), slow_once]}

    seen: list[float] = []

    def first_done_second_sleeping(engine) -> bool:
        # gen/1's agent has named its session (task.session), so it is past start-up;
        # a second later it has touched its marker and sleeps
        tasks = engine.state.tasks
        gen0, gen1 = tasks.get(f"{rid}/s1/gen/0"), tasks.get(f"{rid}/s1/gen/1")
        if gen0 is None or gen0.state != "COMPLETED" or gen1 is None or not gen1.session_id:
            return False
        seen.append(time.monotonic())
        return time.monotonic() - seen[0] >= 1.0

    first = await run_with_docker(
        tmp_path, git_repo, run_id=rid, fn=best_of_n, params=params, cancel_when=first_done_second_sleeping
    )
    done_first = {e.key for e in events_by_type(first, "task.completed")}
    assert f"{rid}/s1/gen/0" in done_first and first.state.strategies["s1"].status == "running"
    assert any(e.key == f"{rid}/s1/gen/1" for e in events_by_type(first, "task.interrupted"))

    second = await run_with_docker(tmp_path, git_repo, run_id=rid, fn=best_of_n, params=params)
    s1 = second.state.strategies["s1"]
    assert s1.status == "success", s1.error
    assert s1.result["key"] == f"{rid}/s1/gen/1"
    completed = Counter(e.key for e in events_by_type(second, "task.completed"))
    assert set(completed.values()) == {1}  # every key completed exactly once across both processes
    assert len(completed) == 4  # 2 generations + 2 first-attempt reviews
    started_again = {e.key for e in events_by_type(second, "task.started")} - {
        e.key for e in events_by_type(first, "task.started")
    }
    assert not started_again & done_first


async def test_iterative_improves_in_one_resumed_session(tmp_path, git_repo, workspace_root, rid):
    engine = await run_with_docker(
        tmp_path, git_repo, run_id=rid, fn=iterative, prompt="write a haiku about git", params={"iterations": 2}
    )
    s1 = engine.state.strategies["s1"]
    assert s1.status == "success", s1.error
    completed = {e.key.split("/s1/")[1]: e.payload for e in events_by_type(engine, "task.completed")}
    assert sorted(completed) == [
        "gen",
        "improve/iter-1",
        "improve/iter-2",
        "review/iter-1/attempt-1",
        "review/iter-2/attempt-1",
    ]
    chain = [completed[k] for k in ("gen", "improve/iter-1", "improve/iter-2")]
    assert len({p["session_id"] for p in chain}) == 1  # the agent resumed the same session each time
    final = s1.result["artifact"]["branch_final"]
    # each improvement started from the previous branch: three agent commits on top of main
    assert git(git_repo, "rev-list", "--count", f"main..{final}") == "3"
    assert git(git_repo, "merge-base", "--is-ancestor", chain[0]["artifact"]["branch_final"], final) == ""
    steps = report(engine, "iterations.json")["steps"]
    assert all(isinstance(s["score"], float) for s in steps if s["step"].startswith("review"))


async def test_plan_score_implement_resumes_the_winning_planner(tmp_path, git_repo, workspace_root, rid):
    engine = await run_with_docker(
        tmp_path,
        git_repo,
        run_id=rid,
        fn=plan_score_implement,
        prompt="add input validation",
        params={"angles": ["performance", "simplicity"]},
    )
    s1 = engine.state.strategies["s1"]
    assert s1.status == "success", s1.error
    plans = report(engine, "plans.json")
    scores = [p["score"] for p in plans["plans"]]
    expected = 0 if scores[0] >= scores[1] else 1
    assert plans["selected"]["angle"] == ["performance", "simplicity"][expected]
    winner = engine.state.tasks[f"{rid}/s1/plan/{plans['selected']['angle']}"]
    assert s1.result["key"] == f"{rid}/s1/implement/plan/{winner.instance_id}"
    assert s1.result["session_id"] == winner.session_id
    assert (
        s1.result["artifact"]["has_changes"]
        and git(git_repo, "rev-list", "--count", f"main..{s1.result['artifact']['branch_final']}") == "1"
    )


async def test_cli_best_of_n_dry_run_writes_scores_and_summary(tmp_path, git_repo):
    env = dict(
        os.environ, ANTHROPIC_API_KEY="sk-test-dummy-key-0000000000", ORCHESTRATOR_WORKSPACE_ROOT=str(tmp_path / "ws")
    )
    proc = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator.app.cli",
                "add a README section",
                "--strategy",
                "best-of-n",
                "-S",
                "n=2",
                "--runs",
                "2",
                "--repo",
                str(git_repo),
                "--docker-image",
                TEST_IMAGE,
                "--no-tui",
                "--dry-run",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    )
    (run_dir,) = (tmp_path / "results").iterdir()
    try:
        check_cli_outputs(proc, run_dir, git_repo)
    finally:
        await remove_run_leftovers(run_dir.name)


def check_cli_outputs(proc, run_dir, git_repo):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = run_dir / "strategy_output"
    assert sorted(p.name for p in out.iterdir()) == [
        "best_branch.txt",
        "best_branch_s2.txt",
        "scores.json",
        "scores_s2.json",
    ]
    summary = json.loads((run_dir / "summary.json").read_text())
    selected = {st["strategy_execution_id"]: st["selected_branch"] for st in summary["strategies"]}
    assert summary["dry_run"] and summary["status"] == "completed" and summary["totals"]["failed"] == 0
    for name, sid in (("best_branch.txt", "s1"), ("best_branch_s2.txt", "s2")):
        branch = (out / name).read_text().strip()
        assert selected[sid] == branch and git(git_repo, "rev-parse", "--verify", branch)
        assert (
            json.loads((out / name.replace("best_branch", "scores").replace(".txt", ".json")).read_text())["selected"][
                "branch"
            ]
            == branch
        )
