"""A finished task's checkout serves the next task of the run, exactly as a fresh clone would.

Through real containers: the first task's agent does what it can to leave
something behind (a file changed with its size and time kept, a tracked file
turned into a link, deleted and executable files, untracked and ignored files, a
nested repository, a hook, a config entry, a directory it locked); the next
task, started in that checkout, must see what a task on a fresh clone sees.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE as IMAGE
from conftest import git, make_repo, runner_log
from reliability_helpers import check_log, events_path, remove_run

from orchestrator.runner import AuthConfig, DockerRunner, RetryConfig, git_ops, run_instance
from orchestrator.sanitize import Sanitizer

pytestmark = [pytest.mark.docker]

SHARED = {
    "ORCHESTRATOR_ORCHESTRATION__HARD_MIN_FREE_DISK_GB": "0",
    "ORCHESTRATOR_ORCHESTRATION__MIN_FREE_DISK_GB": "0",
    "ORCHESTRATOR_RUNNER__NETWORK_EGRESS": "offline",
}

# Everything a task can see of its workspace, except times (a fresh clone's differ too).
REPORT = r"""
echo "files: $(find . -path ./.git -prune -o -printf '%p %m %s %y\n' | sort | tr '\n' ';')"
echo "status: $(git status --porcelain --ignored | tr '\n' ';')"
echo "f0: $(cat f0.txt)"
echo "hooks: $(ls .git/hooks | grep -v sample | tr '\n' ' ')"
echo "config: $(git config --local --list | grep -v '^core\.' | sort | tr '\n' ' ')"
echo "fsmonitor: $(git config core.fsmonitor || echo none)"
echo "head: $(git rev-parse HEAD)"
echo "refs: $(git for-each-ref --format='%(refname)' | tr '\n' ' ')"
echo "writable d: $(touch d/probe 2>/dev/null && rm d/probe && echo yes || echo no)"
git add -A && echo "copied: $(find .git/objects -type f ! -path '*/info/*' | wc -l)"
"""

# The last agent's mischief: then it commits a file of its own, so its task has a branch.
MISCHIEF = r"""
set -e
m=$(stat -c %Y f0.txt)
printf 'X\n' > f0.txt && touch -d "@$m" f0.txt
rm f1.txt
rm f2.txt && ln -s /etc/passwd f2.txt
chmod +x f3.txt
echo junk > build.log
mkdir -p cache/deep && echo c > cache/deep/c.bin
git init -q cache/nested && echo n > cache/nested/n.txt
printf '#!/bin/sh\nexit 1\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit
git config core.fsmonitor 'touch /tmp/pwned'
git config alias.st status
echo mine > agent.txt
git add agent.txt && git commit --no-verify -qm agent
echo stray > stray.txt
chmod 500 d
echo done
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    files = {f"f{i}.txt": f"{i}\n" for i in range(4)}
    files |= {".gitignore": "*.log\ncache/\n", "d/g.txt": "g\n", "d/e/h.txt": "h\n"}
    path = make_repo(tmp_path / "repo", files)
    git(path, "gc", "-q")
    return path


def _runner(tmp_path: Path, name: str) -> DockerRunner:
    return DockerRunner(auth=AuthConfig(api_key="k-test"), logs_dir=tmp_path / name, sanitizer=Sanitizer())


def _fields(run_id: str, key: str, command: str) -> dict:
    return dict(
        run_id=run_id,
        task_key=key,
        docker_image=IMAGE,
        retry_config=RetryConfig(max_attempts=1),
        plugin_name="command",
        command=command,
    )


def _prepared(runner: DockerRunner, key: str) -> dict:
    return next(
        e for e in runner_log(runner) if e["message"] == "runner.workspace.prepared" and e.get("task_key") == key
    )


async def _fresh_report(tmp_path: Path, repo: Path, run_id: str) -> str:
    """What a task on a fresh clone sees: another runner, which has no finished checkout to give."""
    other = _runner(tmp_path, "fresh-logs")
    try:
        res = await run_instance("", repo, runner=other, **_fields(run_id, "fresh", REPORT))
    finally:
        await other.aclose()
    assert res.status == "success", res.error
    assert _prepared(other, "fresh")["reused"] is False
    return res.final_message


