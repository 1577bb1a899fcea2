"""What AgentExec.uncommitted makes of the look in the container: each outcome's events and answer.

No Docker: the engine's answer to the status-and-commit exec is given (tests/test_uncommitted.py
runs the same look for real, where the failures below cannot be provoked).
"""

from __future__ import annotations

import pytest

from orchestrator.errors import ContainerError
from orchestrator.runner.docker_agent import AgentExec
from orchestrator.runner.registry import get_plugin
from orchestrator.runner.types import InstanceRequest
from orchestrator.sanitize import Sanitizer

SECRET = "sk-ant-test-0123456789abcdef0123456789"


class _Host:
    """The one engine call uncommitted() makes: its answer, and how often it was asked."""

    def __init__(self, answer: tuple[int, bytes] | Exception) -> None:
        self.answer = answer
        self.execs = 0

    async def exec_simple(self, container: str, argv: list[str]) -> tuple[int, bytes]:
        self.execs += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def _look(answer: tuple[int, bytes] | Exception, counted: int | None = None, policy: str = "commit"):
    host = _Host(answer)
    events: list[tuple[str, str, dict]] = []

    def emit(request, on_event, type_, level="info", **fields):
        events.append((type_, level, fields))

    sanitizer = Sanitizer()
    sanitizer.add_secrets([SECRET])
    agent = AgentExec(host, None, None, sanitizer, emit, None, None)  # type: ignore[arg-type]
    # the names every request has; their values do not matter to this look
    names = "prompt repo_path branch_name run_id strategy_execution_id instance_id task_key container_name"
    request = InstanceRequest(**dict.fromkeys(names.split(), "x"), uncommitted=policy)  # type: ignore[arg-type]
    answer = await agent.uncommitted(request, get_plugin("claude-code"), None, counted)
    return answer, [(t, lvl, {k: v for k, v in f.items() if k != "duration_s"}) for t, lvl, f in events], host.execs


@pytest.mark.parametrize(
    ("answer", "counted", "policy", "expected", "execs", "level"),
    [
        ((0, b""), 0, "commit", (0, False), 0, "debug"),  # the wrapper's count of nothing is the answer
        ((0, b""), 3, "discard", (3, False), 0, "warn"),  # files left under discard: counted, no exec
        ((0, b"uncommitted=2\ncommitted\n"), 2, "commit", (2, True), 1, "info"),
    ],
)
async def test_a_look_that_worked_is_one_event(answer, counted, policy, expected, execs, level):
    got, events, n = await _look(answer, counted=counted, policy=policy)
    assert (got, n) == (expected, execs)
    files, committed = expected
    assert events == [
        ("runner.uncommitted", level, dict(phase="collect", files=files, policy=policy, auto_committed=committed))
    ]


async def test_a_commit_that_failed_is_said_scrubbed_and_the_files_are_counted_as_left():
    answer, events, _ = await _look((1, f"uncommitted=2\nhook refused {SECRET}\n".encode()), counted=2)
    assert answer == (2, False)
    assert [(t, lvl) for t, lvl, _ in events] == [("runner.uncommitted.failed", "warn"), ("runner.uncommitted", "warn")]
    failed = events[0][2]
    assert failed["exit_code"] == 1 and "hook refused" in failed["error"] and SECRET not in failed["error"]
    assert events[1][2] == dict(phase="collect", files=2, policy="commit", auto_committed=False)


@pytest.mark.parametrize("counted", [None, 2])
async def test_an_answer_without_the_count_is_a_failed_look_and_no_answer(counted):
    answer, events, _ = await _look((3, f"sh: git: not found {SECRET}\n".encode()), counted=counted)
    assert answer is None
    assert len(events) == 1
    type_, level, fields = events[0]
    assert (type_, level, fields["exit_code"]) == ("runner.uncommitted.failed", "warn", 3)
    assert "git: not found" in fields["error"] and SECRET not in fields["error"]


async def test_an_exec_that_cannot_run_is_a_failed_look_and_no_answer():
    answer, events, _ = await _look(ContainerError("container c1 is gone"), counted=None)
    assert answer is None
    assert events == [("runner.uncommitted.failed", "warn", {"error": "container c1 is gone"})]
