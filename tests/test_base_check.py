"""The base checks' command and rules, run by a real ``sh`` (no Docker): what stops a run and what does not."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.strategy import BaseEvaluationFailed
from strategies.base_check import (
    TESTS_CANNOT_RUN,
    base_command,
    could_not_run,
    evaluation_of,
    parse_base_run,
    unusable_evaluation,
    why_tests_cannot_run,
)
from strategies.tree_beam_measure import parse_runs

INSTALL = (
    "install it in the project's environment (--env-setup, --env-image or .devcontainer/devcontainer.json; "
    "see docs/environment.md), or correct the command"
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


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("no_such_test_runner -q", f"command not found: no_such_test_runner (exit status 127); {INSTALL}"),
        ("echo collecting; no_such_test_runner -q tests", "command not found: no_such_test_runner (exit status 127)"),
        (
            "printf 'echo hi\\n' > x.sh && chmod -x x.sh && ./x.sh",
            "cannot execute ./x.sh (exit status 126: found, but not executable); commit it executable "
            "(git update-index --chmod=+x ./x.sh) or run it with its interpreter (sh ./x.sh)",
        ),
    ],
)
def test_a_command_the_shell_cannot_run_is_named_with_the_fix(tmp_path, command, says):
    # A test command exiting 127 was "the evaluation of the base cannot be used: the shell could
    # not run it: exit status 127 (command not found)": neither which command nor what to do.
    run = on_base(tmp_path, command)
    why = why_tests_cannot_run(run)
    assert why is not None and why.startswith(says), why
    stop = BaseEvaluationFailed(why, command=command, output=run.output, headline=TESTS_CANNOT_RUN)
    assert str(stop).startswith(f"the test command cannot run on the base: {says}"), str(stop)
    # the same command as the evaluation: its reason is the same line
    ev = evaluation_of(run)
    assert unusable_evaluation(ev, ["t"]) == ("root_evaluation_failed", why)


@pytest.mark.parametrize(
    "said",
    [
        "/bin/sh: 1: npm: not found",  # dash (Debian's sh)
        "bash: line 1: npm: command not found",
        "sh: npm: not found",  # busybox
        "  > test\n  > npm run lint\nsh: 1: npm: not found",
    ],
)
def test_the_missing_command_is_read_from_each_shell_s_words(said):
    assert could_not_run(127, said.replace("\\n", "\n")).startswith("command not found: npm (exit status 127)")
    assert could_not_run(127, "").startswith("command not found (exit status 127); install it")
    assert could_not_run(1, said) is None and could_not_run(None, said) is None


def test_tree_beam_names_the_command_its_evaluation_could_not_find():
    runs = parse_runs("@@orch-run 0 c 127 2 /bin/sh: 1: nosuch_bench: not found \n@@orch-done 1\n")
    ((ev,),) = runs.by_label.values()
    assert unusable_evaluation(ev, ["t"]) == (
        "root_evaluation_failed",
        f"command not found: nosuch_bench (exit status 127); {INSTALL}",
    )
