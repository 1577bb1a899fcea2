"""Dry runs that several test files read, made once per test session.

Each is the real ``orchestrator`` command with ``--dry-run``: real Docker and
git, the simulated agent, plain prompts, and a repository whose evaluation
command counts the files the coders committed. test_dry_run_flows.py,
test_strategy_progress.py and test_merge_advice.py each made the same runs of
their own (a tree-beam run is about 25 containers); now the first test that
asks for one makes it, and the tests that read it run on one pytest-xdist
worker (the ``shared_runs`` group, tests/conftest.py). A test that changes a
run (its branches, its files, its log) makes its own instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import cli_env, only_run_id, run_cli, settings_args, strategy_args
from conftest import TEST_IMAGE, make_repo
from scenarios import KEEP_GOAL_YAML

# Each committed sim/*.txt file is worth 10: every implemented idea improves the metric.
BENCH = """import json, os
n = len(os.listdir("sim")) if os.path.isdir("sim") else 0
print(json.dumps({"metrics": {"throughput": 100 + 10 * n}}))
"""
EVAL = settings_args(eval_command="python3 bench.py", primary_metric="throughput")
COLOURED = r"printf '\033[32m++hello \033[2m[string]\033[0m\n'; echo NO_COLOR=$NO_COLOR"
GOALS = (
    KEEP_GOAL_YAML
    + """\
  - id: work
    description: the project records simulated work under sim/
    check: test -n "$(ls sim 2>/dev/null)"
    weight: 5
"""
)

# name: (the repository's files, the command's arguments before --dry-run)
DRY_RUNS: dict[str, tuple[dict[str, str], list[str]]] = {
    # "score" in the goal: the simulated agent used to guess its answer from such words and
    # answered the ideator with a review score (test_dry_run_flows.py keeps that case).
    "tree-beam": (
        {"bench.py": BENCH},
        [
            "raise the benchmark score",
            *strategy_args("tree-beam"),
            *EVAL,
            *settings_args(
                ideas_per_node=2, max_depth=2, beam_width=1, max_total_evals=6, test_command="python3 bench.py"
            ),
        ],
    ),
    # keep_branches=false: the candidates it does not select are deleted once it has finished.
    "best-of-n": ({}, ["raise the benchmark", *strategy_args("best-of-n", n=3, keep_branches="false")]),
    "evolve": (
        {"keep.txt": "keep\n", "GOALS.yaml": GOALS},
        ["keep the project healthy", *strategy_args("evolve", goals="GOALS.yaml", max_cycles=3)],
    ),
    # The test command prints in colour, as npm test and pytest do, and says whether NO_COLOR reached it.
    "review-loop": (
        {"bench.py": BENCH},
        ["raise the benchmark", *strategy_args("review-loop", test_command=COLOURED), *EVAL],
    ),
}


@dataclass(frozen=True)
class DryRun:
    root: Path  # holds repo/, logs/, state/, results/ and ws/, as a test's tmp_path would
    repo: Path
    run_id: str
    stdout: str
    stderr: str

    @property
    def results(self) -> Path:
        return self.root / "results" / self.run_id

    @property
    def logs(self) -> Path:
        return self.root / "logs" / self.run_id


class LazyRuns(dict):
    """Each run is made when a test first asks for it, so ``-k synthesize`` makes one, not five."""

    def __init__(self, makers: dict) -> None:
        super().__init__()
        self.makers = makers

    def __missing__(self, name: str):
        self[name] = self.makers[name]()
        return self[name]


def make_dry_run(root: Path, name: str) -> DryRun:
    files, args = DRY_RUNS[name]
    repo = make_repo(root / "repo", files or None)
    done = run_cli(
        [*args, "--dry-run", "--no-tui", "--docker-image", TEST_IMAGE], cwd=repo, env=cli_env(root), timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return DryRun(root, repo, only_run_id(root), done.stdout, done.stderr)


@pytest.fixture(scope="session")
def dry_runs(tmp_path_factory) -> LazyRuns:
    return LazyRuns({name: (lambda n=name: make_dry_run(tmp_path_factory.mktemp(f"dry-{n}"), n)) for name in DRY_RUNS})
