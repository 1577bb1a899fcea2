"""Several Docker engines for one run (runner.hosts / --docker-host).

The second engine is the session's private dockerd (tests/private_engine.py):
it shares no images with the host engine, and the runner treats every
configured non-local engine as remote, so its tasks move in and out through
the archive API only (no bind mount), which these tests check on the
containers themselves.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import msgspec
import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE, git, make_repo
from plugin_helpers import instance_request
from reliability_helpers import (
    NO_DISK_MIN,
    check_log,
    check_snapshot_is_replay,
    events_path,
    host_containers,
    interrupted_run_on_two_hosts,
    remove_run,
)

from orchestrator.errors import ConfigError, GitError
from orchestrator.runner import archive
from orchestrator.runner.git_ops import _prepare_workspace_sync
from orchestrator.runner.hosts import parse_host_flag, resolve_hosts
from orchestrator.sanitize import redact_url

# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("flag", "entry"),
    [
        ("big1=ssh://ci@big1:16", {"name": "big1", "docker": "ssh://ci@big1", "max_parallel": 16}),
        ("big1=ssh://ci@big1", {"name": "big1", "docker": "ssh://ci@big1"}),
        ("b=tcp://h:2376", {"name": "b", "docker": "tcp://h:2376"}),
        ("b=tcp://h:2376:8", {"name": "b", "docker": "tcp://h:2376", "max_parallel": 8}),
        ("local=local:3", {"name": "local", "docker": "local", "max_parallel": 3}),
        ("b=unix:///run/x.sock:2", {"name": "b", "docker": "unix:///run/x.sock", "max_parallel": 2}),
    ],
)
def test_docker_host_flag(flag, entry):
    assert parse_host_flag(flag) == entry


def test_host_urls_never_show_a_password_or_query():
    assert redact_url("ssh://ci:hunter2@big1:22") == "ssh://ci:***@big1:22"
    assert "tok" not in redact_url("tcp://h:2376?token=tok")
    assert redact_url("ssh://ci@big1") == "ssh://ci@big1"


@pytest.mark.parametrize(
    ("entries", "words"),
    [
        ([{"name": "big1"}], ["big1", "docker: URL"]),
        ([{"name": "a", "docker": "http://x"}], ["ssh://"]),
        ([{"name": "local"}, {"name": "local"}], ["twice"]),
        ([{"name": "a", "docker": "ssh://a", "max_parallel": 0}], ["max_parallel"]),
        ([{"name": "a b", "docker": "ssh://a"}], ["host name"]),
    ],
)
def test_bad_host_entries_are_one_clear_error(entries, words):
    with pytest.raises(ConfigError) as info:
        resolve_hosts(entries)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_bad_docker_host_flag_is_one_line_exit_2(tmp_path):
    repo = make_repo(tmp_path / "repo")
    result = run_cli(["x", "--docker-host", "nourl", "--no-tui"], cwd=repo, env=cli_env(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "NAME=URL" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())


# ---------------------------------------------------------------- the bundle


def wgit(cwd, *args: str) -> str:
    """git in a task clone (owned by the container user, so git needs to be told it is safe)."""
    return git(cwd, "-c", "safe.directory=*", *args)


def _clone_with_agent_commit(tmp_path: Path) -> tuple[Path, Path, Path, str, str]:
    """A repo, a task clone of it at the base, and a second clone where 'the agent' committed."""
    repo = make_repo(tmp_path / "repo")
    local = _prepare_workspace_sync(repo, "main", tmp_path / "ws_local").path
    agent = _prepare_workspace_sync(repo, "main", tmp_path / "ws_agent").path
    base = wgit(local, "rev-parse", "HEAD")
    (agent / "new.txt").write_text("agent work\n")
    wgit(agent, "add", "-A")
    wgit(agent, "-c", "user.email=a@b", "-c", "user.name=A", "commit", "-q", "-m", "agent")
    head = wgit(agent, "rev-parse", "HEAD")
    bundle = tmp_path / "result.bundle"
    wgit(agent, "bundle", "create", "-q", str(bundle), "HEAD", "--not", base)
    return repo, local, bundle, base, head


def test_good_bundle_moves_the_clone_to_the_agents_commit(tmp_path):
    _, local, bundle, _, head = _clone_with_agent_commit(tmp_path)
    archive.import_bundle(local, bundle, head)
    assert wgit(local, "rev-parse", "HEAD") == head
    assert wgit(local, "show", "HEAD:new.txt") == "agent work"


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_bundle_is_a_git_error_and_changes_nothing(tmp_path, damage):
    repo, local, bundle, base, head = _clone_with_agent_commit(tmp_path)
    data = bundle.read_bytes()
    bundle.write_bytes(data[: len(data) // 2] if damage == "truncated" else data[:60] + b"\0" * (len(data) - 60))
    refs_before = git(repo, "for-each-ref")
    with pytest.raises(GitError) as info:
        archive.import_bundle(local, bundle, head)
    assert info.value.category == "git"
    assert "bundle" in str(info.value)
    assert wgit(local, "rev-parse", "HEAD") == base
    assert git(repo, "for-each-ref") == refs_before


# ---------------------------------------------------------------- two real engines


def _score_approach(i: int) -> str:
    return (
        f"SIM: write c{i}.txt candidate {i}\nSIM: commit add c{i}\n"
        f'SIM: print SIM: print-json {{"score": {i}, "rationale": "ok"}}'
    )


@pytest.mark.docker
def test_best_of_n_over_two_engines_imports_and_notes_every_branch(tmp_path, private_engine):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    approaches = json.dumps([_score_approach(i) for i in range(4)])
    result = run_cli(
        [
            "add a file",
            "--strategy",
            "best-of-n",
            "-S",
            "n=4",
            "-S",
            f"approaches={approaches}",
            "--no-tui",
            "--docker-image",
            private_engine.image,
            "--docker-host",
            "local=local:2",
            "--docker-host",
            f"b={private_engine.url}:2",
        ],
        cwd=repo,
        env=env,
        timeout=600,
    )
    run_id = only_run_id(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        check_snapshot_is_replay(tmp_path, run_id)
        completed = [e for e in events if e.type == "task.completed"]
        gens = [e for e in completed if "/gen/" in e.key]
        assert len(gens) == 4 and len({e.key for e in completed}) == len(completed)
        for e in gens:
            branch = e.payload["artifact"]["branch_final"]
            i = int(e.key.rsplit("/", 1)[1])
            assert git(repo, "show", f"{branch}:c{i}.txt") == f"candidate {i}"
            note = git(repo, "notes", "--ref", "orchestrator", "show", branch)
            assert f"task_key={e.key}" in note and run_id in note
        local = host_containers(None, run_id)
        remote = host_containers(private_engine.url, run_id)
        assert local and remote, "both engines ran tasks"
        assert {c["Config"]["Labels"]["orchestrator.host"] for c in local} == {"local"}
        assert {c["Config"]["Labels"]["orchestrator.host"] for c in remote} == {"b"}
        # The remote engine never bind-mounted this machine's directories: archive path only.
        for c in remote:
            ws = next(m for m in c["Mounts"] if m["Destination"] == "/workspace")
            assert ws["Type"] == "volume", ws
        for c in local:
            ws = next(m for m in c["Mounts"] if m["Destination"] == "/workspace")
            assert ws["Type"] == "bind", ws
        started_hosts = {e.payload["host"] for e in events if e.type == "task.started"}
        assert started_hosts == {"local", "b"}
        # The watchdog reads this machine's /proc and cgroups: never for a remote engine's container.
        runner_log = [
            json.loads(line) for line in (tmp_path / "logs" / run_id / "runner.jsonl").read_text().splitlines()
        ]
        skipped = {r["task_key"] for r in runner_log if r.get("message") == "runner.watchdog.skipped"}
        on_b = {e.key for e in events if e.type == "task.started" and e.payload["host"] == "b"}
        assert skipped == on_b, (skipped, on_b)
        # Reviewers (import_policy never) on the remote engine returned nothing.
        assert all(e.payload["artifact"]["branch_final"] is None for e in completed if "/score/" in e.key)
    finally:
        remove_run(None, run_id)
        remove_run(private_engine.url, run_id)


@pytest.mark.docker
def test_bundle_spoiled_inside_the_container_fails_the_task_as_git_and_imports_nothing(tmp_path, private_engine):
    """The agent bundles its own commits, keeps the first half of that bundle, and
    leaves a process behind that swaps the half in for the result bundle the
    orchestrator creates in the container, the moment it appears. The truncated
    bundle really travels through the archive API: the task fails with
    error_type git, and the repository gets no branch and no provenance note."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    refs_before = git(repo, "for-each-ref")
    # Python, not a shell loop: the swap must land before the orchestrator reads the
    # bundle back (a few API round trips later), and a fork per step is too slow.
    swap = (
        "import os,itertools; b='.git/orchestrator-result.bundle'; "
        "any(os.path.isfile(b) and os.path.getsize(b) for _ in itertools.count()); "
        "os.replace('.git/half.bundle', b)"
    )
    spoiler = (
        "git bundle create -q .git/full.bundle HEAD --not $(cat .git/BASE_COMMIT) && "
        "head -c $(( $(wc -c < .git/full.bundle) / 2 )) .git/full.bundle > .git/half.bundle && "
        f'(python3 -c "{swap}" >/dev/null 2>&1 &)'
    )
    prompt = f"SIM: write a.txt work\nSIM: commit a\nSIM: exec {spoiler}\nSIM: print done"
    result = run_cli(
        [prompt, "--no-tui", "--docker-image", private_engine.image, "--docker-host", f"b={private_engine.url}:1"],
        cwd=repo,
        env=env,
        timeout=300,
    )
    run_id = only_run_id(tmp_path)
    try:
        assert result.returncode != 0, result.stderr
        assert "Traceback" not in result.stderr
        events = check_log(events_path(tmp_path, run_id))
        (failed,) = [e for e in events if e.type == "task.failed"]
        assert failed.payload["error_type"] == "git", failed.payload
        message = failed.payload["message"]
        assert "result bundle is corrupt or truncated" in message and "early EOF" in message, message
        assert not [e for e in events if e.type == "task.completed"]
        runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
        assert '"runner.archive.copied_in"' in runner_log  # the archive path, not a bind mount
        # Nothing half-imported: no branch, no note, no ref of any kind.
        assert git(repo, "for-each-ref") == refs_before
        assert git(repo, "notes", "--ref", "orchestrator", "list") == ""
    finally:
        remove_run(private_engine.url, run_id)


