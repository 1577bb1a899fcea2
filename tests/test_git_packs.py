"""Imports keep the user's repository packed (issue 32: loose objects piled up, runs slowed down).

Every import used to leave its objects and its provenance note loose in the
user's repository: after 300 tasks there were about a thousand loose files, and
the same 50 tasks took 2.4x as long. Now the importer rolls them up into a few
packs once they pass a small limit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE, git, make_repo
from reliability_helpers import remove_run_docker

from orchestrator.runner.git_import import _import_branch_sync
from orchestrator.runner.git_ops import _prepare_workspace_sync
from orchestrator.runner.git_packs import LOOSE_LIMIT, object_counts


def _commit(ws: Path, name: str, text: str) -> None:
    (ws / name).write_text(text)
    # the workspace belongs to the container user when the tests run as root
    ident = ["-c", "safe.directory=*", "-c", "user.name=a", "-c", "user.email=a@x"]
    git(ws, *ident, "add", name)
    git(ws, *ident, "commit", "-qm", f"add {name}")


def _host(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    for i in range(1000):
        (path / f"src{i}.txt").write_text(f"source file {i}\n" * 20)
    git(path, "add", "-A")
    git(path, "-c", "user.name=a", "-c", "user.email=a@x", "commit", "-qm", "history")
    git(path, "gc", "-q")  # one pack, as a real repository's history is
    return path


def _pack_names(repo: Path) -> set[str]:
    return {p.name for p in (repo / ".git" / "objects" / "pack").glob("*.pack")}


def test_many_imports_leave_a_few_packs_not_loose_objects(tmp_path):
    host = _host(tmp_path / "host")
    (users_pack,) = _pack_names(host)
    branches = {}
    for i in range(24):
        ws = tmp_path / f"ws{i}"
        _prepare_workspace_sync(host, "main", ws, isolation_mode="full_copy")
        _commit(ws, f"agent{i}.txt", f"work {i}\n")
        _commit(ws, f"more{i}.txt", f"more {i}\n")
        art = _import_branch_sync(host, ws, branch_name=f"task{i}", task_key=f"k{i}", run_id="r")
        branches[art.branch_final] = (i, art.commit)
    loose, packs = object_counts(host)
    # before: about seven loose objects per import (two commits, their trees and
    # blobs, the note's blob, tree and commit), 168 after 24 imports
    assert loose < LOOSE_LIMIT, loose
    assert packs <= 6, packs
    # a roll-up only takes packs smaller than half the next: the history's own pack stays
    assert users_pack in _pack_names(host), "the repository's own pack is left as it was"
    git(host, "fsck", "--strict", "--no-dangling")
    for name, (i, commit) in branches.items():
        assert git(host, "rev-parse", name) == commit
        assert git(host, "show", f"{name}:agent{i}.txt") == f"work {i}"
        assert "task_key=" in git(host, "notes", "--ref=orchestrator", "show", commit)


@pytest.mark.docker
def test_a_run_of_many_tasks_leaves_the_repository_packed(tmp_path):
    """The reduced bench/bench_many_tasks.py: one run of 16 tasks through real
    containers, then the user's repository holds a few packs, not ~100 loose objects."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(
        tmp_path,
        ORCHESTRATOR_ORCHESTRATION__HARD_MIN_FREE_DISK_GB="0",
        ORCHESTRATOR_ORCHESTRATION__MIN_FREE_DISK_GB="0",
    )
    # each task's own content, as real tasks have (identical files would share their objects)
    prompt = "SIM: exec od -An -N16 -tx1 /dev/urandom > work.txt\nSIM: commit work"
    args = [prompt, "--no-tui", "--dry-run", "--runs", "16", "--max-parallel", "8", "--docker-image", TEST_IMAGE]
    result = run_cli(args, cwd=repo, env=env, timeout=600)
    run_id = only_run_id(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        branches = git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split()
        assert len(branches) == 17, branches  # main and one per task
        loose, packs = object_counts(repo)
        assert loose < LOOSE_LIMIT and packs <= 4, (loose, packs)
        git(repo, "fsck", "--strict", "--no-dangling")
        works = {git(repo, "show", f"{b}:work.txt") for b in branches if b != "main"}
        assert len(works) == 16 and all(works), works
    finally:
        remove_run_docker(run_id)
