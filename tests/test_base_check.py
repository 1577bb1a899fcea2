"""The base checks' command and rules, run by a real ``sh`` (no Docker): what stops a run and what does not."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.strategy import BaseEvaluationFailed
from strategies.base_check import (
    base_command,
    evaluation_of,
    parse_base_run,
    unusable_evaluation,
    why_tests_cannot_run,
)


def on_base(tmp_path, command: str):
    proc = subprocess.run(["sh", "-c", base_command(command)], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0  # the status travels on the marker line, never as the task's own
    return parse_base_run(proc.stdout)


@pytest.mark.parametrize(
    ("command", "status", "stops"),
    [
        ("no_such_test_runner -q", 127, True),
        ("python3 -c 'import no_such_mod' 2>/dev/null || exit 127; python3 -m no_such_mod", 127, True),
        ("touch x.sh && chmod -x x.sh && ./x.sh", 126, True),
        ("echo '1 failed'; exit 1", 1, False),  # failing tests: what an idea may fix
        ("python3 -m no_such_test_runner", 1, False),  # exits like failing tests: not told apart
        ("echo ok", 0, False),
    ],
)
def test_a_test_command_stops_the_run_only_when_it_cannot_run(tmp_path, command, status, stops):
    run = on_base(tmp_path, command)
    assert run.exit_code == status
    assert (why_tests_cannot_run(run) is not None) is stops


def test_stdout_and_stderr_come_back_apart_and_the_json_line_still_parses(tmp_path):
    run = on_base(tmp_path, 'echo warming up; echo oops >&2; echo \'{"metrics": {"t": 2}, "valid": false}\'')
    assert (run.stdout, run.stderr) == ('warming up\n{"metrics": {"t": 2}, "valid": false}', "oops")
    ev = evaluation_of(run)
    assert ev.metrics == {"t": 2.0} and not ev.valid
    assert unusable_evaluation(ev, ["t"]) == ("root_evaluation_invalid", "it reports valid: false")
    stop = BaseEvaluationFailed("it reports valid: false", command="python3 bench.py", output=run.output)
    assert str(stop).splitlines()[-3:] == ["  | warming up", '  | {"metrics": {"t": 2}, "valid": false}', "  | oops"]


def test_an_evaluation_that_exits_non_zero_or_lacks_a_metric_is_unusable(tmp_path):
    crashed = evaluation_of(on_base(tmp_path, "echo 'Traceback: boom' >&2; exit 2"))
    assert unusable_evaluation(crashed, ["t"]) == (
        "root_evaluation_failed",
        "it did not run to a result (command: exit status 2: Traceback: boom)",
    )
    partial = evaluation_of(on_base(tmp_path, 'echo \'{"metrics": {"rows": 5}}\''))
    assert unusable_evaluation(partial, ["t"])[0].startswith("objective_metrics_missing: it does not report 't'")
    assert unusable_evaluation(partial, ["rows"]) is None


def test_the_stop_keeps_the_last_twenty_lines():
    output = "\n".join(f"line {i}" for i in range(1, 31))
    stop = BaseEvaluationFailed("it reports valid: false", command="make bench", output=output)
    lines = str(stop).splitlines()
    assert lines[1:3] == ["  command: make bench", "  its output (last 20 lines):"]
    assert lines[3] == "  | line 11" and lines[-1] == "  | line 30" and len(lines) == 23
    assert stop.output.splitlines()[0] == "line 11"
