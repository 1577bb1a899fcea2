"""A third agent plugin, outside the package: what a new agent CLI takes.

It is registered by configuration only (``runner.plugin_modules: {toy:
toy_plugin}``); nothing in orchestrator/ names it. Its "agent" is a shell line
that writes the prompt into a file and commits it, and answers one line.
"""

from __future__ import annotations

import shlex

from orchestrator.runner.plugin import AgentEvent, AgentOutcome, PluginCapabilities
from orchestrator.runner.types import AuthConfig, InstanceRequest


class ToyPlugin:
    name = "toy"
    capabilities = PluginCapabilities(
        supports_resume=False,
        supports_token_counts=False,
        supports_streaming_events=False,
        auth_methods=(),
        image_tools=("git",),
    )

    def resolve_auth(self, environ: dict[str, str], *, mode: str | None) -> AuthConfig:
        return AuthConfig()

    def known_models(self) -> dict[str, str] | None:
        return {"toy-1": "toy-1"}

    def validate_environment(self, auth: AuthConfig) -> None:
        return None

    def prepare_environment(self, auth: AuthConfig, request: InstanceRequest) -> dict[str, str]:
        return {}

    def build_command(self, request: InstanceRequest, *, resume_session_id: str | None) -> list[str]:
        script = (
            f"printf '%s\\n' {shlex.quote(request.prompt)} > toy.txt && git add toy.txt && "
            "git -c user.name=toy -c user.email=toy@example.com commit -qm 'toy: wrote the prompt' && "
            "echo 'toy wrote toy.txt'"
        )
        return ["/bin/sh", "-c", script]

    def new_parser(self, *, previous: dict[str, float] | None = None) -> ToyParser:
        return ToyParser()


class ToyParser:
    def __init__(self) -> None:
        self._out = bytearray()

    def feed(self, chunk: bytes) -> list[AgentEvent]:
        self._out += chunk
        return []

    def finish(self, exit_code: int | None) -> AgentOutcome:
        text = self._out.decode("utf-8", "replace").strip()
        if exit_code != 0:
            return AgentOutcome(
                final_message=text, exit_code=exit_code, is_error=True, error_message=text or "toy failed"
            )
        return AgentOutcome(final_message=text, exit_code=0)


PLUGIN = ToyPlugin()
