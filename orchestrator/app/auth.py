"""Credential selection: which secret each plugin gets, or a clear error."""

from __future__ import annotations

from ..runner import AuthConfig, RunnerPlugin


def resolve_auth(
    environ: dict[str, str], *, plugin: RunnerPlugin, mode: str | None = None, dry_run: bool = False
) -> AuthConfig:
    """Credentials for ``plugin`` from ``environ`` (process env over ``.env``), by the plugin's own ``resolve_auth``;
    none for a dry run or a plugin that needs none (``command``)."""
    if dry_run or not plugin.capabilities.auth_env:
        return AuthConfig(openai_base_url=environ.get("OPENAI_BASE_URL") or None)
    return plugin.resolve_auth(environ, mode=mode)
