"""The runner plugin interface: what the Docker runner needs to know about one agent tool.

A plugin knows one agent tool: which models it accepts, how to build its
command line and environment, and how to parse what it prints. It never
creates containers; the Docker runner owns the container and feeds the
plugin's parser the bytes the tool writes to stdout.

Implementations live in the top-level ``runner_plugins`` package, one module
per tool, and are looked up by name with :func:`get_plugin`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from .types import AuthConfig, ErrorCategory, InstanceRequest


class PluginCapabilities(msgspec.Struct, frozen=True, kw_only=True):
    supports_resume: bool = False
    supports_cost: bool = False
    supports_streaming_events: bool = True
    supports_token_counts: bool = True
    supports_streaming: bool = True
    supports_cost_limits: bool = False
    # The tool can be made to answer with JSON matching a schema (InstanceRequest.output_schema).
    supports_output_schema: bool = False
    # The tool can stop after a number of turns (task field max_turns); a task
    # that sets it on a plugin without is refused when it is scheduled.
    supports_max_turns: bool = True
    auth_methods: tuple[str, ...] = ("oauth", "api_key")


AgentEventKind = Literal["init", "text", "tool_use", "tool_result", "usage", "rate_limit", "error", "result", "other"]


class AgentEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One parsed line of tool output, in a tool-neutral shape (for runner.jsonl)."""

    kind: AgentEventKind
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class AgentOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What one execution of the tool produced, once its stream ended."""

    final_message: str = ""
    session_id: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    num_turns: int | None = None
    is_error: bool = False
    error_category: ErrorCategory | None = None
    error_message: str | None = None
    retryable: bool = False
    exit_code: int | None = None
    # Cumulative counters the tool reported (for resumed sessions, per-task usage
    # is the difference from the previous execution's cumulative values).
    cumulative: dict[str, float] = msgspec.field(default_factory=dict)
    # The object the tool returned for ``output_schema`` (Claude Code's
    # ``structured_output``); ``None`` when the answer is only in ``final_message``.
    structured_output: Any = None


class StreamParser(Protocol):
    def feed(self, chunk: bytes) -> list[AgentEvent]:
        """Consume raw stdout bytes (any split, even mid-line or mid-UTF-8) and return complete events."""

    def finish(self, exit_code: int | None) -> AgentOutcome:
        """Flush any buffered final line and build the outcome."""


@runtime_checkable
class RunnerPlugin(Protocol):
    name: str
    capabilities: PluginCapabilities

    def known_models(self) -> dict[str, str] | None:
        """Friendly name -> concrete model id; ``None`` means any model name is accepted."""

    def validate_environment(self, auth: AuthConfig) -> None:
        """Raise :class:`~orchestrator.errors.PreflightError` naming the variables to set."""

    def prepare_environment(self, auth: AuthConfig, request: InstanceRequest) -> dict[str, str]:
        """Environment for the tool process, including credentials."""

    def build_command(self, request: InstanceRequest, *, resume_session_id: str | None) -> list[str]:
        """argv to ``docker exec`` inside the container (cwd ``/workspace``)."""

    def new_parser(self, *, previous: dict[str, float] | None = None) -> StreamParser:
        """A parser for one execution; ``previous`` is the cumulative usage of the prior one."""

    # Optional: ``container_files(request) -> dict[str, bytes]``, files (absolute
    # paths under /tmp) the runner writes into the container before each execution.
