"""SIGKILL in the window between a task's end and its durable ``task.completed``.

The real command, real Docker, real git and the sim agent; the kill is placed
exactly (the process kills itself as ``task.completed`` is about to be written)
instead of at a random moment, so the window is hit every time. Seen once in the
random crash suite: the workspace was already deleted there, so the resume started
the task afresh in a new clone and a new session, paying for its work twice.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git, make_repo
from reliability_helpers import (
    IMG,
    check_log,
    check_snapshot_is_replay,
    cli_env,
    events_path,
    remove_run_docker,
    run_cli,
    run_ids,
    run_volumes,
    running_containers,
    terminal_counts,
)

from orchestrator.naming import short8
from orchestrator.runner.git_ops import kept_workspace

pytestmark = pytest.mark.docker

# The real command, killed by SIGKILL just before the first task.completed reaches the log.
KILLED_AT_COMPLETION = """
import os, signal, sys
from orchestrator.app.cli import main
from orchestrator.engine import engine

real_emit = engine.Engine.emit

def emit(self, etype, *args, **kwargs):
    if etype == "task.completed":
        os.kill(os.getpid(), signal.SIGKILL)
    return real_emit(self, etype, *args, **kwargs)

engine.Engine.emit = emit
sys.exit(main(sys.argv[1:]))
"""


def _sim_record(run_id: str) -> list[dict]:
    entries = []
    for volume in run_volumes(run_id):
        mount = subprocess.run(
            ["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", volume], capture_output=True, text=True
        ).stdout.strip()
        record = Path(mount) / ".sim-agent" / "executions.jsonl"
        if record.exists():
            entries += [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return entries


def test_sigkill_before_the_completion_is_logged_keeps_the_workspace_and_the_session(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    prompt = "SIM: write a.txt one\nSIM: commit work"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AT_COMPLETION, prompt, "--no-tui", *IMG],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    (run_id,) = run_ids(tmp_path)
    try:
        events = check_log(events_path(tmp_path, run_id))
        (key,) = {e.key for e in events if e.type == "task.started"}
        assert not terminal_counts(events), "the kill came after task.completed was written"
        runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
        assert '"runner.instance.completed"' in runner_log  # the runner had finished: the window was hit
        workspace = tmp_path / "ws" / run_id / f"k_{short8(key)}"
        kept = kept_workspace(workspace)
        assert not isinstance(kept, str), f"the unfinished task lost its workspace: {kept}"

        result = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        events = check_log(events_path(tmp_path, run_id))
        assert terminal_counts(events) == {key: 1}
        resets = [e.payload for e in events if e.type == "task.session" and e.payload.get("reason")]
        assert resets == [], resets
        record = [x for x in _sim_record(run_id) if x["task_key"] == key]
        fresh = [x for x in record if not x["resumed"]]
        assert len(fresh) == 1 and len({x["session_id"] for x in record}) == 1, record
        (done,) = [e for e in events if e.type == "task.completed"]
        assert git(repo, "show", f"{done.payload['artifact']['branch_final']}:a.txt") == "one"
        # once the completion is on disk the workspace goes, as before
        assert not workspace.exists() and list(workspace.parent.glob(f"{workspace.name}*")) == []
        check_snapshot_is_replay(tmp_path, run_id)
        assert running_containers(run_id) == []
    finally:
        remove_run_docker(run_id)
