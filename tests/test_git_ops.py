"""Git isolation layer: real git in temporary directories, no mocks."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from git_ops_helpers import commit_file, git, heads, land, make_ws, note, ws_head
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import BranchExistsError, GitError, PreflightError
from orchestrator.naming import branch_name, is_run_branch, short8
from orchestrator.runner.git_ops import (
    _import_branch_sync,
    _prepare_workspace_sync,
    import_branch,
    kept_workspace,
    object_store_path,
    prepare_workspace,
    remove_workspace,
    validate_repository,
    workspace_path,
    workspace_root,
)

# No user or system git config: notes must work without a configured identity.
pytestmark = pytest.mark.usefixtures("isolated_git_config")


# ---------------------------------------------------------------------------
# paths


def test_workspace_paths(monkeypatch, tmp_path):
    monkeypatch.delenv("ORCHESTRATOR_WORKSPACE_ROOT", raising=False)
    import tempfile

    assert workspace_root() == Path(tempfile.gettempdir()) / "orchestrator"
    monkeypatch.setenv("ORCHESTRATOR_WORKSPACE_ROOT", str(tmp_path))
    assert workspace_path("run_1", "key/a") == tmp_path / "run_1" / f"k_{short8('key/a')}"
    for bad in ("..", "a/b", ""):
        with pytest.raises(ValueError):
            workspace_path(bad, "k")


# ---------------------------------------------------------------------------
# validate_repository


def test_validate_repository_ok(host):
    info = validate_repository(host, "main")
    assert info.path == Path(os.path.realpath(host))
    assert info.git_dir == Path(os.path.realpath(host / ".git"))
    assert info.base_commit == git(host, "rev-parse", "main")
    assert info.base_branch == "main" and info.dirty is False
    (host / "a.txt").write_text("changed\n")
    assert validate_repository(host / ".", "main").dirty is True


def _one_line_preflight(repo, base) -> str:
    with pytest.raises(PreflightError) as exc:
        validate_repository(repo, base)
    msg = str(exc.value)
    assert "\n" not in msg and msg
    return msg


def test_validate_repository_errors(host, tmp_path):
    assert "does not exist" in _one_line_preflight(tmp_path / "nope", "main")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "not a git repository" in _one_line_preflight(plain, "main")
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "main")
    assert "no commits" in _one_line_preflight(empty, "main")
    for bad in ("bad..name", "-x", "--upload-pack=x", "a b", "x.lock", "@{-1}", "../main"):
        assert "invalid base branch" in _one_line_preflight(host, bad)
    msg = _one_line_preflight(host, "nosuch")
    assert "not found" in msg and "main" in msg and "side" in msg


# ---------------------------------------------------------------------------
# prepare_workspace


def _an_object_file(git_dir: Path) -> Path:
    for sub in sorted((git_dir / "objects").iterdir()):
        if len(sub.name) == 2:
            return next(sub.iterdir())
    packs = sorted((git_dir / "objects" / "pack").glob("*.pack"))
    return packs[0]


async def test_prepare_workspace_is_isolated(host, tmp_path):
    ws = tmp_path / "run" / "k_1"
    info = await prepare_workspace(host, "main", ws)
    assert info.path == ws and info.base_branch == "main"
    assert info.base_commit == git(host, "rev-parse", "main")
    assert git(ws, "remote") == ""
    assert not (ws / ".git" / "objects" / "info" / "alternates").exists()
    assert (ws / ".git" / "BASE_BRANCH").read_text().strip() == "main"
    assert (ws / ".git" / "BASE_COMMIT").read_text().strip() == info.base_commit
    assert set(heads(ws)) == {"main"}  # single branch: `side` is invisible
    assert git(ws, "symbolic-ref", "HEAD") == "refs/heads/main"
    host_obj = _an_object_file(host / ".git")
    ws_obj = ws / ".git" / host_obj.relative_to(host / ".git")
    assert ws_obj.exists()
    assert ws_obj.stat().st_ino != host_obj.stat().st_ino
    assert ws_obj.stat().st_nlink == 1
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        assert (ws / "a.txt").stat().st_uid == 1000
        assert (ws / ".git" / "HEAD").stat().st_uid == 1000
    # the container user (here: anyone with safe.directory) can commit
    commit_file(ws, "new.txt", "x\n", "agent")


def test_include_branches_and_head_stays_on_base(host, tmp_path):
    ws = tmp_path / "ws"
    _prepare_workspace_sync(host, "main", ws, include_branches=["side", "main"])
    assert heads(ws) == {"main": git(host, "rev-parse", "main"), "side": git(host, "rev-parse", "side")}
    assert git(ws, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert git(ws, "remote") == ""
    with pytest.raises(GitError, match="nosuch"):
        _prepare_workspace_sync(host, "main", tmp_path / "ws2", include_branches=["nosuch"])


def test_shared_objects_borrow_from_the_runs_store_not_the_users_repository(host, tmp_path, caplog):
    run = tmp_path / "run"
    ws = run / "k_a"
    with caplog.at_level(logging.INFO, logger="orchestrator.runner"):
        _prepare_workspace_sync(host, "main", ws, isolation_mode="shared_objects")
    store = object_store_path(ws, host)
    assert store.parent == run.resolve() and store.name.startswith("objects_")
    alternates = (ws / ".git" / "objects" / "info" / "alternates").read_text()
    # relative: the store here, and its mount point /<store name>/objects in a container
    assert alternates == f"../../../{store.name}/objects\n"
    assert (ws / ".git" / "objects" / alternates.strip()).resolve() == (store / "objects").resolve()
    assert any("shared_objects" in r.getMessage() for r in caplog.records)
    assert git(ws, "remote") == ""
    assert git(store, "config", "gc.auto") == "0"

    # main moves on and the old history is rewritten and pruned from the user's repository:
    # the first workspace still reads everything, and the next task sees the new main
    old = git(host, "rev-parse", "main")
    git(host, "checkout", "-q", "--orphan", "rewritten")
    git(host, "commit", "-qm", "rewritten")
    git(host, "branch", "-M", "rewritten", "main")
    git(host, "branch", "-f", "side", "main")
    git(host, "reflog", "expire", "--expire=now", "--all")
    git(host, "gc", "-q", "--prune=now")
    assert subprocess.run(["git", "-C", str(host), "cat-file", "-e", old]).returncode != 0
    git(ws, "fsck", "--connectivity-only")
    ws2 = run / "k_b"
    _prepare_workspace_sync(host, "main", ws2, isolation_mode="shared_objects", include_branches=["side"])
    assert git(ws2, "rev-parse", "HEAD") == git(host, "rev-parse", "main") != old
    assert git(ws2, "rev-parse", "side") == git(host, "rev-parse", "side")
    assert git(ws, "rev-parse", "HEAD") == old


def test_the_store_of_a_repository_that_borrows_objects_has_them_all(host, tmp_path):
    """A repository made with `git clone --shared` borrows its objects: the run's
    store must not (its alternates would name a path no container has)."""
    git(host, "gc", "-q")
    user = tmp_path / "user"
    git(tmp_path, "clone", "-q", "--shared", str(host), str(user))
    assert (user / ".git" / "objects" / "info" / "alternates").exists()
    ws = tmp_path / "run" / "k_a"
    _prepare_workspace_sync(user, "main", ws, isolation_mode="shared_objects")
    store = object_store_path(ws, user)
    assert not (store / "objects" / "info" / "alternates").exists()
    git(store, "fsck", "--connectivity-only")  # every object is in the store itself
    assert git(ws, "rev-parse", "HEAD") == git(user, "rev-parse", "main")
    assert git(user, "rev-parse", "main") == git(host, "rev-parse", "main")  # the user's side is untouched
    assert (user / ".git" / "objects" / "info" / "alternates").exists()


def test_a_half_made_object_store_is_made_again(host, tmp_path):
    ws = tmp_path / "run" / "k_a"
    store = object_store_path(ws, host)
    partial = store.with_name(store.name + ".partial")
    partial.mkdir(parents=True)
    (partial / "junk").write_text("a crash left this")
    _prepare_workspace_sync(host, "main", ws, isolation_mode="shared_objects")
    assert not partial.exists() and git(ws, "rev-parse", "HEAD") == git(host, "rev-parse", "main")


def test_prepare_replaces_leftover_workspace(host, tmp_path):
    ws = tmp_path / "ws"
    make_ws(host, ws, changes=True)
    (ws / "leftover").write_text("old attempt")
    info = _prepare_workspace_sync(host, "main", ws)
    assert not (ws / "leftover").exists()
    assert ws_head(ws) == info.base_commit


def test_prepare_rejects_option_like_names(host, tmp_path):
    for bad in ("--upload-pack=touch pwned", "-b", "../main"):
        with pytest.raises(GitError):
            _prepare_workspace_sync(host, bad, tmp_path / "ws")
        with pytest.raises(GitError):
            _prepare_workspace_sync(host, "main", tmp_path / "ws2", include_branches=[bad])
    assert not (tmp_path / "ws").exists()
    assert not list(tmp_path.rglob("pwned"))


def test_remove_workspace(host, tmp_path):
    ws = make_ws(host, tmp_path / "ws", changes=True)
    remove_workspace(ws)
    assert not ws.exists()
    remove_workspace(ws)  # missing is fine


# ---------------------------------------------------------------------------
# import_branch: the policy matrix


@pytest.mark.parametrize("preexisting", [False, True], ids=["fresh", "exists"])
@pytest.mark.parametrize("changes", [True, False], ids=["changes", "nochanges"])
@pytest.mark.parametrize("skip_empty", [True, False], ids=["skip", "noskip"])
@pytest.mark.parametrize("conflict", ["fail", "overwrite", "suffix"])
@pytest.mark.parametrize("policy", ["auto", "never", "always"])
def test_policy_matrix(host, tmp_path, policy, conflict, skip_empty, changes, preexisting):
    ws = make_ws(host, tmp_path / "ws", changes=changes)
    name = "strat_run1_kabc"
    other = git(host, "rev-parse", "main~1")
    if preexisting:
        git(host, "branch", name, other)
    before = heads(host)
    head = ws_head(ws)
    base_commit = git(host, "rev-parse", "main")
    kw = dict(
        branch_name=name,
        task_key="task-1",
        run_id="run1",
        import_policy=policy,
        import_conflict_policy=conflict,
        skip_empty_import=skip_empty,
    )

    skipped = policy == "never" or (policy == "auto" and skip_empty and not changes)
    if not skipped and preexisting and conflict == "fail":
        with pytest.raises(BranchExistsError) as exc:
            _import_branch_sync(host, ws, **kw)
        assert name in str(exc.value) and "overwrite" in str(exc.value) and "git branch -D" in str(exc.value)
        assert heads(host) == before
        assert ws.exists()  # kept for the caller
        return

    art = _import_branch_sync(host, ws, **kw)
    assert art.type == "branch" and art.branch_planned == name and art.base == "main"
    if skipped:
        assert art.branch_final is None and art.has_changes is False
        assert art.commit == base_commit
        assert heads(host) == before
        return

    expected = f"{name}_2" if preexisting and conflict == "suffix" else name
    assert art.branch_final == expected
    assert art.commit == head
    assert heads(host)[expected] == head
    assert art.has_changes is changes
    if changes:
        assert (art.commit_count, art.lines_added, art.lines_deleted) == (2, 2, 1)
    else:
        assert art.commit_count == 0 and head == base_commit
    if preexisting and conflict == "suffix":
        assert heads(host)[name] == other
    assert "task_key=task-1; run_id=run1" in note(host, head)
    # every other branch is untouched
    assert {k: v for k, v in heads(host).items() if k != expected} == {k: v for k, v in before.items() if k != expected}
    # crash window: the same call again is a no-op returning the same artifact
    assert _import_branch_sync(host, ws, **kw) == art
    assert heads(host)[expected] == head and f"{expected}_2" not in heads(host)


# ---------------------------------------------------------------------------
# idempotency and provenance


@pytest.mark.parametrize("conflict", ["fail", "overwrite", "suffix"])
async def test_crash_window_reimport(host, tmp_path, conflict):
    ws = make_ws(host, tmp_path / "ws", changes=True)
    kw = dict(branch_name="b", task_key="k", run_id="r", import_conflict_policy=conflict)
    first = await import_branch(host, ws, **kw)
    branches = heads(host)
    again = await import_branch(host, ws, **kw)
    assert again == first and heads(host) == branches
    assert note(host, first.commit).count("task_key=k;") == 1


def test_suffix_idempotency_with_provenance(host, tmp_path):
    ws = make_ws(host, tmp_path / "ws", changes=True)
    head = ws_head(ws)
    # an earlier attempt of task k landed on b_2 (b was taken), then crashed
    land(host, ws, "b_2")
    git(host, "notes", "--ref=orchestrator", "add", "-m", "task_key=k; run_id=r", head)
    kw = dict(branch_name="b", task_key="k", run_id="r", import_conflict_policy="suffix")
    art = _import_branch_sync(host, ws, **kw)
    assert art.branch_final == "b_2" and art.commit == head
    assert set(heads(host)) == {"main", "side", "b_2"}
    # same with b existing elsewhere
    git(host, "branch", "b", "main~1")
    assert _import_branch_sync(host, ws, **kw).branch_final == "b_2"
    assert set(heads(host)) == {"main", "side", "b", "b_2"}


def test_suffix_without_matching_provenance_creates_next(host, tmp_path):
    ws = make_ws(host, tmp_path / "ws", changes=True)
    git(host, "branch", "b", "main~1")
    land(host, ws, "b_2")  # same HEAD, but no note: not ours
    kw = dict(branch_name="b", task_key="k", run_id="r", import_conflict_policy="suffix")
    assert _import_branch_sync(host, ws, **kw).branch_final == "b_3"
    # a note from another task does not count either; a key that is a prefix neither
    ws2 = make_ws(host, tmp_path / "ws2", changes=True, n=2)
    git(host, "branch", "c", "main~1")
    land(host, ws2, "c_2")
    git(host, "notes", "--ref=orchestrator", "add", "-m", "task_key=kk; run_id=r", ws_head(ws2))
    art = _import_branch_sync(host, ws2, branch_name="c", task_key="k", run_id="r", import_conflict_policy="suffix")
    assert art.branch_final == "c_3"
    assert "task_key=kk; run_id=r" in note(host, ws_head(ws2))  # appended, not clobbered
    assert "task_key=k; run_id=r" in note(host, ws_head(ws2))


def test_always_on_shared_base_commit_appends_notes(host, tmp_path):
    base = git(host, "rev-parse", "main")
    for i in (1, 2):
        ws = make_ws(host, tmp_path / f"ws{i}", changes=False)
        art = _import_branch_sync(host, ws, branch_name=f"b{i}", task_key=f"key{i}", run_id="r", import_policy="always")
        assert art.branch_final == f"b{i}" and art.commit == base and art.has_changes is False
    text = note(host, base)
    assert "task_key=key1; run_id=r" in text and "task_key=key2; run_id=r" in text


# ---------------------------------------------------------------------------
# the user's repository is never disturbed


def _snapshot(repo: Path) -> tuple:
    index = hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest()
    files = {p.name: p.read_bytes() for p in repo.iterdir() if p.is_file()}
    return (
        git(repo, "symbolic-ref", "HEAD"),
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain"),
        index,
        files,
    )


def test_host_tree_index_head_untouched(host, tmp_path):
    (host / "a.txt").write_text("dirty edit\n")
    (host / "staged.txt").write_text("staged\n")
    git(host, "add", "staged.txt")
    (host / "untracked.txt").write_text("u\n")
    before = _snapshot(host)
    for i, conflict in enumerate(["fail", "overwrite", "suffix", "suffix"]):
        ws = make_ws(host, tmp_path / f"ws{i}", changes=True, n=i)
        _import_branch_sync(
            host,
            ws,
            branch_name="feature",
            task_key=f"k{i}",
            run_id="r",
            import_conflict_policy=conflict if i else "fail",
        )
    assert _snapshot(host) == before
    assert validate_repository(host, "main").dirty is True


def test_refuses_to_overwrite_checked_out_branch(host, tmp_path):
    ws = make_ws(host, tmp_path / "ws", changes=True)
    main_before = git(host, "rev-parse", "main")
    with pytest.raises(GitError, match="checked out"):
        _import_branch_sync(host, ws, branch_name="main", task_key="k", run_id="r", import_conflict_policy="overwrite")
    assert git(host, "rev-parse", "main") == main_before
    assert git(host, "status", "--porcelain") == ""


def test_refuses_to_overwrite_the_head_branch_of_a_bare_repository(host, tmp_path):
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(host), str(bare))
    ws = make_ws(bare, tmp_path / "ws", changes=True)
    main_before = git(bare, "rev-parse", "main")
    with pytest.raises(GitError, match="checked out"):
        _import_branch_sync(bare, ws, branch_name="main", task_key="k", run_id="r", import_conflict_policy="overwrite")
    assert git(bare, "rev-parse", "main") == main_before
    art = _import_branch_sync(bare, ws, branch_name="feature", task_key="k", run_id="r")
    assert art.branch_final == "feature" and git(bare, "rev-parse", "feature") == ws_head(ws)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.text(alphabet="abzAZ09_-", min_size=1, max_size=8), min_size=1, max_size=3)
    .map("/".join)
    .filter(lambda n: not n.startswith("-"))
)
def test_plain_branch_names_skip_git_only_when_git_accepts_them(name):
    # check_branch_name accepts these without running git (the fast path); git agrees.
    assert subprocess.run(["git", "check-ref-format", f"refs/heads/{name}"]).returncode == 0
    from orchestrator.runner import git_cmd

    assert git_cmd._PLAIN_NAME.fullmatch(name) and git_cmd.check_branch_name(name) == name


@pytest.mark.parametrize("bad", ["--upload-pack=touch pwned", "../escape", "a/../b", "-b", "x@{-1}", "a..b", "HEAD"])
def test_hostile_branch_names_rejected(host, tmp_path, bad):
    ws = make_ws(host, tmp_path / "ws", changes=True)
    before = heads(host)
    with pytest.raises(GitError):
        _import_branch_sync(host, ws, branch_name=bad, task_key="k", run_id="r", import_conflict_policy="overwrite")
    assert heads(host) == before
    assert not list(tmp_path.rglob("pwned")) and not list(host.rglob("pwned"))


def test_git_failure_is_giterror_and_keeps_workspace(host, tmp_path):
    ws = make_ws(host, tmp_path / "ws", changes=True)
    git(host, "branch", "feat", "main")
    # refs/heads/feat exists, so refs/heads/feat/x cannot be created (D/F conflict)
    with pytest.raises(GitError) as exc:
        _import_branch_sync(host, ws, branch_name="feat/x", task_key="k", run_id="r")
    assert "feat/x" in str(exc.value) and "exit" in str(exc.value)
    assert ws.exists() and (ws / ".git").is_dir()
    (ws / ".git" / "BASE_COMMIT").unlink()
    with pytest.raises(GitError, match="BASE_COMMIT"):
        _import_branch_sync(host, ws, branch_name="other", task_key="k", run_id="r")


def test_workspace_gitfile_is_refused(host, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").write_text(f"gitdir: {host / '.git'}\n")
    with pytest.raises(GitError, match=r"no \.git directory"):
        _import_branch_sync(host, ws, branch_name="x", task_key="k", run_id="r")


def test_audit_log_line(host, tmp_path, caplog):
    ws = make_ws(host, tmp_path / "ws", changes=True)
    with caplog.at_level(logging.INFO, logger="orchestrator.runner"):
        _import_branch_sync(host, ws, branch_name="audit", task_key="k", run_id="r")
    rec = [r for r in caplog.records if getattr(r, "outcome", None)][-1]
    assert rec.workspace == str(ws) and rec.branch == "audit" and rec.outcome == "imported"
    assert rec.commit_count == 2 and rec.size > 0 and rec.duration_s >= 0
    assert (host / ".git" / ".orc_import.lock").exists()


# ---------------------------------------------------------------------------
# concurrency


async def test_async_import_does_not_block_loop_and_serializes(host, tmp_path):
    wss = [make_ws(host, tmp_path / f"ws{i}", changes=True, n=i) for i in range(8)]
    ticks = 0
    results = {}

    async def ticker():
        nonlocal ticks
        while len(results) < len(wss):
            ticks += 1
            await anyio.sleep(0.001)

    alias = tmp_path / "alias"  # the same repository under another name: same lock
    alias.symlink_to(host)

    async def one(i, ws):
        results[i] = await import_branch(
            alias if i % 2 else host,
            ws,
            branch_name="same",
            task_key=f"k{i}",
            run_id="r",
            import_conflict_policy="suffix",
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        for i, ws in enumerate(wss):
            tg.start_soon(one, i, ws)
    assert ticks > 3
    finals = {a.branch_final for a in results.values()}
    assert finals == {"same"} | {f"same_{i}" for i in range(2, 9)}
    h = heads(host)
    assert {h[a.branch_final] for a in results.values()} == {ws_head(ws) for ws in wss}


def _mp_import(args):
    host, ws, name, key, conflict = args
    art = _import_branch_sync(
        Path(host), Path(ws), branch_name=name, task_key=key, run_id="race", import_conflict_policy=conflict
    )
    return key, art.branch_final, art.commit


@pytest.mark.slow
def test_parallel_process_imports(host, tmp_path):
    jobs = []
    expected_distinct = {}
    for i in range(50):
        ws = make_ws(host, tmp_path / f"ws{i}", changes=True, n=i)
        expected_distinct[f"task{i}"] = (f"strat_race_k{i:03d}", ws_head(ws))
        jobs.append((str(host), str(ws), f"strat_race_k{i:03d}", f"task{i}", "fail"))
    same_heads = {}
    for j in range(6):
        ws = make_ws(host, tmp_path / f"same{j}", changes=True, n=100 + j)
        same_heads[f"same{j}"] = ws_head(ws)
        jobs.append((str(host), str(ws), "contested", f"same{j}", "suffix"))

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(16) as pool:
        results = pool.map(_mp_import, jobs, chunksize=1)

    git(host, "fsck", "--strict", "--no-dangling")
    h = heads(host)
    by_key = {key: (final, commit) for key, final, commit in results}
    for key, (name, head) in expected_distinct.items():
        assert by_key[key] == (name, head)
        assert h[name] == head
    contested = {by_key[k][0] for k in same_heads}
    assert contested == {"contested"} | {f"contested_{i}" for i in range(2, 7)}
    for key, head in same_heads.items():
        assert h[by_key[key][0]] == head
        assert f"task_key={key};" in note(host, head)
    assert len(h) == 2 + 50 + 6


def test_agent_written_workspace_config_does_not_run_on_host(host, tmp_path):
    ws = make_ws(host, tmp_path / "ws", changes=True)
    marker = tmp_path / "pwned"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    script.chmod(0o755)
    for key in ("core.fsmonitor", "diff.external", "core.pager", "uploadpack.packObjectsHook"):
        git(ws, "config", key, str(script))
    hooks = ws / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for hook in ("post-checkout", "reference-transaction", "pre-auto-gc"):
        (hooks / hook).write_text(script.read_text())
        (hooks / hook).chmod(0o755)
    art = _import_branch_sync(host, ws, branch_name="evil", task_key="k", run_id="r")
    assert art.branch_final == "evil" and art.commit_count == 2
    assert not marker.exists()


def test_a_kept_workspace_is_continued_only_when_whole(tmp_path):
    """A crash mid-clone or mid-deletion must not leave a workspace a resumed task would continue in."""
    from conftest import make_repo

    from orchestrator.runner.git_ops import _prepare_workspace_sync, remove_workspace

    repo = make_repo(tmp_path / "repo")
    ws = tmp_path / "ws" / "k_1"
    info = _prepare_workspace_sync(repo, "main", ws)
    kept = kept_workspace(ws)
    assert not isinstance(kept, str) and kept.base_commit == info.base_commit
    (ws / ".git" / "BASE_COMMIT").rename(ws / ".git" / "BASE_COMMIT.x")  # clone cut off before its end
    assert "not completely prepared" in kept_workspace(ws)
    (ws / ".git" / "BASE_COMMIT.x").rename(ws / ".git" / "BASE_COMMIT")
    for name in ("HEAD", "objects"):  # a deletion cut off half-way
        target = ws / ".git" / name
        subprocess.run(["rm", "-rf", str(target)], check=True)
    assert "no longer a git repository" in kept_workspace(ws)
    remove_workspace(ws)
    assert "no longer exists" in kept_workspace(ws)
    assert list((tmp_path / "ws").iterdir()) == []  # nothing left beside it either


KILL_MID_STEP = """
import os, signal, sys
from pathlib import Path
from orchestrator.runner import git_ops

