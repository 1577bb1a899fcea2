"""Command plugin: argv, plain-text output, exit status, bounded output."""

from __future__ import annotations

import random
import subprocess

import pytest
from plugin_helpers import requests_for

from orchestrator.errors import ConfigError
from orchestrator.runner.plugin import RunnerPlugin
from orchestrator.runner.registry import get_plugin
from orchestrator.runner.types import AuthConfig
from runner_plugins.command import OUTPUT_LIMIT, PLUGIN

request = requests_for(prompt="", plugin_name="command")


def execute(command: str, chunk: int = 4096):
    """Run the built argv for real (no Docker) and feed the parser like the runner would."""
    argv = PLUGIN.build_command(request(command=command), resume_session_id=None)
    proc = subprocess.run(argv, capture_output=True, check=False)
    parser = PLUGIN.new_parser()
    for i in range(0, len(proc.stdout), chunk):
        assert parser.feed(proc.stdout[i : i + chunk]) == []
    parser.feed_stderr(proc.stderr)
    return parser.finish(proc.returncode)


def test_lookup_capabilities_and_environment(monkeypatch):
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    assert get_plugin("command") is PLUGIN and isinstance(PLUGIN, RunnerPlugin)
    caps = PLUGIN.capabilities
    assert not (caps.supports_resume or caps.supports_cost or caps.supports_token_counts)
    assert caps.auth_methods == ()
    PLUGIN.validate_environment(AuthConfig())  # nothing required
    env = PLUGIN.prepare_environment(AuthConfig(api_key="secret"), request(command="true", env={"X": "1"}))
    assert dict(env) == {"X": "1", "NO_COLOR": "1"}  # no credentials; told that no one reads colours


def test_a_command_is_told_the_users_own_colour_choice(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert dict(PLUGIN.prepare_environment(AuthConfig(), request(command="true"))) == {"FORCE_COLOR": "1"}
    monkeypatch.setenv("NO_COLOR", "")
    env = PLUGIN.prepare_environment(AuthConfig(), request(command="true", env={"NO_COLOR": "yes"}))
    assert dict(env) == {"NO_COLOR": "yes", "FORCE_COLOR": "1"}  # the task's own setting wins


def test_build_command():
    assert PLUGIN.build_command(request(command="pytest -q && echo 'ok'"), resume_session_id=None) == [
        "/bin/sh",
        "-c",
        "pytest -q && echo 'ok'",
    ]
    for empty in (None, "", "   "):
        with pytest.raises(ConfigError):
            PLUGIN.build_command(request(command=empty), resume_session_id=None)
    assert PLUGIN.stdin_payload(request(command="true")) is None


def test_success_keeps_the_whole_output():
    out = execute("printf 'line one\\nsecond: ünï 🎉\\n'")
    assert (out.is_error, out.exit_code, out.error_category, out.error_message) == (False, 0, None, None)
    assert out.final_message == "line one\nsecond: ünï 🎉\n"
    assert (out.tokens_in, out.tokens_out, out.cost_usd, out.session_id) == (0, 0, None, None)


def test_nonzero_exit_is_a_plain_task_failure():
    out = execute("echo partial; echo 'boom: tests failed' >&2; exit 3")
    assert (out.is_error, out.retryable, out.error_category, out.exit_code) == (True, False, None, 3)
    assert out.error_message == "command exited with status 3: boom: tests failed"
    assert out.final_message == "partial\n"
    quiet = execute("echo only-stdout; exit 1")
    assert quiet.error_message == "command exited with status 1: only-stdout"


def test_huge_output_is_bounded_to_the_tail():
    out = execute('i=0; while [ $i -lt 30000 ]; do echo "row $i ünï"; i=$((i+1)); done', chunk=7)
    assert out.final_message.startswith("[output truncated: showing the last ")
    body = out.final_message.split("]\n", 1)[1]
    assert len(body.encode()) <= OUTPUT_LIMIT
    assert body.endswith("row 29999 ünï\n") and "\ufffd" not in body


def test_chunking_and_utf8_splits_are_invisible():
    data = "".join(f"{i}: ünïcødé 🎉\n" for i in range(500)).encode() + b"\xff tail"
    whole = PLUGIN.new_parser()
    whole.feed(data)
    expected = whole.finish(0)
    for seed in range(20):
        rng = random.Random(seed)
        parser, pos = PLUGIN.new_parser(), 0
        while pos < len(data):
            step = rng.randint(1, 7)
            parser.feed(data[pos : pos + step])
            pos += step
        assert parser.finish(0) == expected
    assert expected.final_message.endswith("\ufffd tail")


def test_many_megabytes_keep_memory_bounded():
    parser = PLUGIN.new_parser()
    block = b"z" * (1 << 20)
    for _ in range(20):
        parser.feed(block)
    out = parser.finish(0)
    assert len(out.final_message) < OUTPUT_LIMIT + 200
    assert f"of {20 << 20} bytes" in out.final_message