@pytest.mark.docker
def test_image_missing_on_a_host_stops_with_the_fix_or_is_synced(tmp_path, private_engine):
    tag = f"{TEST_IMAGE}:h18sync"
    subprocess.run(["docker", "tag", private_engine.image, tag], check=True)
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    args = [
        "SIM: write s.txt synced\nSIM: commit s",
        "--no-tui",
        "--docker-image",
        tag,
        "--docker-host",
        f"b={private_engine.url}:1",
    ]
    try:
        private_engine.docker("rmi", tag)
        refused = run_cli(args, cwd=repo, env=env)
        assert refused.returncode == 2, refused.stderr
        line = refused.stderr.strip()
        assert (
            "\n" not in line
            and "host b" in line
            and f"docker save {tag} | docker -H {private_engine.url} load" in line
            and "--sync-image" in line
        ), line
        synced = run_cli([*args, "--sync-image"], cwd=repo, env=env, timeout=900)
        assert synced.returncode == 0, synced.stderr
        assert "syncing image to host b" in synced.stderr
        want = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True
        ).stdout.strip()
        got = private_engine.docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()
        assert got == want
        run_id = only_run_id(tmp_path)
        events = check_log(events_path(tmp_path, run_id))
        (done,) = [e for e in events if e.type == "task.completed"]
        assert git(repo, "show", f"{done.payload['artifact']['branch_final']}:s.txt") == "synced"
        remove_run(private_engine.url, run_id)
    finally:
        private_engine.docker("rmi", tag)
        subprocess.run(["docker", "rmi", tag], capture_output=True)


