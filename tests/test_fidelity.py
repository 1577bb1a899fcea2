"""The REAL claude and codex CLIs through the product's plugins and the real command.

The model API is scripted (docker/fidelity/api_server.py) and runs inside the
agent's container; the scripts make the agent use its real tools (write a
file, ``git commit``, edit it, commit again) and the commits must come back
as a branch. Nothing in the plugins changes for these tests: the CLIs are
pointed at the server with ANTHROPIC_BASE_URL / OPENAI_BASE_URL.
"""

from __future__ import annotations

import pytest

from cli_helpers import only_run_id
from conftest import REPO_ROOT, git, make_repo
from fidelity_helpers import (
    ensure_image,
    events,
    final_facts,
    one,
    run_orchestrator,
    scripted,
    server_requests,
)

pytestmark = [pytest.mark.docker, pytest.mark.fidelity]
PLUGINS = ["claude-code", "codex"]


@pytest.fixture(scope="session")
def fidelity_image():
    return ensure_image()


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo")


@pytest.mark.parametrize("plugin", PLUGINS)
def test_success_brings_the_agents_commits_back_as_a_branch(tmp_path, repo, fidelity_image, plugin):
    result = run_orchestrator(tmp_path, repo, plugin, "FIDELITY: success")
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = only_run_id(tmp_path)
    done = one(events(tmp_path, run_id), "task.completed")
    branch = done["artifact"]["branch_final"]
    assert git(repo, "log", "--format=%s", f"main..{branch}").splitlines() == [
        "fidelity: edit notes.txt", "fidelity: add notes.txt"]
    assert git(repo, "show", f"{branch}:notes.txt") == "edited line"
    facts = final_facts(done["final_message"])
    assert facts["tool_results"] == 4
    requests = scripted(server_requests(run_id))
    assert [r["step"] for r in requests] == [0, 1, 2, 3, 4]
    assert all(r["stream"] for r in requests)  # the SSE paths of both APIs are what ran
    # the server reports 100 input and 20 output tokens per response
    assert done["metrics"]["tokens_in"] == 100 * len(requests)
    assert done["metrics"]["tokens_out"] == 20 * len(requests)


STRATEGY = f"{REPO_ROOT}/tests/fixtures/fidelity_strategy.py:fidelity"
# A line of each CLI's own long system prompt (Claude Code keeps a one-line
# identity ahead of a replaced prompt, so that line is no evidence).
CLAUDE_DEFAULT = "# Harness"
CODEX_DEFAULT = "You are a coding agent running in the Codex CLI"


@pytest.mark.parametrize("plugin", PLUGINS)
def test_system_prompt_replaces_and_append_adds(tmp_path, repo, fidelity_image, plugin):
    result = run_orchestrator(tmp_path, repo, plugin, "FIDELITY: prompts", "--strategy", STRATEGY,
                              "-S", "system_prompt=SYS-MARKER: you are a fidelity probe.",
                              "-S", "append_system_prompt=APPEND-MARKER: answer briefly.")
    assert result.returncode == 0, result.stdout + result.stderr
    requests = scripted(server_requests(only_run_id(tmp_path)))
    assert requests
    for r in requests:
        assert "SYS-MARKER" in r["system"] and "APPEND-MARKER" in r["system"]
        assert r["system"].index("SYS-MARKER") < r["system"].index("APPEND-MARKER")
        assert CLAUDE_DEFAULT not in r["system"] and CODEX_DEFAULT not in r["system"]


@pytest.mark.parametrize("plugin", PLUGINS)
def test_without_system_prompt_the_cli_keeps_its_own(tmp_path, repo, fidelity_image, plugin):
    result = run_orchestrator(tmp_path, repo, plugin, "FIDELITY: prompts")
    assert result.returncode == 0, result.stdout + result.stderr
    requests = scripted(server_requests(only_run_id(tmp_path)))
    default = CLAUDE_DEFAULT if plugin == "claude-code" else CODEX_DEFAULT
    assert requests and all(default in r["system"] for r in requests)


def test_max_turns_stops_claude_code_with_a_timeout_error(tmp_path, repo, fidelity_image):
    result = run_orchestrator(tmp_path, repo, "claude-code", "FIDELITY: maxturns", "--strategy", STRATEGY,
                              "-S", "max_turns=2")
    assert result.returncode == 1, result.stdout + result.stderr
    run_id = only_run_id(tmp_path)
    failed = one(events(tmp_path, run_id), "task.failed")
    assert failed["error_type"] == "timeout", failed  # a turn budget: retrying the same budget fails the same way
    assert len(scripted(server_requests(run_id))) == 2


def test_max_turns_on_codex_is_refused_when_scheduled(tmp_path, repo, fidelity_image):
    result = run_orchestrator(tmp_path, repo, "codex", "FIDELITY: maxturns", "--strategy", STRATEGY,
                              "-S", "max_turns=2")
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "plugin codex has no turn limit: remove max_turns from the task" in out, out
    assert "Traceback" not in out
    assert not [e for e in events(tmp_path, only_run_id(tmp_path)) if e["type"] == "task.started"]
