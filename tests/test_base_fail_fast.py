"""Fail fast on the base: tree-beam, evolve and review-loop stop before any agent task when the
evaluation of the base cannot be used, with exit 1, the command and the last lines of its output.

The real ``orchestrator`` command, ``--dry-run``, real Docker and git. The evaluations fail the
way they do in an image without the project's toolchain: a Python module that is not installed,
a tool that is not on the PATH. A base whose evaluation works goes on as before
(tests/test_dry_run_flows.py).
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import cli_env, only_run_id, run_cli, strategy_args
from conftest import TEST_IMAGE, make_repo
from scenarios import KEEP_GOAL_YAML

from orchestrator.log.eventlog import read_events

pytestmark = pytest.mark.docker

IMG = ["--docker-image", TEST_IMAGE]

# What the bench_eval.py did: time the project's tests, and say the timing is unusable
# when they cannot run. The runner's own error goes to stderr, as an uncaptured child's would.
BENCH_EVAL = """import json, subprocess, sys, time
t = time.monotonic()
p = subprocess.run([sys.executable, "-m", "no_such_test_runner", "-q"], capture_output=True, text=True)
print("ran the test suite")
sys.stderr.write(p.stderr)
print(json.dumps({"metrics": {"seconds": time.monotonic() - t}, "valid": p.returncode == 0}))
"""

CRASHING_BENCH = """import json
print("loading the benchmark")
import no_such_benchmark_lib
print(json.dumps({"metrics": {"throughput": 1}}))
"""


def run(tmp_path, repo, args):
    result = run_cli([*args, "--dry-run", "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path), timeout=600)
    run_id = only_run_id(tmp_path)
    events = list(read_events(tmp_path / "logs" / run_id / "events.jsonl"))
    summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
    return result, events, summary


EVALUATION_UNUSABLE = "BaseEvaluationFailed: the evaluation of the base cannot be used: "
INSTALL = (
    "install it in the project's environment (--env-setup, --env-image or .devcontainer/devcontainer.json; "
    "see docs/environment.md), or correct the command"
)


def assert_stopped_before_any_agent(result, events, summary, *expected, headline=EVALUATION_UNUSABLE):
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    scheduled = [e.payload for e in events if e.type == "task.scheduled"]
    assert scheduled and {p["plugin"] for p in scheduled} == {"command"}, scheduled
    started = {e.key for e in events if e.type == "task.started"}
    assert started <= {p["key"] for p in scheduled}
    (strategy,) = summary["strategies"]
    # a run that stopped on its base failed (it used to say "completed"), and the task that
    # measured the base is no success: it ran, but its result is what could not be used
    assert strategy["status"] == "failed" and summary["status"] == "failed"
    unusable = [t["key"].split("/", 2)[2] for t in strategy["tasks"] if t["unusable"]]
    assert unusable, strategy["tasks"]
    shown = out.split("Results by strategy:")[1]
    for key in unusable:
        assert f"  ✗ {key}  " in shown and f"✓ {key} " not in shown, shown[:3000]
    assert "100%" not in out and summary["totals"]["success_rate"] is None
    error = strategy["error"]
    assert error.startswith(headline), error
    for text in expected:
        assert text in error, (text, error)
        assert text in out, (text, out[-3000:])
    assert "Kept main" not in out


def test_tree_beam_stops_when_the_base_reports_valid_false(tmp_path):
    repo = make_repo(tmp_path / "repo", {"bench_eval.py": BENCH_EVAL})
    result, events, summary = run(
        tmp_path,
        repo,
        [
            "make the tests faster",
            *strategy_args(
                "tree-beam", eval_command="python3 bench_eval.py", primary_metric="seconds", direction="min"
            ),
        ],
    )
    assert_stopped_before_any_agent(
        result,
        events,
        summary,
        "it reports valid: false",
        "command: python3 bench_eval.py",
        "No module named no_such_test_runner",
        "ran the test suite",
    )


def test_a_missing_evaluation_script_is_named_by_the_path_the_user_wrote(tmp_path):
    # tree-beam measures in a clone under /tmp: the stop named "/tmp/orch-eval.XXXXXX/c/scripts/bench.py".
    repo = make_repo(tmp_path / "repo")
    result, events, summary = run(
        tmp_path,
        repo,
        [
            "make it faster",
            *strategy_args("tree-beam", eval_command="python3 scripts/bench.py", primary_metric="throughput"),
        ],
    )
    assert_stopped_before_any_agent(
        result,
        events,
        summary,
        "python3: can't open file 'scripts/bench.py': [Errno 2] No such file or directory",
        "command: python3 scripts/bench.py",
    )
    out = result.stdout + result.stderr
    assert "orch-eval" not in out and "orch-eval" not in summary["strategies"][0]["error"], out[-3000:]


def test_evolve_stops_when_a_check_cannot_run_on_the_base(tmp_path):
    goals = (
        KEEP_GOAL_YAML
        + """\
  - id: tests
    description: the test suite passes
    check: echo collecting; no_such_test_runner -q tests
    weight: 5
"""
    )
    repo = make_repo(tmp_path / "repo", {"keep.txt": "keep\n", "GOALS.yaml": goals})
    result, events, summary = run(
        tmp_path, repo, ["keep the project healthy", *strategy_args("evolve", goals="GOALS.yaml")]
    )
    assert_stopped_before_any_agent(
        result,
        events,
        summary,
        f"goal 'tests': command not found: no_such_test_runner (exit status 127); {INSTALL}",
        "command: echo collecting; no_such_test_runner -q tests",
        "no_such_test_runner: not found",
        "collecting",
    )


def test_review_loop_stops_when_the_base_evaluation_crashes(tmp_path):
    repo = make_repo(tmp_path / "repo", {"bench.py": CRASHING_BENCH})
    result, events, summary = run(
        tmp_path,
        repo,
        [
            "make the solver faster",
            *strategy_args("review-loop", eval_command="python3 bench.py", primary_metric="throughput"),
        ],
    )
    assert_stopped_before_any_agent(
        result,
        events,
        summary,
        "it did not run to a result (command: exit status 1",
        "command: python3 bench.py",
        "ModuleNotFoundError: No module named 'no_such_benchmark_lib'",
        "loading the benchmark",
    )


def test_review_loop_stops_when_its_test_command_cannot_run_on_the_base(tmp_path):
    repo = make_repo(tmp_path / "repo", {"bench.py": 'print(\'{"metrics": {"throughput": 1}}\')\n'})
    result, events, summary = run(
        tmp_path,
        repo,
        [
            "make the solver faster",
            *strategy_args(
                "review-loop",
                test_command="no_such_test_runner -q",
                eval_command="python3 bench.py",
                primary_metric="throughput",
            ),
        ],
    )
    # It said "the evaluation of the base cannot be used" of a test command, and not which command
    # was not found, nor what to do.
    assert_stopped_before_any_agent(
        result,
        events,
        summary,
        f"command not found: no_such_test_runner (exit status 127); {INSTALL}",
        "command: no_such_test_runner -q",
        "no_such_test_runner: not found",
        headline="BaseEvaluationFailed: the test command cannot run on the base: command not found",
    )
