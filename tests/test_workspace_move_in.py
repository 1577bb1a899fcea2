"""Moving a finished checkout into a new task's place, and giving way to a fresh clone when it cannot be moved."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.runner.docker_workspace import _move_in


def _spare(tmp_path: Path) -> tuple[Path, Path]:
    checkout = tmp_path / "spares" / "w1"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "a.txt").write_text("kept\n")
    record = tmp_path / "spares" / "w1.json"
    record.write_text("{}")
    return checkout, record


def test_a_finished_checkout_takes_the_empty_workspace_s_place(tmp_path):
    spare = _spare(tmp_path)
    workspace = tmp_path / "ws" / "task"
    workspace.mkdir(parents=True)
    assert _move_in(spare, workspace) == spare
    assert (workspace / "a.txt").read_text() == "kept\n" and not spare[0].exists()


def test_a_workspace_that_is_no_longer_empty_keeps_its_place_and_the_checkout_is_dropped(tmp_path):
    spare = _spare(tmp_path)
    workspace = tmp_path / "ws" / "task"
    workspace.mkdir(parents=True)
    (workspace / "stray").write_text("x")  # the directory cannot be removed: the move fails
    assert _move_in(spare, workspace) is None
    # the task clones into an empty directory, and nothing of the checkout is left behind
    assert workspace.is_dir() and os.listdir(workspace) == []
    assert not spare[0].exists() and not spare[1].exists()


def test_a_checkout_that_vanished_leaves_an_empty_workspace_for_the_clone(tmp_path):
    spare = _spare(tmp_path)
    workspace = tmp_path / "ws" / "task"
    workspace.mkdir(parents=True)
    missing = (tmp_path / "spares" / "gone", spare[1])
    assert _move_in(missing, workspace) is None
    assert workspace.is_dir() and os.listdir(workspace) == [] and not spare[1].exists()
