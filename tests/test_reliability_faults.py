"""Faults users meet: each ends as a categorized task failure or a clean, resumable stop.

Never a corrupt log, a lost completed result, a hung process or a container
left running. Every case runs the real command (real Docker, git, sim agent).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import git, make_repo
from reliability_helpers import (
    IMG,
    all_containers,
    check_log,
    check_snapshot_is_replay,
    cli_env,
    events_path,
    finish,
    manifest,
    record,
    remove_run_docker,
    run_cli,
    run_ids,
    running_containers,
    start_cli,
    terminal_counts,
    wait_for,
)

from orchestrator.naming import branch_name

pytestmark = pytest.mark.docker
NO_DISK_MIN = {
    "ORCHESTRATOR_ORCHESTRATION__HARD_MIN_FREE_DISK_GB": "0",
    "ORCHESTRATOR_ORCHESTRATION__MIN_FREE_DISK_GB": "0",
}


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo")


def outcome(tmp_path: Path, run_id: str) -> dict:
    """The one task's terminal event payload plus its type, after the whole-run checks."""
    events = check_log(events_path(tmp_path, run_id))
    check_snapshot_is_replay(tmp_path, run_id)
    assert running_containers(run_id) == [], "a container of the run is still running"
    terminal = [e for e in events if e.type in ("task.completed", "task.failed")]
    assert len(terminal) == 1, [e.type for e in events]
    return {"type": terminal[0].type, **terminal[0].payload}


