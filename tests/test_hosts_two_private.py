"""``--resume`` after BOTH engines of a run restart (issue 18).

The host's engine is shared by everyone on the machine and is never restarted,
so a run that must lose both of its engines runs on two private ones only: the
session's (the ``private_engine`` fixture) and a second one this file starts
itself, with its own socket, data root and bridge, stopped by its own pid and
its bridge deleted when the test ends, pass or fail.
"""

from __future__ import annotations

import pytest
from cli_helpers import cli_env, run_cli
from conftest import git, make_repo
from reliability_helpers import (
    NO_DISK_MIN,
    check_log,
    check_snapshot_is_replay,
    docker,
    events_path,
    interrupt_when_sessions_known,
    remove_run,
    start_cli,
    wait_run_started,
)


@pytest.fixture
def second_engine(private_engine):
    """Another private dockerd with the session engine's image (same image ID, so the
    run's pre-flight accepts both). Requesting ``private_engine`` first matters: its
    bridge is up by then, so this one's bridge picks a different subnet."""
    from private_engine import PrivateEngine

    # Its own name prefix: the bridge is "<name><pid>", so it never collides with
    # the session engine's "orc2<pid>" made by the same process.
    engine = PrivateEngine(name="orc3")
    engine.image = private_engine.image
    try:
        engine.start()
        engine.load_image(engine.image)
        yield engine
    finally:
        engine.close()  # SIGTERM to its own pid, then its bridge and directories


def _session_volumes(url: str, run_id: str) -> set[str]:
    out = docker(url, "volume", "ls", "-q", "--filter", f"label=run_id={run_id}", check=True).stdout
    return {v for v in out.split() if v.startswith("orc_home_")}


def _home_volumes_by_task(url: str, run_id: str) -> dict[str, set[str]]:
    """task_key -> the session volumes its containers on this engine mount at /home/node."""
    ids = docker(url, "ps", "-aq", "--filter", f"label=run_id={run_id}", check=True).stdout.split()
    found: dict[str, set[str]] = {}
    for line in (
        docker(
            url,
            "inspect",
            "--format",
            '{{index .Config.Labels "task_key"}} {{range .Mounts}}{{if eq .Destination "/home/node"}}{{.Name}}{{end}}{{end}}',
            *ids,
            check=True,
        ).stdout.splitlines()
        if ids
        else []
    ):
        key, _, volume = line.partition(" ")
        found.setdefault(key, set()).add(volume.strip())
    return found


@pytest.mark.docker
@pytest.mark.slow
def test_resume_after_both_engines_restart_keeps_each_session_on_its_engine(tmp_path, private_engine, second_engine):
    """Two tasks, one on each private engine, interrupted while their agents work;
    both engines restart; ``--resume`` with the hosts the other way round and c given
    more slots (without session affinity both tasks would go to c) finishes each task
    once, in its agent session, on the engine that holds its session volume."""
    b, c = private_engine, second_engine
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    prompt = "SIM: write a.txt $TASK\nSIM: commit a\nSIM: sleep 30\nSIM: print done"
    out = tmp_path / "out" / "first"
    proc = start_cli(
        [prompt, "--runs", "2", "--no-tui", "--docker-image", b.image,
         "--docker-host", f"b={b.url}:1", "--docker-host", f"c={c.url}:1"],
        cwd=repo,
        env=env,
        out=out,
    )  # fmt: skip
    run_id = ""
    try:
        run_id = wait_run_started(proc, out, tmp_path)
        events = interrupt_when_sessions_known(proc, out, tmp_path, run_id, tasks=2)
        first_hosts = {e.key: e.payload["host"] for e in events if e.type == "task.started"}
        assert sorted(first_hosts.values()) == ["b", "c"], first_hosts
        interrupted = {e.key: e.payload.get("session_id") for e in events if e.type == "task.interrupted"}
        assert sorted(interrupted) == sorted(first_hosts) and all(interrupted.values()), interrupted
        # Each engine holds exactly the session volume of the task it ran.
        urls = {"b": b.url, "c": c.url}
        volume_of = {}
        for key, host in first_hosts.items():
            held = _session_volumes(urls[host], run_id)
            assert len(held) == 1, (host, held)
            assert _home_volumes_by_task(urls[host], run_id)[key] == held
            volume_of[key] = held.pop()
        assert len(set(volume_of.values())) == 2

        b.restart()
        c.restart()
        assert b.answering() and c.answering()

        n_before = len(events)
        result = run_cli(
            ["--resume", run_id, "--no-tui", "--docker-host", f"c={c.url}:3", "--docker-host", f"b={b.url}:1"],
            cwd=repo,
            env=env,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        check_snapshot_is_replay(tmp_path, run_id)
        resumed = [e for e in events[n_before:] if e.type == "task.started"]
        assert {e.key: e.payload["host"] for e in resumed} == first_hosts
        # The agent session that was interrupted is the one resumed: never a fresh one.
        assert {e.key: e.payload["session_id"] for e in resumed} == interrupted
        assert not [e for e in events[n_before:] if e.type == "task.session" and e.payload.get("session_id") is None]
        for key, host in first_hosts.items():
            assert _home_volumes_by_task(urls[host], run_id)[key] == {volume_of[key]}
            other = urls["c" if host == "b" else "b"]
            assert key not in _home_volumes_by_task(other, run_id), f"{key} also ran on the other engine"
        completed = [e for e in events if e.type == "task.completed"]
        assert sorted(e.key for e in completed) == sorted(first_hosts), "every task finished exactly once"
        for e in completed:
            branch = e.payload["artifact"]["branch_final"]
            assert git(repo, "show", f"{branch}:a.txt") == "$TASK"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if not b.answering():
            b.start()  # later tests use the session engine; c goes with its fixture
        if run_id:
            remove_run(b.url, run_id)
