"""The agent wrapper, run by the machine's own ``sh`` in a real git repository.

It stands between the agent and the exec's stdout to keep the agent's first
line (which names its session) in the workspace: what the runner reads must be
exactly what the agent wrote, with its exit status, and a process the agent
leaves behind must not hold the task up.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from conftest import make_repo

from orchestrator.runner.docker_agent import AGENT_WRAPPER_SCRIPT, FIRST_LINE_FILE


def _wrapped(repo: Path, agent: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["sh", "-c", AGENT_WRAPPER_SCRIPT, "orchestrator-agent", "sh", "-c", agent],
        cwd=repo,
        input=stdin,
        capture_output=True,
        timeout=60,
    )


def test_the_agents_output_passes_unchanged_and_its_first_line_is_kept(tmp_path):
    repo = make_repo(tmp_path / "repo")
    agent = 'printf \'{"session_id":"s-1"}\\n\'; cat; printf "\\nno newline at the end"; exit 7'
    done = _wrapped(repo, agent, stdin=b"prompt line 1\nprompt \\ line 2\n")
    assert done.returncode == 7
    assert done.stdout == b'{"session_id":"s-1"}\nprompt line 1\nprompt \\ line 2\n\nno newline at the end'
    assert done.stderr.endswith(b"\n@@orchestrator-end=0\n")
    assert (repo / FIRST_LINE_FILE).read_bytes() == b'{"session_id":"s-1"}\n'
    # an agent that prints a partial first line, then nothing: the bytes still all pass
    assert _wrapped(repo, "printf partial").stdout == b"partial"


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