def run_one(tmp_path, repo, prompt, *, timeout=120, **env_extra):
    result = run_cli([prompt, "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path, **env_extra), timeout=timeout)
    (run_id,) = run_ids(tmp_path)
    return result, run_id


OOM_PY = (
    "import os\\np = os.getppid()\\nwhile p > 1:\\n    try:\\n"
    "        open(f'/proc/{p}/oom_score_adj', 'w').write('1000')\\n"
    "    except OSError:\\n        pass\\n    p = int(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1])\\n"
    "x = bytearray(512 * 1024 * 1024)\\nprint('allocated', len(x))\\n"
)


@pytest.mark.parametrize("victim", ["tool", "agent"])
def test_oom_kill_under_the_memory_limit(victim, tmp_path, repo):
    """64m limit, 512 MB allocation. The kernel kills the allocation (the agent sees a
    killed tool and carries on) or, when the agent is made the preferred victim, the
    agent itself: then the task fails as a container error naming the exit status."""
    if victim == "tool":
        prompt = 'SIM: exec python3 -c "x=bytearray(512*1024*1024); print(len(x))"\nSIM: print survived'
    else:
        prompt = f"SIM: write oom.py {OOM_PY}\nSIM: exec python3 oom.py\nSIM: print survived"
    result, run_id = run_one(tmp_path, repo, prompt, ORCHESTRATOR_RUNNER__CONTAINER_MEMORY="64m")
    try:
        got = outcome(tmp_path, run_id)
        assert "Traceback" not in result.stderr
        if victim == "tool":
            assert result.returncode == 0, result.stderr
            assert got["type"] == "task.completed" and got["final_message"] == "survived", got
            runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
            assert "536870912" not in runner_log and "137" in runner_log  # the allocation never succeeded
        else:
            assert result.returncode == 1, result.stderr
            assert got["type"] == "task.failed" and got["error_type"] == "container", got
            assert "137" in got["message"] and "out of memory" in got["message"], got["message"]
        record("faults", fault=f"OOM kill ({victim})", survived=1, outcome=f"{got['type']}:{got.get('error_type')}")
    finally:
        remove_run_docker(run_id)


def test_hanging_agent_times_out(tmp_path, repo):
    t0 = time.monotonic()
    result, run_id = run_one(tmp_path, repo, "SIM: hang", ORCHESTRATOR_RUNNER__CONTAINER_TIMEOUT_SECONDS="3")
    try:
        assert time.monotonic() - t0 < 60
        got = outcome(tmp_path, run_id)
        assert result.returncode == 1
        assert got["type"] == "task.failed" and got["error_type"] == "timeout", got
        assert "timeout of 3s" in got["message"]
        record("faults", fault="hang past timeout", survived=1, outcome="task.failed:timeout")
    finally:
        remove_run_docker(run_id)


@pytest.mark.parametrize("case", ["garbage", "spam"])
def test_garbage_and_huge_output_complete_with_bounded_records(case, tmp_path, repo):
    prompt = {
        "garbage": "SIM: garbage\nSIM: print after the garbage",
        "spam": "SIM: spam 100\nSIM: print after the spam",
    }[case]
    t0 = time.monotonic()
    result, run_id = run_one(tmp_path, repo, prompt, timeout=240)
    try:
        got = outcome(tmp_path, run_id)
        assert result.returncode == 0, result.stderr
        assert got["type"] == "task.completed", got
        assert f"after the {case}" in got["final_message"]
        # 100 MB of agent output never reaches the durable records whole
        for d in ("logs", "state", "results"):
            for p in (tmp_path / d).rglob("*"):
                if p.is_file():
                    assert p.stat().st_size < 20 << 20, (p, p.stat().st_size)
        record(
            "faults",
            fault=f"agent output: {case}",
            survived=1,
            outcome="task.completed",
            seconds=round(time.monotonic() - t0, 1),
        )
    finally:
        remove_run_docker(run_id)


@pytest.fixture
def small_tmpfs(tmp_path):
    mounts = []

    def make(name: str, size: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
        mounts.append(path)
        return path

    yield make
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_logs_disk_fills_up_mid_run_then_resume_finishes(tmp_path, repo, small_tmpfs):
    logs = small_tmpfs("logs_fs", "2m")
    env = cli_env(tmp_path, ORCHESTRATOR_LOGS_DIR=str(logs), **NO_DISK_MIN)
    prompt = "SIM: write a.txt hello\nSIM: commit a\nSIM: sleep 3\nSIM: print done"
    out = tmp_path / "out" / "full"
    proc = start_cli([prompt, "--runs", "2", "--no-tui", *IMG], cwd=repo, env=env, out=out)
    run_id = wait_for(lambda: run_ids(tmp_path) and run_ids(tmp_path)[0])
    wait_for(lambda: sum(e.type == "task.started" for e in check_log(logs / run_id / "events.jsonl")) == 2)
    filler = logs / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True)  # until ENOSPC
    try:
        rc, _, err = finish(proc, out, timeout=90)
        assert rc in (1, 130), err
        assert "Traceback" not in err, err
        assert "No space left" in err or "interrupted" in err.lower(), err
        check_log(logs / run_id / "events.jsonl")
        assert running_containers(run_id) == []
        filler.unlink()  # the user frees space and resumes
        result = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env)
        assert result.returncode == 0, result.stderr
        events = check_log(logs / run_id / "events.jsonl")
        assert sorted(terminal_counts(events).values()) == [1, 1]
        summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
        assert summary["totals"]["completed"] == 2
        for b in summary["branches"]:
            assert git(repo, "show", f"{b}:a.txt") == "hello"
        record("faults", fault="logs disk full", survived=1, outcome=f"exit {rc}, resumed to completion")
    finally:
        remove_run_docker(run_id)


def test_workspace_disk_full_is_a_categorized_failure(tmp_path, repo, small_tmpfs):
    ws = small_tmpfs("ws_fs", "2m")
    result, run_id = run_one(
        tmp_path, repo, "SIM: write a.txt x\nSIM: commit a", ORCHESTRATOR_WORKSPACE_ROOT=str(ws), **NO_DISK_MIN
    )
    try:
        got = outcome(tmp_path, run_id)
        assert result.returncode == 1, result.stderr
        assert got["type"] == "task.failed" and got["error_type"] == "git", got
        assert "disk space" in got["message"]
        record("faults", fault="workspace disk full", survived=1, outcome="task.failed:git")
    finally:
        remove_run_docker(run_id)


def _started(tmp_path: Path, n: int = 1):
    def ready():
        ids = run_ids(tmp_path)
        if not ids:
            return None
        path = events_path(tmp_path, ids[0])
        started = sum(e.type == "task.started" for e in check_log(path)) if path.exists() else 0
        return ids[0] if started >= n else None

    return wait_for(ready)


def test_stale_git_ref_lock_is_a_categorized_failure(tmp_path, repo):
    env = cli_env(tmp_path)
    out = tmp_path / "out" / "lock"
    proc = start_cli(["SIM: write a.txt x\nSIM: commit a\nSIM: sleep 3", "--no-tui", *IMG], cwd=repo, env=env, out=out)
    run_id = _started(tmp_path)
    planned = branch_name("simple", run_id, f"{run_id}/s1/task")
    lock = repo / ".git" / "refs" / "heads" / f"{planned}.lock"
    lock.write_text("")  # another git process died holding it
    try:
        rc, _, err = finish(proc, out)
        got = outcome(tmp_path, run_id)
        assert rc == 1, err
        assert got["type"] == "task.failed" and got["error_type"] == "git", got
        assert ".lock" in got["message"], got["message"]
        assert git(repo, "branch", "--list", planned) == ""
        record("faults", fault="stale git ref lock", survived=1, outcome="task.failed:git")
    finally:
        lock.unlink(missing_ok=True)
        remove_run_docker(run_id)


def test_base_branch_moving_mid_run_keeps_the_snapshot_the_task_started_from(tmp_path, repo):
    env = cli_env(tmp_path)
    start_commit = git(repo, "rev-parse", "main")
    out = tmp_path / "out" / "move"
    proc = start_cli(
        ["SIM: write feature.txt new\nSIM: commit feature\nSIM: sleep 2", "--no-tui", *IMG], cwd=repo, env=env, out=out
    )
    run_id = _started(tmp_path)
    runner_log = tmp_path / "logs" / run_id / "runner.jsonl"
    wait_for(lambda: runner_log.exists() and "runner.exec.started" in runner_log.read_text())  # cloned already
    (repo / "moved.txt").write_text("main moved on\n")
    git(repo, "add", "moved.txt")
    git(repo, "commit", "-q", "-m", "main moves while the agent works")
    try:
        rc, _, err = finish(proc, out)
        assert rc == 0, err
        got = outcome(tmp_path, run_id)
        branch = got["artifact"]["branch_final"]
        assert git(repo, "rev-parse", f"{branch}~1") == start_commit
        assert git(repo, "show", f"{branch}:feature.txt") == "new"
        assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"
        assert (repo / "moved.txt").exists() and git(repo, "status", "--porcelain") == ""
        record("faults", fault="base branch moved mid-run", survived=1, outcome="task.completed on the start commit")
    finally:
        remove_run_docker(run_id)


@pytest.mark.slow
@pytest.mark.daemon_restart
def test_docker_daemon_restart_mid_run_then_resume_finishes(tmp_path, repo, private_engine, monkeypatch):
    """The engine the run uses restarts under it. That engine is the session's private
    one (own socket, roots, pid file and bridge): the host's engine is never touched.
    Containers there run offline, as the private bridge has no route out."""
    monkeypatch.setenv("DOCKER_HOST", private_engine.url)  # the run and the helpers' docker CLI
    env = cli_env(tmp_path, ORCHESTRATOR_RUNNER__NETWORK_EGRESS="offline")
    prompt = "SIM: write a.txt hello\nSIM: commit a\nSIM: sleep 6\nSIM: print done"
    out = tmp_path / "out" / "daemon"
    proc = start_cli(
        [prompt, "--runs", "2", "--no-tui", "--docker-image", private_engine.image], cwd=repo, env=env, out=out
    )
    run_id = _started(tmp_path, 2)
    try:
        # Mid-run means the agents' containers are up: on six busy workers a fixed second
        # after task.started was sometimes before any existed, and the run then had no
        # container on the engine to check (seen once: all_containers() == []).
        wait_for(lambda: len(running_containers(run_id)) >= 1, timeout=120, interval=0.2)
        time.sleep(1)
        private_engine.restart()  # SIGTERM to its own pid, then the same dockerd again
        rc, _, err = finish(proc, out, timeout=180)
        assert rc in (0, 1, 130), err
        assert "Traceback" not in err, err
        events = check_log(events_path(tmp_path, run_id))
        assert set(terminal_counts(events).values()) <= {1}
        if manifest(tmp_path, run_id)["status"] == "interrupted" or rc == 1:
            result = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env)
            assert result.returncode in (0, 1), result.stderr
        events = check_log(events_path(tmp_path, run_id))
        terminal = [e for e in events if e.type in ("task.completed", "task.failed")]
        assert len({e.key for e in terminal}) == 2, [e.type for e in events]
        for e in terminal:
            if e.type == "task.failed":
                assert e.payload["error_type"] in ("container", "api"), e.payload
        check_snapshot_is_replay(tmp_path, run_id)
        assert running_containers(run_id) == []
        # The run's containers were on the private engine, and none on the host's.
        assert all_containers(run_id)
        on_host = subprocess.run(
            ["docker", "-H", "unix:///var/run/docker.sock", "ps", "-aq", "--filter", f"label=run_id={run_id}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert on_host == []
        record("faults", fault="docker daemon restart (private engine)", survived=1, outcome=f"exit {rc}")
    finally:
        if not private_engine.answering():
            private_engine.start()  # whatever happened, later tests on it need the engine back
        remove_run_docker(run_id)
