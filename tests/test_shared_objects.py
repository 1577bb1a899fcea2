"""isolation_mode: shared_objects (the default) through real containers: the run's read-only object store.

Each task's clone borrows its objects (git alternates) from one bare store in
the run's folder, which the container mounts read-only at the path the
alternates name. The user's repository is never mounted. On a remote engine
(archive path) the task gets a full copy instead. ``full_copy`` is the opt-in
for a clone with objects of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from cli_helpers import cli_env, only_run_id, run_cli, wait_for
from conftest import TEST_IMAGE as IMAGE
from conftest import git, make_repo, runner_log
from reliability_helpers import check_log, events_path, remove_run

from orchestrator.runner import AuthConfig, DockerRunner, RetryConfig, git_ops, run_instance
from orchestrator.sanitize import Sanitizer

pytestmark = [pytest.mark.docker]

# No isolation_mode here: these runs take the default.
SHARED = {
    "ORCHESTRATOR_ORCHESTRATION__HARD_MIN_FREE_DISK_GB": "0",
    "ORCHESTRATOR_ORCHESTRATION__MIN_FREE_DISK_GB": "0",
    "ORCHESTRATOR_RUNNER__NETWORK_EGRESS": "offline",
}


@pytest.fixture
async def runner(tmp_path: Path):
    r = DockerRunner(auth=AuthConfig(api_key="k-test"), logs_dir=tmp_path / "logs", sanitizer=Sanitizer())
    yield r
    await r.aclose()


def fields(run_id: str, key: str, **kw):
    base = dict(
        run_id=run_id,
        task_key=key,
        docker_image=IMAGE,
        retry_config=RetryConfig(max_attempts=1),
    )
    base.update(kw)
    return base


def _inspect(name: str, url: str | None = None) -> dict:
    base = ["docker"] + (["-H", url] if url else [])
    out = subprocess.run([*base, "inspect", name], check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]


def test_shared_objects_commit_comes_back_as_a_branch(tmp_path):
    """The reported failure: every task ended "completed, no branch" with exit 0,
    because the clone's alternates named the user's repository, which the
    container does not have. Now the commit comes back as a branch, the clone
    borrows from the run's store, mounted read-only, and the repository is not mounted.
    With no isolation_mode configured: the store is the default (it was a full copy)."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **SHARED)
    result = run_cli(
        [
            "SIM: write shared.txt from the agent\nSIM: commit add shared\nSIM: print done",
            "--no-tui",
            "--docker-image",
            IMAGE,
        ],
        cwd=repo,
        env=env,
        timeout=300,
    )
    run_id = only_run_id(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        (done,) = [e for e in events if e.type == "task.completed"]
        branch = done.payload["artifact"]["branch_final"]
        assert branch, done.payload
        assert git(repo, "show", f"{branch}:shared.txt") == "from the agent"
        (container,) = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
        ).stdout.split()
        mounts = {m["Destination"]: m for m in _inspect(container)["Mounts"]}
        store = git_ops.object_store_objects(tmp_path / "ws" / run_id / "k_x", repo)
        inside = f"/{store.parent.name}/objects"
        assert mounts[inside]["Source"] == str(store) and mounts[inside]["RW"] is False
        assert store.parent.parent == (tmp_path / "ws" / run_id).resolve()
        assert not any(str(repo) in m["Source"] for m in mounts.values())
    finally:
        remove_run(None, run_id)


async def test_a_container_cannot_write_into_the_shared_store(repo_with_history, run_id, runner):
    repo = repo_with_history
    ws = git_ops.workspace_path(run_id, "w")
    store = git_ops.object_store_objects(ws, repo)
    inside = f"/{store.parent.name}/objects"  # where the relative alternates lead in the container
    probe = (
        f"cat /workspace/.git/objects/info/alternates; "
        f"touch {inside}/planted 2>&1; "
        f"for f in {inside}/pack/*.pack; do rm -f $f 2>&1; done; "
        f"echo end"
    )
    res = await run_instance("", repo, runner=runner, **fields(run_id, "w", plugin_name="command", command=probe))
    assert res.status == "success", res.error
    out = res.final_message
    assert out.splitlines()[0] == f"../../..{inside}"
    assert out.count("Read-only file system") >= 2, out
    assert not (store / "planted").exists()
    assert list((store / "pack").glob("*.pack")), "the store's packs are all still there"
    git(store.parent, "fsck", "--connectivity-only")  # raises if the store lost anything


