"""Run the real ``orchestrator`` console script in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ORCH = str(Path(sys.executable).parent / "orchestrator")
TEST_KEY = "sk-ant-test-key-0123456789abcdef0123"


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ORCHESTRATOR_", "ANTHROPIC_", "CLAUDE_", "OPENAI_"))
    }
    env.update(
        ANTHROPIC_API_KEY=TEST_KEY,
        # Tasks run offline unless a test asks for the network (online: test_cli_run.py):
        # neither the simulated agent nor the agent CLIs' scripted API server (on the
        # container's own loopback) needs one, and an offline container costs the machine
        # about a quarter less CPU (docs/performance.md, "A task's network").
        ORCHESTRATOR_RUNNER__NETWORK_EGRESS="offline",
        ORCHESTRATOR_WORKSPACE_ROOT=str(tmp_path / "ws"),
        ORCHESTRATOR_LOGS_DIR=str(tmp_path / "logs"),
        ORCHESTRATOR_STATE_DIR=str(tmp_path / "state"),
        ORCHESTRATOR_RESULTS_DIR=str(tmp_path / "results"),
    )
    env.update(extra)
    return env


def run_cli(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 180, input: str | None = None):
    return subprocess.run([ORCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input)


def only_run_id(tmp_path: Path) -> str:
    runs = [p.name for p in (tmp_path / "state").iterdir() if (p / "run.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


def wait_for(predicate, timeout: float = 60, interval: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {getattr(predicate, '__name__', predicate)}")


def strategy_args(name: str, **settings: object) -> list[str]:
    """``--strategy NAME -S key=value ...``: a built-in strategy and its settings as the command line takes them."""
    return ["--strategy", name, *settings_args(**settings)]


def settings_args(**settings: object) -> list[str]:
    """``-S key=value`` for each setting, in the order given."""
    return [arg for key, value in settings.items() for arg in ("-S", f"{key}={value}")]


def run_events(tmp_path: Path, run_id: str) -> list[dict]:
    """The run's event log (under ``cli_env``'s folders), one dict an event."""
    path = tmp_path / "logs" / run_id / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_summary(tmp_path: Path, run_id: str) -> dict:
    """The run's summary.json."""
    return json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
