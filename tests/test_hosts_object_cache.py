"""A remote engine's object cache (issue 32, Wanted 2): history crosses the link once.

The ``orchestrator`` command reaches the session's private engine through
tests/engine_proxy.py, which counts the bytes sent towards the engine: the
measurement is of the link itself, not of a figure the product reports.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from cli_helpers import cli_env, run_cli
from conftest import git, make_repo
from engine_proxy import EngineProxy
from reliability_helpers import NO_DISK_MIN, check_log, events_path, remove_run

# The cache's names, as a user (and `docker volume ls --filter label=...`) sees them.
LABEL = "orchestrator.object-cache"
STAMP = "orchestrator-last-used"


def cache_key(repo: Path | str) -> str:
    return hashlib.sha256(os.path.realpath(repo).encode()).hexdigest()[:16]


def volume_name(repo: Path | str) -> str:
    return f"orc_objcache_{cache_key(repo)}"


# Incompressible history, so the bytes a copy of it costs are plain to see.
HISTORY_BYTES = 3 << 20
PROBE = (
    "SIM: exec sh -c 'touch /orchestrator-objects/objects/x' > probe.txt 2>&1; "
    "cat .git/objects/info/alternates >> probe.txt; git count-objects -v | grep size-pack >> probe.txt\n"
    "SIM: commit probe"
)


def _repo_with_history(path: Path) -> Path:
    repo = make_repo(path)
    for i in range(3):
        (repo / f"blob{i}.bin").write_bytes(os.urandom(HISTORY_BYTES // 3))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"history {i}")
    git(repo, "repack", "-adq")
    return repo


def _new_run_id(tmp_path: Path, seen: set[str]) -> str:
    runs = {p.name for p in (tmp_path / "state").iterdir() if (p / "run.json").exists()} - seen
    assert len(runs) == 1, runs
    return runs.pop()


def _run(
    tmp_path: Path,
    repo: Path,
    env: dict[str, str],
    image: str,
    url: str,
    prompt: str,
    seen: set[str],
    extra: tuple[str, ...] = (),
):
    result = run_cli(
        [prompt, "--no-tui", "--docker-image", image, "--docker-host", f"far={url}:3", *extra],
        cwd=repo,
        env=env,
        timeout=300,
    )
    run_id = _new_run_id(tmp_path, seen)
    seen.add(run_id)
    return result, run_id


def _branch_of(tmp_path: Path, run_id: str) -> tuple[str, list]:
    events = check_log(events_path(tmp_path, run_id))
    (done,) = [e for e in events if e.type == "task.completed"]
    return done.payload["artifact"]["branch_final"], events


def _runner_events(tmp_path: Path, run_id: str, message: str) -> list[dict]:
    lines = (tmp_path / "logs" / run_id / "runner.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("message") == message]


@pytest.mark.docker
def test_remote_history_crosses_the_link_once_and_the_cache_is_read_only(tmp_path, private_engine, proxy_dir):
    repo = _repo_with_history(tmp_path / "repo")
    pack = int(git(repo, "count-objects", "-v").split("size-pack: ")[1].split()[0]) << 10
    env = cli_env(tmp_path, **NO_DISK_MIN)
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock")
    volume = volume_name(repo)
    seen: set[str] = set()
    try:
        # First run, three tasks starting at once: the history travels once, as one pack.
        prompt = "SIM: write r.txt result\nSIM: commit r"
        result, run1 = _run(tmp_path, repo, env, private_engine.image, proxy.url, prompt, seen, ("--runs", "3"))
        assert result.returncode == 0, result.stderr
        done = [e for e in check_log(events_path(tmp_path, run1)) if e.type == "task.completed"]
        assert len(done) == 3
        for e in done:
            assert git(repo, "show", f"{e.payload['artifact']['branch_final']}:r.txt") == "result"
        first = proxy.sent
        assert pack <= first <= 1.1 * pack + (1 << 20), (first, pack)
        sends = [e for e in _runner_events(tmp_path, run1, "runner.object_cache.synced") if e["bytes"]]
        assert len(sends) == 1 and sends[0]["bytes"] >= pack and sends[0]["volume"] == volume, sends

        # The task container mounted the cache read-only where the alternates name it.
        names = private_engine.docker("ps", "-aq", "--filter", f"label=run_id={run1}").stdout.split()
        info = json.loads(private_engine.docker("inspect", *names).stdout)[0]
        cache = next(m for m in info["Mounts"] if m["Destination"] == "/orchestrator-objects")
        assert cache["Name"] == volume and cache["RW"] is False, cache
        labels = json.loads(private_engine.docker("volume", "inspect", volume).stdout)[0]["Labels"]
        assert labels[LABEL] == cache_key(repo)

        # Second run: no history crosses; the agent cannot write into the cache and
        # its workspace holds no objects of its own beside what it creates.
        before = proxy.sent
        result, run2 = _run(tmp_path, repo, env, private_engine.image, proxy.url, PROBE, seen)
        assert result.returncode == 0, result.stderr
        second = proxy.sent - before
        assert second < (1 << 20), second
        branch, _ = _branch_of(tmp_path, run2)
        probe = git(repo, "show", f"{branch}:probe.txt")
        assert "Read-only file system" in probe, probe
        assert "/orchestrator-objects/objects" in probe, probe
        assert not _runner_events(tmp_path, run2, "runner.object_cache.synced")[0]["bytes"]
        gone = private_engine.docker("run", "--rm", "-v", f"{volume}:/c:ro", private_engine.image, "ls", "/c/objects")
        assert "x" not in gone.stdout.split()
    finally:
        proxy.close()
        for run_id in seen:
            remove_run(private_engine.url, run_id)
        private_engine.docker("volume", "rm", "-f", volume)


@pytest.mark.docker
def test_hosts_lists_the_cache_expiry_drops_it_and_clean_containers_removes_it(tmp_path, private_engine):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    volume = volume_name(repo)
    hosts = ["--docker-host", f"far={private_engine.url}:1", "--docker-image", private_engine.image]
    seen: set[str] = set()
    try:
        result, _ = _run(
            tmp_path, repo, env, private_engine.image, private_engine.url, "SIM: write a.txt a\nSIM: commit a", seen
        )
        assert result.returncode == 0, result.stderr

        listed = run_cli(["--hosts", *hosts], cwd=repo, env=env)
        line = next((ln for ln in listed.stdout.splitlines() if volume in ln), "")
        assert "object cache" in line and "repo repo" in line and "MB" in line and "last used" in line, listed.stdout

        def age_the_cache() -> None:
            private_engine.docker(
                "run", "--rm", "--user", "0", "-v", f"{volume}:/c", "--entrypoint", "sh", private_engine.image,
                "-c", f"echo 1000 > /c/{STAMP} && touch /c/old-marker",
                check=True,
            )  # fmt: skip

        # Unused for longer than the expiry, but the first run's stopped container still
        # mounts it: Docker refuses to remove it, so it is kept and used as it is.
        age_the_cache()
        result, run2 = _run(
            tmp_path, repo, env, private_engine.image, private_engine.url, "SIM: write b.txt b\nSIM: commit b", seen
        )
        assert result.returncode == 0, result.stderr
        (synced,) = _runner_events(tmp_path, run2, "runner.object_cache.synced")
        assert "not dropped" in synced["dropped"] and "mounts it" in synced["dropped"], synced

        # Once no container mounts it, the next run drops it and builds it again.
        for run_id in seen:
            remove_run(private_engine.url, run_id)
        age_the_cache()
        result, run3 = _run(
            tmp_path, repo, env, private_engine.image, private_engine.url, "SIM: write c.txt c\nSIM: commit c", seen
        )
        assert result.returncode == 0, result.stderr
        branch, _ = _branch_of(tmp_path, run3)
        assert git(repo, "show", f"{branch}:c.txt") == "c"
        (synced,) = _runner_events(tmp_path, run3, "runner.object_cache.synced")
        assert "object_cache_expiry_days" in synced["dropped"] and "not" not in synced["dropped"], synced
        assert synced["bytes"] > 0, synced
        after = private_engine.docker(
            "run", "--rm", "-v", f"{volume}:/c:ro", "--entrypoint", "sh", private_engine.image,
            "-c", f"ls /c; cat /c/{STAMP}",
        ).stdout  # fmt: skip
        assert "old-marker" not in after and "1000" not in after.split(), after

        # --clean-containers names the cache and removes it (the run's containers go first).
        for run_id in seen:
            remove_run(private_engine.url, run_id)
        dry = run_cli(["--clean-containers", "--dry-run", *hosts], cwd=repo, env=env)
        assert f"would remove object cache {volume} on far" in dry.stdout, dry.stdout
        assert private_engine.docker("volume", "inspect", volume).returncode == 0
        done = run_cli(["--clean-containers", "--force", *hosts], cwd=repo, env=env)
        assert done.returncode == 0, done.stderr
        assert f"remove object cache {volume} on far" in done.stdout, done.stdout
        assert private_engine.docker("volume", "inspect", volume).returncode != 0
    finally:
        for run_id in seen:
            remove_run(private_engine.url, run_id)
        private_engine.docker("volume", "rm", "-f", volume)


def test_cache_key_is_the_repository_not_the_run(tmp_path):
    from orchestrator.runner import object_cache

    assert object_cache.volume_name(tmp_path) == volume_name(tmp_path)
    assert object_cache.LABEL == LABEL and object_cache.STAMP == STAMP
    a = make_repo(tmp_path / "a")
    b = make_repo(tmp_path / "b")
    assert volume_name(a) == volume_name(str(a) + "/") == volume_name(tmp_path / "x" / ".." / "a")
    assert volume_name(a) != volume_name(b)


@pytest.mark.docker
def test_two_processes_filling_one_cache_at_once_leave_it_whole(tmp_path, private_engine):
    """Two runners that share nothing (as two orchestrator processes) send the same
    commits into one empty cache at the same moment: both packs land, the refs'
    lock contention is waited out, and git finds every object of both commits."""
    import anyio

    from orchestrator.runner.git_ops import _prepare_workspace_sync
    from orchestrator.runner.hosts import HostSpec, docker_host
    from orchestrator.runner.object_cache import ObjectCache

    repo = _repo_with_history(tmp_path / "repo")
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "side.txt").write_text("side\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "side")
    git(repo, "checkout", "-q", "main")
    ws = _prepare_workspace_sync(
        repo, "main", tmp_path / "ws" / "run" / "k", isolation_mode="shared_objects", include_branches=["side"]
    ).path
    wants = [git(repo, "rev-parse", "main"), git(repo, "rev-parse", "side")]
    volume = volume_name(repo)

    async def both() -> list[dict]:
        hosts = [docker_host(HostSpec(f"p{i}", private_engine.url, 1)) for i in range(2)]
        done: list[dict] = [{}, {}]

        async def one(i: int) -> None:
            done[i] = await ObjectCache().sync(hosts[i], private_engine.image, str(repo), ws, wants[:: 1 - 2 * i])

        try:
            async with anyio.create_task_group() as tg:
                for i in range(2):
                    tg.start_soon(one, i)
        finally:
            for h in hosts:
                await h.aclose()
        return done

    try:
        done = anyio.run(both)
        assert all(d["checked"] for d in done), done
        check = private_engine.docker(
            "run", "--rm", "-v", f"{volume}:/c:ro", "--entrypoint", "sh", private_engine.image,
            "-c", "cd /c && git -c safe.directory='*' fsck --connectivity-only --no-dangling "
            "$(git -c safe.directory='*' for-each-ref --format='%(objectname)' refs/tips/) && "
            "git -c safe.directory='*' for-each-ref --format='%(refname)' refs/tips/",
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
        assert sorted(check.stdout.split()) == sorted(f"refs/tips/{w}" for w in wants), check.stdout
    finally:
        private_engine.docker("volume", "rm", "-f", volume)


@pytest.mark.docker
def test_a_cache_that_cannot_be_read_fails_the_task_as_git_naming_it(tmp_path, private_engine):
    """A cache volume that is not a git repository (damaged, or someone else's data
    under the name): the task fails as git with the cache named; no agent runs in a
    workspace whose objects are missing, and nothing is imported."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    volume = volume_name(repo)
    seen: set[str] = set()
    try:
        private_engine.docker("volume", "create", "--label", f"{LABEL}={cache_key(repo)}", volume, check=True)
        private_engine.docker(
            "run", "--rm", "--user", "0", "-v", f"{volume}:/c", "--entrypoint", "sh", private_engine.image,
            "-c", "echo garbage > /c/HEAD && mkdir /c/config /c/objects",
            check=True,
        )  # fmt: skip
        result, run_id = _run(
            tmp_path, repo, env, private_engine.image, private_engine.url, "SIM: write a.txt a\nSIM: commit a", seen
        )
        assert result.returncode != 0
        events = check_log(events_path(tmp_path, run_id))
        (failed,) = [e for e in events if e.type == "task.failed"]
        assert failed.payload["error_type"] == "git", failed.payload
        assert "object cache" in failed.payload["message"] and volume in failed.payload["message"], failed.payload
        assert not [e for e in events if e.type == "task.completed"]
        assert git(repo, "for-each-ref", "refs/heads/").count("\n") == 0  # main only
    finally:
        for run_id in seen:
            remove_run(private_engine.url, run_id)
        private_engine.docker("volume", "rm", "-f", volume)


