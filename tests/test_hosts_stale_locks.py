"""A task resumed in its kept workspace: the git locks its killed agent left there.

A git command killed mid-way leaves its lock files: ``.git/index.lock`` (every
add and commit) and, for a commit killed while it moves its branch, the ref's
own ``refs/heads/<branch>.lock``. Left in place, either makes every commit of
the resumed agent fail ("cannot lock ref"). On the local engine the work is the
task's clone on this machine; on a remote engine it lives in a Docker volume
there, so the locks have to be cleared inside the container.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from cli_helpers import cli_env, run_cli
from conftest import git, make_repo
from reliability_helpers import (
    IMG,
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


def _resume_after_planted_locks(tmp_path: Path, url: str | None, args: list[str], resume_args: list[str]) -> None:
    """The agent commits, then is interrupted while git locks are held in its workspace
    (planted through the container, as a git command killed mid-way leaves them). The
    resumed agent's commit must succeed: the locks are cleared and logged."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    prompt = "SIM: append b.txt line\nSIM: commit b\nSIM: sleep 20\nSIM: print done"
    out = tmp_path / "out" / "first"
    proc = start_cli([prompt, "--no-tui", *args], cwd=repo, env=env, out=out)
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
        branch = docker(url, "exec", container, "git", "-C", "/workspace", "symbolic-ref", "--short", "HEAD")
        ref_lock = f"refs/heads/{branch.stdout.strip()}.lock"
        planted = docker(url, "exec", container, "touch", "/workspace/.git/index.lock", f"/workspace/.git/{ref_lock}")
        assert planted.returncode == 0, planted.stderr
        proc.send_signal(signal.SIGINT)
        rc, _, err = finish(proc, out, timeout=120)
        assert rc == 130, err
        assert [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.interrupted"]

        result = run_cli(["--resume", run_id, "--no-tui", *resume_args], cwd=repo, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        completed = [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.completed"]
        assert len(completed) == 1
        branch_final = completed[0].payload["artifact"]["branch_final"]
        # Both executions' lines: the resumed agent's commit went through.
        assert git(repo, "show", f"{branch_final}:b.txt").splitlines() == ["line", "line"]
        runner_log = [
            json.loads(line) for line in (tmp_path / "logs" / run_id / "runner.jsonl").read_text().splitlines()
        ]
        kept = [r for r in runner_log if r.get("message") == "runner.workspace.kept"]
        assert [r["stale_locks_removed"] for r in kept] == [["index.lock", ref_lock]], kept
    finally:
        if proc.poll() is None:
            proc.kill()
        if run_id:
            remove_run(url, run_id)


@pytest.mark.docker
def test_resume_clears_stale_git_locks_in_the_kept_workspace(tmp_path):
    _resume_after_planted_locks(tmp_path, None, IMG, [])


@pytest.mark.docker
def test_resume_on_a_remote_engine_clears_stale_git_locks_in_the_workspace_volume(tmp_path, private_engine):
    hosts = ["--docker-host", f"b={private_engine.url}:1"]
    _resume_after_planted_locks(tmp_path, private_engine.url, ["--docker-image", private_engine.image, *hosts], hosts)