def test_host_config_redacted_in_the_manifest():
    from orchestrator.config import Config, redacted

    config = msgspec.convert({"runner": {"hosts": [{"name": "b", "docker": "ssh://ci:pw123@big1"}]}}, Config)
    assert "pw123" not in json.dumps(redacted(config))


@pytest.mark.docker
@pytest.mark.slow
def test_engine_killed_mid_run_its_tasks_rerun_on_the_other(tmp_path, private_engine):
    """SIGKILL to the private dockerd while two tasks run there: they fail there as a
    docker error naming the host, are placed again on the local engine (events.jsonl
    says so: task.session null, reason host_down), and every key completes exactly
    once with its branch."""
    from reliability_helpers import finish, run_ids, start_cli, wait_for

    repo = make_repo(tmp_path / "repo")
    env = cli_env(
        tmp_path, ORCHESTRATOR_RUNNER__BACKOFF_BASE_S="0.5", ORCHESTRATOR_RUNNER__BACKOFF_FACTOR="1", **NO_DISK_MIN
    )
    prompt = "SIM: write a.txt $TASK\nSIM: commit a\nSIM: sleep 10\nSIM: print done"
    out = tmp_path / "out" / "kill"
    proc = start_cli(
        [
            prompt,
            "--runs",
            "4",
            "--no-tui",
            "--docker-image",
            private_engine.image,
            "--docker-host",
            "local=local:2",
            "--docker-host",
            f"b={private_engine.url}:2",
        ],
        cwd=repo,
        env=env,
        out=out,
    )
    run_id = wait_for(lambda: run_ids(tmp_path) and run_ids(tmp_path)[0], timeout=120)
    try:

        def two_agents_on_b():
            ids = private_engine.docker("ps", "-q", "--filter", f"label=run_id={run_id}").stdout.split()
            runner_log = tmp_path / "logs" / run_id / "runner.jsonl"
            execs = runner_log.read_text().count('"runner.exec.started"') if runner_log.exists() else 0
            return len(ids) == 2 and execs >= 4

        wait_for(two_agents_on_b, timeout=180, interval=0.5)
        private_engine.kill()
        rc, _, err = finish(proc, out, timeout=600)
        assert rc == 0, err
        assert "Traceback" not in err
        assert "Docker host b is down" in err
        events = check_log(events_path(tmp_path, run_id))
        check_snapshot_is_replay(tmp_path, run_id)
        completed = [e for e in events if e.type == "task.completed"]
        assert sorted(e.key for e in completed) == sorted({e.key for e in completed}) and len(completed) == 4
        assert not [e for e in events if e.type == "task.failed"]
        for e in completed:
            assert git(repo, "show", f"{e.payload['artifact']['branch_final']}:a.txt") == "$TASK"
        runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
        replaced = [json.loads(line) for line in runner_log.splitlines() if '"runner.host.replaced"' in line]
        assert len(replaced) == 2, "the two tasks on b were placed again"
        assert all(
            r["error_type"] == "docker" and r["error"].startswith("Docker host b stopped answering") for r in replaced
        ), replaced
        started_on_b = {e.key for e in events if e.type == "task.started" and e.payload["host"] == "b"}
        moved = [e for e in events if e.type == "task.session" and e.payload.get("reason") == "host_down"]
        assert {e.key for e in moved} == started_on_b and len(moved) == 2, moved
        for e in moved:
            assert e.payload["session_id"] is None and e.payload["host"] == "local"
            assert e.payload["error_type"] == "docker" and "Docker host b stopped answering" in e.payload["detail"]
        # The dashboard's host line: b was marked down in the event log.
        statuses = [e.payload["hosts"] for e in events if e.type == "hosts.status"]
        assert statuses[0] == [
            {"name": "local", "max_parallel": 2, "down": False},
            {"name": "b", "max_parallel": 2, "down": False},
        ]
        assert any(
            h["name"] == "b" and h["down"] and "Docker host b" in h["reason"] for table in statuses for h in table
        ), statuses
        local = host_containers(None, run_id)
        assert len(local) == 4, "all four ended on the local engine (two of them after b died)"
    finally:
        if not private_engine.answering():
            private_engine.start()  # later tests use the engine
        remove_run(None, run_id)
        remove_run(private_engine.url, run_id)