def test_a_copy_in_from_the_cache_carries_no_objects_and_no_tracked_files(tmp_path):
    """What travels for a fresh task on a remote engine: .git without objects (its
    alternates name the cache), the files git ignores (an image's seed), gzipped;
    the copy stays marked partial until the container's checkout has finished."""
    import io
    import tarfile

    from orchestrator.runner import archive
    from orchestrator.runner.git_ops import _prepare_workspace_sync

    repo = _repo_with_history(tmp_path / "repo")
    ws = _prepare_workspace_sync(repo, "main", tmp_path / "ws" / "r" / "k", isolation_mode="shared_objects").path
    (ws / "seed.bin").write_text("seeded\n")
    spool = archive.tar_workspace(
        ws, read_only=False, alternates="/orchestrator-objects/objects", skip=archive.tracked_files(ws)
    )
    data = spool.read()
    assert len(data) < 16 << 10, len(data)  # the history is 3 MB, the checkout 3 MB
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = set(tar.getnames())
        assert tar.extractfile("./.git/objects/info/alternates").read() == b"/orchestrator-objects/objects\n"
        assert tar.extractfile("./seed.bin").read() == b"seeded\n"
        marks = [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith("orchestrator-copy-in")]
    assert marks == [b"partial\n"]
    assert not {n for n in names if n.startswith("./blob") or n == "./README.md" or n == "./.git/index"}
    assert not {n for n in names if n.startswith("./.git/objects/pack/") or n.endswith(".sample")}


