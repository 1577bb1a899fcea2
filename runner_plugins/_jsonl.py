"""Stream helpers shared by the runner plugins: lines, a bounded tail, error classification, masked env."""

from __future__ import annotations

import json
import re
from typing import Any

from orchestrator.runner.plugin import AgentEvent
from orchestrator.runner.types import ErrorCategory

MAX_LINE_BYTES = 8 * 1024 * 1024
EVENT_TEXT_LIMIT = 64 * 1024


class LineBuffer:
    """Complete lines, split on the byte ``\\n`` before decoding (``0x0A`` is never inside a UTF-8 sequence split
    across reads); a line past ``max_line_bytes`` is dropped as it arrives, so memory stays bounded."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._skipping = False  # inside an oversized line: drop bytes until "\n"
        self.oversized_lines = 0

    @property
    def buffered(self) -> int:
        """Bytes currently held for an incomplete line (for tests and metrics)."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        view = memoryview(chunk)
        while (nl := chunk.find(b"\n", start)) >= 0:
            self._take(view[start:nl], lines, complete=True)
            start = nl + 1
        if start < len(chunk):
            self._take(view[start:], lines, complete=False)
        return lines

    def flush(self) -> list[str]:
        """Return the final line when the stream ended without a newline."""
        lines = [_decode(self._buf)] if self._buf and not self._skipping else []
        self._buf = bytearray()
        self._skipping = False
        return lines

    def _take(self, piece: memoryview, lines: list[str], *, complete: bool) -> None:
        if not self._skipping:
            if len(self._buf) + len(piece) > self.max_line_bytes:
                self.oversized_lines += 1
                self._skipping = True
                self._buf = bytearray()
            else:
                self._buf += piece
        if complete:
            if not self._skipping:
                lines.append(_decode(self._buf))
            self._buf = bytearray()
            self._skipping = False


def _decode(raw: bytes | bytearray) -> str:
    text = bytes(raw).decode("utf-8", errors="replace")
    return text[:-1] if text.endswith("\r") else text


def parse_object(line: str) -> dict[str, Any] | None:
    """A JSON object from one line, or ``None`` for blank, garbage or non-object lines."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class Tail:
    """The last ``limit`` bytes written; counts everything seen."""

    def __init__(self, limit: int = 64 * 1024) -> None:
        self.limit = limit
        self._buf = bytearray()
        self.total = 0

    def write(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._buf += chunk[-self.limit :]  # never more than the window of a large chunk
        del self._buf[: -self.limit]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._buf)

    def text(self) -> str:
        raw = bytes(self._buf)
        if self.truncated:
            # Drop a partial UTF-8 sequence cut at the front of the window.
            while raw and 0x80 <= raw[0] < 0xC0:
                raw = raw[1:]
        return raw.decode("utf-8", errors="replace")

    def last_lines(self, n: int = 20, max_chars: int = 2000) -> str:
        return "\n".join(self.text().rstrip().splitlines()[-n:])[-max_chars:]


def clip(value: Any, limit: int = EVENT_TEXT_LIMIT) -> Any:
    """Shorten long strings for event payloads (runner.jsonl), leaving other values alone."""
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"... [{len(value) - limit} more chars]"
    return value


def as_int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def dict_at(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """``obj[key]`` if it is a JSON object, else an empty one: a tool's output may lack any field."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def list_at(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    return value if isinstance(value, list) else []


_AUTH = re.compile(
    r"\b40[13]\b|unauthori[sz]ed|forbidden|authentication|invalid api key|incorrect api key|"
    r"api[ _]key|oauth token|not logged in|please run /login|permission_error",
    re.IGNORECASE,
)
_BAD_REQUEST = re.compile(
    r"\b40[04]\b|not_found_error|model .*not (found|supported)|invalid_request_error", re.IGNORECASE
)
_RATE = re.compile(
    r"\b429\b|\b529\b|rate[ _-]?limit|too many requests|usage limit|session limit|overloaded|quota",
    re.IGNORECASE,
)
_TRANSIENT_API = re.compile(
    r"\b50[0234]\b|api error|internal server error|connection reset|socket hang up|ECONNRESET|ECONNREFUSED|"
    r"ETIMEDOUT|ENETUNREACH|EAI_AGAIN|stream disconnected|network error|fetch failed",
    re.IGNORECASE,
)
_DOCKER = re.compile(
    r"connection refused|no such host|timeout|timed out|daemon|cannot connect|no such container|"
    r"OCI runtime|container .* is not running|out of memory|no space left",
    re.IGNORECASE,
)


