"""An engine that loses an exec's output must not fail the task that exec ran.

Under load, dockerd closes an exec's streams a fixed time after the process
exits, whether or not it has copied what the process wrote: the client then
sees a clean end of stream with nothing in it, and an exit code of 0. Seen in
the test suite on six workers, where a one-line dry run failed with
"claude-code exited with status 0 without a result". The agent runs under a
wrapper whose last line always reaches stderr; its absence names the loss.

The proxy (tests/engine_proxy.py) does to one exec what the busy engine does:
the agent runs to its end in its container, and its stream is ended empty.
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE, git, make_repo
from engine_proxy import EngineProxy
from reliability_helpers import check_log, events_path, remove_run_docker

pytestmark = pytest.mark.docker

# The agent's exec create: its command runs under the agent wrapper, whose first
# line names it (JSON-escaped in the request body).
AGENT_EXEC = rb"# orchestrator-agent-wrapper\\n"


def test_an_agent_exec_whose_output_the_engine_lost_is_run_again_and_its_work_comes_back(tmp_path, proxy_dir):
    repo = make_repo(tmp_path / "repo")
    proxy = EngineProxy("/var/run/docker.sock", proxy_dir / "engine.sock", exec_of=AGENT_EXEC, swallow=True)
    env = cli_env(
        tmp_path,
        DOCKER_HOST=proxy.url,
        ORCHESTRATOR_RUNNER__BACKOFF_BASE_S="0.2",
        ORCHESTRATOR_RUNNER__BACKOFF_FACTOR="1",
    )
    run_id = None
    try:
        result = run_cli(
            ["SIM: write t.txt kept\nSIM: commit t", "--dry-run", "--no-tui", "--docker-image", TEST_IMAGE],
            cwd=repo,
            env=env,
            timeout=300,
        )
        run_id = only_run_id(tmp_path)
        log = [json.loads(line) for line in (tmp_path / "logs" / run_id / "runner.jsonl").read_text().splitlines()]
        messages = [r.get("message") for r in log]
        assert proxy.cuts == 1, messages
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        (done,) = [e for e in check_log(events_path(tmp_path, run_id)) if e.type == "task.completed"]
        branch = done.payload["artifact"]["branch_final"]
        assert git(repo, "show", f"{branch}:t.txt") == "kept"
        (scheduled,) = [r for r in log if r.get("message") == "runner.retry.scheduled"]
        assert "returned none of the agent's output" in scheduled["reason"], scheduled
        assert messages.count("runner.exec.started") == 2, messages
    finally:
        proxy.close()
        if run_id:
            remove_run_docker(run_id)
