"""Codex plugin: every fixture transcript (current and legacy formats), chunking, resume usage, argv, env."""

from __future__ import annotations

import json

import pytest
from plugin_helpers import FIXTURES, assert_chunking_is_invisible, fixture_names, parse, requests_for

from orchestrator.errors import ConfigError, PreflightError
from orchestrator.runner.plugin import RunnerPlugin
from orchestrator.runner.registry import get_plugin
from orchestrator.runner.types import AuthConfig
from runner_plugins.codex import PLUGIN

LAST_AGENT_MESSAGE = object()  # long text: the last agent_message item of the file, read below with json


def _last_agent_message(name: str) -> str:
    texts = [
        o["item"]["text"]
        for o in map(json.loads, (FIXTURES / name).read_text().splitlines())
        if o.get("type") == "item.completed" and o["item"].get("type") == "agent_message"
    ]
    return texts[-1]


# Computed by hand. tokens_in = input_tokens (cached tokens are a subset), no cost from codex.
# (final, session_id, tokens_in, tokens_out, is_error, category, retryable, exit_code, error_message contains)
EXPECTED = {
    "codex_0.169.0-local_auth401.jsonl": (
        "",
        "01a20268-6646-7bf3-b6a7-355c79cef9d2",
        0,
        0,
        True,
        "api",
        False,
        1,
        "401 Unauthorized",
    ),
    "codex_0.169.0-local_ratelimit429.jsonl": (
        "",
        "01a20268-6652-7a80-ae93-085f8eb49767",
        0,
        0,
        True,
        "api",
        True,
        1,
        "429 Too Many Requests",
    ),
    # cumulative over the thread; no previous given here, so the whole counters
    "codex_0.169.0-local_resume.jsonl": (
        "Done: edited hello.txt in the resumed session",
        "01a20268-664f-7090-9974-96ca9c44508b",
        56582,
        366,
        False,
        None,
        False,
        0,
        None,
    ),
    "codex_0.169.0-local_success.jsonl": (
        "Done",
        "01a20268-664f-7090-9974-96ca9c44508b",
        27751,
        199,
        False,
        None,
        False,
        0,
        None,
    ),
    "codex_hive-mind-auth401_1.jsonl": (
        "",
        "019a72db-80ed-7911-8a8a-94994ffc009b",
        0,
        0,
        True,
        "api",
        False,
        1,
        "exceeded retry limit, last status: 401 Unauthorized",
    ),
    "codex_hive-mind-success_1.jsonl": (
        LAST_AGENT_MESSAGE,
        "019a3fe0-82fb-7e31-8e96-1d5c0544fd8a",
        177136,
        2836,
        False,
        None,
        False,
        0,
        None,
    ),
    "codex_hive-mind-usagelimit_1.jsonl": (
        "",
        "019a77e4-0716-7152-8396-b642e26c3e20",
        0,
        0,
        True,
        "api",
        True,
        1,
        "usage limit",
    ),
    "codex_openai-docs_1.jsonl": (
        "Yep — there’s a `README.md` in the repository root.",
        "0199a213-81c0-7800-8aa1-bbab2a035a53",
        24763,
        122,
        False,
        None,
        False,
        0,
        None,
    ),
    # a failed command inside a completed turn is not a task failure
    "codex_rust-codex-codes_1.jsonl": (
        "The command exited with code `42`.",
        "019c8143-0e53-7271-89e8-3eec4d067c77",
        15086,
        114,
        False,
        None,
        False,
        0,
        None,
    ),
    "codex_rust-codex-codes_2.jsonl": (
        "`echo step1` → `step1`  \n`echo step2` → `step2`  \n`echo step3` → `step3`",
        "019c8143-abe2-7722-9bd1-fd70f687175b",
        30669,
        205,
        False,
        None,
        False,
        0,
        None,
    ),
    "codex_rust-codex-codes_3.jsonl": (
        "Updated `test.txt` via a direct file edit. It now contains:\n\n`new content`",
        "019c8143-62bb-7e43-8f0a-66dac76af4d4",
        22857,
        250,
        False,
        None,
        False,
        0,
        None,
    ),
    "codex_unattributed-0.149_1.jsonl": (
        "PONG",
        "01a02ac4-a618-7f10-a528-c07b0cc55ee2",
        18293,
        6,
        False,
        None,
        False,
        0,
        None,
    ),
    # warning item before turn.started is not fatal; the JSON-encoded 400 is unwrapped
    "codex_unattributed-0.149_2.jsonl": (
        "",
        "01a02ac5-169e-79f2-91a8-8ec3ae756bb4",
        0,
        0,
        True,
        "api",
        False,
        1,
        "The 'definitely-not-a-real-model' model is not supported when using Codex with a ChatGPT account.",
    ),
    "codex_vibe-kanban-legacy_1.jsonl": (
        "",
        None,
        0,
        0,
        True,
        "api",
        False,
        1,
        "Missing environment variable: `OPENAI_API_KEY`",
    ),
    "codex_vibe-kanban-legacy_2.jsonl": (
        "I can see the directory structure of your project. This appears to be a Rust project with a "
        "frontend/backend architecture, using pnpm for package management. The project includes various "
        "configuration files, documentation, and development assets.",
        None,
        0,
        0,
        False,
        None,
        False,
        0,
        None,
    ),
}


