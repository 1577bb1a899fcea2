"""The runner plugin interface: what the Docker runner needs to know about one agent tool (its
models, command line, environment, and a parser of what it prints); the runner owns the container.
Implementations: the ``runner_plugins`` package, looked up by name with :func:`.registry.get_plugin`.
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
    # The environment variables its credentials come from, in the order --doctor shows them.
    auth_env: tuple[str, ...] = ()
    # The executables the agent image must hold for it (a dry run needs the simulated agent instead).
    image_tools: tuple[str, ...] = ("git",)
    # It runs the task's ``command`` (and nothing else without one): no agent, no prompt.
    runs_command: bool = False
    # Its exit code is the task's verdict: non-zero fails the task as a ``command`` error.
    exit_code_is_verdict: bool = False
    # Its work is a commit on a branch: what it leaves uncommitted is counted and imported.
    makes_commits: bool = True
    # The persona the simulated agent speaks in a dry run (``claude`` or ``codex``); None: run it for real.
    simulated_as: str | None = None
    # Said after the list of known models when a model name is unknown.
    model_hint: str = ""


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

    def resolve_auth(self, environ: dict[str, str], *, mode: str | None) -> AuthConfig:
        """Its credentials from ``environ``; :class:`~orchestrator.errors.PreflightError` naming what to set."""

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
