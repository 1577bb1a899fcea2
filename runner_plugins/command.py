"""Plain shell commands (evaluations, checks, merges): ``/bin/sh -c <command>``.

What a user sees is in docs/strategies.md (``command``) and docs/cli.md ("Output without terminal codes").
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from orchestrator.errors import ConfigError
from orchestrator.runner.plugin import AgentEvent, AgentOutcome, PluginCapabilities
from orchestrator.runner.types import AuthConfig, InstanceRequest

from ._jsonl import SecretEnv, Tail

OUTPUT_LIMIT = 64 * 1024
COLOUR_VARS = ("NO_COLOR", "FORCE_COLOR")


def colour_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a command is told about colour: the user's own ``NO_COLOR``/``FORCE_COLOR``, else ``NO_COLOR=1``."""
    chosen = {k: environ[k] for k in COLOUR_VARS if k in environ}
    return chosen or {"NO_COLOR": "1"}


class CommandPlugin:
    name = "command"
    capabilities = PluginCapabilities(
        supports_token_counts=False,
        supports_streaming_events=False,
        auth_methods=(),
        image_tools=(),
        runs_command=True,
        exit_code_is_verdict=True,
        makes_commits=False,
    )

    def resolve_auth(self, environ: dict[str, str], *, mode: str | None) -> AuthConfig:
        return AuthConfig()

    def known_models(self) -> dict[str, str] | None:
        return None  # no model: whatever the request says is ignored

    def validate_environment(self, auth: AuthConfig) -> None:
        return None

    def prepare_environment(self, auth: AuthConfig, request: InstanceRequest) -> dict[str, str]:
        # No credentials reach a plain command; a variable the task itself sets wins.
        return SecretEnv({**colour_env(os.environ), **request.env})

    def build_command(self, request: InstanceRequest, *, resume_session_id: str | None) -> list[str]:
        if not request.command or not request.command.strip():
            raise ConfigError("the command plugin needs a non-empty request.command")
        return ["/bin/sh", "-c", request.command]

    def stdin_payload(self, request: InstanceRequest) -> bytes | None:
        return None

    def new_parser(self, *, previous: dict[str, float] | None = None) -> CommandOutputParser:
        return CommandOutputParser()


class CommandOutputParser:
    def __init__(self, limit: int = OUTPUT_LIMIT) -> None:
        self._stdout = Tail(limit)
        self._stderr = Tail(16 * 1024)

    def feed(self, chunk: bytes) -> list[AgentEvent]:
        self._stdout.write(chunk)
        return []

    def feed_stderr(self, chunk: bytes) -> None:
        self._stderr.write(chunk)

    def finish(self, exit_code: int | None) -> AgentOutcome:
        final = self._stdout.text()
        if self._stdout.truncated:
            final = (
                f"[output truncated: showing the last {len(final.encode('utf-8'))} of "
                f"{self._stdout.total} bytes]\n{final}"
            )
        if exit_code == 0:
            return AgentOutcome(final_message=final, exit_code=0)
        tail = self._stderr.last_lines() or self._stdout.last_lines()
        status = f"exited with status {exit_code}" if exit_code is not None else "ended without an exit status"
        message = f"command {status}" + (f": {tail}" if tail else "")
        return AgentOutcome(
            final_message=final,
            exit_code=exit_code,
            is_error=True,
            retryable=False,
            error_category=None,
            error_message=message,
        )


PLUGIN = CommandPlugin()
