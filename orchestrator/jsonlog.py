"""Component logs: ``logs/<run_id>/{orchestration,runner,tui}.jsonl``, one sanitized JSON object per line.

Unbuffered small appends are cheap enough for the event loop; a write error (disk full) drops the line instead of
failing the caller. Rotated by size (:func:`configure`), or a long run's debug log grows without bound."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import queue
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from .sanitize import Sanitizer, default_sanitizer


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_settings: dict[str, Any] = {"max_bytes": 64 * 1024 * 1024, "backups": 3, "echo": False}


class _Echo:
    """``--debug``'s copy of every line on stderr, written by a thread of its own: a stderr nobody reads (a full pipe)
    would block the event loop in ``write``. Lines wait in a bounded queue; past its size they are counted, and the
    count is echoed once stderr drains. One writer also keeps each line whole while many threads log at once."""

    LIMIT = 10_000

    def __init__(self) -> None:
        self._queue: queue.Queue[bytes] = queue.Queue(self.LIMIT)
        self._dropped = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, data: bytes) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._write, name="debug-echo", daemon=True)
                    self._thread.start()
                    atexit.register(self.drain, 2.0)
        try:
            self._queue.put_nowait(data)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def _write(self) -> None:
        while True:
            data = self._queue.get()
            if self._queue.empty() and self._dropped:
                with self._lock:
                    dropped, self._dropped = self._dropped, 0
                note = {"timestamp": utc_now_iso(), "component": "debug-echo", "level": "warn"}
                note["message"] = f"{dropped} lines were not echoed: stderr was not being read"
                data += orjson.dumps(note) + b"\n"
            try:
                sys.stderr.write(data.decode("utf-8"))
                sys.stderr.flush()
            except (OSError, ValueError):
                pass  # stderr closed: the files keep every line
            finally:
                self._queue.task_done()

    def drain(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until every queued line is written (at exit, and for tests)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)


echo = _Echo()


def configure(*, max_bytes: int, backups: int, echo: bool) -> None:
    """Process-wide defaults: rotation size (0 = never), backups kept, and whether every line is echoed to stderr."""
    _settings.update(max_bytes=max_bytes, backups=backups, echo=echo)


class ComponentLog:
    def __init__(
        self,
        path: str | Path | None,
        component: str,
        run_id: str | None = None,
        sanitizer: Sanitizer | None = None,
        *,
        max_bytes: int | None = None,
        backups: int | None = None,
    ) -> None:
        self.path = Path(path) if path else None
        self.component = component
        self.run_id = run_id
        self.sanitizer = sanitizer or default_sanitizer()
        self.max_bytes = _settings["max_bytes"] if max_bytes is None else max_bytes
        self.backups = _settings["backups"] if backups is None else backups
        self._lock = threading.Lock()
        self._fh = None
        self._size = 0
        self.dropped = 0  # lines lost to write errors (disk full) since the last good write
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115  (held open for the log's lifetime)
            self._size = self._fh.tell()

    def _rotate(self) -> None:
        """Called with the lock held, after a write took the file past ``max_bytes``."""
        assert self.path is not None and self._fh is not None
        self._fh.close()
        self._fh = None
        with contextlib.suppress(OSError):  # else: keep appending to the same file rather than lose lines
            if self.backups <= 0:
                os.unlink(self.path)
            else:
                for n in range(self.backups - 1, 0, -1):
                    older = self.path.with_name(f"{self.path.name}.{n}")
                    if older.exists():
                        os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115  (held open until the next rotation)
        self._size = self._fh.tell()

    def log(self, level: str, message: str, **fields: Any) -> None:
        record = {
            "timestamp": utc_now_iso(),
            "component": self.component,
            "level": level,
            "run_id": self.run_id,
            "message": message,
        }
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
                    self._size += len(data)
                    if 0 < self.max_bytes <= self._size:
                        self._rotate()
                except OSError:
                    # Diagnostics only (the event log is the record): a full disk must
                    # not fail the task that tried to log. Lines are dropped and
                    # counted until writes succeed again.
                    self.dropped += 1
        if _settings["echo"]:
            echo.put(data.lstrip(b"\n"))

    debug = functools.partialmethod(log, "debug")
    info = functools.partialmethod(log, "info")
    warning = functools.partialmethod(log, "warn")
    error = functools.partialmethod(log, "error")

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
