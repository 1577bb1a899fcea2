"""Resume keeps the agent's work: its workspace and its session (issue 15, items 2 and 3).

Every test drives the real command (real git, real Docker, the sim agent). The
agent's prompt writes ``notes.txt`` without committing and then works on
(sleeps) the first time; when it runs again in the same session volume it
commits whatever the workspace holds. So only a resume in the workspace the
first execution left puts ``notes.txt`` on the task's branch.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import git, make_repo
from reliability_helpers import (
    IMG,
    RESUMABLE_PROMPT,
    check_log,
    check_snapshot_is_replay,
    cli_env,
    events_path,
    finish,
    remove_run_docker,
    run_ids,
    runner_messages,
    running_containers,
    sigkill,
    sim_executions,
    start_cli,
    wait_for,
)

pytestmark = [pytest.mark.docker]


def start_and_wait_for_the_agents_edit(
    tmp_path: Path, repo: Path, env: dict, *, durable_session: bool = False, extra: tuple[str, ...] = ()
):
    out = tmp_path / "out" / "first"
    proc = start_cli([RESUMABLE_PROMPT, "--no-tui", *IMG, *extra], cwd=repo, env=env, out=out)
    run_id = wait_for(lambda: run_ids(tmp_path) and run_ids(tmp_path)[0])
    notes = wait_for(lambda: next((tmp_path / "ws" / run_id).glob("k_*/notes.txt"), None), timeout=120)
    if durable_session:  # the session id is in the log before the agent has finished anything
        wait_for(lambda: [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.session"], timeout=30)
    else:  # the runner has read the agent's init line (on a loaded machine it can lag behind the agent)
        wait_for(lambda: runner_messages(tmp_path, run_id, "runner.init"), timeout=30)
    return proc, out, run_id, notes.parent


@contextlib.contextmanager
def interrupted_first_run(
    tmp_path: Path, repo: Path, env: dict, *, stop: str = "ctrl-c", extra: tuple[str, ...] = ()
) -> Iterator[tuple[str, Path]]:
    """The first execution, stopped once the agent has written notes.txt: (run id, its workspace).

    ``stop``: "ctrl-c" (the command must exit 130) or "sigkill" (the process dies
    at once, so the test waits for the session id to be in the log first). The
    run's containers and volumes are removed afterwards.
    """
    proc, out, run_id, workspace = start_and_wait_for_the_agents_edit(
        tmp_path, repo, env, extra=extra, durable_session=stop != "ctrl-c"
    )
    try:
        if stop == "ctrl-c":
            proc.send_signal(signal.SIGINT)
            rc, _, err = finish(proc, out, timeout=60)
            assert rc == 130, err
        else:
            sigkill(proc)
        yield run_id, workspace
    finally:
        if proc.poll() is None:
            sigkill(proc)
        remove_run_docker(run_id)


def resume(tmp_path: Path, repo: Path, env: dict, run_id: str, *extra: str) -> str:
    out = tmp_path / "out" / f"resume{len(list((tmp_path / 'out').glob('resume*.out')))}"
    rc, _, err = finish(start_cli(["--resume", run_id, "--no-tui", *extra], cwd=repo, env=env, out=out), out)
    assert rc == 0, err[-3000:]
    return err


def the_branch_holds_the_notes(repo: Path, run_id: str, events) -> None:
    (done,) = [e for e in events if e.type == "task.completed"]
    branch = (done.payload.get("artifact") or {}).get("branch_final")
    assert branch, f"the task ended without a branch: the agent's notes.txt was lost ({done.payload})"
    assert git(repo, "show", f"{branch}:notes.txt") == "work"


def session_events(events) -> list[dict]:
    return [e.payload for e in events if e.type == "task.session"]


@pytest.mark.parametrize("stop", ["ctrl-c", "sigkill", "sigkill-codex"])
def test_an_interrupted_task_resumes_its_session_in_the_workspace_it_left(stop, tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, OPENAI_API_KEY="sk-test-openai-0123456789abcdef0123")
    extra = ("--plugin", "codex", "--model", "gpt-5-codex") if stop.endswith("codex") else ()
    with interrupted_first_run(tmp_path, repo, env, stop="ctrl-c" if stop == "ctrl-c" else "sigkill", extra=extra) as (
        run_id,
        workspace,
    ):
        events = check_log(events_path(tmp_path, run_id))
        recorded = [e.payload.get("session_id") for e in events if e.type in ("task.session", "task.interrupted")]
        session = recorded[0]
        assert session and set(recorded) == {session}, recorded
        assert (workspace / "notes.txt").read_text() == "work\n"  # kept as the agent left it
        # Resumable: the object store the workspace borrows from and its pristine index stay.
        folder = workspace.parent
        assert list(folder.glob("objects_*.git/objects")) and (folder / ".pristine-index" / workspace.name).exists()

        resume(tmp_path, repo, env, run_id)
        events = check_log(events_path(tmp_path, run_id))
        the_branch_holds_the_notes(repo, run_id, events)
        # Finished: nothing of it runs again, so its folder (store, indexes) is given back at once.
        assert not folder.exists(), sorted(p.name for p in folder.iterdir())
        execs = sim_executions(run_id)
        assert [(x["session_id"], x["resumed"]) for x in execs] == [(session, False), (session, True)], execs
        assert {x["persona"] for x in execs} == {"codex" if extra else "claude"}
        (started,) = [r for r in runner_messages(tmp_path, run_id, "runner.exec.started") if r.get("resume_session_id")]
        assert started["resume_session_id"] == session
        (kept,) = runner_messages(tmp_path, run_id, "runner.workspace.kept")
        assert kept["workspace_path"] == str(workspace)
        check_snapshot_is_replay(tmp_path, run_id)
        assert running_containers(run_id) == []


def test_a_deleted_workspace_restarts_fresh_with_a_fresh_session_and_the_log_says_why(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    with interrupted_first_run(tmp_path, repo, env) as (run_id, workspace):
        shutil.rmtree(workspace)  # deleted by hand
        resume(tmp_path, repo, env, run_id)
        events = check_log(events_path(tmp_path, run_id))
        sessions = session_events(events)
        old = sessions[0]["session_id"]
        reset = [s for s in sessions if s["session_id"] is None]
        assert [(s["reason"], s["previous_session_id"]) for s in reset] == [("workspace_missing", old)], sessions
        execs = sim_executions(run_id)
        assert len(execs) == 2 and execs[1]["resumed"] is False and execs[1]["session_id"] != old, execs
        assert sessions[-1]["session_id"] == execs[1]["session_id"]  # the new session is durable too
        assert runner_messages(tmp_path, run_id, "runner.workspace.prepared")[-1]["workspace_path"] == str(workspace)


def test_resume_fresh_starts_a_fresh_clone_with_a_fresh_session(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    with interrupted_first_run(tmp_path, repo, env) as (run_id, _workspace):
        resume(tmp_path, repo, env, run_id, "--resume-fresh")
        execs = sim_executions(run_id)
        assert len(execs) == 2 and execs[1]["resumed"] is False and execs[1]["session_id"] != execs[0]["session_id"]
        assert not runner_messages(tmp_path, run_id, "runner.workspace.kept")
        assert len(runner_messages(tmp_path, run_id, "runner.workspace.prepared")) == 2
        events = check_log(events_path(tmp_path, run_id))
        (done,) = [e for e in events if e.type == "task.completed"]
        # the fresh clone had no notes.txt and the agent (its marker says it ran before) committed nothing
        assert not (done.payload.get("artifact") or {}).get("branch_final")
