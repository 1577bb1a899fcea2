"""Dry runs rehearse each built-in strategy's whole flow: the real ``orchestrator`` command,
``--dry-run``, real Docker and git, the simulated agent and plain prompts (no SIM lines).

The simulated agent answers every task that carries an ``output_schema`` with an
instance of that schema derived from the prompt, so ideas, scores and verdicts
have the shape the strategy asked for and differ from one prompt to the next.
Each repository has a real evaluation command whose result depends on what the
agent committed (the sim agent commits one ``sim/<hash>.txt`` per coding task).
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE, git, make_repo
from screen_checks import check_screen
from tree_checks import validate_tree

from strategies.tree_beam_report import best_path

pytestmark = pytest.mark.docker

IMG = ["--docker-image", TEST_IMAGE]

# Each committed sim/*.txt file is worth 10: every implemented idea improves the metric.
BENCH = """import json, os
n = len(os.listdir("sim")) if os.path.isdir("sim") else 0
print(json.dumps({"metrics": {"throughput": 100 + 10 * n}}))
"""


def test_dry_run_tree_beam_grows_to_max_depth(tmp_path):
    # A goal that says "score": the simulated agent used to guess its answer from such words and
    # answered the ideator with a review score, so the run stopped after two idea tasks
    # (frontier_empty, 0 evaluations). With output_schema it answers with ideas.
    repo = make_repo(tmp_path / "repo", {"bench.py": BENCH})
    result = run_cli(
        [
            "raise the benchmark score",
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
            "max_total_evals=6",
            "-S",
            "test_command=python3 bench.py",
        ],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_id = only_run_id(tmp_path)
    # its measurement tasks (command tasks whose script and output carry marker lines) stay readable
    seen = check_screen(tmp_path / "logs" / run_id, run_id, result.stdout + result.stderr)
    assert seen["no_branch_tasks"] >= 4 and seen["frames"] > 10, seen
    out = tmp_path / "results" / run_id / "strategy_output"
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


def test_dry_run_best_of_n_scores_every_candidate(tmp_path):
    repo = make_repo(tmp_path / "repo")
    result = run_cli(
        ["add a README section", "--strategy", "best-of-n", "-S", "n=3", "--dry-run", "--no-tui", *IMG],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "results" / only_run_id(tmp_path) / "strategy_output"
    report = json.loads((out / "scores.json").read_text())
    rows = report["candidates"]
    assert [r["status"] for r in rows] == ["scored"] * 3, rows
    assert all(0 <= r["score"] <= 10 and r["rationale"] and r["attempts"] == 1 for r in rows)
    assert report["selected"]["score"] == max(r["score"] for r in rows)


def test_dry_run_review_loop_runs_its_review_rounds(tmp_path):
    repo = make_repo(tmp_path / "repo", {"bench.py": BENCH})
    result = run_cli(
        [
            "make the solver faster",
            "--strategy",
            "review-loop",
            "-S",
            "test_command=true",
            "-S",
            "eval_command=python3 bench.py",
            "-S",
            "primary_metric=throughput",
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
    seen = check_screen(tmp_path / "logs" / run_id, run_id, result.stdout + result.stderr)
    assert seen["no_branch_tasks"] >= 2, seen  # its test/eval commands and its reviews make no branch
    out = tmp_path / "results" / run_id / "strategy_output"
    (summary_path,) = out.glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["status"] == "completed", summary
    assert summary["rounds"] and summary["rounds"][0]["verdict"] == "APPROVE"
    assert summary["tests"]["exit_code"] == 0
    assert summary["evaluation"]["metrics"]["throughput"] > 100
    assert (summary_path.parent / "review_round_1.md").exists()


GOALS = """\
version: 1
goals:
  - id: keep
    description: keep.txt stays
    check: test -f keep.txt
    weight: 1
  - id: work
    description: the project records simulated work under sim/
    check: test -n "$(ls sim 2>/dev/null)"
    weight: 5
"""


def test_dry_run_evolve_runs_a_wave_and_its_gate(tmp_path):
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
    seen = check_screen(tmp_path / "logs" / run_id, run_id, result.stdout + result.stderr)
    assert seen["no_branch_tasks"] >= 2, seen  # its goal measurements
    summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
    (strategy,) = summary["strategies"]
    assert strategy["result"]["stopped"] == "all-passing", strategy["result"]
    out = tmp_path / "results" / run_id / "strategy_output"
    cycles = [json.loads(line) for line in (out / "cycle-history.jsonl").read_text().splitlines()]
    # one wave fixed the failing goal, and its gate (every goal measured on the merged wave) kept it
    assert [(c["goal_ids"], c["result"], c["fixed"], c["regressed"]) for c in cycles] == [
        (["work"], "improved", ["work"], [])
    ], cycles
    final = strategy["result"]["final_branch"]
    assert git(repo, "ls-tree", "--name-only", final, "sim/")