step = sys.argv[3]
real = getattr(git_ops, step)

def killed_half_way(root, *args):
    if step == "_chown_tree":  # the workspace's own top directory is given away, the objects are not yet
        os.lchown(root, *args)
    else:
        real(root, *args)
    os.kill(os.getpid(), signal.SIGKILL)

setattr(git_ops, step, killed_half_way)
git_ops._prepare_workspace_sync(sys.argv[1], "main", Path(sys.argv[2]), isolation_mode=sys.argv[4])
"""


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="the chown to the agent's user runs as root"
)
@pytest.mark.parametrize(
    ("step", "mode"),
    [("_chown_tree", "full_copy"), ("_chown_tree", "shared_objects"), ("_settle_index", "shared_objects")],
)
def test_a_clone_killed_before_it_belongs_to_the_agent_is_not_continued(tmp_path, step, mode):
    """SIGKILL while the new clone is handed to the container user (uid 1000): a resume must clone
    it again, not continue in it. (Seen in the crash suite: the resumed agent's `git commit` failed
    with "insufficient permission for adding an object to repository database .git/objects".)"""
    from conftest import make_repo

    repo = make_repo(tmp_path / "repo")
    ws = tmp_path / "ws" / "k_1"
    proc = subprocess.run(
        [sys.executable, "-c", KILL_MID_STEP, str(repo), str(ws), step, mode], capture_output=True, text=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (ws / ".git" / "objects").is_dir()  # the clone itself had finished
    assert "not completely prepared" in kept_workspace(ws)


@pytest.mark.parametrize(
    ("name", "made_by_a_run"),
    [
        (branch_name("best-of-n", "run_20250101_000000", "run_20250101_000000/s1/gen/0"), True),
        (branch_name("simple", "run_20250101_000000_2", "run_20250101_000000_2/s1/t"), True),  # same second
        (branch_name("simple", "run_20250101_000000", "run_20250101_000000/s1/t") + "_3", True),  # suffix policy
        (branch_name("../my strategy", "run_20250101_000000", "k"), True),
        ("main", False),
        ("feature/run_20250101_000000", False),
        ("release_run_20250101_000000_notes", False),
        ("best-of-n_run_20250101_000000_k1", False),
    ],
)
def test_a_runs_branches_are_told_from_the_users(name, made_by_a_run):
    assert is_run_branch(name) is made_by_a_run
