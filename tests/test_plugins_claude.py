"""Claude Code plugin: every fixture transcript, chunking, bounds, argv, env."""

from __future__ import annotations

import json

import pytest
from plugin_helpers import CLAUDE_FLAGS, FIXTURES, assert_chunking_is_invisible, fixture_names, multibyte_splits, parse
from plugin_helpers import instance_request as request

from orchestrator.errors import ConfigError, PreflightError
from orchestrator.runner.plugin import RunnerPlugin
from orchestrator.runner.registry import get_plugin
from orchestrator.runner.types import AuthConfig
from runner_plugins._jsonl import LineBuffer
from runner_plugins.claude_code import PLUGIN, PROMPT_ARGV_LIMIT

FROM_RESULT = object()  # long final messages: the fixture's own result text, read below with json


def _result_text(name: str) -> str:
    for line in (FIXTURES / name).read_text().splitlines():
        obj = json.loads(line)
        if obj.get("type") == "result":
            return obj["result"]
    raise AssertionError(name)


# Computed by hand from each file. tokens_in counts cache reads and writes as input.
# (final, session_id, tokens_in, tokens_out, cost, num_turns, is_error, category, retryable, exit_code)
EXPECTED = {
    "claude_2.1.330-local_auth401.jsonl": (
        "Invalid API key · Fix external API key",
        "25698ccc-1002-4126-8f05-6a4befc2d6b3",
        0,
        0,
        0.0,
        1,
        True,
        "api",
        False,
        1,
    ),
    "claude_2.1.330-local_ratelimit429.jsonl": (
        "API Error: Request rejected (429) · This request would exceed the rate limit for your organization "
        "(mock) of 50 requests per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits.",
        "1f3f8238-b6bb-4cbb-994f-d889ed8d9d7a",
        0,
        0,
        0.0,
        1,
        True,
        "api",
        True,
        1,
    ),
    # model_usage_since_last_result (38682 in / 119 out / $0.078554), not the cumulative $0.155332.
    "claude_2.1.330-local_resume.jsonl": (
        "Done: edited hello.txt in the resumed session",
        "8cf203f6-45ed-4c5e-8e87-7a9e284e3e09",
        38682,
        119,
        0.078554,
        3,
        False,
        None,
        False,
        0,
    ),
    "claude_2.1.330-local_success.jsonl": (
        "Done: created hello.txt",
        "8cf203f6-45ed-4c5e-8e87-7a9e284e3e09",
        37864,
        105,
        0.076778,
        3,
        False,
        None,
        False,
        0,
    ),
    "claude_2.1.330-local_transient429.jsonl": (
        "Done: created hello.txt",
        "9c8947bd-21bc-46cb-83bf-c6acb9a193a5",
        37816,
        92,
        0.076552,
        3,
        False,
        None,
        False,
        0,
    ),
    # 16 + 23996 + 70367 = 94379
    "claude_cc-executor_1.jsonl": (
        FROM_RESULT,
        "4c4af66a-5593-42fd-817d-42dd102478f3",
        94379,
        1884,
        0.6989115,
        7,
        False,
        None,
        False,
        0,
    ),
    # 10 + 21570 + 0
    "claude_gleam-sdk_1.jsonl": (
        "4",
        "1d1e46f9-35c7-4834-b529-846d5bb82288",
        21580,
        25,
        0.1354875,
        1,
        False,
        None,
        False,
        0,
    ),
    # 18 + 25067 + 17254; modelUsage cost differs, total_cost_usd is used without since_last_result
    "claude_gleam-sdk_2.jsonl": (
        "Here are the files in the current directory.",
        "40e7b02d-c0f9-4876-9010-f514d4eb0603",
        42339,
        424,
        0.24722425,
        2,
        False,
        None,
        False,
        0,
    ),
    # usage is 0 although modelUsage is not: usage + total_cost_usd are what this CLI gives per run
    "claude_hive-mind-api404_1.jsonl": (
        'API Error: 404 {"type":"error","error":{"type":"not_found_error","message":"model: oups"},'
        '"request_id":"req_011CVk2vdLxynFeaMQaoKZPH"}',
        "16a26db9-fd28-4a13-b08f-8b06aed6552c",
        0,
        0,
        0.027108,
        1,
        True,
        "api",
        False,
        1,
    ),
    # Three results from different sessions: the first successful one wins; its result is "" so the
    # final message is the last assistant text; num_turns -1 becomes None.
    "claude_rust-claude-codes_1.jsonl": (
        "Hello! I'm ready to help you with your Rust project. I can see you're working on the "
        "`feature/basic-message-types` branch with some modifications to `src/io.rs` and a test case file."
        "\n\nWhat would you like me to help you with today?",
        "aa276296-4409-42ca-9ac0-b0ae4e6cad19",
        0,
        0,
        0.0001096,
        None,
        False,
        None,
        False,
        0,
    ),
    # 10 + 5534 + 32197; denied tool results do not make the task fail
    "claude_rust-claude-codes_2.jsonl": (
        FROM_RESULT,
        "1f2f4a66-82a4-42e2-b93d-089998d779e6",
        37741,
        368,
        0.0395976,
        4,
        False,
        None,
        False,
        0,
    ),
    # 2409 + 29104 + 1617801; max turns: a tool-level limit -> "timeout", not retryable
    "claude_unattributed-maxturns_1.jsonl": (
        "",
        "495cc7e5-d22e-4192-92ba-4ce2d14827a6",
        1649314,
        15946,
        1.4020935,
        41,
        True,
        "timeout",
        False,
        1,
    ),
    # abridged result: no session id (taken from init), no cost
    "claude_unattributed-ratelimit_1.jsonl": (
        "You've hit your session limit · resets 9am (Europe/Berlin)",
        "a74d2edb-d7df-475f-ad7f-2c89def2ca88",
        0,
        0,
        None,
        None,
        True,
        "api",
        True,
        1,
    ),
    # only an "allowed" rate_limit_event: no result at all -> container failure, not retryable
    "claude_unattributed-ratelimit_2.jsonl": (
        "",
        "ef6991ec-b324-40c8-ac80-cf2d8982ebf7",
        0,
        0,
        None,
        None,
        True,
        "container",
        False,
        1,
    ),
}


