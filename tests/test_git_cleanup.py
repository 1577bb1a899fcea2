"""Deleting a run's working branches: only this run's, never a checked-out or moved one (real git)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import git, make_repo
from plugin_helpers import instance_request

from orchestrator.engine.fingerprint import TaskDefaults, fingerprint, normalize_task
from orchestrator.errors import ConfigError
from orchestrator.naming import branch_name
from orchestrator.runner import DockerRunner
from orchestrator.runner.git_cleanup import delete_run_branches
from orchestrator.runner.git_import import _ensure_note


def _branch(repo: Path, name: str, text: str, *, key: str | None = None, run_id: str | None = None) -> str:
    git(repo, "checkout", "-q", "-b", name, "main")
    (repo / f"{name}.txt").write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", name)
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    if key is not None:
        _ensure_note(repo, sha, key, run_id)
    return sha


FIX, MERGE, OTHER, BUSY = (
    branch_name("evolve", run, key)
    for run, key in (
        ("r1", "r1/s1/c/1/fix/a"),
        ("r1", "r1/s1/c/1/merge/1"),
        ("r2", "r2/s1/c/1/fix/a"),
        ("r1", "r1/s1/c/2/fix/b"),
    )
)


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = make_repo(tmp_path / "repo")
    _branch(repo, FIX, "a", key="r1/s1/c/1/fix/a", run_id="r1")
    _branch(repo, MERGE, "b", key="r1/s1/c/1/merge/1", run_id="r1")
    _branch(repo, OTHER, "c", key="r2/s1/c/1/fix/a", run_id="r2")  # another run's
    _branch(repo, "feature", "d")  # the user's own, no provenance
    _branch(repo, BUSY, "e", key="r1/s1/c/2/fix/b", run_id="r1")
    git(repo, "worktree", "add", "-q", str(repo.parent / "wt"), BUSY)  # checked out elsewhere
    git(repo, "branch", "mine", FIX)  # the user's branch on one of the run's commits
    return repo


def heads(repo: Path) -> set[str]:
    return set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split())


async def test_only_this_runs_unused_branches_are_deleted(repo):
    outcome = await delete_run_branches(repo, [FIX, MERGE, OTHER, "feature", "mine", BUSY, "gone"], run_id="r1")
    assert outcome == {
        FIX: "deleted",
        MERGE: "deleted",
        OTHER: "not created by this run",
        "feature": "not created by this run",
        "mine": "not created by this run",
        BUSY: "checked out",
        "gone": "missing",
    }
    assert heads(repo) == {"main", OTHER, "feature", "mine", BUSY}
    # asking again is harmless (a resumed run repeats its cleanup)
    assert await delete_run_branches(repo, [FIX], run_id="r1") == {FIX: "missing"}


async def test_a_suffixed_import_is_ours_and_a_run_id_prefix_is_not(repo):
    git(repo, "branch", FIX + "_2", FIX)  # import_conflict_policy=suffix names it like this
    r10 = branch_name("evolve", "r10", "r10/s1/c/1/fix/a")
    _branch(repo, r10, "f", key="r10/s1/c/1/fix/a", run_id="r10")
    assert await delete_run_branches(repo, [FIX + "_2", r10], run_id="r1") == {
        FIX + "_2": "deleted",
        r10: "not created by this run",
    }


async def test_the_docker_runner_deletes_without_a_container(repo, tmp_path):
    runner = DockerRunner(logs_dir=tmp_path / "logs", client_factory=_no_docker)
    req = instance_request(
        prompt="cleanup",
        repo_path=str(repo),
        branch_name="unused",
        run_id="r1",
        strategy_execution_id="s1",
        instance_id="i1",
        task_key="r1/s1/cleanup/branches",
        container_name="c1",
        plugin_name="command",
        import_policy="never",
        delete_branches=(FIX, OTHER),
    )
    try:
        result = await runner.run(req)
    finally:
        await runner.aclose()
    assert result.status == "success", result.error
    assert result.final_message == f"@@branch deleted: {FIX}\n@@branch not created by this run: {OTHER}\n"
    assert FIX not in heads(repo) and OTHER in heads(repo)
    # task.completed carries an artifact object for every successful task: this one made no branch
    art = result.artifact
    assert art is not None
    assert (art.branch_planned, art.branch_final, art.base, art.has_changes) == ("unused", None, "main", False)
    assert art.commit == git(repo, "rev-parse", "main").strip()


def _no_docker():
    raise AssertionError("a branch cleanup must not talk to Docker")


def test_task_field_validation_and_fingerprints():
    defaults = TaskDefaults()
    plain = {"prompt": "p", "plugin": "command", "command": "true"}
    before = fingerprint(normalize_task(plain, defaults, default_base_branch="main"))
    assert "delete_branches" not in normalize_task(plain, defaults, default_base_branch="main")
    assert before == fingerprint(normalize_task(dict(plain), defaults, default_base_branch="main"))
    norm = normalize_task({"delete_branches": ["a", "b"]}, defaults, default_base_branch="main")
    assert norm["delete_branches"] == ["a", "b"] and norm["plugin_name"] == "command"
    assert norm["import_policy"] == "never" and "command" not in norm
    with pytest.raises(ConfigError, match="delete_branches must be a non-empty list"):
        normalize_task({"delete_branches": []}, defaults, default_base_branch="main")
    with pytest.raises(ConfigError, match="runs nothing else"):
        normalize_task({"delete_branches": ["a"], "command": "rm -rf /"}, defaults, default_base_branch="main")
