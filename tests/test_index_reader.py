"""The git index reader that tells a reused checkout's untouched files from the ones an agent wrote."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import git, make_repo

from orchestrator.errors import GitError
from orchestrator.runner.workspace_reuse import read_index

# the workspace belongs to the container's user, not to the test
SAFE = ("-c", "safe.directory=*")


@pytest.mark.parametrize("version", [2, 3, 4])
def test_every_entry_of_each_index_version_is_read_with_its_stat_data(tmp_path: Path, version: int) -> None:
    files = {
        "a.txt": "a\n",
        "deep/er/b.txt": "bb\n",
        "deep/er/bc.txt": "bcbc\n",
        "deep/x" * 30 + ".txt": "long name\n",  # over 100 bytes, shares a long prefix with nothing
        "ü/名前.txt": "unicode\n",
    }
    repo = make_repo(tmp_path / "r", files)
    os.symlink("a.txt", repo / "link")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    git(repo, "add", "-A")
    if version == 3:  # an entry with extended flags, which only version 3 has
        (repo / "new.txt").write_text("n\n")
        git(repo, "add", "-N", "new.txt")
    git(repo, "update-index", "--index-version", str(version))
    entries = read_index((repo / ".git" / "index").read_bytes())
    expected = git(repo, "-c", "core.quotePath=false", "ls-files", "--stage").splitlines()
    assert [e.path for e in entries] == [line.split("\t", 1)[1] for line in expected]
    assert [oct(e.mode)[2:] for e in entries] == [line.split()[0] for line in expected]
    for e in entries:
        st = os.lstat(repo / e.path)
        if e.path == "new.txt":
            continue  # intent-to-add: git records no stat data for it
        assert (e.size, e.ino, e.mtime) == (st.st_size, st.st_ino & 0xFFFFFFFF, divmod(st.st_mtime_ns, 10**9))


def test_a_damaged_index_is_an_error_not_a_guess(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"a.txt": "a\n", "b.txt": "b\n"})
    data = (repo / ".git" / "index").read_bytes()
    with pytest.raises(GitError, match="damaged"):
        read_index(data[:80])
    with pytest.raises(GitError, match="not a git index"):
        read_index(b"PACK" + data[4:])


def test_a_checkout_with_submodules_is_not_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git clean does not reach into a submodule's directory: what an agent left
    there would reach the next task, so such a checkout is cloned afresh instead."""
    from orchestrator.runner import git_ops
    from orchestrator.runner.workspace_reuse import reuse_workspace

    monkeypatch.setenv("ORCHESTRATOR_WORKSPACE_ROOT", str(tmp_path / "ws"))
    sub = make_repo(tmp_path / "sub", {"s.txt": "s\n"})
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "lib")
    git(repo, "commit", "-qm", "with a submodule")
    workspace = git_ops.workspace_path("r1", "k")
    git_ops._prepare_workspace_sync(repo, "main", workspace, isolation_mode="shared_objects")
    (workspace / "lib" / "left.txt").write_text("by the last agent\n")
    store = git_ops.object_store_path(workspace, repo)
    with pytest.raises(GitError, match="submodules"):
        reuse_workspace(workspace, git_ops.pristine_index_path(workspace), "main", object_store=store)


def test_a_reused_checkout_gets_the_include_branches_and_nothing_of_the_last_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the host, without a container: the reuse's own git work (a new .git with the
    base and the include_branches, what the last task wrote undone)."""
    from orchestrator.runner import git_ops
    from orchestrator.runner.workspace_reuse import reuse_workspace

    monkeypatch.setenv("ORCHESTRATOR_WORKSPACE_ROOT", str(tmp_path / "ws"))
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", "d/b.txt": "b\n"})
    git(repo, "branch", "extra")
    workspace = git_ops.workspace_path("r1", "k")
    store = git_ops._ensure_object_store_sync(repo, workspace, ["main", "extra"])
    git_ops._prepare_workspace_sync(repo, "main", workspace, isolation_mode="shared_objects", object_store=store)
    (workspace / "a.txt").write_text("changed by the last task\n")
    (workspace / "d" / "b.txt").unlink()
    (workspace / "left.txt").write_text("left\n")
    git(workspace, *SAFE, "config", "user.email", "x@example.com")
    info = reuse_workspace(
        workspace, git_ops.pristine_index_path(workspace), "main", include_branches=("extra",), object_store=store
    )
    assert info.base_commit == git(repo, "rev-parse", "main")
    assert git(workspace, *SAFE, "for-each-ref", "--format=%(refname)") == "refs/heads/extra\nrefs/heads/main"
    assert git(workspace, *SAFE, "status", "--porcelain", "--ignored") == ""
    assert (workspace / "a.txt").read_text() == "a\n" and (workspace / "d" / "b.txt").read_text() == "b\n"
    assert subprocess.run(["git", *SAFE, "config", "--local", "user.email"], cwd=workspace).returncode == 1
    assert not (workspace / ".git" / "ORIG_HEAD").exists()