def test_every_fixture_has_an_expectation():
    assert fixture_names("codex") == sorted(EXPECTED)


def run(data: bytes, exit_code: int | None, chunks: list[int] | None = None, previous=None):
    return parse(PLUGIN, data, exit_code, chunks, previous)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_outcome(name):
    final, session, tin, tout, is_error, category, retryable, code, needle = EXPECTED[name]
    out, events = run((FIXTURES / name).read_bytes(), code)
    assert out.final_message == (_last_agent_message(name) if final is LAST_AGENT_MESSAGE else final)
    assert out.session_id == session
    assert (out.tokens_in, out.tokens_out, out.cost_usd) == (tin, tout, None)
    assert (out.is_error, out.error_category, out.retryable, out.exit_code) == (is_error, category, retryable, code)
    if needle:
        assert needle in out.error_message
    else:
        assert out.error_message is None
    assert events


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_chunking_is_invisible(name):
    data = (FIXTURES / name).read_bytes()
    code = EXPECTED[name][7]
    assert_chunking_is_invisible(PLUGIN, data, code)


def test_resume_usage_is_the_difference_from_previous():
    first, _ = run((FIXTURES / "codex_0.169.0-local_success.jsonl").read_bytes(), 0)
    assert first.cumulative["input_tokens"] == 27751 and first.cumulative["output_tokens"] == 199
    second, _ = run((FIXTURES / "codex_0.169.0-local_resume.jsonl").read_bytes(), 0, previous=first.cumulative)
    assert (second.tokens_in, second.tokens_out) == (56582 - 27751, 366 - 199)
    assert second.cumulative["input_tokens"] == 56582 and second.cumulative["output_tokens"] == 366
    # counters below the previous ones belong to another thread: taken as they are
    other, _ = run((FIXTURES / "codex_unattributed-0.149_1.jsonl").read_bytes(), 0, previous=first.cumulative)
    assert (other.tokens_in, other.tokens_out) == (18293, 6)


def test_garbage_and_huge_lines_are_skipped():
    clean = (FIXTURES / "codex_openai-docs_1.jsonl").read_bytes()
    lines = clean.splitlines(keepends=True)
    noise = b'garbage\n\xff\xfe\xc3(\n[]\n{"no": \n'
    huge = b'{"type":"item.completed","item":{"type":"agent_message","text":"' + b"y" * (20 << 20) + b'"}}\n'
    parser = PLUGIN.new_parser()
    events = []
    peak = 0
    for i, line in enumerate(lines):
        events += parser.feed(line + noise)
        if i == 4:
            for j in range(0, len(huge), 3 << 20):
                events += parser.feed(huge[j : j + (3 << 20)])
                peak = max(peak, parser._lines.buffered)
    assert peak <= 8 << 20
    assert any(e.data.get("skipped_oversized_lines") == 1 for e in events)
    assert parser.finish(0) == run(clean, 0)[0]


def test_crash_without_turn_end():
    parser = PLUGIN.new_parser()
    parser.feed(b'{"type":"thread.started","thread_id":"t1"}\n{"type":"turn.started"}\n')
    parser.feed_stderr(b"thread 'main' panicked\nError: stream disconnected before completion\n")
    out = parser.finish(1)
    assert (out.is_error, out.error_category, out.retryable, out.session_id) == (True, "api", True, "t1")
    assert "stream disconnected" in out.error_message
    plain = PLUGIN.new_parser()
    plain.feed(b'{"type":"thread.started","thread_id":"t1"}\n')
    assert (plain.finish(2).error_category, plain.finish(2).retryable) == ("container", False)


request = requests_for(model="gpt-5", plugin_name="codex")


