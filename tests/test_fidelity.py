"""The REAL claude and codex CLIs through the product's plugins and the real command.

The model API is scripted (docker/fidelity/api_server.py) and runs inside the
agent's container; the scripts make the agent use its real tools (write a
file, ``git commit``, edit it, commit again) and the commits must come back
as a branch. Nothing in the plugins changes for these tests: the CLIs are
pointed at the server with ANTHROPIC_BASE_URL / OPENAI_BASE_URL.
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from cli_helpers import ORCH, only_run_id, run_cli, run_events, wait_for
from conftest import REPO_ROOT, git, make_repo
from fidelity_helpers import (
    MODELS,
    ensure_image,
    fidelity_env,
    final_facts,
    one,
    remove_run_resources,
    run_orchestrator,
    runner_events,
    scripted,
    server_requests,
)

pytestmark = [pytest.mark.docker, pytest.mark.fidelity]
PLUGINS = ["claude-code", "codex"]
# Codex's own instructions start with this line in every version tried. Claude
# Code's wording changes between versions and it keeps a one-line identity
# ahead of a replaced prompt, so for it the evidence is length: its own prompt
# runs to several thousand characters, a replaced one is the caller's text.
CODEX_DEFAULT = "You are a coding agent running in the Codex CLI"
CLAUDE_OWN_PROMPT_CHARS = 4000


def keeps_own_prompt(plugin: str, system: str) -> bool:
    return len(system) > CLAUDE_OWN_PROMPT_CHARS if plugin == "claude-code" else CODEX_DEFAULT in system


@pytest.fixture(scope="session")
def fidelity_image():
    return ensure_image()


@pytest.fixture
def repo(tmp_path):
    yield make_repo(tmp_path / "repo")
    remove_run_resources(tmp_path / "state")


def run_to_end(
    tmp_path, repo, plugin: str, prompt: str, *args: str, rc: int = 0, outcome: str = "task.completed"
) -> tuple[str, dict]:
    """Run the command to its end: check its exit status, return the run id and the task's one ``outcome`` event."""
    result = run_orchestrator(tmp_path, repo, plugin, prompt, *args)
    assert result.returncode == rc, result.stdout + result.stderr
    run_id = only_run_id(tmp_path)
    return run_id, one(run_events(tmp_path, run_id), outcome)


# runner pricing: a price per 1,000 tokens for each CLI's model, far from any real one.
PRICED = "pricing:\n  openai:\n    gpt-5: {input_per_1k_usd: 0.5, output_per_1k_usd: 2.0}\n" + (
    "  anthropic:\n    sonnet: {input_per_1k_usd: 0.5, output_per_1k_usd: 2.0}\n"
)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_success_brings_the_agents_commits_back_as_a_branch(tmp_path, repo, fidelity_image, plugin):
    config = tmp_path / "priced.yaml"
    config.write_text(PRICED)
    run_id, done = run_to_end(tmp_path, repo, plugin, "FIDELITY: success", "--config", str(config))
    branch = done["artifact"]["branch_final"]
    assert git(repo, "log", "--format=%s", f"main..{branch}").splitlines() == [
        "fidelity: edit notes.txt",
        "fidelity: add notes.txt",
    ]
    assert git(repo, "show", f"{branch}:notes.txt") == "edited line"
    facts = final_facts(done["final_message"])
    assert facts["tool_results"] == 4
    requests = scripted(server_requests(run_id))
    assert [r["step"] for r in requests] == [0, 1, 2, 3, 4]
    assert all(r["stream"] for r in requests)  # the SSE paths of both APIs are what ran
    assert all(keeps_own_prompt(plugin, r["system"]) for r in requests)  # no system_prompt: the CLI keeps its own
    # the server reports 100 input and 20 output tokens per response
    assert done["metrics"]["tokens_in"] == 100 * len(requests)
    assert done["metrics"]["tokens_out"] == 20 * len(requests)
    # Codex reports tokens and no cost: the configured price makes one. Claude Code reports
    # its own cost, which the configured price does not replace.
    priced = (100 * 0.5 + 20 * 2.0) * len(requests) / 1000
    if plugin == "codex":
        assert done["metrics"]["cost_usd"] == pytest.approx(priced)
    else:
        assert done["metrics"]["cost_usd"] is not None and done["metrics"]["cost_usd"] != pytest.approx(priced)


