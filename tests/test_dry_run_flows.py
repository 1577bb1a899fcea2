"""Dry runs rehearse each built-in strategy's whole flow: the real ``orchestrator`` command,
``--dry-run``, real Docker and git, the simulated agent and plain prompts (no SIM lines).

The simulated agent answers every task that carries an ``output_schema`` with an
instance of that schema derived from the prompt, so ideas, scores and verdicts
have the shape the strategy asked for and differ from one prompt to the next.
Each repository has a real evaluation command whose result depends on what the
agent committed (the sim agent commits one ``sim/<hash>.txt`` per coding task).
The runs are tests/shared_runs.py's, which other files read too.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from conftest import git
from screen_checks import check_screen
from shared_runs import DRY_RUNS
from tree_checks import validate_tree

from strategies.tree_beam_report import best_path

pytestmark = pytest.mark.docker


def test_dry_run_tree_beam_grows_to_max_depth(dry_runs):
    # A goal that says "score": the simulated agent used to guess its answer from such words and
    # answered the ideator with a review score, so the run stopped after two idea tasks
    # (frontier_empty, 0 evaluations). With output_schema it answers with ideas.
    run = dry_runs["tree-beam"]
    assert "raise the benchmark score" in DRY_RUNS["tree-beam"][1]
    repo, run_id = run.repo, run.run_id
    # its measurement tasks (command tasks whose script and output carry marker lines) stay readable
    seen = check_screen(run.logs, run_id, run.stdout + run.stderr)
    assert seen["no_branch_tasks"] >= 4 and seen["frames"] > 10, seen
    # its measurements' and test gate's cards show the user's commands, not their wrappers' first lines
    assert {"$ python3 bench.py"} <= seen["commands"], seen["commands"]
    out = run.results / "strategy_output"
    tree = json.loads((out / "tree.json").read_text())
    assert tree["stop_reason"] == "max_depth", tree["stop_reason"]
    assert [n["id"] for n in tree["nodes"]] == ["n0", "n1", "n2"]
    assert [n["id"] for n in best_path(tree)] == ["n0", "n1", "n2"]
    assert validate_tree(tree, repo) == []
    evals = tree["evaluations"]
    assert 4 == len(evals) <= 6
    titles = [e["idea"]["title"] for e in evals]
    assert len(set(titles)) == len(titles) and all(titles), titles  # distinct ideas from the ideator
    for e in evals:
        assert e["status"] == "completed", e
        assert e["evaluation"]["metrics"]["throughput"] > 100  # implemented: the coder committed
        assert e["decision"]["passed_gate"], e["decision"]
    promoted = [e for e in evals if e.get("promoted_to")]
    assert [e["promoted_to"] for e in promoted] == ["n1", "n2"]
    best = tree["nodes"][-1]
    assert git(repo, "rev-parse", "--verify", best["branch"])
    assert (out / "TREE_SUMMARY.md").exists()


def test_dry_run_best_of_n_scores_every_candidate(dry_runs):
    report = json.loads((dry_runs["best-of-n"].results / "strategy_output" / "scores.json").read_text())
    rows = report["candidates"]
    assert [r["status"] for r in rows] == ["scored"] * 3, rows
    assert all(0 <= r["score"] <= 10 and r["rationale"] and r["attempts"] == 1 for r in rows)
    assert report["selected"]["score"] == max(r["score"] for r in rows)
    # Each reviewer scores the work it reads, so a rehearsal ranks: distinct scores, no tie-break
    # (every candidate used to get one score and one rationale from the one reviewer prompt).
    assert len({r["score"] for r in rows}) == 3 and len({r["rationale"] for r in rows}) == 3, rows
    (verdict,) = [ln for ln in dry_runs["best-of-n"].stdout.splitlines() if "Verdict: " in ln]
    assert "tie" not in verdict, verdict


def test_dry_run_best_of_n_without_keep_branches_leaves_only_the_selected_branch(dry_runs):
    run = dry_runs["best-of-n"]  # -S keep_branches=false (tests/shared_runs.py)
    report = json.loads((run.results / "strategy_output" / "scores.json").read_text())
    selected = report["selected"]["branch"]
    others = [r["branch"] for r in report["candidates"] if r["branch"] != selected]
    assert len(others) == 2 and sorted(report["delete_branches"]) == sorted(others)
    assert git(run.repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split() == sorted(
        ["main", selected]
    )
    assert "best-of-n: deleted 2 branch(es) it no longer needs" in run.stderr
    (s,) = json.loads((run.results / "summary.json").read_text())["strategies"]
    assert sorted(t["branch"] for t in s["tasks"] if t["branch_deleted"]) == sorted(others)
    assert s["selected_branch"] == selected


def test_dry_run_review_loop_runs_its_review_rounds(dry_runs):
    run = dry_runs["review-loop"]
    seen = check_screen(run.logs, run.run_id, run.stdout + run.stderr)
    assert seen["no_branch_tasks"] >= 2, seen  # its test/eval commands and its reviews make no branch
    out = run.results / "strategy_output"
    (summary_path,) = out.glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["status"] == "completed", summary
    assert summary["rounds"] and summary["rounds"][0]["verdict"] == "APPROVE"
    assert summary["tests"]["exit_code"] == 0
    assert summary["evaluation"]["metrics"]["throughput"] > 100
    assert (summary_path.parent / "review_round_1.md").exists()


def test_dry_run_review_loop_shows_test_output_without_terminal_codes(dry_runs):
    # Its test command prints in colour (tests/shared_runs.py). The codes used to reach the
    # report, summary.json and the log raw, shown as "[32m++hello [2m[string]".
    run = dry_runs["review-loop"]
    assert "\x1b" not in run.stdout + run.stderr
    written = [p for d in (run.logs, run.results) for p in d.rglob("*") if p.is_file()]
    assert any(p.name == "events.jsonl" for p in written) and any(p.name == "report.html" for p in written)
    for path in written:
        text = path.read_text("utf-8", errors="replace")
        assert "\x1b" not in text and "\\u001b" not in text.lower(), path
    (tests_log,) = (run.results / "strategy_output").glob("*/tests.log")
    # Command tasks run with NO_COLOR=1 (the test's environment sets neither NO_COLOR nor FORCE_COLOR).
    assert tests_log.read_text() == "++hello [string]\nNO_COLOR=1\n"
    assert "++hello [string]\nNO_COLOR=1" in (run.results / "report.html").read_text("utf-8")


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_a_finished_dry_run_gives_its_workspace_folder_back(dry_runs, name):
    # The object store (a copy of the repository's history when the workspace root is on
    # another filesystem) and the pristine indexes used to stay until a later start's retention.
    run = dry_runs[name]
    folder = run.root / "ws" / run.run_id
    left = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    assert not [n for n in left if "objects_" in n or n == ".pristine-index"], left
    totals = json.loads((run.results / "summary.json").read_text())["totals"]
    if not totals["failed"]:  # no failed task's workspace is kept for a post-mortem: nothing is left
        assert not folder.exists(), left


def _docker_count(*args: str) -> int:
    done = subprocess.run(["docker", *args, "-q"], capture_output=True, text=True, check=True)
    return len(done.stdout.split())


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_the_summary_ends_with_what_the_run_leaves_and_how_to_remove_it(dry_runs, name):
    run = dry_runs[name]
    *_, left, remove = run.stdout.rstrip().splitlines()
    found = re.fullmatch(r"Left behind: (\d+) branch(?:es)?, (\d+) stopped containers? and (\d+) volumes?", left)
    assert found, run.stdout[-1500:]
    branches = git(run.repo, "branch", "--list", f"*{run.run_id}*").split()
    containers = _docker_count("ps", "-a", "--filter", f"label=run_id={run.run_id}")
    volumes = _docker_count("volume", "ls", "--filter", f"label=run_id={run.run_id}")
    assert tuple(map(int, found.groups())) == (len(branches), containers, volumes)
    assert containers and volumes  # stopped containers and session volumes stay for retention
    assert (
        remove == f"To remove the containers and volumes (the branches stay): orchestrator --cleanup-run {run.run_id}"
    )
    leftovers = json.loads((run.results / "summary.json").read_text())["leftovers"]
    assert leftovers == {"branches": len(branches), "containers": containers, "running": 0, "volumes": volumes}


def test_dry_run_evolve_runs_a_wave_and_its_gate(dry_runs):
    run = dry_runs["evolve"]
    repo = run.repo
    seen = check_screen(run.logs, run.run_id, run.stdout + run.stderr)
    assert seen["no_branch_tasks"] >= 2, seen  # its goal measurements
    summary = json.loads((run.results / "summary.json").read_text())
    (strategy,) = summary["strategies"]
    assert strategy["result"]["stopped"] == "all-passing", strategy["result"]
    out = run.results / "strategy_output"
    cycles = [json.loads(line) for line in (out / "cycle-history.jsonl").read_text().splitlines()]
    # one wave fixed the failing goal, and its gate (every goal measured on the merged wave) kept it
    assert [(c["goal_ids"], c["result"], c["fixed"], c["regressed"]) for c in cycles] == [
        (["work"], "improved", ["work"], [])
    ], cycles
    final = strategy["result"]["final_branch"]
    assert git(repo, "ls-tree", "--name-only", final, "sim/")
