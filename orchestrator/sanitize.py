"""One sanitizer for everything the product writes.

Every writer (event log, component logs, state snapshots, results files) passes
its data through :class:`Sanitizer`. It removes the spec's secret patterns and,
more importantly, the exact values of every secret the process knows about
(configured API keys and tokens), because a random token does not always look
like one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[REDACTED]"

SECRET_PATTERNS = [
    re.compile(r"(?i)(api|token|oauth|secret)[-_ ]?(key|token)\s*[:=]\s*[\w\-]{8,}"),
    re.compile(r"sk-[A-Za-z0-9_\-]{20,}"),
    re.compile(r"(?i)bearer\s+[A-Za-z0-9_\-.=]{16,}"),
]

# Environment variables whose values are secrets wherever they appear.
SECRET_ENV_VARS = (
    "ANTHROPIC_API_KEY",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
)
_SECRET_NAME = re.compile(r"(?i)(api[_-]?key|token|secret|password)")
_MIN_SECRET_LEN = 6


class Sanitizer:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self._regex: re.Pattern[str] | None = None
        self.add_secrets(secrets)

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> Sanitizer:
        environ = dict(os.environ if environ is None else environ)
        values = [v for k, v in environ.items() if k in SECRET_ENV_VARS or (_SECRET_NAME.search(k) and k.startswith(("ORCHESTRATOR_", "ANTHROPIC_", "OPENAI_", "CLAUDE_")))]
        return cls(values)

    def add_secrets(self, secrets: Iterable[str]) -> None:
        for s in secrets:
            if isinstance(s, str) and len(s) >= _MIN_SECRET_LEN:
                self._secrets.add(s)
        if self._secrets:
            # Longest first so a secret that contains another is removed whole.
            alts = sorted(self._secrets, key=len, reverse=True)
            self._regex = re.compile("|".join(re.escape(s) for s in alts))

    def scrub_text(self, text: str) -> str:
        if self._regex is not None:
            text = self._regex.sub(REDACTED, text)
        for pat in SECRET_PATTERNS:
            text = pat.sub(REDACTED, text)
        return text

    def scrub(self, obj: Any) -> Any:
        """Return a copy of ``obj`` (JSON-like) with every string scrubbed."""
        if isinstance(obj, str):
            return self.scrub_text(obj)
        if isinstance(obj, dict):
            return {self.scrub(k) if isinstance(k, str) else k: self.scrub(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.scrub(v) for v in obj]
        return obj

    def scrub_bytes(self, data: bytes) -> bytes:
        return self.scrub_text(data.decode("utf-8", "replace")).encode("utf-8")


_default = Sanitizer.from_environ()


def default_sanitizer() -> Sanitizer:
    """The process-wide sanitizer; the CLI adds configured secrets to it at start."""
    return _default
