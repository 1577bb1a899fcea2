"""Work an agent leaves uncommitted reaches the branch, or is counted when discarded (issue 15, item 6).

Real command, real git, real Docker, the sim agent: its prompt writes files and
never commits them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import git, make_repo
from reliability_helpers import IMG, check_log, cli_env, events_path, remove_run_docker, run_cli, run_ids

pytestmark = [pytest.mark.docker]

PROMPT = "SIM: write notes.txt hello\nSIM: write sub/more.txt more\nSIM: write debug.log noise\nSIM: print done"

STRATEGY = '''
async def leave(prompt, base_branch, ctx, *, uncommitted: str = "commit", import_policy: str = "auto"):
    task = {"prompt": prompt, "base_branch": base_branch, "import_policy": import_policy}
    if uncommitted != "default":
        task["uncommitted"] = uncommitted
    return await ctx.wait(ctx.run(task, key=ctx.key("task")))
'''


def run(tmp_path: Path, *params: str):
    repo = make_repo(tmp_path / "repo", {"README.md": "# demo\n", ".gitignore": "*.log\n"})
    strategy = tmp_path / "leave.py"
    strategy.write_text(STRATEGY)
    env = cli_env(tmp_path)
    proc = run_cli([PROMPT, "--strategy", f"{strategy}:leave", *params, "--no-tui", *IMG], cwd=repo, env=env)
    (run_id,) = run_ids(tmp_path)
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        events = check_log(events_path(tmp_path, run_id))
        (done,) = [e for e in events if e.type == "task.completed"]
        summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
        (row,) = summary["strategies"][0]["tasks"]
        return repo, done.payload, row, proc.stdout
    finally:
        remove_run_docker(run_id)


@pytest.mark.parametrize("uncommitted", ["default", "commit"])
def test_changes_the_agent_left_uncommitted_are_committed_in_a_commit_of_their_own(uncommitted, tmp_path):
    repo, payload, row, _ = run(tmp_path, "-S", f"uncommitted={uncommitted}")
    artifact = payload["artifact"]
    branch = artifact["branch_final"]
    assert branch, f"the agent's files never reached a branch: {payload}"
    assert (artifact["uncommitted_files"], artifact["auto_committed"]) == (2, True)  # debug.log is ignored
    assert git(repo, "show", f"{branch}:notes.txt") == "hello"
    assert git(repo, "show", f"{branch}:sub/more.txt") == "more"
    assert "debug.log" not in git(repo, "ls-tree", "-r", "--name-only", branch).split()
    subject = git(repo, "log", "-1", "--format=%s%n%b", branch)
    assert "left uncommitted" in subject
    assert git(repo, "rev-list", "--count", f"main..{branch}") == "1"
    assert (row["uncommitted_files"], row["auto_committed"]) == (2, True)


def test_discard_keeps_the_old_behaviour_and_says_how_many_files_were_left_behind(tmp_path):
    _repo, payload, row, stdout = run(tmp_path, "-S", "uncommitted=discard")
    artifact = payload["artifact"]
    assert artifact["branch_final"] is None and artifact["has_changes"] is False
    assert (artifact["uncommitted_files"], artifact["auto_committed"]) == (2, False)
    assert (row["uncommitted_files"], row["auto_committed"]) == (2, False)
    assert "2 file(s) the agent left uncommitted were discarded" in stdout


def test_review_tasks_that_never_import_are_untouched(tmp_path):
    _repo, payload, _row, _ = run(tmp_path, "-S", "import_policy=never")
    artifact = payload["artifact"]
    assert (artifact["uncommitted_files"], artifact["auto_committed"]) == (0, False)
    assert artifact["branch_final"] is None


def test_the_uncommitted_policy_does_not_change_recorded_fingerprints():
    from orchestrator.errors import ConfigError
    from orchestrator.fingerprint import TaskDefaults, fingerprint, normalize_task

    def fp(task):
        return fingerprint(normalize_task(task, TaskDefaults(), default_base_branch="main"))

    # the fingerprint this task had before the field existed: recorded runs still resume
    recorded = "e881d39745aeb6677882a5ffbff465671643c70a59c3b2ad2d25aec135b55e52"
    assert fp({"prompt": "fix the bug"}) == recorded
    assert fp({"prompt": "fix the bug", "uncommitted": "commit"}) == recorded
    assert fp({"prompt": "fix the bug", "uncommitted": "discard"}) != recorded
    with pytest.raises(ConfigError, match="uncommitted='keep' is invalid; use one of commit, discard"):
        fp({"prompt": "fix the bug", "uncommitted": "keep"})
