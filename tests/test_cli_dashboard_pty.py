"""The real ``orchestrator`` command in a terminal (tmux): the dashboard during a run, a clean shell after."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest
from cli_helpers import ORCH, cli_env
from conftest import TEST_IMAGE, make_repo
from tmux_helpers import tmux, wait_for_screen

pytestmark = [pytest.mark.docker, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")]


def _terminal(tmp_path, sessions):
    """A repository, the env exports for the command, and a fresh 140x45 tmux shell."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    exports = " ".join(f"{k}={v!r}" for k, v in env.items() if k.startswith(("ORCHESTRATOR_", "ANTHROPIC_")))
    name = f"orch-{uuid.uuid4().hex[:8]}"
    sessions.append(name)
    tmux("new-session", "-d", "-s", name, "-x", "140", "-y", "45", "bash --norc --noprofile")
    return repo, exports, name


def test_dashboard_during_a_real_run_then_summary_and_clean_terminal(tmp_path, sessions):
    repo, exports, name = _terminal(tmp_path, sessions)
    prompt = "SIM: write a.txt hi\\nSIM: commit a\\nSIM: sleep 4\\nSIM: print finished"
    cmd = (
        f"cd {repo} && export {exports} && {ORCH} \"$(printf '{prompt}')\" --runs 2 --max-parallel 2 "
        f"--docker-image {TEST_IMAGE}; echo EXIT=$?"
    )
    tmux("send-keys", "-t", name, cmd, "Enter")
    # wait for the strategy's own section, not just the first (empty) frame
    live = wait_for_screen(name, lambda s: "simple" in s and "[detailed]" in s and "EXIT=" not in s, timeout=60)
    assert "run_" in live and "EXIT=" not in live
    done = wait_for_screen(name, lambda s: "EXIT=0" in s, timeout=90)
    assert "Run Complete" in done or "Final branches" in done
    # the dashboard's alternate screen is gone and the shell echoes input again
    tmux("send-keys", "-t", name, "echo CLEAN-$((40+2))", "Enter")
    after = wait_for_screen(name, lambda s: "CLEAN-42" in s)
    assert "[detailed]" not in after

    # --show-run --follow on the finished run: the monitor opens and quits with q
    run_id = next(p.name for p in (tmp_path / "state").iterdir())
    follow = f"{name}-f"
    sessions.append(follow)
    tmux("new-session", "-d", "-s", follow, "-x", "140", "-y", "45", "bash --norc --noprofile")
    tmux(
        "send-keys",
        "-t",
        follow,
        f"cd {repo} && export {exports} && {ORCH} --show-run {run_id} --follow; echo EXIT=$?",
        "Enter",
    )
    wait_for_screen(follow, lambda s: run_id in s and "[detailed]" in s, timeout=30)
    tmux("send-keys", "-t", follow, "q")
    wait_for_screen(follow, lambda s: "EXIT=0" in s, timeout=15)
    assert (
        subprocess.run(["git", "branch", "--list", "simple_*"], cwd=repo, capture_output=True, text=True).stdout.count(
            "simple_"
        )
        == 2
    )


def test_ctrl_c_under_the_dashboard_acknowledges_at_once_and_exits_130(tmp_path, sessions):
    import time

    repo, exports, name = _terminal(tmp_path, sessions)
    tmux(
        "send-keys",
        "-t",
        name,
        f"cd {repo} && export {exports} && {ORCH} 'SIM: sleep 60' --runs 2 "
        f"--max-parallel 2 --docker-image {TEST_IMAGE}; echo EXIT=$?",
        "Enter",
    )
    wait_for_screen(name, lambda s: "simple" in s and "[detailed]" in s and "2 running" in s, timeout=60)
    t0 = time.monotonic()
    tmux("send-keys", "-t", name, "C-c")
    wait_for_screen(name, lambda s: "Interrupting" in s, timeout=5)
    assert time.monotonic() - t0 < 5
    done = wait_for_screen(name, lambda s: "EXIT=130" in s, timeout=30)
    assert "Resume with: orchestrator --resume run_" in done and "[detailed]" not in done
