"""The link to a remote engine breaks while a task's container is being set up.

A remote engine is reached over a connection that can drop (an ssh pipe, a TCP
link). Here the ``orchestrator`` command reaches the session's private engine
through tests/engine_proxy.py, which drops the connection carrying one chosen
request, once. The task must come through: the runner retries, and the retry
finds the container the failed attempt created, whose /workspace volume is
empty or holds half a copy. An agent must never run there; the clone is copied
in again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal

import pytest
from cli_helpers import cli_env, only_run_id, run_cli, wait_for
from conftest import git, make_repo
from engine_proxy import EngineProxy
from reliability_helpers import (
    NO_DISK_MIN,
    check_log,
    events_path,
    finish,
    remove_run,
    runner_messages,
    sigkill,
    start_cli,
)

PUT_ARCHIVE = rb"PUT /[^ ]*/containers/[^/ ]+/archive\?path=%2Fworkspace"
# The container set-up's exec that checks the session volume is writable.
SETUP_EXEC = rb'"Cmd": \["test", "-w", "/home/node"\]'


@pytest.mark.docker
@pytest.mark.parametrize(
    ("cut", "after"),
    [
        pytest.param(PUT_ARCHIVE, 0, id="copy-in-never-arrives"),
        # Part of the tar reaches the engine, which extracts what it got: the volume
        # holds a half-copied .git that must not pass for a clone.
        pytest.param(PUT_ARCHIVE, 60_000, id="copy-in-cut-midway"),
        # The attempt fails before any copy-in; the retry reuses the running container.
        pytest.param(SETUP_EXEC, 0, id="container-setup-cut"),
    ],
)
def test_a_dropped_link_during_set_up_is_retried_and_the_agent_gets_the_whole_clone(
    tmp_path, private_engine, proxy_dir, cut, after
):
    # Incompressible and larger than the part of the copy that gets through.
    repo = make_repo(tmp_path / "repo", {"README.md": "# demo\n", "blob.hex": os.urandom(150_000).hex()})
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock", cut=cut, after=after)
    env = cli_env(
        tmp_path, ORCHESTRATOR_RUNNER__BACKOFF_BASE_S="0.2", ORCHESTRATOR_RUNNER__BACKOFF_FACTOR="1", **NO_DISK_MIN
    )
    if after:
        # A copy large enough to be cut midway: the whole clone. With the engine's
        # object cache (the default) the copy is a few KB of .git and the files are
        # checked out in the container (tests/test_hosts_object_cache.py).
        env["ORCHESTRATOR_RUNNER__ISOLATION_MODE"] = "full_copy"
    branch, log = _one_task_through(proxy, private_engine, repo, tmp_path, env, "linked")
    # The agent worked in the whole clone: the base commit's files came with it.
    assert git(repo, "show", f"{branch}:blob.hex") == (repo / "blob.hex").read_text()
    messages = [r.get("message") for r in log]
    retry = messages.index("runner.retry.scheduled")
    assert "runner.archive.copied_in" in messages[retry:], messages
    ready = [r for r in log if r.get("message") == "runner.container.ready"]
    # The retry found the container the failed attempt left and kept it.
    assert ready[-1]["action"] == "reused", ready


def _through(proxy, private_engine, repo, tmp_path, env, args: list[str]) -> tuple[str, list[dict]]:
    """The ``orchestrator`` command with ``args`` on the private engine, through ``proxy``,
    which cuts one request. The run must come through: returns its id and the
    runner's log records. The proxy is closed and the run's containers and
    volumes removed afterwards."""
    run_id = None
    try:
        result = run_cli(
            [*args, "--no-tui", "--docker-image", private_engine.image, "--docker-host", f"far={proxy.url}:1"],
            cwd=repo,
            env=env,
            timeout=300,
        )
        run_id = only_run_id(tmp_path)
        assert proxy.cuts == 1
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text().splitlines()
        return run_id, [json.loads(line) for line in runner_log]
    finally:
        proxy.close()
        if run_id:
            remove_run(private_engine.url, run_id)


def _one_task_through(proxy, private_engine, repo, tmp_path, env, word: str) -> tuple[str, list[dict]]:
    """One task that writes ``word`` to t.txt, through ``proxy``: its branch and the runner's log records."""
    run_id, log = _through(proxy, private_engine, repo, tmp_path, env, [f"SIM: write t.txt {word}\nSIM: commit t"])
    (done,) = [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.completed"]
    branch = done.payload["artifact"]["branch_final"]
    assert git(repo, "show", f"{branch}:t.txt") == word
    return branch, log


# The object cache's pack, sent into its helper container's mount of the cache.
CACHE_PUT = rb"PUT /[^ ]*/containers/orc_objcache_helper_[0-9a-f]+/archive\?path=%2Fcache"


@pytest.mark.docker
def test_a_link_dropped_while_the_history_is_sent_to_the_cache_is_sent_again(tmp_path, private_engine, proxy_dir):
    # Incompressible: the pack is far larger than the part that gets through before the cut.
    repo = make_repo(tmp_path / "repo", {"README.md": "# demo\n", "blob.bin": os.urandom(150_000).hex()})
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock", cut=CACHE_PUT, after=20_000)
    env = cli_env(tmp_path, **NO_DISK_MIN)
    branch, log = _one_task_through(proxy, private_engine, repo, tmp_path, env, "cached")
    assert git(repo, "show", f"{branch}:blob.bin") == (repo / "blob.bin").read_text()
    messages = [r.get("message") for r in log]
    retry = messages.index("runner.object_cache.retry")
    synced = [r for r in log[retry:] if r.get("message") == "runner.object_cache.synced"]
    assert synced and synced[0]["bytes"] > 150_000, synced


# The agent's exec create: its command runs under the agent wrapper, whose first
# line names it (JSON-escaped in the request body).
AGENT_EXEC = rb"# orchestrator-agent-wrapper\\n"
EXEC_OF_REVIEW = rb"# orchestrator-exec-wrapper\\n"
# Every execution of the agent appends one "run" line and, after the sleep in
# which the link drops, one "end" line: two agents in one workspace would leave
# two "end" lines.
MID_AGENT_PROMPT = (
    "SIM: append log.txt run\nSIM: commit a\nSIM: sleep 8\nSIM: append log.txt end\nSIM: write b.txt two\nSIM: commit b"
)


@pytest.mark.docker
def test_a_link_dropped_while_the_agent_runs_ends_that_agent_and_resumes_its_session(
    tmp_path, private_engine, proxy_dir
):
    repo = make_repo(tmp_path / "repo")
    base = git(repo, "rev-parse", "HEAD")
    # The agent's output stream is cut 3 s in: it has committed "a" and sleeps.
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock", exec_of=AGENT_EXEC, hold=3.0)
    env = cli_env(
        tmp_path, ORCHESTRATOR_RUNNER__BACKOFF_BASE_S="0.2", ORCHESTRATOR_RUNNER__BACKOFF_FACTOR="1", **NO_DISK_MIN
    )
    run_id = None
    try:
        result = run_cli(
            [
                MID_AGENT_PROMPT,
                "--no-tui",
                "--docker-image",
                private_engine.image,
                "--docker-host",
                f"far={proxy.url}:1",
            ],
            cwd=repo,
            env=env,
            timeout=300,
        )
        run_id = only_run_id(tmp_path)
        log = [json.loads(line) for line in (tmp_path / "logs" / run_id / "runner.jsonl").read_text().splitlines()]
        messages = [r.get("message") for r in log]
        assert proxy.cuts == 1, messages
        assert result.returncode == 0, (result.stderr, messages)
        (done,) = [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.completed"]
        branch = done.payload["artifact"]["branch_final"]
        # The first agent was ended before the second began: one "end" line. The
        # resumed agent ran the whole prompt again in the same workspace, on top
        # of the first one's committed "a".
        assert git(repo, "show", f"{branch}:log.txt").splitlines() == ["run", "run", "end"]
        assert git(repo, "show", f"{branch}:b.txt") == "two"
        assert git(repo, "log", "--format=%s", f"{base}..{branch}").splitlines() == ["b", "a", "a"]

        retry = messages.index("runner.retry.scheduled")
        scheduled = log[retry]
        assert "broke while the agent was still running" in scheduled["reason"], scheduled
        stopped = [r for r in log[:retry] if r.get("message") == "runner.agent.stopped"]
        assert stopped and stopped[-1]["exited"] is True, messages
        (first, second) = [r for r in log if r.get("message") == "runner.exec.started"]
        assert first["resume_session_id"] is None
        assert second["resume_session_id"] and second["resume_session_id"] == scheduled["resume_session_id"]
    finally:
        proxy.close()
        if run_id:
            remove_run(private_engine.url, run_id)


# The checkout from the engine's object cache, after the copy-in of a clone without its files.
CHECKOUT_EXEC = rb"checked-out"


@pytest.mark.docker
def test_a_checkout_whose_output_the_engine_lost_still_counts_by_its_exit_status(tmp_path, private_engine, proxy_dir):
    # A busy engine can end an exec's output before copying it: the client sees exit 0 and
    # nothing. The checkout's exit status alone says whether it worked; waiting for its
    # last line failed the task as git ("failed (exit 0): ") in a side-by-side test run.
    repo = make_repo(tmp_path / "repo", {"README.md": "# demo\n", "blob.bin": os.urandom(20_000).hex()})
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock", exec_of=CHECKOUT_EXEC, swallow=True)
    branch, log = _one_task_through(proxy, private_engine, repo, tmp_path, cli_env(tmp_path, **NO_DISK_MIN), "kept")
    # the agent worked in the whole checkout
    assert git(repo, "show", f"{branch}:blob.bin") == (repo / "blob.bin").read_text()
    assert "runner.retry.scheduled" not in [r.get("message") for r in log]


@pytest.mark.docker
def test_an_agent_exec_whose_output_the_engine_lost_is_run_again_and_its_work_comes_back(
    tmp_path, private_engine, proxy_dir
):
    # Under load dockerd closes an exec's streams a fixed time after the process exits,
    # copied or not: exit 0 and nothing. A one-line dry run failed with "claude-code exited
    # with status 0 without a result" on six test workers. The agent wrapper's last line
    # always reaches stderr, so its absence names the loss and the attempt is tried again.
    repo = make_repo(tmp_path / "repo")
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock", exec_of=AGENT_EXEC, swallow=True)
    env = cli_env(
        tmp_path, ORCHESTRATOR_RUNNER__BACKOFF_BASE_S="0.2", ORCHESTRATOR_RUNNER__BACKOFF_FACTOR="1", **NO_DISK_MIN
    )
    _, log = _one_task_through(proxy, private_engine, repo, tmp_path, env, "kept")
    messages = [r.get("message") for r in log]
    (scheduled,) = [r for r in log if r.get("message") == "runner.retry.scheduled"]
    assert "returned none of the task's output" in scheduled["reason"], scheduled
    assert messages.count("runner.exec.started") == 2, messages
    assert "runner.exec.output_lost" in messages, messages


# A strategy file with one command task, whose output it returns as its result.
ONE_CHECK = """
from orchestrator.strategy import Context


async def one_check(prompt: str, base_branch: str, ctx: Context) -> dict:
    task = {"plugin": "command", "command": "echo measured-$((6 * 7))", "base_branch": base_branch, "import_policy": "never"}
    result = await ctx.wait(ctx.run(task, key=ctx.key("check")))
    return {"said": result["final_message"]}
"""
CHECK_EXEC = rb"echo measured-"


@pytest.mark.docker
def test_a_command_whose_output_the_engine_lost_is_run_again_and_its_output_comes_back(
    tmp_path, private_engine, proxy_dir
):
    # An evolve check on six test workers failed with "the check's output has no end
    # marker", and a synthesis had no provenance: the engine lost a command's output,
    # which read as a success that printed nothing. Every task's process runs under a
    # wrapper whose last line proves the output complete.
    repo = make_repo(tmp_path / "repo")
    strategy = tmp_path / "one_check.py"
    strategy.write_text(ONE_CHECK)
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock", exec_of=CHECK_EXEC, swallow=True)
    env = cli_env(
        tmp_path, ORCHESTRATOR_RUNNER__BACKOFF_BASE_S="0.2", ORCHESTRATOR_RUNNER__BACKOFF_FACTOR="1", **NO_DISK_MIN
    )
    run_id, log = _through(proxy, private_engine, repo, tmp_path, env, ["check", "--strategy", str(strategy)])
    (done,) = [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "strategy.completed"]
    assert done.payload["result"]["said"].strip() == "measured-42", done.payload
    messages = [r.get("message") for r in log]
    (scheduled,) = [r for r in log if r.get("message") == "runner.retry.scheduled"]
    assert "returned none of the task's output" in scheduled["reason"], scheduled
    assert messages.count("runner.exec.output_lost") == 1, messages


# The object cache's update, in its helper container, after the pack was sent.
CACHE_UPDATE_EXEC = rb"echo updated"


@pytest.mark.docker
def test_a_cache_update_whose_output_the_engine_lost_is_checked_in_the_cache(tmp_path, private_engine, proxy_dir):
    # The update said nothing (exit 0, output lost): the cache itself is asked whether it
    # now holds the commits, instead of failing the task as git.
    repo = make_repo(tmp_path / "repo")
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock", exec_of=CACHE_UPDATE_EXEC, swallow=True)
    _, log = _one_task_through(proxy, private_engine, repo, tmp_path, cli_env(tmp_path, **NO_DISK_MIN), "cached")
    assert "runner.object_cache.synced" in [r.get("message") for r in log]


# Runs on after the first attempt is interrupted (a resume redoes the prompt in its
# session): short enough for the resume, long enough for the interruption to come first.
INTERRUPTED_PROMPT = "SIM: write a.txt one\nSIM: commit a\nSIM: sleep 8\nSIM: write b.txt two\nSIM: commit b"
SESSION_ID = re.compile(rb'"session_id":\s*"([^"]+)"')


# A review agent: its work is not imported, its workspace is read-only, and it runs
# under the plain wrapper.
REVIEW = ("SIM: print looking\nSIM: sleep 8\nSIM: print reviewed", ["-S", "import_policy=never"], EXEC_OF_REVIEW)


@contextlib.contextmanager
def _first_line_held(tmp_path, private_engine, proxy_dir, task=(INTERRUPTED_PROMPT, [], AGENT_EXEC)):
    """A run on the private engine whose agent has written its session's line, which the runner has not read.

    ``task``: the prompt, extra arguments and the proxy's pattern for the agent's exec.
    Yields (repo, env, proxy, the running command, its output prefix, the session, the run id).
    """
    prompt, extra, exec_of = task
    repo = make_repo(tmp_path / "repo")
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock", exec_of=exec_of, stall=True)
    env = cli_env(tmp_path, **NO_DISK_MIN)
    far = ["--no-tui", "--docker-image", private_engine.image, "--docker-host", f"far={proxy.url}:1"]
    out = tmp_path / "out" / "first"
    proc = start_cli([prompt, *far, *extra], cwd=repo, env=env, out=out)
    run_id = None
    try:
        found = wait_for(lambda: SESSION_ID.search(bytes(proxy.held)), timeout=120)
        run_id = only_run_id(tmp_path)
        yield repo, env, proxy, proc, out, found.group(1).decode(), run_id
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.close()
        if run_id:
            remove_run(private_engine.url, run_id)


def _resume_continues(tmp_path, repo, env, run_id: str, session: str) -> list:
    """The resume finishes the task in the session the agent announced; returns the run's events."""
    result = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    events = check_log(events_path(tmp_path, run_id))
    (done,) = [e for e in events if e.type == "task.completed"]
    assert done.payload["session_id"] == session, done.payload
    branch = (done.payload["artifact"] or {}).get("branch_final")
    if branch:  # a review agent's work is not imported
        assert git(repo, "show", f"{branch}:b.txt") == "two"
    started = runner_messages(tmp_path, run_id, "runner.exec.started")
    assert [s.get("resume_session_id") for s in started][-1] == session, started
    return events


@pytest.mark.docker
def test_ctrl_c_before_the_agents_first_line_is_read_keeps_its_session_for_the_resume(
    tmp_path, private_engine, proxy_dir
):
    # On a loaded machine (or a slow link) the agent's first line, which names its session,
    # can still be on its way when the user presses Ctrl+C. The connection was closed at
    # once, the session was lost with it, and the resume paid for the agent's work again.
    with _first_line_held(tmp_path, private_engine, proxy_dir) as (repo, env, proxy, proc, out, session, run_id):
        proc.send_signal(signal.SIGINT)
        # The line comes through only once the agent has been asked to end: a runner that
        # closed the connection when the Ctrl+C came has lost it by then.
        wait_for(lambda: runner_messages(tmp_path, run_id, "runner.agent.stopped"), timeout=60)
        proxy.release()
        rc, _, err = finish(proc, out, timeout=60)
        assert rc == 130, err[-3000:]
        (interrupted,) = [e.payload for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.interrupted"]
        assert interrupted.get("session_id") == session, interrupted
        _resume_continues(tmp_path, repo, env, run_id, session)
        assert len(runner_messages(tmp_path, run_id, "runner.exec.started")) == 2


@pytest.mark.docker
@pytest.mark.parametrize("task", [(INTERRUPTED_PROMPT, [], AGENT_EXEC), REVIEW], ids=["imported", "review"])
def test_a_kill_before_the_agents_first_line_is_read_resumes_the_session_the_agent_announced(
    tmp_path, private_engine, proxy_dir, task
):
    # kill -9 while the agent's first line, which names its session, is still on its way
    # (a lagging stream on a loaded machine, a slow link): nothing recorded the session,
    # and the resume started a second session in the kept workspace, paying for the work again.
    held = _first_line_held(tmp_path, private_engine, proxy_dir, task)
    with held as (repo, env, proxy, proc, _, session, run_id):
        sigkill(proc)
        assert not [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.session"]
        proxy.release()
        events = _resume_continues(tmp_path, repo, env, run_id, session)
        (recovered,) = runner_messages(tmp_path, run_id, "runner.session.recovered")
        assert recovered["session_id"] == session, recovered
        started = runner_messages(tmp_path, run_id, "runner.exec.started")
        assert [s.get("resume_session_id") for s in started] == [None, session], started
        assert {e.payload["session_id"] for e in events if e.type == "task.session"} == {session}
