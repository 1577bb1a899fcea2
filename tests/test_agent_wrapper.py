"""The agent wrapper, run by the machine's own ``sh`` in a real git repository.

It stands between the agent and the exec's stdout to keep the agent's first
line (which names its session) in the file the runner names: what the runner reads must be
exactly what the agent wrote, with its exit status, and a process the agent
leaves behind must not hold the task up.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import make_repo

from orchestrator.runner.docker_agent import AGENT_WRAPPER_SCRIPT, EXEC_WRAPPER_SCRIPT, FIRST_LINE_ENV


def _wrapped(
    repo: Path, agent: str, stdin: bytes = b"", script: str = AGENT_WRAPPER_SCRIPT, keep: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != FIRST_LINE_ENV}
    if keep is not None:
        env[FIRST_LINE_ENV] = str(keep)
    return subprocess.run(
        ["sh", "-c", script, "orchestrator-agent", "sh", "-c", agent],
        cwd=repo,
        input=stdin,
        capture_output=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("script", "end"), [(AGENT_WRAPPER_SCRIPT, b"0"), (EXEC_WRAPPER_SCRIPT, b"-")], ids=["agent", "exec"]
)
def test_the_agents_output_passes_unchanged_and_its_first_line_is_kept(tmp_path, script, end):
    repo = make_repo(tmp_path / "repo")
    keep = tmp_path / "home" / ".orchestrator" / "first-line" / "task-1"
    agent = 'printf \'{"session_id":"s-1"}\\n\'; cat; printf "\\nno newline at the end"; exit 7'
    done = _wrapped(repo, agent, stdin=b"prompt line 1\nprompt \\ line 2\n", script=script, keep=keep)
    assert done.returncode == 7
    assert done.stdout == b'{"session_id":"s-1"}\nprompt line 1\nprompt \\ line 2\n\nno newline at the end'
    assert done.stderr.endswith(b"\n@@orchestrator-end=" + end + b"\n")
    assert keep.read_bytes() == b'{"session_id":"s-1"}\n'
    # an agent that prints a partial first line, then nothing: the bytes still all pass
    assert _wrapped(repo, "printf partial", script=script, keep=keep).stdout == b"partial"
    assert keep.read_bytes() == b"partial\n"  # each attempt's own line, never an earlier one


def test_without_a_file_named_the_output_passes_and_nothing_is_kept(tmp_path):
    # a command task: its output is not an agent's, and no file is named for it
    repo = make_repo(tmp_path / "repo")
    done = _wrapped(repo, "echo measured; exit 3", script=EXEC_WRAPPER_SCRIPT)
    assert (done.returncode, done.stdout) == (3, b"measured\n")
    assert done.stderr.endswith(b"\n@@orchestrator-end=-\n")
    assert not list(tmp_path.rglob("first-line*"))


def test_a_process_the_agent_left_holding_its_stdout_does_not_hold_up_the_task(tmp_path):
    # An exec ends when its process does (the engine stops copying soon after): the
    # wrapper itself must end, whatever still holds the agent's stdout.
    repo = make_repo(tmp_path / "repo")
    out, err = tmp_path / "out", tmp_path / "err"
    agent = "sleep 30 </dev/null 2>/dev/null & echo first; exit 3"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            ["sh", "-c", AGENT_WRAPPER_SCRIPT, "orchestrator-agent", "sh", "-c", agent],
            cwd=repo,
            env={**os.environ, FIRST_LINE_ENV: str(tmp_path / "first-line")},
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        assert proc.wait(timeout=20) == 3  # not the 30 s of the agent's leftover sleep
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    assert out.read_bytes() == b"first\n"
    assert err.read_bytes().endswith(b"\n@@orchestrator-end=0\n")