async def test_the_next_task_starts_in_the_finished_checkout_as_in_a_fresh_clone(tmp_path, repo, run_id):
    runner = _runner(tmp_path, "logs")
    try:
        first = await run_instance("", repo, runner=runner, **_fields(run_id, "a", MISCHIEF))
        assert first.status == "success", first.error
        assert first.artifact is not None and first.artifact.branch_final
        assert git(repo, "show", f"{first.artifact.branch_final}:agent.txt") == "mine"
        # the user's main moves on meanwhile: the next task's base is the new one
        (repo / "moved.txt").write_text("moved\n")
        git(repo, "add", "moved.txt")
        git(repo, "commit", "-qm", "moved")
        second = await run_instance("", repo, runner=runner, **_fields(run_id, "b", REPORT))
        assert second.status == "success", second.error
        assert _prepared(runner, "b")["reused"] is True
        workspaces = git_ops.workspace_path(run_id, "a").parent
    finally:
        await runner.aclose()
    fresh = await _fresh_report(tmp_path, repo, run_id)
    assert second.final_message == fresh
    report = dict(line.split(": ", 1) for line in fresh.splitlines() if ": " in line)
    assert report["f0"] == "0" and report["fsmonitor"] == "none" and report["hooks"] == ""
    assert "./moved.txt" in report["files"] and "stray" not in report["files"]
    assert report["head"] == git(repo, "rev-parse", "main")
    assert report["writable d"] == "yes" and report["copied"] == "0"
    # The runner closed: no finished checkout and no pristine index is left behind.
    assert not [p.name for p in workspaces.iterdir() if ".deleting-" in p.name or p.name.startswith(".k_")]
    assert not list((workspaces / ".pristine-index").iterdir())


async def test_a_finished_checkout_that_cannot_be_reused_gives_way_to_a_fresh_clone(tmp_path, repo, run_id):
    """Its recorded index is damaged: the task is warned about and clones afresh."""
    runner = _runner(tmp_path, "logs")
    try:
        first = await run_instance("", repo, runner=runner, **_fields(run_id, "a", MISCHIEF))
        assert first.status == "success", first.error
        kept = git_ops.workspace_path(run_id, "a").parent / ".pristine-index"
        for index in kept.iterdir():
            index.write_bytes(b"DIRC")
        second = await run_instance("", repo, runner=runner, **_fields(run_id, "b", REPORT))
        assert second.status == "success", second.error
        assert _prepared(runner, "b")["reused"] is False
        assert any(e["message"] == "runner.workspace.not_reused" for e in runner_log(runner))
    finally:
        await runner.aclose()
    assert second.final_message == await _fresh_report(tmp_path, repo, run_id)


def test_runs_of_one_command_reuse_finished_checkouts_and_leave_nothing_to_the_next(tmp_path):
    """Through the real command: three tasks one after another, each reading what
    an earlier agent left in an ignored file. Every branch shows nothing was left,
    and the later tasks started in a finished checkout."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# demo\n", ".gitignore": "*.log\n"})
    prompt = (
        "SIM: exec cat cache.log > seen.txt 2>/dev/null; true\nSIM: append cache.log left by an agent\nSIM: commit work"
    )
    env = cli_env(tmp_path, **SHARED)
    args = [prompt, "--no-tui", "--docker-image", IMAGE, "--runs", "3", "--max-parallel", "1"]
    result = run_cli(args, cwd=repo, env=env, timeout=300)
    run_id = only_run_id(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        done = [e for e in events if e.type == "task.completed"]
        assert len(done) == 3
        for e in done:
            branch = e.payload["artifact"]["branch_final"]
            assert git(repo, "show", f"{branch}:seen.txt") == "", branch
        runner_jsonl = events_path(tmp_path, run_id).parent / "runner.jsonl"
        prepared = [
            json.loads(line) for line in runner_jsonl.read_text().splitlines() if '"runner.workspace.prepared"' in line
        ]
        # The first task has nothing to reuse. A finished checkout is set aside only
        # once its task.completed is on disk, after its slot went to the next task:
        # under load the next task may be prepared first and get a fresh clone (seen
        # once in a six-worker run: False, False, True). Reuse must still happen.
        flags = [p["reused"] for p in prepared]
        assert len(flags) == 3 and flags[0] is False and True in flags[1:], flags
        assert not list((tmp_path / "ws" / run_id).glob("*.deleting-*"))
    finally:
        remove_run(None, run_id)


def test_a_kill_right_after_a_finished_checkout_is_moved_in_leaves_nothing_a_resume_continues(tmp_path):
    # A task takes a finished task's checkout: it is moved to the task's path, then made
    # new. Killed in between, the resume found a "kept" workspace with the other task's
    # commits and its agent committed on top of them (seen in the SIGKILL-and-resume test).
    from orchestrator.runner.docker_workspace import _move_in

    spare = make_repo(tmp_path / "k_finished")
    git(spare, "commit", "-q", "--allow-empty", "-m", "the finished task's work")
    git_ops._mark_whole(
        spare, git_ops.WorkspaceInfo(path=spare, base_branch="main", base_commit=git(spare, "rev-parse", "HEAD"))
    )
    assert not isinstance(git_ops.kept_workspace(spare), str)  # what a finished checkout looks like
    pristine = tmp_path / "k_finished.pristine"
    pristine.write_bytes(b"")
    workspace = tmp_path / "k_next"
    workspace.mkdir()
    assert _move_in((spare, pristine), workspace) is not None
    why = git_ops.kept_workspace(workspace)
    assert isinstance(why, str) and "not completely prepared" in why, why