@pytest.mark.docker
@pytest.mark.slow
def test_resume_after_engine_restart_keeps_each_session_on_its_engine(tmp_path, private_engine):
    """Interrupt, restart the private engine (only private engines are ever restarted: the
    host's engine stays up, so 'both engines restart' is the private one here), resume
    with the hosts listed the other way round and b given more slots: without session
    affinity both tasks would go to b; each resumes its agent session where its volume is."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    run_id, first_hosts = interrupted_run_on_two_hosts(tmp_path, repo, private_engine, env)
    try:
        private_engine.restart()
        n_before = len(check_log(events_path(tmp_path, run_id)))
        result = run_cli(
            [
                "--resume",
                run_id,
                "--no-tui",
                "--docker-host",
                f"b={private_engine.url}:3",
                "--docker-host",
                "local=local:1",
            ],
            cwd=repo,
            env=env,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        check_snapshot_is_replay(tmp_path, run_id)
        resumed = [e for e in events[n_before:] if e.type == "task.started"]
        assert {e.key: e.payload["host"] for e in resumed} == first_hosts
        assert all(e.payload["session_id"] for e in resumed)
        completed = [e for e in events if e.type == "task.completed"]
        assert sorted(e.key for e in completed) == sorted(first_hosts)
        for e in completed:
            assert git(repo, "show", f"{e.payload['artifact']['branch_final']}:a.txt") == "$TASK"
    finally:
        remove_run(None, run_id)
        remove_run(private_engine.url, run_id)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("left", ["local", "b"])
def test_resume_without_the_engine_holding_a_session_restarts_it_fresh(tmp_path, private_engine, left):
    """The host set changed: only ``left`` is configured at resume. The other host's
    task starts a fresh session on ``left``, the event log says so (task.session
    null, reason host_gone), and both tasks finish once with their file. With b
    left, the task that ran locally continues in its kept clone, which travels to
    b's new container through the archive API (it had no bind mount to keep)."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    run_id, first_hosts = interrupted_run_on_two_hosts(tmp_path, repo, private_engine, env)
    url = "local" if left == "local" else private_engine.url
    try:
        n_before = len(check_log(events_path(tmp_path, run_id)))
        result = run_cli(
            ["--resume", run_id, "--no-tui", "--docker-host", f"{left}={url}:2"], cwd=repo, env=env, timeout=300
        )
        assert result.returncode == 0, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        resumed = [e for e in events[n_before:] if e.type == "task.started"]
        assert {e.payload["host"] for e in resumed} == {left}
        lost = [k for k, h in first_hosts.items() if h != left]
        gone = [e for e in events[n_before:] if e.type == "task.session" and e.payload.get("reason") == "host_gone"]
        assert [e.key for e in gone] == lost, gone
        assert gone[0].payload["session_id"] is None and gone[0].payload["previous_session_id"]
        assert gone[0].payload["host"] == left and "session volume" in gone[0].payload["detail"]
        # The other task resumed its session where it was: no reset for it.
        assert not [
            e
            for e in events[n_before:]
            if e.type == "task.session" and e.key != lost[0] and e.payload["session_id"] is None
        ]
        statuses = [e.payload["hosts"] for e in events[n_before:] if e.type == "hosts.status"]
        assert statuses == [[{"name": left, "max_parallel": 2, "down": False}]]
        completed = [e for e in events if e.type == "task.completed"]
        assert sorted(e.key for e in completed) == sorted(first_hosts)
        for e in completed:
            assert git(repo, "show", f"{e.payload['artifact']['branch_final']}:a.txt") == "$TASK"
        if left == "b":
            runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
            copied = [json.loads(line) for line in runner_log.splitlines() if '"runner.archive.copied_in"' in line]
            assert lost[0] in {c["task_key"] for c in copied}, "the kept clone was copied into b"
    finally:
        remove_run(None, run_id)
        remove_run(private_engine.url, run_id)


