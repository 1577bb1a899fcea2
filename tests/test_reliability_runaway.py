"""Runaway agents end as failed tasks with a reason; the rest of the run carries on (real command, Docker, sim agent).

A fork bomb, a process filling /tmp and a process writing into the
workspace without end: the container's limits keep the machine safe, and the
runner's watchdog stops the task with ``error_type: resource`` instead of
letting it fail at everything until its timeout.
"""

from __future__ import annotations

import json
import textwrap
import time

import pytest
from conftest import make_repo
from reliability_helpers import IMG, cli_env, events_path, record, remove_run_docker, run_cli, run_ids

pytestmark = pytest.mark.docker

NORMAL = "SIM: write ok.txt fine\\nSIM: commit ok\\nSIM: print ok"


def _strategy(tmp_path, hostile: str) -> str:
    path = tmp_path / "pair.py"
    path.write_text(
        textwrap.dedent(f'''
        async def pair(prompt, base_branch, ctx):
            bad = ctx.run({{"prompt": {hostile!r}}}, key=ctx.key("runaway"))
            good = ctx.run({{"prompt": "{NORMAL}"}}, key=ctx.key("normal"))
            out = {{}}
            for name, handle in (("good", good), ("bad", bad)):
                try:
                    out[name] = (await ctx.wait(handle))["artifact"]["branch_final"]
                except ctx.errors.TaskFailed as exc:
                    out[name] = exc.error_type
            return out
    ''')
    )
    return str(path)


def _run(tmp_path, hostile: str, **env_extra):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **env_extra)
    t0 = time.monotonic()
    result = run_cli(
        ["go", "--strategy", _strategy(tmp_path, hostile), "--max-parallel", "2", "--no-tui", *IMG],
        cwd=repo,
        env=env,
        timeout=300,
    )
    elapsed = time.monotonic() - t0
    (run_id,) = run_ids(tmp_path)
    events = [json.loads(line) for line in events_path(tmp_path, run_id).read_text().splitlines() if line.strip()]
    failed = {e["key"].rsplit("/", 1)[1]: e["payload"] for e in events if e["type"] == "task.failed"}
    done = {e["key"].rsplit("/", 1)[1] for e in events if e["type"] == "task.completed"}
    return result, run_id, failed, done, elapsed


@pytest.mark.parametrize(
    "name,hostile,expect,env",
    [
        ("fork bomb", "SIM: exec sh -c 'b() { b | b & }; b; sleep 600'", "process limit", {}),
        ("/tmp filler", "SIM: exec sh -c 'cat /dev/zero > /tmp/fill; sleep 600'", "filled /tmp", {}),
        (
            "workspace writer",
            "SIM: exec sh -c 'while true; do head -c 1048576 /dev/zero >> big.bin; done'",
            "runner.max_workspace_mb (20 MB)",
            {"ORCHESTRATOR_RUNNER__MAX_WORKSPACE_MB": "20"},
        ),
    ],
)
def test_a_runaway_agent_fails_with_a_reason_and_the_other_task_completes(tmp_path, name, hostile, expect, env):
    result, run_id, failed, done, elapsed = _run(tmp_path, hostile, **env)
    try:
        assert result.returncode == 0, result.stderr  # the strategy caught the failure
        assert "normal" in done, (failed, result.stderr[-2000:])
        assert failed["runaway"]["error_type"] == "resource"
        assert expect in failed["runaway"]["message"]
        assert elapsed < 120  # stopped by the watchdog, not by the one-hour task timeout
        if name == "workspace writer":
            leftovers = list((tmp_path / "ws").rglob("big.bin"))
            assert leftovers and leftovers[0].stat().st_size < 2 * 1024**3
        record("hostile", tried=1, contained=1, what=f"{name}: task failed (resource), the other task completed")
    finally:
        remove_run_docker(run_id)