def test_every_fixture_has_an_expectation():
    assert fixture_names("claude") == sorted(EXPECTED)


def run(data: bytes, exit_code: int | None, chunks: list[int] | None = None, previous=None):
    return parse(PLUGIN, data, exit_code, chunks, previous)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_outcome(name):
    final, session, tin, tout, cost, turns, is_error, category, retryable, code = EXPECTED[name]
    out, events = run((FIXTURES / name).read_bytes(), code)
    assert out.final_message == (_result_text(name) if final is FROM_RESULT else final)
    assert out.session_id == session
    assert (out.tokens_in, out.tokens_out) == (tin, tout)
    assert out.cost_usd == (None if cost is None else pytest.approx(cost, abs=1e-9))
    assert out.num_turns == turns
    assert (out.is_error, out.error_category, out.retryable) == (is_error, category, retryable)
    assert out.exit_code == code
    if is_error:
        assert out.error_message
    assert events, "every fixture yields events"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_chunking_is_invisible(name):
    data = (FIXTURES / name).read_bytes()
    code = EXPECTED[name][-1]
    assert_chunking_is_invisible(PLUGIN, data, code)


def test_multibyte_split_points_exist_in_some_fixture():
    assert any(multibyte_splits((FIXTURES / n).read_bytes()) for n in EXPECTED)


def test_resume_usage_and_cumulative():
    out, _ = run(
        (FIXTURES / "claude_2.1.330-local_resume.jsonl").read_bytes(),
        0,
        previous={"cost_usd": 0.076778, "tokens_in": 37864, "tokens_out": 105},
    )
    assert out.cost_usd == pytest.approx(0.078554)
    assert (out.tokens_in, out.tokens_out) == (38682, 119)
    assert out.cumulative == {"cost_usd": pytest.approx(0.155332), "tokens_in": 76546, "tokens_out": 224}


def _line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def test_first_success_result_wins_over_spurious_error_result():
    data = (FIXTURES / "claude_gleam-sdk_1.jsonl").read_bytes() + _line(
        {
            "type": "result",
            "subtype": "error_during_execution",
            "is_error": True,
            "num_turns": 0,
            "session_id": "1d1e46f9-35c7-4834-b529-846d5bb82288",
            "errors": ["only prompt commands are supported in streaming mode"],
        }
    )
    out, _ = run(data, 1)
    assert (out.is_error, out.final_message, out.num_turns) == (False, "4", 1)