STRATEGY = f"{REPO_ROOT}/tests/fixtures/fidelity_strategy.py:fidelity"


@pytest.mark.parametrize("plugin", PLUGINS)
def test_system_prompt_replaces_and_append_adds(tmp_path, repo, fidelity_image, plugin):
    result = run_orchestrator(
        tmp_path,
        repo,
        plugin,
        "FIDELITY: prompts",
        "--strategy",
        STRATEGY,
        "-S",
        "system_prompt=SYS-MARKER: you are a fidelity probe.",
        "-S",
        "append_system_prompt=APPEND-MARKER: answer briefly.",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    requests = scripted(server_requests(only_run_id(tmp_path)))
    assert requests
    for r in requests:
        assert "SYS-MARKER" in r["system"] and "APPEND-MARKER" in r["system"]
        assert r["system"].index("SYS-MARKER") < r["system"].index("APPEND-MARKER")
        assert not keeps_own_prompt(plugin, r["system"]), len(r["system"])


def test_max_turns_stops_claude_code_with_a_timeout_error(tmp_path, repo, fidelity_image):
    run_id, failed = run_to_end(
        tmp_path,
        repo,
        "claude-code",
        "FIDELITY: maxturns",
        "--strategy",
        STRATEGY,
        "-S",
        "max_turns=2",
        rc=1,
        outcome="task.failed",
    )
    assert failed["error_type"] == "timeout", failed  # a turn budget: retrying the same budget fails the same way
    assert len(scripted(server_requests(run_id))) == 2


def test_max_turns_on_codex_is_refused_when_scheduled(tmp_path, repo, fidelity_image):
    result = run_orchestrator(
        tmp_path, repo, "codex", "FIDELITY: maxturns", "--strategy", STRATEGY, "-S", "max_turns=2"
    )
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "plugin codex has no turn limit: remove max_turns from the task" in out, out
    assert "Traceback" not in out
    assert not [e for e in run_events(tmp_path, only_run_id(tmp_path)) if e["type"] == "task.started"]


def retries_scheduled(tmp_path, run_id) -> int:
    return sum(1 for e in runner_events(tmp_path, run_id) if e.get("message") == "runner.retry.scheduled")


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_429_then_success_finishes_the_work_once(tmp_path, repo, fidelity_image, plugin):
    run_id, done = run_to_end(tmp_path, repo, plugin, "FIDELITY: ratelimit")
    assert git(repo, "log", "--format=%s", f"main..{done['artifact']['branch_final']}") == "fidelity: add notes.txt"
    requests = server_requests(run_id)
    assert [r["status"] for r in scripted(requests)].count(429) == 1
    answered = [r for r in scripted(requests) if r["status"] == 200]
    assert final_facts(done["final_message"])["served_429"] == 1
    # Tokens are counted once: a resumed session's cumulative usage is not added twice.
    assert done["metrics"]["tokens_in"] == 100 * len(answered)
    assert done["metrics"]["tokens_out"] == 20 * len(answered)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_401_fails_the_task_without_runner_retries(tmp_path, repo, fidelity_image, plugin):
    run_id, failed = run_to_end(tmp_path, repo, plugin, "FIDELITY: auth", rc=1, outcome="task.failed")
    assert failed["error_type"] == "api", failed
    assert retries_scheduled(tmp_path, run_id) == 0
    statuses = [r["status"] for r in scripted(server_requests(run_id))]
    assert statuses and set(statuses) == {401}
    # The CLI's own retries are bounded by what the plugin sets (claude: CLAUDE_CODE_MAX_RETRIES=2).
    assert len(statuses) <= 3, statuses


@pytest.mark.parametrize("plugin", PLUGINS)
def test_interrupted_mid_turn_then_resume_continues_the_same_session(tmp_path, repo, fidelity_image, plugin):
    env = fidelity_env(tmp_path)
    proc = subprocess.Popen(
        [
            ORCH,
            "FIDELITY: interrupt",
            "--plugin",
            plugin,
            "--model",
            MODELS[plugin],
            "--docker-image",
            fidelity_image,
            "--no-tui",
        ],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def stalled():
            state = tmp_path / "state"
            runs = [p.name for p in state.iterdir()] if state.exists() else []
            if not runs or not (tmp_path / "logs" / runs[0] / "events.jsonl").exists():
                return None
            names = [
                e["payload"]["container_name"] for e in run_events(tmp_path, runs[0]) if e["type"] == "task.scheduled"
            ]
            probe = (
                subprocess.run(
                    ["docker", "exec", names[0], "test", "-f", "/home/node/.fidelity/stalled"], capture_output=True
                )
                if names
                else None
            )
            return runs[0] if probe is not None and probe.returncode == 0 else None

        # the agent wrote and committed, and its next model call is in flight
        run_id = wait_for(stalled, timeout=180, interval=0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    interrupted = one(run_events(tmp_path, run_id), "task.interrupted")
    assert interrupted["session_id"]

    result = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    evs = run_events(tmp_path, run_id)
    resumed = [e["payload"] for e in evs if e["type"] == "task.started"][-1]
    assert resumed["session_id"] == interrupted["session_id"]
    done = one(evs, "task.completed")
    assert done["session_id"] == interrupted["session_id"]
    assert done["artifact"].get("branch_final"), done
    assert git(repo, "log", "--format=%s", f"main..{done['artifact']['branch_final']}").splitlines() == [
        "fidelity: edit notes.txt",
        "fidelity: add notes.txt",
    ]
    assert git(repo, "show", f"{done['artifact']['branch_final']}:notes.txt") == "edited line"
    facts = final_facts(done["final_message"])
    # The resumed turn carried the interrupted one's history: its two tool results and the first prompt.
    assert facts["tool_results"] == 4 and facts["user_prompts"] == 2, facts
    answered = [r for r in scripted(server_requests(run_id)) if r["status"] == 200]
    after = [r for r in answered if r["step"] >= 2]
    assert 100 * len(after) <= done["metrics"]["tokens_in"] <= 100 * len(answered)


SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}, "verdict": {"type": "string"}},
    "required": ["score", "verdict"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("plugin", PLUGINS)
@pytest.mark.parametrize("script", ["structured", "structured-repair"])
def test_structured_output_comes_back_validated(tmp_path, repo, fidelity_image, plugin, script):
    run_id, done = run_to_end(
        tmp_path,
        repo,
        plugin,
        f"FIDELITY: {script}",
        "--strategy",
        STRATEGY,
        "-S",
        f"output_schema={json.dumps(SCHEMA)}",
    )
    assert done["output"] == {"score": 7, "verdict": "ship it"}
    log = runner_events(tmp_path, run_id)
    repairs = [e for e in log if e.get("message") == "runner.output.invalid"]
    assert len(repairs) == (1 if script == "structured-repair" else 0)
    # The repair turn resumes the session, whose usage (and Claude Code's cost)
    # the CLI reports cumulatively: each model call is counted once.
    answered = [r for r in scripted(server_requests(run_id)) if r["status"] == 200]
    assert done["metrics"]["tokens_in"] == 100 * len(answered)
    assert done["metrics"]["tokens_out"] == 20 * len(answered)
    if plugin == "claude-code":
        totals = [e["data"]["total_cost_usd"] for e in log if e.get("message") == "runner.result"]
        assert len(totals) == len(repairs) + 1
        assert done["metrics"]["cost_usd"] == pytest.approx(totals[-1])