async def test_the_agents_first_git_add_copies_no_borrowed_object(repo_with_history, run_id, runner):
    """git cannot freshen an object in the read-only store, so it writes a copy of
    every file it hashes again into the workspace: the checkout must not look
    changed to the agent's first `git add` (it did after the chown to the container user)."""
    count = "git add -A && find .git/objects -type f ! -path '*/info/*' | wc -l"
    res = await run_instance(
        "", repo_with_history, runner=runner, **fields(run_id, "a", plugin_name="command", command=count)
    )
    assert res.status == "success", res.error
    assert res.final_message.strip() == "0", res.final_message


@pytest.fixture
def repo_with_history(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "repo")
    for i in range(3):
        (repo / f"f{i}.txt").write_text(f"{i}\n")
        git(repo, "add", ".")
        git(repo, "commit", "-qm", f"c{i}")
    git(repo, "gc", "-q")  # packed, as a real repository's history is
    return repo


async def test_gc_prune_in_the_user_repository_while_tasks_run_breaks_no_task(repo_with_history, run_id, runner):
    """While the agents work, the user rewrites main and runs `git gc --prune=now`:
    the tasks' base commit is gone from their repository, but not from the run's
    store, so every task still commits and is imported."""
    repo = repo_with_history
    base = git(repo, "rev-parse", "main")
    keys = ["g1", "g2", "g3"]
    results: dict[str, object] = {}
    pruned: list[bool] = []

    async def task(key: str) -> None:
        prompt = f"SIM: sleep 4\nSIM: write {key}.txt {key}\nSIM: commit {key}"
        results[key] = await run_instance(prompt, repo, runner=runner, **fields(run_id, key))

    def rewrite_and_prune() -> None:
        subprocess.run(
            "git checkout -q --orphan fresh && git commit -qm rewritten && git branch -M fresh main && "
            "git reflog expire --expire=now --all && git gc -q --prune=now",
            shell=True,
            cwd=repo,
            check=True,
        )
        pruned.append(subprocess.run(["git", "-C", str(repo), "cat-file", "-e", base]).returncode != 0)

    async def prune_when_started() -> None:
        started = [git_ops.workspace_path(run_id, k) / ".git" / "BASE_COMMIT" for k in keys]
        await anyio.to_thread.run_sync(lambda: wait_for(lambda: all(p.exists() for p in started), timeout=60))
        await anyio.to_thread.run_sync(rewrite_and_prune)

    async with anyio.create_task_group() as tg:
        for key in keys:
            tg.start_soon(task, key)
        tg.start_soon(prune_when_started)

    assert pruned == [True], "the gc removed the tasks' base commit from the user's repository"
    for key in keys:
        res = results[key]
        assert res.status == "success", res.error
        branch = res.artifact.branch_final
        assert branch and git(repo, "show", f"{branch}:{key}.txt") == key
        assert git(repo, "rev-parse", f"{branch}^") == base
        assert git(repo, "rev-list", "--count", branch) == "5"  # initial + 3 + the agent's commit


async def test_a_resumed_shared_objects_task_continues_in_its_kept_workspace(repo_with_history, run_id, runner):
    """The kept workspace's container mounts the run's store again: the work the
    first attempt left uncommitted is committed by the resumed agent and imported."""
    repo = repo_with_history
    first = await run_instance(
        "SIM: write kept.txt first half\nSIM: fail 1 interrupted", repo, runner=runner, **fields(run_id, "r")
    )
    assert first.status == "failed" and first.error_type != "git", first.error
    await runner.host.remove(first.container_name)  # a fresh container must mount the store again
    res = await run_instance("SIM: commit resumed", repo, runner=runner, **fields(run_id, "r", resume_workspace=True))
    assert res.status == "success", res.error
    assert any(e["message"] == "runner.workspace.kept" for e in runner_log(runner))
    assert git(repo, "show", f"{res.artifact.branch_final}:kept.txt") == "first half"


async def test_repository_unusable_inside_the_container_fails_as_git(repo_with_history, run_id, runner):
    """A kept workspace whose alternates name the user's repository (what
    shared_objects made before): fine on the host, empty inside the container.
    The task fails as git naming the cause; it never ends completed with no branch."""
    repo = repo_with_history
    ws = git_ops.workspace_path(run_id, "u")
    ws.parent.mkdir(parents=True)
    git(ws.parent, "clone", "-q", "--shared", "--branch=main", str(repo), str(ws))
    base = git(ws, "rev-parse", "HEAD")
    (ws / ".git" / "BASE_BRANCH").write_text("main\n")
    (ws / ".git" / "BASE_COMMIT").write_text(base + "\n")
    if os.geteuid() == 0:  # the container user's, as the runner leaves its clones
        git_ops._chown_tree(ws, 1000, 1000)
    res = await run_instance(
        "SIM: write lost.txt work\nSIM: commit lost",
        repo,
        runner=runner,
        **fields(run_id, "u", isolation_mode="full_copy", resume_workspace=True),
    )
    assert res.status == "failed", (res.status, res.artifact)
    assert res.error_type == "git", res.error
    assert "unusable inside its container" in res.error and str(repo) in res.error, res.error
    assert res.artifact is None
    assert git(repo, "for-each-ref", "refs/heads/").count("\n") == 0  # main only
    assert res.session_id is None  # the agent never started
    assert any(e["message"] == "runner.instance.failed" for e in runner_log(runner))


