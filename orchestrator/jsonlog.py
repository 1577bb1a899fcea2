"""Component logs: ``logs/<run_id>/{orchestration,runner,tui}.jsonl``.

One JSON object per line with ``timestamp, component, level, run_id, message``
and any extra fields; everything passes through the sanitizer first. Writes
are small appends to an unbuffered file, cheap enough for the event loop. A
write error (disk full) drops the line instead of failing the caller.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from .sanitize import Sanitizer, default_sanitizer


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ComponentLog:
    def __init__(self, path: str | Path | None, component: str, run_id: str | None = None,
                 sanitizer: Sanitizer | None = None, echo=None) -> None:
        self.path = Path(path) if path else None
        self.component = component
        self.run_id = run_id
        self.sanitizer = sanitizer or default_sanitizer()
        self._echo = echo  # optional callable(str) for debug mode (stderr)
        self._lock = threading.Lock()
        self._fh = None
        self.dropped = 0  # lines lost to write errors (disk full) since the last good write
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab", buffering=0)

    def log(self, level: str, message: str, **fields: Any) -> None:
        record = {"timestamp": utc_now_iso(), "component": self.component, "level": level,
                  "run_id": self.run_id, "message": message}
        record.update(fields)
        data = orjson.dumps(self.sanitizer.scrub(record), default=str) + b"\n"
        with self._lock:
            if self._fh is not None:
                try:
                    if self.dropped:
                        # an earlier write may have left a torn line: end it first
                        data = b"\n" + data
                    self._fh.write(data)
                    self.dropped = 0
                except OSError:
                    # Diagnostics only (the event log is the record): a full disk must
                    # not fail the task that tried to log. Lines are dropped and
                    # counted until writes succeed again.
                    self.dropped += 1
        if self._echo is not None:
            self._echo(data.decode("utf-8").rstrip("\n"))

    def debug(self, message: str, **fields: Any) -> None:
        self.log("debug", message, **fields)

    def info(self, message: str, **fields: Any) -> None:
        self.log("info", message, **fields)

    def warning(self, message: str, **fields: Any) -> None:
        self.log("warn", message, **fields)

    def error(self, message: str, **fields: Any) -> None:
        self.log("error", message, **fields)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