@pytest.mark.docker
def test_hosts_check_and_cleanup_run_cover_every_engine(tmp_path, private_engine):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    hosts = ["--docker-host", "local=local:1", "--docker-host", f"b={private_engine.url}:1"]
    checked = run_cli(
        [
            "--hosts",
            "--docker-image",
            private_engine.image,
            *hosts,
            "--docker-host",
            "gone=unix:///nonexistent/docker.sock",
        ],
        cwd=repo,
        env=env,
    )
    assert checked.returncode == 1, checked.stderr
    lines = {line.split()[0]: line for line in checked.stdout.splitlines() if line.strip()}
    assert " up " in lines["b"] and f"image {private_engine.image}: same" in lines["b"] and "rtt" in lines["b"]
    assert "DOWN" in lines["gone"]
    result = run_cli(
        [
            "SIM: write a.txt x\nSIM: commit a",
            "--runs",
            "2",
            "--no-tui",
            "--docker-image",
            private_engine.image,
            *hosts,
        ],
        cwd=repo,
        env=env,
        timeout=300,
    )
    run_id = only_run_id(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        assert host_containers(private_engine.url, run_id), "one task ran on b"
        cleaned = run_cli(["--cleanup-run", run_id, *hosts], cwd=repo, env=env)
        assert cleaned.returncode == 0, cleaned.stderr
        assert host_containers(private_engine.url, run_id) == [] and host_containers(None, run_id) == []
        left = private_engine.docker("volume", "ls", "-q", "--filter", f"label=run_id={run_id}").stdout.split()
        assert left == [], left
    finally:
        remove_run(None, run_id)
        remove_run(private_engine.url, run_id)


@pytest.mark.docker
@pytest.mark.slow
def test_all_hosts_down_stops_the_run_resumably(tmp_path, private_engine):
    """The run's only engine is killed mid-run: the run stops like Ctrl+C (exit 130, tasks
    interrupted, none failed); after the engine is back, --resume finishes every task once."""
    from reliability_helpers import finish, run_ids, start_cli, wait_for

    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    hosts = ["--docker-host", f"b={private_engine.url}:2"]
    out = tmp_path / "out" / "alldown"
    proc = start_cli(
        [
            "SIM: write a.txt x\nSIM: commit a\nSIM: sleep 20\nSIM: print done",
            "--runs",
            "2",
            "--no-tui",
            "--docker-image",
            private_engine.image,
            *hosts,
        ],
        cwd=repo,
        env=env,
        out=out,
    )
    run_id = wait_for(lambda: run_ids(tmp_path) and run_ids(tmp_path)[0], timeout=300)
    try:

        def both_running():
            log = tmp_path / "logs" / run_id / "runner.jsonl"
            return log.exists() and log.read_text().count('"runner.exec.started"') >= 2

        wait_for(both_running, timeout=180, interval=0.5)
        private_engine.kill()
        rc, _, err = finish(proc, out, timeout=300)
        assert rc == 130, err
        assert "every Docker host is down" in err and f"orchestrator --resume {run_id}" in err
        events = check_log(events_path(tmp_path, run_id))
        check_snapshot_is_replay(tmp_path, run_id)
        assert not [e for e in events if e.type in ("task.failed", "task.completed")]
        assert len([e for e in events if e.type == "task.interrupted"]) == 2
        assert [h["down"] for e in events if e.type == "hosts.status" for h in e.payload["hosts"]] == [False, True]
        private_engine.start()
        resumed = run_cli(["--resume", run_id, "--no-tui", *hosts], cwd=repo, env=env, timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        events = check_log(events_path(tmp_path, run_id))
        completed = [e for e in events if e.type == "task.completed"]
        assert len(completed) == 2 and len({e.key for e in completed}) == 2
    finally:
        if not private_engine.answering():
            private_engine.start()
        remove_run(private_engine.url, run_id)


@pytest.mark.docker
def test_read_only_archive_copy_cannot_be_changed_by_the_agent(tmp_path, private_engine):
    """Review tasks on a remote engine: the copied clone is root-owned without write bits,
    in a volume that was not filled from the image (so its root is root's too)."""
    import anyio

    from orchestrator.runner.docker_containers import TaskMounts, host_config_kwargs, workspace_read_only
    from orchestrator.runner.hosts import HostSpec, docker_host

    repo = make_repo(tmp_path / "repo")
    ws = _prepare_workspace_sync(repo, "main", tmp_path / "ws").path
    request = instance_request(
        prompt="p",
        repo_path=str(repo),
        run_id="run_ro",
        strategy_execution_id="s1",
        container_name="h18-ro-test",
        import_policy="never",
    )
    mounts = TaskMounts(ws, "v", workspace_read_only(request), workspace_volume="wv")
    mount = next(m for m in host_config_kwargs(request, mounts)["mounts"] if m["Target"] == "/workspace")
    nocopy = ":nocopy" if (mount.get("VolumeOptions") or {}).get("NoCopy") else ""
    name, volume = "h18-ro-test", "h18-ro-test-vol"
    private_engine.docker(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "none",
        "--read-only",
        "-v",
        f"{volume}:/workspace{nocopy}",
        private_engine.image,
        "sleep",
        "infinity",
        check=True,
    )

    async def check():
        host = docker_host(HostSpec("b", private_engine.url, 1))
        try:
            await archive.copy_in(host, name, ws, read_only=True)
            edit = await host.exec_simple(name, ["sh", "-c", "echo x >> /workspace/README.md"])
            add = await host.exec_simple(name, ["touch", "/workspace/new.txt"])
            read = await host.exec_simple(name, ["cat", "/workspace/README.md"])
            return edit, add, read
        finally:
            await host.aclose()

    try:
        edit, add, read = anyio.run(check)
        assert edit[0] != 0 and add[0] != 0, (edit, add)
        assert read == (0, b"# demo\n")
    finally:
        private_engine.docker("rm", "-f", name)
        private_engine.docker("volume", "rm", "-f", volume)


@pytest.mark.docker
def test_clean_containers_on_a_remote_engine_lists_and_removes_its_workspace_volume(tmp_path, private_engine):
    """A stopped task container past retention on b goes, and with it the volume that
    held its workspace (the archive path's orc_ws_<name>); both are named first."""
    import os

    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    name = f"orch-cc-remote-{os.getpid()}"
    volume = f"orc_ws_{name}"
    hosts = ["--docker-host", f"b={private_engine.url}:1"]
    try:
        private_engine.docker("volume", "create", "--label", f"run_id=run_cc_{os.getpid()}", volume, check=True)
        private_engine.docker(
            "run",
            "--name",
            name,
            "--network",
            "none",
            "--label",
            "orchestrator=true",
            "--label",
            f"run_id=run_cc_{os.getpid()}",
            "--label",
            "orchestrator.last_active_ts=2020-01-01T00:00:00.000Z",
            "-v",
            f"{volume}:/workspace",
            private_engine.image,
            "true",
            check=True,
        )
        listed = run_cli(["--clean-containers", "--dry-run", *hosts], cwd=repo, env=env)
        assert listed.returncode == 0, listed.stderr
        assert f"would remove {name} on b" in listed.stdout, listed.stdout
        assert f"would remove workspace volume {volume} on b" in listed.stdout, listed.stdout
        assert private_engine.docker("volume", "ls", "-q", "--filter", f"name={volume}").stdout.split() == [volume]
        removed = run_cli(["--clean-containers", "--force", *hosts], cwd=repo, env=env)
        assert removed.returncode == 0, removed.stderr
        assert f"remove workspace volume {volume} on b" in removed.stdout, removed.stdout
        assert private_engine.docker("ps", "-aq", "--filter", f"name={name}").stdout.split() == []
        assert private_engine.docker("volume", "ls", "-q", "--filter", f"name={volume}").stdout.split() == []
    finally:
        private_engine.docker("rm", "-f", name)
        private_engine.docker("volume", "rm", "-f", volume)


@pytest.mark.parametrize("raised", ["git", "config"])
def test_an_error_raised_by_a_hosts_runner_reaches_the_caller_unwrapped(raised):
    """The host watcher runs the task in a task group: an error the engine's runner
    raises must come out as itself (a RunnerError becomes the task's failure with its
    category; anything else keeps its type), not as an ExceptionGroup that the
    orchestration would report as an internal error."""
    import anyio

    from orchestrator.errors import ConfigError, GitError
    from orchestrator.jsonlog import ComponentLog
    from orchestrator.runner.hosts import HostSpec, MultiHostRunner

    class Raising:
        """An engine's runner that raises before it gets anywhere (no Docker is touched)."""

        def __init__(self, host):
            self.host = host
            self.log = ComponentLog(None, "runner", "run_x")

        async def run(self, request, *, on_event=None):
            raise GitError("the clone failed") if raised == "git" else ConfigError("plugin says no")

        def emit_event(self, request, on_event, type_, level="info", **fields):
            self.log.log(level, type_, **fields)

        async def aclose(self):
            await self.host.aclose()

    request = instance_request(prompt="p", repo_path="/nonexistent", run_id="run_x", strategy_execution_id="s1")

    async def go():
        runner = MultiHostRunner([HostSpec("only", None, 1)], Raising)
        try:
            return await runner.run(request)
        finally:
            await runner.aclose()

    if raised == "git":
        result = anyio.run(go)
        assert result.status == "failed" and result.error_type == "git" and result.error == "the clone failed"
    else:
        with pytest.raises(ConfigError, match="plugin says no"):
            anyio.run(go)


def test_retry_policy_docker_covers_a_dead_host_and_a_failed_container():
    from orchestrator.engine.engine import RetryPolicy

    default = RetryPolicy()
    assert default.retries("docker") and default.retries("container")
    assert RetryPolicy(retry_on=("network",)).retries("docker")
    assert not RetryPolicy(retry_on=("api",)).retries("docker")
    assert not default.retries("internal")


async def test_a_placement_event_goes_through_the_runners_one_emitter_and_is_scrubbed(tmp_path):
    """The multi-host runner had its own copy of the emitter, without the scrubbing: a
    secret in a placement event's fields reached the caller in clear."""
    import json

    from orchestrator.runner import DockerRunner
    from orchestrator.runner.hosts import HostSpec, MultiHostRunner
    from orchestrator.sanitize import Sanitizer

    secret = "sk-ant-placement-0123456789abcdef"
    sanitizer = Sanitizer()
    sanitizer.add_secrets([secret])

    def make(host):
        return DockerRunner(logs_dir=tmp_path, sanitizer=sanitizer, host=host)

    runner = MultiHostRunner([HostSpec("a", None, 1), HostSpec("b", None, 1)], make)
    request = instance_request(
        prompt="p",
        repo_path=str(tmp_path),
        run_id="r1",
        strategy_execution_id="s1",
        instance_id="i1",
        task_key="r1/s1/k",
        container_name="c1",
    )
    seen: list[dict] = []
    try:
        runner._task_event(request, seen.append, "runner.host.replaced", "warn", host="a", error=f"boom {secret}")
    finally:
        await runner.aclose()
    assert len(seen) == 1 and secret not in json.dumps(seen) and seen[0]["host"] == "a"
    logged = (tmp_path / "runner.jsonl").read_text()
    assert "runner.host.replaced" in logged and secret not in logged
