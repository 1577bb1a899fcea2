"""Merge advice names only a branch the strategy selected, in a run that finished.

The real ``orchestrator`` command, ``--dry-run``, real Docker and git and the
simulated agent. The console summary, ``summary.json`` and ``report.html`` must
agree on the selected branch, and a branch that failed its gates, or a run that
did not finish, is never offered as ``git merge``.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE, git, make_repo
from markupsafe import escape
from reliability_helpers import (
    all_containers,
    check_log,
    events_path,
    finish,
    remove_run_docker,
    start_cli,
    wait_for,
    wait_run_started,
)
from shared_runs import DRY_RUNS

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _remove_run_containers(tmp_path):
    """Finished runs keep their stopped containers for retention; the test machine is shared.

    Only this test's containers (their manifest label points into tmp_path), and a
    run's volumes only once no container of that run id is left (another test's
    run may have started in the same second).
    """
    yield
    state = tmp_path / "state"
    for run in state.iterdir() if state.exists() else []:
        mine = f"label=orchestrator.run_manifest={run / 'run.json'}"
        names = subprocess.run(
            ["docker", "ps", "-a", "--filter", f"label=run_id={run.name}", "--filter", mine, "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if names:
            subprocess.run(["docker", "rm", "-f", *names], capture_output=True)
        if not all_containers(run.name):
            remove_run_docker(run.name)


IMG = ["--docker-image", TEST_IMAGE]

BENCH = """import json, os
n = len(os.listdir("sim")) if os.path.isdir("sim") else 0
print(json.dumps({"metrics": {"throughput": 100 + 10 * n}}))
"""


def review_loop(tmp_path, test_command: str):
    repo = make_repo(tmp_path / "repo")
    args = ["make the parser faster", "--strategy", "review-loop", "-S", f"test_command={test_command}"]
    done = run_cli(
        [*args, "--dry-run", "--no-tui", *IMG],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = only_run_id(tmp_path)
    summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
    page = (tmp_path / "results" / run_id / "report.html").read_text("utf-8")
    return repo, done.stdout, summary, page


def test_review_loop_whose_tests_fail_recommends_no_merge(tmp_path):
    # The case: the test command cannot run in the image. The idea ends tests_failed,
    # and the summary used to fall back to "every branch created" and advise merging one.
    _, out, summary, page = review_loop(tmp_path, "python3 -c 'import no_such_module_in_the_image'")
    (s,) = summary["strategies"]
    assert [i["status"] for i in s["result"]["ideas"]] == ["tests_failed"], s["result"]["ideas"]
    assert summary["branches"], "the coder made a branch: that is what used to be advised"
    assert s["selected_branch"] is None and summary["final_branches"] == []
    assert "git merge" not in out and "→ Selected" not in out, out
    assert "No branch to merge: no strategy execution selected a branch." in out, out
    assert "git merge" not in page and "Nothing selected" in page


def test_review_loop_good_run_selects_its_best_idea_everywhere(tmp_path):
    repo, out, summary, page = review_loop(tmp_path, "true")
    (s,) = summary["strategies"]
    best = s["result"]["best"]
    assert best is not None and best["status"] == "completed", s["result"]
    branch = best["branch"]
    assert git(repo, "rev-parse", "--verify", branch)
    assert s["selected_branch"] == branch and summary["final_branches"] == [branch]
    assert f"  → Selected: {branch}\n" in out and f"  git merge {branch}\n" in out, out
    assert re.findall(r"git merge (\S+)", out) == [branch]
    assert f"git merge {branch}</code>" in page


def test_interrupted_tree_beam_recommends_no_merge_and_shows_the_resume(tmp_path):
    repo = make_repo(tmp_path / "repo", {"bench.py": BENCH})
    env = cli_env(tmp_path)
    args = ["raise the benchmark", "--strategy", "tree-beam", "--dry-run", "--no-tui", *IMG]
    args += ["-S", "eval_command=python3 bench.py", "-S", "primary_metric=throughput"]
    args += ["-S", "ideas_per_node=2", "-S", "max_depth=2", "-S", "beam_width=1"]
    out = tmp_path / "out" / "run"
    proc = start_cli(args, cwd=repo, env=env, out=out)
    try:
        run_id = wait_run_started(proc, out, tmp_path)

        def a_candidate_branch_exists():
            assert proc.poll() is None, out.with_suffix(".err").read_text()
            return any(
                e.type == "task.completed" and (e.payload.get("artifact") or {}).get("branch_final")
                for e in check_log(events_path(tmp_path, run_id))
            )

        # Interrupted once a candidate exists as a branch: the old summary offered it for merging.
        wait_for(a_candidate_branch_exists, timeout=300, interval=0.5)
        proc.send_signal(2)
        rc, _, err = finish(proc, out, timeout=120)
        assert rc == 130, err
        assert f"Resume with: orchestrator --resume {run_id}" in err

        shown = run_cli(["--show-run", run_id], cwd=repo, env=env, timeout=120)
        assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
        assert "git merge" not in shown.stdout and "→ Selected" not in shown.stdout, shown.stdout
        assert f"Resume with: orchestrator --resume {run_id}" in shown.stdout, shown.stdout
        branches = git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/tree-beam_*").split()
        assert branches, "a candidate branch exists, yet none is advised"
        page = (tmp_path / "results" / run_id / "report.html").read_text("utf-8")
        assert "git merge" not in page and f"orchestrator --resume {run_id}" in page
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


# ---------------------------------------------------------------- the verdict line of each built-in strategy

EVAL = ["-S", "eval_command=python3 bench.py", "-S", "primary_metric=throughput"]
# The strategies whose dry run tests/shared_runs.py makes for other files too are read from there.
VERDICT_RUNS = {
    "simple": (["-S", "import_policy=always"], {}),
    "iterative": ([], {}),
    "plan-score-implement": ([], {}),
    "synthesize": ([], {}),
}


def check_verdict(name: str, root, run_id: str, stdout: str) -> None:
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith("Verdict: ")]
    assert len(lines) == 1, stdout
    line = lines[0].removeprefix("Verdict: ")
    (s,) = json.loads((root / "results" / run_id / "summary.json").read_text())["strategies"]
    assert s["verdict"] == line
    page = (root / "results" / run_id / "report.html").read_text("utf-8")
    assert str(escape(line)) in page
    # a run started in the same second as another (tests side by side) gets a "_2" suffix
    snapshot = re.sub(r"run_\d{8}_\d{6}(?:_\d+)?_k[0-9a-f]{8}", "RUN_k", line)
    assert re.fullmatch(VERDICTS[name], snapshot), snapshot


@pytest.mark.parametrize("name", sorted(VERDICT_RUNS))
def test_each_strategy_states_one_verdict_line_everywhere(tmp_path, name):
    args, files = VERDICT_RUNS[name]
    repo = make_repo(tmp_path / "repo", files or None)
    done = run_cli(
        ["raise the benchmark", "--strategy", name, *args, "--dry-run", "--no-tui", *IMG],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check_verdict(name, tmp_path, only_run_id(tmp_path), done.stdout)


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_each_search_strategy_states_one_verdict_line_everywhere(dry_runs, name):
    run = dry_runs[name]
    check_verdict(name, run.root, run.run_id, run.stdout)


# The simulated agent answers from the prompt and the work it reads, so each dry run's verdict is
# fixed; run ids are masked.
VERDICTS = {
    "best-of-n": re.escape("gen/0 won with score 4.5 (others: gen/1 2.6, gen/2 3.9)"),
    "evolve": re.escape("goals passing 1/2 → 2/2 after 1 cycle(s); stopped: all-passing"),
    "review-loop": re.escape(
        "best: 01-prompt beat the base (score 10, grade strong); ranking: 1. 01-prompt score 10, tests passed"
    ),
    "simple": re.escape("returned one task's result: branch simple_RUN_k"),
    "iterative": re.escape("returned one task's result: branch iterative_RUN_k"),
    "plan-score-implement": re.escape("returned one task's result: branch plan-score-implement_RUN_k"),
    # the reviewers' prompts name the run's branches, so the simulated scores vary with the run id
    # (and the candidates are named best first; the kept candidate has one score in the verdict:
    # the side-by-side one the decision compared)
    "synthesize": r"(synthesis of gen/\d, gen/\d, gen/\d selected: the synthesis scored [\d.]+ >= gen/\d's [\d.]+"
    r"|gen/\d stays best: the synthesis scored [\d.]+ < gen/\d's [\d.]+) side by side; hunks: 1 new",
    "tree-beam": re.escape(
        "n2 beat the base: throughput 100 → 120, change +20.00% [+20.00%, +20.00%] over 10 pairs; stopped: max_depth"
    ),
}


# The evaluator itself is broken: the old summary said "no candidate improved on it" and advised a merge.
BROKEN_RUNS = {
    "review-loop": ["-S", "test_command=true", *EVAL],
    "tree-beam": [*EVAL, "-S", "ideas_per_node=1", "-S", "max_depth=1"],
}


@pytest.mark.parametrize("name", sorted(BROKEN_RUNS))
def test_a_broken_evaluator_is_named_as_the_reason_and_nothing_is_advised(tmp_path, name):
    repo = make_repo(tmp_path / "repo", {"bench.py": "raise SystemExit(3)\n"})
    done = run_cli(
        ["raise the benchmark", "--strategy", name, *BROKEN_RUNS[name], "--dry-run", "--no-tui", *IMG],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=600,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "strategy failed: BaseEvaluationFailed: the evaluation of the base cannot be used" in done.stdout
    assert "git merge" not in done.stdout and "Kept main" not in done.stdout and "Verdict:" not in done.stdout
    run_id = only_run_id(tmp_path)
    (s,) = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())["strategies"]
    assert s["selected_branch"] is None