@pytest.mark.parametrize("mode", [None, "full_copy"])
def test_shared_objects_on_a_remote_engine_gets_a_full_copy_and_the_branch(tmp_path, private_engine, mode):
    """On a second engine (archive path) this machine's store cannot be mounted: the
    default borrows from the engine's own object cache instead (object_cache.py),
    the opt-in full_copy gets a full copy; either way the commit comes back as a
    branch (before: every task failed as git, "unable to normalize alternate object
    path")."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **SHARED, **({"ORCHESTRATOR_RUNNER__ISOLATION_MODE": mode} if mode else {}))
    result = run_cli(
        [
            "SIM: write remote.txt from afar\nSIM: commit add remote\nSIM: print done",
            "--no-tui",
            "--docker-image",
            private_engine.image,
            "--docker-host",
            f"b={private_engine.url}:1",
        ],
        cwd=repo,
        env=env,
        timeout=300,
    )
    run_id = only_run_id(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        # The default: nothing to warn about, a remote task always had a full copy.
        assert "full copy" not in result.stderr and "shared_objects" not in result.stderr, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        (done,) = [e for e in events if e.type == "task.completed"]
        branch = done.payload["artifact"]["branch_final"]
        assert branch and git(repo, "show", f"{branch}:remote.txt") == "from afar"
        log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
        assert '"runner.archive.copied_in"' in log
        assert '"runner.workspace.full_copy"' not in log
        assert ('"runner.object_cache.synced"' in log) is (mode is None)
    finally:
        remove_run(private_engine.url, run_id)
        if mode is None:
            from orchestrator.runner.object_cache import volume_name

            private_engine.docker("volume", "rm", "-f", volume_name(repo))


def test_full_copy_opt_in_has_objects_of_its_own_and_the_branch_comes_back(tmp_path):
    """``full_copy`` stays as the opt-in: no store is made or mounted, the clone has
    no alternates, and the agent's commit comes back as a branch."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **SHARED, ORCHESTRATOR_RUNNER__ISOLATION_MODE="full_copy")
    prompt = "SIM: write own.txt a copy of its own\nSIM: commit add own\nSIM: print done"
    result = run_cli([prompt, "--no-tui", "--docker-image", IMAGE], cwd=repo, env=env, timeout=300)
    run_id = only_run_id(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        (done,) = [e for e in events if e.type == "task.completed"]
        branch = done.payload["artifact"]["branch_final"]
        assert branch and git(repo, "show", f"{branch}:own.txt") == "a copy of its own"
        (container,) = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
        ).stdout.split()
        mounts = [m["Destination"] for m in _inspect(container)["Mounts"]]
        assert not any("objects_" in m for m in mounts), mounts
        assert not list((tmp_path / "ws" / run_id).glob("objects_*")), "no store is made for full_copy"
    finally:
        remove_run(None, run_id)


async def test_the_store_is_readable_when_the_workspace_root_is_where_the_container_user_cannot_go(
    repo_with_history, run_id, runner, monkeypatch
):
    """A workspace root under /root (mode 700 in the image too): the store was mounted at
    its host path, inside /root, and the container user could not read it, so every
    task failed as git ("unable to normalize alternate object path"). It is now mounted
    at /<store name>/objects, where the workspace's relative alternates lead."""
    home = Path.home()
    if os.geteuid() != 0 or str(home) != "/root":
        pytest.skip("needs the tests to run as root, whose home the image keeps private")
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="orch-test-ws-", dir=home))
    monkeypatch.setenv("ORCHESTRATOR_WORKSPACE_ROOT", str(root))
    try:
        res = await run_instance(
            "SIM: write deep.txt under root\nSIM: commit deep", repo_with_history, runner=runner, **fields(run_id, "d")
        )
        assert res.status == "success", res.error
        assert git(repo_with_history, "show", f"{res.artifact.branch_final}:deep.txt") == "under root"
    finally:
        shutil.rmtree(root, ignore_errors=True)
