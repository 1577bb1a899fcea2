"""Docker API round trips of a task on a remote engine (issue 18).

Over a distant link every request costs a round trip, and each exec costs three
(create, start, inspect). The task's result comes out of the container in one
exec: its HEAD and, when the agent committed, the bundle of its commits. The
``orchestrator`` command reaches the private engine through tests/engine_proxy.py,
which lists every request it forwards.
"""

from __future__ import annotations

import re

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import git, make_repo
from engine_proxy import EngineProxy
from reliability_helpers import NO_DISK_MIN, check_log, events_path, remove_run

from orchestrator.runner.object_cache import volume_name

EXEC_CREATE = re.compile(r"^POST /[^ ]*/containers/[^/ ]+/exec HTTP")


@pytest.mark.docker
@pytest.mark.parametrize(
    ("prompt", "committed"),
    [
        pytest.param("SIM: write r.txt result\nSIM: commit r", True, id="agent-committed"),
        pytest.param("SIM: print nothing to change", False, id="no-commit"),
    ],
)
def test_a_remote_task_brings_its_result_out_in_one_exec(tmp_path, private_engine, proxy_dir, prompt, committed):
    repo = make_repo(tmp_path / "repo")
    base = git(repo, "rev-parse", "HEAD")
    proxy = EngineProxy(private_engine.socket, proxy_dir / "engine.sock")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    run_id = None
    try:
        result = run_cli(
            [prompt, "--no-tui", "--docker-image", private_engine.image, "--docker-host", f"far={proxy.url}:1"],
            cwd=repo,
            env=env,
            timeout=300,
        )
        run_id = only_run_id(tmp_path)
        assert result.returncode == 0, result.stderr
        (done,) = [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.completed"]
        branch = done.payload["artifact"]["branch_final"]
        if committed:
            assert git(repo, "show", f"{branch}:r.txt") == "result"
            assert git(repo, "rev-parse", f"{branch}~1") == base
        else:
            assert branch is None or git(repo, "rev-parse", branch) == base
        # In the task's container: the check that the image's home is writable (once
        # per image and engine), the checkout from the engine's object cache, the
        # agent, and one exec for the result; the agent's wrapper counted its
        # uncommitted files, so none for that. The object cache's helper: one exec
        # to read what the cache holds and one to add what it lacked (once per run).
        execs = [r for r in proxy.requests if EXEC_CREATE.match(r)]
        helper = [r for r in execs if "/containers/orc_objcache_helper_" in r]
        assert len(execs) - len(helper) == 4 and len(helper) == 2, proxy.requests
    finally:
        proxy.close()
        if run_id:
            remove_run(private_engine.url, run_id)
        private_engine.docker("volume", "rm", "-f", volume_name(repo))