def classify_status(status: int | None) -> tuple[ErrorCategory, bool] | None:
    """(category, retryable) for an HTTP status the tool reported, if it decides."""
    if status is None:
        return None
    if status in (429, 529) or status >= 500:
        return "api", True
    if status in (400, 401, 403, 404, 413, 422):
        return "api", False
    return None


def classify_api_text(text: str) -> tuple[ErrorCategory, bool]:
    """(category, retryable) for an error message the agent tool reported about its API."""
    for pattern, retryable in ((_AUTH, False), (_RATE, True), (_BAD_REQUEST, False), (_TRANSIENT_API, True)):
        if pattern.search(text):
            return "api", retryable
    return "api", False


# Claude Code: "No conversation found with session ID: <id>"; Codex: "thread/session not found: <id>".
_SESSION_GONE = re.compile(r"No conversation found with session ID|thread/session not found", re.I)


def session_gone(text: str) -> bool:
    """Whether the tool said it cannot find the session it was asked to resume."""
    return bool(_SESSION_GONE.search(text))


def classify_crash(exit_code: int | None, text: str) -> tuple[ErrorCategory, bool]:
    """(category, retryable) when the tool ended without reporting a result."""
    if _SESSION_GONE.search(text):
        # Resuming a session the tool cannot find: the runner starts a new one.
        return "session_corrupted", False
    if _AUTH.search(text):
        return "api", False
    if _RATE.search(text) or _TRANSIENT_API.search(text):
        return "api", True
    if _DOCKER.search(text) or exit_code in (137, 143):  # SIGKILL (OOM) / SIGTERM
        return "container", True
    return "container", False


def tool_use(tool_id: Any, name: Any, tool_input: Any) -> AgentEvent:
    return AgentEvent(kind="tool_use", data={"id": tool_id, "name": name, "input": tool_input})


def tool_result(tool_use_id: Any, content: Any, **fields: Any) -> AgentEvent:
    """``fields`` (``is_error``, ``exit_code``) go between the id and the content, in the order given."""
    return AgentEvent(kind="tool_result", data={"tool_use_id": tool_use_id, **fields, "content": content})


class SecretEnv(dict):
    """Environment mapping whose ``repr``/``str`` hide credential values."""

    def __init__(self, *args: Any, secret_keys: frozenset[str] = frozenset(), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.secret_keys = secret_keys

    def __repr__(self) -> str:
        shown = {k: ("***" if k in self.secret_keys else v) for k, v in self.items()}
        return f"SecretEnv({shown!r})"

    __str__ = __repr__


class JsonLinesParser:
    """Shared front half of the agent-stream parsers: bytes in, each complete line to ``_handle_line``."""

    def __init__(self, *, previous: dict[str, float] | None = None) -> None:
        self.previous = dict(previous or {})
        self._lines = LineBuffer()
        self._stderr = Tail(16 * 1024)
        self.final_events: list[AgentEvent] = []
        self.session_id: str | None = None
        self.model: str | None = None

    def feed(self, chunk: bytes) -> list[AgentEvent]:
        before = self._lines.oversized_lines
        events: list[AgentEvent] = []
        for line in self._lines.feed(chunk):
            events.extend(self._handle_line(line))
        if self._lines.oversized_lines != before:
            events.append(AgentEvent(kind="other", data={"skipped_oversized_lines": self._lines.oversized_lines}))
        return events

    def feed_stderr(self, chunk: bytes) -> None:
        self._stderr.write(chunk)

    def _handle_line(self, line: str) -> list[AgentEvent]:
        raise NotImplementedError
