"""A task that ran again after its import (crash before the completion was logged) replaces its own branch."""

from __future__ import annotations

import pytest
from git_ops_helpers import commit_file, heads, make_ws, note, ws_head

from orchestrator.errors import BranchExistsError
from orchestrator.runner.git_ops import _import_branch_sync

pytestmark = pytest.mark.usefixtures("isolated_git_config")
KEY = "run_x/s1/gen/0"


@pytest.mark.parametrize("policy", ["fail", "suffix", "overwrite"])
def test_rerun_of_the_same_task_replaces_its_own_branch(host, tmp_path, policy):
    first = make_ws(host, tmp_path / "ws1", changes=True, n=1)
    art1 = _import_branch_sync(
        host, first, branch_name="b", task_key=KEY, run_id="run_x", import_conflict_policy=policy
    )
    assert art1.branch_final == "b"
    # the process died before task.completed was durable; the task runs again and commits anew
    second = make_ws(host, tmp_path / "ws2", changes=True, n=2)
    assert ws_head(second) != ws_head(first)
    art2 = _import_branch_sync(
        host, second, branch_name="b", task_key=KEY, run_id="run_x", import_conflict_policy=policy
    )
    assert art2.branch_final == "b" and art2.commit == ws_head(second)
    assert [n for n in heads(host) if n.startswith("b")] == ["b"]  # no b_2
    assert f"task_key={KEY}" in note(host, ws_head(second))


def test_another_tasks_branch_is_still_protected(host, tmp_path):
    first = make_ws(host, tmp_path / "ws1", changes=True, n=1)
    _import_branch_sync(host, first, branch_name="b", task_key="run_x/s1/other", run_id="run_x")
    second = make_ws(host, tmp_path / "ws2", changes=True, n=2)
    with pytest.raises(BranchExistsError):
        _import_branch_sync(host, second, branch_name="b", task_key=KEY, run_id="run_x")
    assert heads(host)["b"] == ws_head(first)


def test_a_users_own_branch_with_the_planned_name_is_protected(host, tmp_path):
    commit_file(host, "user.txt", "mine\n", "user work")
    from git_ops_helpers import git

    git(host, "branch", "b")
    user_tip = heads(host)["b"]
    ws = make_ws(host, tmp_path / "ws", changes=True, n=1)
    with pytest.raises(BranchExistsError):
        _import_branch_sync(host, ws, branch_name="b", task_key=KEY, run_id="run_x")
    assert heads(host)["b"] == user_tip
