"""A stopped task's still-running agent gets its grace to save its session (issue 15, item 8).

Real command, real Docker. The "agent" is a command task that, on SIGTERM,
takes two seconds to save its work: more than the old one-second stop, and
tini as PID 1 ended the container at once anyway.
"""

from __future__ import annotations

import signal
import time

import pytest
from conftest import make_repo
from reliability_helpers import (
    IMG,
    cli_env,
    finish,
    remove_run_docker,
    run_ids,
    running_containers,
    start_cli,
    wait_for,
)

pytestmark = [pytest.mark.docker]

STRATEGY = """
async def slow_saver(prompt, base_branch, ctx):
    command = ("trap 'sleep 2; echo saved > saved.txt; exit 0' TERM; echo started > started.txt; "
               "while :; do sleep 0.1; done")
    return await ctx.wait(ctx.run({"plugin": "command", "command": command, "base_branch": base_branch},
                                  key=ctx.key("task")))
"""


def test_ctrl_c_gives_a_live_agent_its_grace_to_save_its_work(tmp_path):
    repo = make_repo(tmp_path / "repo")
    strategy = tmp_path / "saver.py"
    strategy.write_text(STRATEGY)
    env = cli_env(tmp_path)
    out = tmp_path / "out" / "run"
    proc = start_cli(["go", "--strategy", f"{strategy}:slow_saver", "--no-tui", *IMG], cwd=repo, env=env, out=out)
    run_id = wait_for(lambda: run_ids(tmp_path) and run_ids(tmp_path)[0])
    try:
        started = wait_for(lambda: next((tmp_path / "ws" / run_id).glob("k_*/started.txt"), None), timeout=120)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc, _, err = finish(proc, out, timeout=60)
        assert rc == 130, err
        assert (started.parent / "saved.txt").read_text() == "saved\n", "the agent was killed before it could save"
        assert time.monotonic() - t0 < 20
        assert running_containers(run_id) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        remove_run_docker(run_id)
