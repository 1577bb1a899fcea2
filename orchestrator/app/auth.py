"""Credential selection: which secret each plugin gets, or a clear error."""

from __future__ import annotations

from ..errors import PreflightError
from ..runner.types import AuthConfig


def resolve_auth(environ: dict[str, str], *, plugin: str, mode: str | None = None, dry_run: bool = False) -> AuthConfig:
    """Pick credentials for ``plugin`` from ``environ`` (process env over ``.env``).

    claude-code: ``--mode api`` uses ``ANTHROPIC_API_KEY`` (with optional
    ``ANTHROPIC_BASE_URL``); otherwise an OAuth token means subscription mode, an
    API key alone means API mode. codex: ``OPENAI_API_KEY`` (+ ``OPENAI_BASE_URL``).
    A dry run and the ``command`` plugin need none.
    """
    oauth = environ.get("CLAUDE_CODE_OAUTH_TOKEN") or None
    api_key = environ.get("ANTHROPIC_API_KEY") or None
    base_url = environ.get("ANTHROPIC_BASE_URL") or None
    openai_key = environ.get("OPENAI_API_KEY") or None
    openai_url = environ.get("OPENAI_BASE_URL") or None
    if dry_run or plugin == "command":
        return AuthConfig(openai_base_url=openai_url)
    if plugin == "codex":
        if not openai_key:
            raise PreflightError("no credentials for codex: set OPENAI_API_KEY (or use --dry-run to rehearse)")
        return AuthConfig(openai_api_key=openai_key, openai_base_url=openai_url)
    if mode == "api":
        if not api_key:
            raise PreflightError(
                "--mode api needs ANTHROPIC_API_KEY (optionally ANTHROPIC_BASE_URL for a custom endpoint)"
            )
        return AuthConfig(api_key=api_key, base_url=base_url, openai_api_key=openai_key)
    if mode == "subscription":
        if not oauth:
            raise PreflightError("--mode subscription needs CLAUDE_CODE_OAUTH_TOKEN (from `claude setup-token`)")
        return AuthConfig(oauth_token=oauth, openai_api_key=openai_key)
    if oauth:
        return AuthConfig(oauth_token=oauth, openai_api_key=openai_key)
    if api_key:
        return AuthConfig(api_key=api_key, base_url=base_url, openai_api_key=openai_key)
    raise PreflightError(
        "no credentials: set CLAUDE_CODE_OAUTH_TOKEN (subscription) or ANTHROPIC_API_KEY (API), "
        "in the environment or in ./.env; or rehearse with --dry-run"
    )
