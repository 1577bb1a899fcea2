"""Engine + DockerRunner + sim agent: the layers meet for real (no CLI)."""

from __future__ import annotations

import pytest
from conftest import git
from docker_harness import run_with_docker

from orchestrator.log.eventlog import read_events
from strategies.simple import simple

pytestmark = pytest.mark.docker


async def test_simple_strategy_imports_a_branch_through_docker(tmp_path, git_repo, workspace_root):
    engine = await run_with_docker(
        tmp_path, git_repo, simple, prompt="SIM: write hello.txt hi there\nSIM: commit add hello\nSIM: print all done"
    )
    state = engine.state
    assert state.strategies["s1"].status == "success", state.strategies["s1"].error
    result = state.strategies["s1"].result
    branch = result["artifact"]["branch_final"]
    assert branch.startswith(f"test_{engine.config.run_id}_k") and result["final_message"] == "all done"
    assert git(git_repo, "show", f"{branch}:hello.txt") == "hi there"
    types = [e.type for e in read_events(engine.paths.events)]
    assert types == [
        "strategy.started",
        "task.scheduled",
        "task.started",
        "task.session",
        "task.completed",
        "strategy.completed",
    ]