@pytest.mark.docker
@pytest.mark.slow
def test_a_task_resumed_after_its_engines_cache_was_removed_gets_the_history_again(tmp_path, private_engine):
    """Interrupted mid-agent; meanwhile the engine's containers and its object cache
    go (--clean-containers, or a cache dropped): the task's workspace volume, which
    borrows from the cache, survives. The resume sends the base's objects again
    before the agent continues, and the commit comes back as a branch."""
    from reliability_helpers import interrupted_run_on_two_hosts

    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    volume = volume_name(repo)
    run_id, first_hosts = interrupted_run_on_two_hosts(tmp_path, repo, private_engine, env)
    try:
        names = private_engine.docker("ps", "-aq", "--filter", f"label=run_id={run_id}").stdout.split()
        private_engine.docker("rm", "-f", *names, check=True)
        assert private_engine.docker("volume", "rm", volume).returncode == 0
        result = run_cli(
            [
                "--resume",
                run_id,
                "--no-tui",
                "--docker-host",
                "local=local:1",
                "--docker-host",
                f"b={private_engine.url}:1",
            ],
            cwd=repo,
            env=env,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        completed = [e for e in events if e.type == "task.completed"]
        assert sorted(e.key for e in completed) == sorted(first_hosts)
        for e in completed:
            assert git(repo, "show", f"{e.payload['artifact']['branch_final']}:a.txt") == "$TASK"
        sends = [e for e in _runner_events(tmp_path, run_id, "runner.object_cache.synced") if e["bytes"]]
        assert len(sends) == 2, sends  # the first start, and the resume
        kept = _runner_events(tmp_path, run_id, "runner.workspace.kept")
        on_b = next(k for k, h in first_hosts.items() if h == "b")
        assert on_b in {k["task_key"] for k in kept}, kept
    finally:
        remove_run(None, run_id)
        remove_run(private_engine.url, run_id)
        private_engine.docker("volume", "rm", "-f", volume)
