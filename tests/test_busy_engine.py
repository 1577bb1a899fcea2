"""A Docker engine that answers slowly is busy, not missing.

On a loaded machine (several runs at once, or a test suite beside a run) the
engine's first answers can take seconds. The pre-flight check used to give up
after 3 s and tell the user to start Docker, which was running all along.
"""

from __future__ import annotations

import subprocess
import uuid

import anyio
import pytest
from cli_helpers import cli_env, run_cli
from conftest import TEST_IMAGE, make_repo
from engine_proxy import EngineProxy

from orchestrator.runner.docker_containers import remove_containers

pytestmark = pytest.mark.docker


def test_a_slow_engine_is_waited_for_not_reported_as_not_running(tmp_path, proxy_dir):
    # Each chunk held 0.7 s each way: the client's first round trips (API version,
    # ping, version) take about 4-5 s, past the old 3 s limit, well inside the new one.
    proxy = EngineProxy("/var/run/docker.sock", proxy_dir / "engine.sock", delay_ms=700)
    try:
        repo = make_repo(tmp_path / "repo")
        env = cli_env(tmp_path, DOCKER_HOST=proxy.url)
        result = run_cli(["--clean-containers", "--dry-run"], cwd=repo, env=env, timeout=120)
    finally:
        proxy.close()
    assert "did not answer" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    assert len(proxy.requests) >= 3  # it went through the slow link, not around it


def test_two_cleanups_removing_the_same_container_at_once_both_succeed():
    # Two runs starting at once on one machine both remove the same old leftovers;
    # the engine answers the second removal with 409 "already in progress", which
    # failed the whole orphan scan (and skipped the expiry of old workspaces after it).
    name = f"orc-busy-rm-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "run", "-d", "--name", name, "--label", "orchestrator=true", TEST_IMAGE, "sleep", "infinity"],
        check=True,
        capture_output=True,
    )
    try:
        anyio.run(remove_containers, [name] * 6)
        gone = subprocess.run(["docker", "inspect", name], capture_output=True)
        assert gone.returncode != 0
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
