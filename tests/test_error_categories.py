"""Errors carry the right category and only transient ones are paid for again (issue 15, item 9).

Real command, real git, real Docker, the sim agent.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import git, make_repo
from reliability_helpers import (
    IMG,
    RESUMABLE_PROMPT,
    check_log,
    cli_env,
    docker,
    events_path,
    finish,
    remove_run_docker,
    run_cli,
    run_ids,
    run_volumes,
    runner_messages,
    sim_executions,
    start_cli,
    wait_for,
)

pytestmark = [pytest.mark.docker]

STRATEGY = """
async def one(prompt, base_branch, ctx, *, model: str = "sonnet"):
    policy = {"max_attempts": 3, "backoff": {"base_s": 0.1, "factor": 1, "max_s": 0.1},
              "retry_on": ["container", "internal", "api"]}
    return await ctx.wait(ctx.run({"prompt": prompt, "base_branch": base_branch, "model": model},
                                  key=ctx.key("task"), policy=policy))
"""


def run_one(tmp_path: Path, *params: str, env_extra: dict | None = None):
    repo = make_repo(tmp_path / "repo")
    strategy = tmp_path / "one.py"
    strategy.write_text(STRATEGY)
    env = cli_env(tmp_path, **(env_extra or {}))
    proc = run_cli(["SIM: print hi", "--strategy", f"{strategy}:one", *params, "--no-tui", *IMG], cwd=repo, env=env)
    (run_id,) = run_ids(tmp_path)
    return proc, run_id, check_log(events_path(tmp_path, run_id))


def test_an_unknown_task_model_is_rejected_when_the_task_is_scheduled(tmp_path):
    proc, run_id, events = run_one(tmp_path, "-S", "model=sonet")
    try:
        assert proc.returncode == 1, proc.stderr
        assert "unknown model 'sonet' for plugin claude-code; use one of: haiku, opus, sonnet" in proc.stdout
        assert not [e for e in events if e.type.startswith("task.")], [e.type for e in events]
        assert "Traceback" not in proc.stdout + proc.stderr
    finally:
        remove_run_docker(run_id)


def test_the_runners_own_failure_is_internal_and_never_retried(tmp_path):
    # The workspace root is a file: the runner's own code fails with an OSError it does not translate.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    proc, run_id, events = run_one(tmp_path, env_extra={"ORCHESTRATOR_WORKSPACE_ROOT": str(blocker / "ws")})
    try:
        assert proc.returncode == 1, proc.stderr
        (failed,) = [e for e in events if e.type == "task.failed"]
        assert failed.payload["error_type"] == "internal", failed.payload
        # the strategy's policy retries container, api and even "internal": a bug still runs once
        assert len([e for e in events if e.type == "task.started"]) == 1
    finally:
        remove_run_docker(run_id)


def test_a_session_the_agent_cannot_resume_starts_a_fresh_one_in_the_same_workspace(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    out = tmp_path / "out" / "first"
    proc = start_cli([RESUMABLE_PROMPT, "--no-tui", *IMG], cwd=repo, env=env, out=out)
    run_id = wait_for(lambda: run_ids(tmp_path) and run_ids(tmp_path)[0])
    try:
        wait_for(lambda: next((tmp_path / "ws" / run_id).glob("k_*/notes.txt"), None), timeout=120)
        # The agent has announced its session and the run has recorded it: on a loaded
        # machine the agent's first file can come before the runner has read its first line.
        wait_for(lambda: any(e.type == "task.session" for e in check_log(events_path(tmp_path, run_id))), timeout=120)
        proc.send_signal(signal.SIGINT)
        rc, _, err = finish(proc, out, timeout=60)
        assert rc == 130, err
        (old,) = {
            e.payload.get("session_id")
            for e in check_log(events_path(tmp_path, run_id))
            if e.type == "task.interrupted"
        }
        # the session is lost: the agent CLI will answer "No conversation found"
        (volume,) = run_volumes(run_id)
        mount = Path(docker(None, "volume", "inspect", "-f", "{{.Mountpoint}}", volume).stdout.strip())
        (mount / ".sim-agent" / "sessions" / f"{old}.json").unlink()

        out = tmp_path / "out" / "resume"
        rc, _, err = finish(start_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env, out=out), out)
        assert rc == 0, err[-3000:]
        events = check_log(events_path(tmp_path, run_id))
        resets = [e.payload for e in events if e.type == "task.session" and e.payload.get("session_id") is None]
        assert [(r["reason"], r["previous_session_id"]) for r in resets] == [("session_corrupted", old)], resets
        assert "No conversation found" in resets[0]["detail"]
        execs = sim_executions(run_id)
        assert [x.get("error") for x in execs] == [None, "session not found", None], execs
        assert execs[2]["resumed"] is False and execs[2]["session_id"] != old
        # the fresh session ran in the workspace the first one left: its notes reached the branch
        (done,) = [e for e in events if e.type == "task.completed"]
        assert done.payload["session_id"] == execs[2]["session_id"]
        branch = done.payload["artifact"]["branch_final"]
        assert branch and git(repo, "show", f"{branch}:notes.txt") == "work"
        assert runner_messages(tmp_path, run_id, "runner.workspace.kept")
    finally:
        if proc.poll() is None:
            proc.kill()
        remove_run_docker(run_id)
