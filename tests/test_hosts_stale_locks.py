"""A task resumed on a remote engine: git locks its killed agent left in the workspace volume.

On a remote engine the task's work lives in a Docker volume there, not in the
local clone, so a stale ``.git/index.lock`` has to be cleared inside the
container. Left in place, it makes every commit of the resumed agent fail.
"""

from __future__ import annotations

import json
import signal

import pytest
from cli_helpers import cli_env, run_cli
from conftest import git, make_repo
from reliability_helpers import (
    NO_DISK_MIN,
    check_log,
    docker,
    events_path,
    finish,
    remove_run,
    start_cli,
    wait_for,
    wait_run_started,
)


@pytest.mark.docker
def test_resume_on_a_remote_engine_clears_stale_git_locks_in_the_workspace_volume(tmp_path, private_engine):
    """The agent commits, then is interrupted while a git lock is held in its /workspace volume
    (planted through the container, as a git command killed mid-way leaves it). The resumed
    agent's commit must succeed: the lock is cleared inside the container and logged."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    url = private_engine.url
    hosts = ["--docker-host", f"b={url}:1"]
    prompt = "SIM: append b.txt line\nSIM: commit b\nSIM: sleep 20\nSIM: print done"
    out = tmp_path / "out" / "first"
    proc = start_cli([prompt, "--no-tui", "--docker-image", private_engine.image, *hosts], cwd=repo, env=env, out=out)
    run_id = None
    try:
        run_id = wait_run_started(proc, out, tmp_path)

        def committed_container():
            assert proc.poll() is None, out.with_suffix(".err").read_text()
            for name in docker(url, "ps", "-q", "--filter", f"label=run_id={run_id}").stdout.split():
                subject = docker(url, "exec", name, "git", "-C", "/workspace", "log", "-1", "--format=%s")
                if subject.stdout.strip() == "b":
                    return name
            return None

        container = wait_for(committed_container, timeout=300, interval=0.5)
        planted = docker(url, "exec", container, "touch", "/workspace/.git/index.lock")
        assert planted.returncode == 0, planted.stderr
        proc.send_signal(signal.SIGINT)
        rc, _, err = finish(proc, out, timeout=120)
        assert rc == 130, err
        assert [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.interrupted"]

        result = run_cli(["--resume", run_id, "--no-tui", *hosts], cwd=repo, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        completed = [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.completed"]
        assert len(completed) == 1
        branch = completed[0].payload["artifact"]["branch_final"]
        # Both executions' lines: the resumed agent's commit went through.
        assert git(repo, "show", f"{branch}:b.txt").splitlines() == ["line", "line"]
        runner_log = [
            json.loads(line) for line in (tmp_path / "logs" / run_id / "runner.jsonl").read_text().splitlines()
        ]
        kept = [r for r in runner_log if r.get("message") == "runner.workspace.kept"]
        assert [r["stale_locks_removed"] for r in kept] == [["index.lock"]], kept
    finally:
        if proc.poll() is None:
            proc.kill()
        if run_id:
            remove_run(url, run_id)
