"""One sanitizer for everything the product writes: text shaped like a secret, and the exact values and encodings
of every secret the process knows (a random token does not always look like one); :func:`plain_text` for output."""

from __future__ import annotations

import base64
import binascii
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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


def _base64_cores(secret: bytes) -> set[str]:
    """Substrings every base64 encoding of ``secret`` contains, whatever bytes come before it: ``prefix + secret``
    shifts the secret by 0, 1 or 2 bytes within base64's 3-byte groups, and for each shift the characters that depend
    only on the secret's bytes are the same in every such encoding."""
    cores = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + secret).decode()
        core = encoded[{0: 0, 1: 2, 2: 3}[shift] : (len(secret) + shift) // 3 * 4]
        cores.add(core)
        cores.add(core.replace("+", "-").replace("/", "_"))
    return cores


def encoded_forms(secret: str) -> dict[str, str]:
    """Encodings of ``secret`` to look for, each with its name: base64 (both alphabets), hex, percent."""
    raw = secret.encode()
    forms = {core: "base64" for core in _base64_cores(raw)}
    hexed = binascii.hexlify(raw).decode()
    forms[hexed] = forms[hexed.upper()] = "hex"
    quoted = urllib.parse.quote(secret, safe="")
    if quoted != secret:
        forms[quoted] = "percent-encoded"
    return forms


class Sanitizer:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self._regex: re.Pattern[str] | None = None
        self.add_secrets(secrets)

    def add_secrets(self, secrets: Iterable[str]) -> None:
        for s in secrets:
            if isinstance(s, str) and len(s) >= _MIN_SECRET_LEN:
                self._secrets.add(s)
                self._secrets.update(f for f in encoded_forms(s) if len(f) >= _MIN_SECRET_LEN)
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
        """Return a copy of ``obj`` (JSON-like) with every string scrubbed, keys included."""
        return _each_string(obj, self.scrub_text, keys=True)


def _each_string(obj: Any, fn: Callable[[str], str], *, keys: bool) -> Any:
    """A copy of ``obj`` (JSON-like) with ``fn`` applied to every string value (and key, with ``keys``)."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {fn(k) if keys and isinstance(k, str) else k: _each_string(v, fn, keys=keys) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_each_string(v, fn, keys=keys) for v in obj]
    return obj


_SECRET_PREFIXES = ("ORCHESTRATOR_", "ANTHROPIC_", "OPENAI_", "CLAUDE_")
_default = Sanitizer(
    v
    for k, v in os.environ.items()
    if k in SECRET_ENV_VARS or (_SECRET_NAME.search(k) and k.startswith(_SECRET_PREFIXES))
)


def default_sanitizer() -> Sanitizer:
    """The process-wide sanitizer; the CLI adds configured secrets to it at start."""
    return _default


# ESC and what follows it: a CSI sequence (colours, cursor moves, erases), an OSC string
# ended by BEL or ST (titles, hyperlinks), a DCS/SOS/PM/APC string ended by ST, or a
# two-character escape (charset, keypad mode); a lone ESC (its sequence cut off) too.
_ESCAPE = r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[PX^_][^\x1b]*\x1b\\|[ -/]*[0-~])?"
# CSI as the one C1 character U+009B: text only (in bytes, 0x9b is a UTF-8 continuation byte).
_TERMINAL_CODES = re.compile(_ESCAPE + r"|\x9b[0-?]*[ -/]*[@-~]")
_TERMINAL_CODES_BYTES = re.compile(_ESCAPE.encode())


def plain_text(text: str) -> str:
    """``text`` without terminal escape sequences: what a reader of the terminal saw, less the colours."""
    return _TERMINAL_CODES.sub("", text) if ("\x1b" in text or "\x9b" in text) else text


def plain_bytes(data: bytes) -> bytes:
    """:func:`plain_text` for raw output (a tail of it may start inside a character)."""
    return _TERMINAL_CODES_BYTES.sub(b"", data) if b"\x1b" in data else data


def plain(obj: Any) -> Any:
    """A copy of ``obj`` (JSON-like) with every string value made plain (:func:`plain_text`)."""
    return _each_string(obj, plain_text, keys=False)


def redact_url(url: str | None) -> str:
    """A host URL fit for logs: any password and query string are replaced."""
    if not url:
        return "local engine"
    parts = urlsplit(url)
    netloc = parts.netloc
    if ":" not in netloc.rpartition("@")[0] and not parts.query and not parts.fragment:
        return url  # nothing secret-looking; urlunsplit would also turn unix:/// into unix:/
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hostport}" if ":" in userinfo else f"{user}@{hostport}"
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