BASE = [
    "codex",
    "exec",
    "--json",
    "--skip-git-repo-check",
    "--dangerously-bypass-approvals-and-sandbox",
    "-c",
    "analytics.enabled=false",
    "-c",
    "features.unbounded_connection_retries=false",
    "-m",
    "gpt-5",
]


def test_plugin_lookup_and_capabilities():
    assert get_plugin("codex") is PLUGIN and isinstance(PLUGIN, RunnerPlugin)
    caps = PLUGIN.capabilities
    assert caps.supports_resume and not caps.supports_cost and caps.supports_token_counts
    assert PLUGIN.known_models() is None


def test_build_command_shapes():
    assert PLUGIN.build_command(request(), resume_session_id=None) == [*BASE, "fix the bug"]
    assert PLUGIN.build_command(request(), resume_session_id="01a2-t") == [*BASE, "resume", "01a2-t", "fix the bug"]
    custom = PLUGIN.build_command(
        request(), resume_session_id=None, auth=AuthConfig(openai_api_key="k", openai_base_url="http://llm:8000/v1")
    )
    assert custom == [
        *BASE,
        "-c",
        "model_provider=orc",
        "-c",
        'model_providers.orc={name="orc",base_url="http://llm:8000/v1",'
        'env_key="OPENAI_API_KEY",wire_api="responses",request_max_retries=2,stream_max_retries=2}',
        "fix the bug",
    ]
    via_env = PLUGIN.build_command(request(env={"OPENAI_BASE_URL": "http://llm:8000/v1"}), resume_session_id=None)
    assert via_env == custom
    assert PLUGIN.build_command(request(prompt="-x"), resume_session_id=None)[-2:] == ["--", "-x"]
    with pytest.raises(ConfigError):
        PLUGIN.build_command(request(model=""), resume_session_id=None)


def test_huge_prompt_goes_to_stdin():
    tricky = "quote \" ' newline\n emoji 🎉 ünï $VAR `cmd`"
    assert PLUGIN.build_command(request(prompt=tricky), resume_session_id=None)[-1] == tricky
    assert PLUGIN.stdin_payload(request(prompt=tricky)) is None
    huge = tricky * (110_000 // len(tricky))
    argv = PLUGIN.build_command(request(prompt=huge), resume_session_id="t1")
    assert argv[-3:] == ["resume", "t1", "-"]
    assert PLUGIN.stdin_payload(request(prompt=huge)) == huge.encode("utf-8")


def test_environment_and_secrets():
    with pytest.raises(PreflightError, match="OPENAI_API_KEY"):
        PLUGIN.validate_environment(AuthConfig(api_key="anthropic-only"))
    env = PLUGIN.prepare_environment(AuthConfig(openai_api_key="sk-openai-secret"), request(env={"A": "1"}))
    assert env["OPENAI_API_KEY"] == "sk-openai-secret" and "CODEX_HOME" not in env
    assert env["A"] == "1"
    assert "sk-openai-secret" not in repr(env) and "sk-openai-secret" not in str(env)


def test_system_prompts_become_codex_settings():
    req = request(system_prompt='You review.\n"Be strict."', append_system_prompt='Answer "yes" or no\n')
    argv = PLUGIN.build_command(req, resume_session_id=None)
    files = PLUGIN.container_files(req)
    ((path, body),) = files.items()
    assert body == b'You review.\n"Be strict."' and path.startswith("/tmp/orchestrator/instructions-")
    assert argv[argv.index(f'model_instructions_file="{path}"') - 1] == "-c"
    assert argv[argv.index(f'experimental_instructions_file="{path}"') - 1] == "-c"
    assert 'developer_instructions="Answer \\"yes\\" or no\\n"' in argv
    assert PLUGIN.container_files(request()) == {}
    assert not PLUGIN.capabilities.supports_max_turns


def test_a_thread_codex_cannot_resume_is_session_corrupted():
    # what `codex exec --json resume <id>` prints for a thread it does not have
    parser = PLUGIN.new_parser()
    parser.feed(b'{"type":"error","message":"thread/session not found: 019a-missing"}\n')
    parser.feed_stderr(b"Error: thread/session not found: 019a-missing\n")
    outcome = parser.finish(1)
    assert (outcome.is_error, outcome.error_category, outcome.retryable) == (True, "session_corrupted", False)
    crashed = PLUGIN.new_parser()
    crashed.feed_stderr(b"Error: thread/session not found: 019a-missing\n")
    assert crashed.finish(1).error_category == "session_corrupted"