def test_garbage_and_invalid_utf8_are_skipped():
    clean = (FIXTURES / "claude_2.1.330-local_success.jsonl").read_bytes()
    lines = clean.splitlines(keepends=True)
    noise = [
        b"not json at all\n",
        b"\xff\xfe\xfa garbage \xc3\n",
        b"[1, 2, 3]\n",
        b"{broken json\n",
        b"\n",
        b"   \n",
        b'"a string"\n',
        b'{"type": 42}\n',
        b"\x00\x01\x02\n",
    ]
    mixed = b"".join(line + noise[i % len(noise)] for i, line in enumerate(lines))
    assert run(mixed, 0)[0] == run(clean, 0)[0]


def test_invalid_utf8_inside_a_json_string_is_replaced():
    data = (
        b'{"type":"system","subtype":"init","session_id":"s1","model":"m"}\n'
        b'{"type":"result","subtype":"success","is_error":false,"result":"caf\xc3 ok \xff","session_id":"s1",'
        b'"num_turns":1,"total_cost_usd":0.5,"usage":{"input_tokens":1,"output_tokens":2}}\n'
    )
    out, _ = run(data, 0)
    assert out.final_message == "caf\ufffd ok \ufffd"
    assert (out.session_id, out.tokens_in, out.tokens_out, out.cost_usd) == ("s1", 1, 2, 0.5)


def test_huge_single_line_is_bounded():
    clean = (FIXTURES / "claude_2.1.330-local_success.jsonl").read_bytes()
    lines = clean.splitlines(keepends=True)
    huge = b'{"type":"user","message":{"content":[{"type":"tool_result","content":"' + b"x" * (20 << 20) + b'"}]}}\n'
    parser = PLUGIN.new_parser()
    events = []
    for line in lines[:3]:
        events += parser.feed(line)
    peak = 0
    for i in range(0, len(huge), 1 << 20):
        events += parser.feed(huge[i : i + (1 << 20)])
        peak = max(peak, parser._lines.buffered)
    for line in lines[3:]:
        events += parser.feed(line)
    assert peak <= 8 << 20
    assert any(e.data.get("skipped_oversized_lines") == 1 for e in events)
    assert parser.finish(0) == run(clean, 0)[0]


def test_line_buffer_basics():
    buf = LineBuffer(max_line_bytes=10)
    assert buf.feed(b"ab") == []
    assert buf.feed(b"c\r\nd\xc3") == ["abc"]
    assert buf.feed(b"\xa9\n") == ["d\u00e9"]
    assert buf.feed(b"0123456789AB") == [] and buf.buffered == 0  # over the cap: dropped
    assert buf.feed(b"CD\nok\n") == ["ok"] and buf.oversized_lines == 1
    assert buf.feed(b"tail") == [] and buf.flush() == ["tail"]


def test_no_result_classification_from_stderr_and_exit():
    init = _line({"type": "system", "subtype": "init", "session_id": "s9", "model": "m"})
    parser = PLUGIN.new_parser()
    parser.feed(init)
    parser.feed_stderr(b"Error: connect ECONNREFUSED 10.0.0.1:443\n")
    out = parser.finish(1)
    assert (out.is_error, out.error_category, out.retryable, out.session_id) == (True, "api", True, "s9")
    assert "ECONNREFUSED" in out.error_message and "status 1" in out.error_message
    killed = PLUGIN.new_parser()
    killed.feed(init)
    assert (killed.finish(137).error_category, killed.finish(137).retryable) == ("container", True)
    retried = PLUGIN.new_parser()
    retried.feed(
        init
        + _line(
            {
                "type": "system",
                "subtype": "api_retry",
                "attempt": 1,
                "error_status": 529,
                "error": "overloaded",
                "session_id": "s9",
            }
        )
    )
    assert (retried.finish(None).error_category, retried.finish(None).retryable) == ("api", True)


def test_plugin_lookup_and_capabilities():
    assert get_plugin("claude-code") is PLUGIN
    assert isinstance(PLUGIN, RunnerPlugin)
    assert PLUGIN.capabilities.supports_resume and PLUGIN.capabilities.supports_cost


