"""The event log: one writer per run, any number of readers (docs/events.md, docs/architecture.md).

``EventLog.append()``/``write()`` are synchronous and cheap (encode + buffer), so strategy code
and the engine never wait on disk; a flusher task writes and fsyncs batches in a worker thread,
and ``await flush()`` returns once everything appended so far is on disk. Readers align to the
next newline when an offset lands mid-line and ignore a torn last line until its newline arrives.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import msgspec
import orjson

from ..errors import RunLockedError
from .events import (
    EVENT_TYPES,
    Envelope,
    Event,
    EventPayload,
    PayloadMismatch,
    decode_envelope,
    decode_line,
    decode_payload,
    encode_line,
    new_event_id,
    payload_dict,
    type_of,
    utc_ts,
)

_log = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"


# ---------------------------------------------------------------- writer lock


class WriterLock:
    """``events.jsonl.lock``: metadata ``{pid, hostname, started_at_iso}`` plus an OS lock.

    The OS lock (fcntl/msvcrt) is authoritative: it dies with its process, so a
    dead holder's lock is simply taken over. The metadata says who holds it.
    Not ``filelock``: it opens the lock file with ``O_TRUNC`` on every attempt,
    so a probe (:meth:`is_held`, ``--resume`` of a live run) would erase the
    live holder's metadata that the refusal message reports.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @staticmethod
    def read_meta(path: Path) -> dict[str, Any] | None:
        try:
            return orjson.loads(path.read_bytes() or b"null")
        except (OSError, orjson.JSONDecodeError):
            return None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _os_lock(fd)
        except OSError:
            os.close(fd)
            meta = self.read_meta(self.path) or {}
            raise RunLockedError(
                f"run log {self.path.parent.name} is in use by another process "
                f"(pid {meta.get('pid', '?')} on {meta.get('hostname', '?')}, since {meta.get('started_at_iso', '?')}); "
                "wait for it to finish or stop it first"
            ) from None
        meta = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "started_at_iso": datetime.now(UTC).isoformat(timespec="milliseconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, orjson.dumps(meta), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the OS lock
            self._fd = None

    @classmethod
    def is_held(cls, path: Path) -> bool:
        """True when a live process holds the lock (used by --resume pre-flight)."""
        if not path.exists():
            return False
        fd = os.open(path, os.O_RDWR)
        try:
            _os_lock(fd)
        except OSError:
            return True
        finally:
            os.close(fd)  # also releases our probe lock
        return False


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _os_lock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
else:
    import fcntl

    def _os_lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


# ---------------------------------------------------------------- writer


class EventLog:
    """Single writer of one run's ``events.jsonl``: ``async with EventLog(path, run_id=...) as log:``.

    The log is drained and fsynced on exit, also when the surrounding scope is cancelled (Ctrl+C).
    """

    def __init__(
        self,
        path: Path,
        *,
        run_id: str,
        flush_policy: str = "interval",
        interval_ms: int = 50,
        max_batch: int = 256,
        sanitizer=None,
    ) -> None:
        if flush_policy not in ("interval", "per_event"):
            raise ValueError(f"flush policy must be 'interval' or 'per_event', not {flush_policy!r}")
        self.path = Path(path)
        self.run_id = run_id
        self.flush_policy = flush_policy
        self.interval = interval_ms / 1000
        self.max_batch = max_batch
        self.sanitizer = sanitizer
        self._lock = WriterLock(self.path.with_name(self.path.name + LOCK_SUFFIX))
        self._fh: io.FileIO | None = None
        self._buffer: list[bytes] = []
        self._end = 0  # offset after the last appended (not necessarily written) byte
        self._durable = 0  # offset up to which the file is fsynced
        self._wake = anyio.Event()
        self._write_lock = anyio.Lock()
        self._closed = False
        self._error: BaseException | None = None

    # -- lifecycle
    def open_sync(self) -> None:
        self._lock.acquire()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Unbuffered: a failed write leaves nothing queued in a Python buffer
            # that a later flush or close() could append after the cut below.
            fh = open(self.path, "ab+", buffering=0)  # noqa: SIM115  (held open for the log's lifetime; close() closes it)
            size = fh.seek(0, os.SEEK_END)
            if size:
                # A crash can leave a torn last line; cut it so every line we
                # append starts at a clean boundary and offsets stay exact.
                good = _last_complete_offset(fh, size)
                if good != size:
                    fh.truncate(good)
                    size = good
            self._fh = fh
            self._end = self._durable = size
        except BaseException:
            self._lock.release()
            raise

    async def __aenter__(self) -> EventLog:
        await anyio.to_thread.run_sync(self.open_sync)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._flusher)
        return self

    async def __aexit__(self, *exc) -> bool:
        self._closed = True
        self._wake.set()
        try:
            await self._tg.__aexit__(*exc)
        finally:
            # Drain whatever is left, even when the run is being cancelled (Ctrl+C).
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(OSError):  # already recorded; the run reports the failed write
                    await self._write_locked()
            if self._fh is not None:
                self._fh.close()
            self._lock.release()
        return False

    # -- appending
    def append(
        self, event_type: str, *, strategy_execution_id: str, payload: Mapping[str, Any], key: str | None = None
    ) -> tuple[int, str, dict[str, Any]]:
        """Buffer one event whose payload is a JSON object, written as it is (scrubbed): tools, tests.

        Returns ``(start_offset, ts, payload as written)``; never blocks. The engine uses :meth:`write`.
        """
        if event_type not in EVENT_TYPES:
            raise ValueError(f"not a public event type: {event_type}")
        fields = payload_dict(payload)
        if self.sanitizer is not None:
            fields = self.sanitizer.scrub(fields)
        offset, ts = self._buffer_line(event_type, strategy_execution_id, fields, key)
        return offset, ts, fields

    def write(
        self, payload: EventPayload, *, strategy_execution_id: str, key: str | None = None
    ) -> tuple[int, str, EventPayload]:
        """Buffer one event given as its payload struct; returns ``(start_offset, ts, payload as written)``.

        What is returned is the line's payload read back (secrets scrubbed), so
        the caller folds exactly what a replay will read. A payload that would
        not read back (a producer put a value of another type in a field) is
        refused with ValueError before anything is buffered. Never blocks.
        """
        event_type = type_of(payload)
        fields = payload_dict(payload)
        if self.sanitizer is not None:
            fields = self.sanitizer.scrub(fields)
        try:
            written = decode_payload(event_type, fields)
        except PayloadMismatch as exc:
            raise ValueError(f"refused to write it: {exc}") from None
        assert written is not None
        offset, ts = self._buffer_line(event_type, strategy_execution_id, fields, key)
        return offset, ts, written

    def _buffer_line(
        self, event_type: str, strategy_execution_id: str, fields: dict[str, Any], key: str | None
    ) -> tuple[int, str]:
        if self._error is not None:
            raise self._error
        ts = utc_ts()
        offset = self._end
        line = encode_line(
            event_type,
            ts=ts,
            run_id=self.run_id,
            strategy_execution_id=strategy_execution_id,
            start_offset=offset,
            payload=fields,
            key=key,
            event_id=new_event_id(),
        )
        self._buffer.append(line)
        self._end += len(line)
        if len(self._buffer) == 1 or len(self._buffer) >= self.max_batch or self.flush_policy == "per_event":
            self._wake.set()
        return offset, ts

    async def flush(self) -> None:
        """Wait until every event appended so far is written and fsynced.

        Works without the flusher task (it may already be cancelled during a
        Ctrl+C shutdown): the caller writes the batch itself under the lock.
        """
        target = self._end
        while self._durable < target:
            await self._write_locked()

    async def _write_locked(self) -> None:
        if self._error is not None:
            raise self._error
        async with self._write_lock:
            if self._buffer:
                try:
                    await anyio.to_thread.run_sync(self._write_batch)
                except OSError as exc:  # disk full, I/O error: every later append/flush sees it
                    self._error = exc
                    raise

    def _write_batch(self) -> None:
        """Write and fsync everything buffered (runs in a worker thread)."""
        batch, self._buffer = self._buffer, []
        fh = self._fh
        assert fh is not None, "event log is not open"
        chunks = batch if self.flush_policy == "per_event" else [b"".join(batch)]
        try:
            for data in chunks:
                view = memoryview(data)
                while view:
                    view = view[fh.write(view) :]
                os.fsync(fh.fileno())
                self._durable += len(data)
        except OSError:
            # Disk full or I/O error: cut whatever part of the batch reached the
            # file, so the log ends on a whole line at the last durable offset.
            with contextlib.suppress(OSError):
                os.ftruncate(fh.fileno(), self._durable)
            raise

    async def _flusher(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake = anyio.Event()
            if self.flush_policy == "interval" and not self._closed and len(self._buffer) < self.max_batch:
                # Let a batch build up: at most interval_ms or max_batch events.
                with anyio.move_on_after(self.interval):
                    while len(self._buffer) < self.max_batch and not self._closed:
                        await self._wake.wait()
                        self._wake = anyio.Event()
            try:
                await self._write_locked()
            except OSError:
                return  # recorded in self._error; appenders and flush() raise it


def _last_complete_offset(fh, size: int) -> int:
    """Offset just after the last newline in the file (0 if none)."""
    pos = size
    chunk = 65536
    while pos > 0:
        start = max(0, pos - chunk)
        fh.seek(start)
        data = fh.read(pos - start)
        idx = data.rfind(b"\n")
        if idx != -1:
            return start + idx + 1
        pos = start
    return 0


# ---------------------------------------------------------------- readers


def iter_lines(path: Path, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """Yield ``(start_offset, line)`` for every complete line from ``offset``.

    An offset inside a line is aligned forward to the next line start; a last
    line without its newline (a write in progress or a crash) is not yielded.
    """
    with open(path, "rb") as fh:
        if offset > 0:
            fh.seek(offset - 1)
            if fh.read(1) != b"\n":
                fh.readline()  # skip the rest of the line we landed in
        pos = fh.tell()
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                return
            last_nl = chunk.rfind(b"\n")
            if last_nl == -1:
                # no complete line in this chunk; read until newline or EOF
                rest = fh.readline()
                if not rest.endswith(b"\n"):
                    return
                chunk += rest
                last_nl = len(chunk) - 1
            elif last_nl != len(chunk) - 1:
                fh.seek(pos + last_nl + 1)
            start = 0
            body = chunk[: last_nl + 1]
            for line in body.splitlines(keepends=True):
                yield pos + start, line
                start += len(line)
            pos += last_nl + 1


class SkippedLine(NamedTuple):
    """A complete line of the log that is not an event (a corrupt or hand-edited line)."""

    offset: int
    reason: str


class TypedEvent(NamedTuple):
    """An event (its payload still JSON) and its payload struct (None: a type this version does not know)."""

    offset: int
    event: Envelope
    payload: EventPayload | None


class LogReader:
    """The one way every consumer reads an event log: the fold, resume, replay, the TUI, reports.

    A complete line that is not an event (or whose payload does not match its type) is skipped, so
    one bad line cannot stop a run from being read; but never silently: each one is logged and
    kept in ``skipped``, for ``--show-run`` and ``--resume`` to say so.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.skipped: list[SkippedLine] = []

    def _skip(self, offset: int, reason: str) -> None:
        if not any(s.offset == offset for s in self.skipped):
            self.skipped.append(SkippedLine(offset, reason))
            _log.warning("%s: the line at byte %d is not an event and was skipped: %s", self.path, offset, reason)

    def decode(self, offset: int, line: bytes) -> Event | None:
        try:
            return decode_line(line)
        except msgspec.DecodeError as exc:
            self._skip(offset, str(exc))
            return None

    def typed(self, offset: int, line: bytes) -> TypedEvent | None:
        """The event on ``line`` with its payload struct; None (skipped and counted) if it has neither."""
        try:
            ev = decode_envelope(line)
            return TypedEvent(offset, ev, decode_payload(ev.type, ev.payload))
        except (msgspec.DecodeError, PayloadMismatch) as exc:
            self._skip(offset, str(exc))
            return None

    def events(self, offset: int = 0, *, until: int | None = None) -> Iterator[tuple[int, Event]]:
        """``(start_offset, event)`` for every complete, decodable line from ``offset`` (to ``until``), payloads as JSON."""
        for start, line in self._lines(offset, until):
            ev = self.decode(start, line)
            if ev is not None:
                yield start, ev

    def records(self, offset: int = 0, *, until: int | None = None) -> Iterator[TypedEvent]:
        """Every event from ``offset`` (to ``until``) with its payload struct: what the consumers read."""
        for start, line in self._lines(offset, until):
            rec = self.typed(start, line)
            if rec is not None:
                yield rec

    def records_at(self, offsets: Iterable[int]) -> Iterator[TypedEvent]:
        """The events that start at ``offsets`` (offsets the fold recorded, such as a task's result), in that order."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            for offset in offsets:
                fh.seek(offset)
                rec = self.typed(offset, fh.readline())
                if rec is not None:
                    yield rec

    def _lines(self, offset: int, until: int | None) -> Iterator[tuple[int, bytes]]:
        if not self.path.exists():
            return
        for start, line in iter_lines(self.path, offset):
            if until is not None and start > until:
                return
            yield start, line


def skipped_lines(path: str | Path) -> list[SkippedLine]:
    """Read the whole log once and return the lines the consumers skip (empty: the log is sound)."""
    reader = LogReader(path)
    for _ in reader.records():
        pass
    return reader.skipped


def describe_skipped(path: str | Path, skipped: list[SkippedLine]) -> str:
    """One line for a user about lines a log reader skipped."""
    first = skipped[0]
    more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
    return (
        f"warning: {path}: {len(skipped)} line(s) are not events and were skipped, "
        f"first at byte {first.offset}{more}: {first.reason}; what they recorded is missing from this view"
    )


def read_events(path: Path, offset: int = 0) -> Iterator[Event]:
    """Decode every complete event from ``offset``; a line that does not decode is skipped and logged."""
    for _, ev in LogReader(path).events(offset):
        yield ev


def get_events_since(
    run_id: str,
    offset: int | None = None,
    since_ts: str | None = None,
    types: Iterable[str] | None = None,
    limit: int | None = None,
    *,
    logs_dir: str | Path = "logs",
) -> list[dict[str, Any]]:
    """Historical events of a run, as dicts, filtered by offset, timestamp and type."""
    path = Path(logs_dir) / run_id / "events.jsonl"
    wanted = set(types) if types else None
    out: list[dict[str, Any]] = []
    for ev in read_events(path, offset or 0):
        if wanted is not None and ev.type not in wanted:
            continue
        if since_ts is not None and ev.ts < since_ts:
            continue
        out.append(msgspec.to_builtins(ev))
        if limit is not None and len(out) >= limit:
            break
    return out


async def subscribe(
    path: str | Path, offset: int = 0, *, poll_interval: float = 0.05, stop: anyio.Event | None = None
) -> AsyncIterator[Event]:
    """Follow a (possibly live) event log from ``offset``, yielding events as they land.

    One file watcher (inotify/kqueue through watchfiles) wakes the reader within
    ``poll_interval`` of a change, and notices ``stop`` as quickly; without a
    change it reads the log only once a second (in case a notification was
    lost). Where notifications are unavailable the log is read every
    ``poll_interval`` seconds.
    """
    reader = LogReader(path)
    pos = offset

    def read_new() -> list[tuple[int, bytes]]:
        return list(iter_lines(reader.path, pos)) if reader.path.exists() else []

    async for _ in _wakeups(reader.path.parent, poll_interval, stop):
        for start, line in await anyio.to_thread.run_sync(read_new):
            pos = start + len(line)
            ev = reader.decode(start, line)
            if ev is not None:
                yield ev
        if stop is not None and stop.is_set():
            return


# Without a notification the followed log is read anyway this often: a lost
# notification (an overflowed inotify queue, say) delays an event by at most this.
_SAFETY_READ_MS = 1000


async def _wakeups(directory: Path, poll_interval: float, stop: anyio.Event | None) -> AsyncIterator[None]:
    yield None
    try:
        import watchfiles

        if not await anyio.Path(directory).exists():
            raise FileNotFoundError(directory)
        # The watcher's thread wakes every `step` ms to look for changes and for
        # `stop`; a read with no change costs a thread hop. At 5 ms and a read every
        # 50 ms, following an idle run cost 0.05 CPU-s a second; now 0.01.
        step = max(1, int(poll_interval * 1000))
        async for _ in watchfiles.awatch(
            directory,
            stop_event=stop,
            debounce=step,
            step=step,
            yield_on_timeout=True,
            rust_timeout=max(step, _SAFETY_READ_MS),
        ):
            yield None
    except (ImportError, OSError, RuntimeError):
        while stop is None or not stop.is_set():
            await anyio.sleep(poll_interval)
            yield None
    yield None  # one last read after stop