def test_build_command_shapes():
    argv = PLUGIN.build_command(request(), resume_session_id=None)
    assert argv == [
        "claude",
        "-p",
        "fix the bug",
        *CLAUDE_FLAGS,
    ]
    argv = PLUGIN.build_command(
        request(
            model="claude-opus-4-5-20251101", system_prompt="be terse", append_system_prompt="and kind", max_turns=12
        ),
        resume_session_id="8cf203f6-45ed-4c5e-8e87-7a9e284e3e09",
    )
    assert argv[argv.index("--model") + 1] == "claude-opus-4-5-20251101"
    assert argv[argv.index("--resume") + 1] == "8cf203f6-45ed-4c5e-8e87-7a9e284e3e09"
    assert argv[argv.index("--system-prompt") + 1] == "be terse"
    assert argv[argv.index("--append-system-prompt") + 1] == "and kind"
    assert argv[argv.index("--max-turns") + 1] == "12"
    dash = PLUGIN.build_command(request(prompt="-rf is not an option"), resume_session_id=None)
    assert dash[-2:] == ["--", "-rf is not an option"]
    with pytest.raises(ConfigError):
        PLUGIN.build_command(request(max_turns=0), resume_session_id=None)
    with pytest.raises(ConfigError):
        PLUGIN.build_command(request(prompt="  "), resume_session_id=None)


def test_prompts_reach_the_agent_byte_for_byte():
    tricky = "say \"hi\" 'there'\n$HOME `ls` \\n 🎉 ünïcødé\ttab; rm -rf / #"
    argv = PLUGIN.build_command(request(prompt=tricky), resume_session_id=None)
    assert argv[2] == tricky and PLUGIN.stdin_payload(request(prompt=tricky)) is None
    huge = (tricky + "\n") * (102_400 // len(tricky))
    assert len(huge.encode()) > PROMPT_ARGV_LIMIT
    req = request(prompt=huge)
    argv = PLUGIN.build_command(req, resume_session_id="abc")
    assert huge not in argv and all(len(a.encode()) < 131_072 for a in argv)
    assert argv[:2] == ["claude", "-p"] and "--resume" in argv
    assert PLUGIN.stdin_payload(req) == huge.encode("utf-8")


def test_known_models():
    models = PLUGIN.known_models()
    assert {"sonnet", "opus", "haiku"} <= set(models)
    assert (
        "claude-sonnet-4-5-20250929" in models and models["claude-sonnet-4-5-20250929"] == "claude-sonnet-4-5-20250929"
    )
    assert "gpt-5" not in models and "oups" not in models and "claude-" not in models
    with pytest.raises(ConfigError, match="oups"):
        PLUGIN.build_command(request(model="oups"), resume_session_id=None)


def test_environment_and_secrets():
    with pytest.raises(PreflightError) as err:
        PLUGIN.validate_environment(AuthConfig())
    assert "CLAUDE_CODE_OAUTH_TOKEN" in str(err.value) and "ANTHROPIC_API_KEY" in str(err.value)
    env = PLUGIN.prepare_environment(AuthConfig(oauth_token="oat-secret-1"), request(env={"FOO": "bar"}))
    assert env["CLAUDE_CODE_OAUTH_TOKEN"] == "oat-secret-1" and "ANTHROPIC_API_KEY" not in env
    assert env["FOO"] == "bar" and env["CLAUDE_CODE_MAX_RETRIES"] == "2"
    for key in (
        "DISABLE_TELEMETRY",
        "DISABLE_ERROR_REPORTING",
        "DISABLE_AUTOUPDATER",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    ):
        assert env[key] == "1"
    assert "oat-secret-1" not in repr(env) and "oat-secret-1" not in str(env)
    env = PLUGIN.prepare_environment(
        AuthConfig(api_key="sk-ant-secret", base_url="http://proxy:8080"), request(env={"CLAUDE_CODE_MAX_RETRIES": "5"})
    )
    assert env["ANTHROPIC_API_KEY"] == "sk-ant-secret" and env["ANTHROPIC_BASE_URL"] == "http://proxy:8080"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "5" and "CLAUDE_CODE_OAUTH_TOKEN" not in env
    assert "sk-ant-secret" not in repr(env)
    # both present: the subscription token wins (it is what the user pays for already) unless a custom
    # endpoint forces API mode
    both = PLUGIN.prepare_environment(AuthConfig(oauth_token="o", api_key="k"), request())
    assert "CLAUDE_CODE_OAUTH_TOKEN" in both and "ANTHROPIC_API_KEY" not in both


def test_a_conversation_claude_cannot_resume_is_session_corrupted():
    from runner_plugins.claude_code import PLUGIN as CLAUDE

    parser = CLAUDE.new_parser()
    parser.feed_stderr(b"No conversation found with session ID: 3f1c-missing\n")
    outcome = parser.finish(1)
    assert (outcome.is_error, outcome.error_category, outcome.retryable) == (True, "session_corrupted", False)
