"""One ``docker exec`` of the agent, streamed into the plugin's parser.

The exec is started on the daemon's hijacked connection (``socket=True``) so the prompt can be
written to stdin (prompts over ~100 KB do not fit on a command line); frames of Docker's multiplexed
stream are read one at a time on a worker thread, each :class:`AgentEvent` forwarded as it arrives.
On cancellation (task timeout or Ctrl+C) the output is read on while the process is ended: the lines
an agent writes last, and on a loaded machine even its first (the one naming its session), may not
have been read yet, and a resume without the session pays for the work again. A task's output enters
the process here, so its terminal codes are taken out here, once (docs/cli.md, "Output without
terminal codes").
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket as pysocket
import struct
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import msgspec

from ..errors import AgentStreamLostError, ContainerError
from ..sanitize import plain, plain_bytes, plain_text
from .plugin import AgentEvent, AgentOutcome, StreamParser
from .types import WORKSPACE_MOUNT

if TYPE_CHECKING:
    from .docker_containers import DockerHost

_log = logging.getLogger(__name__)  # runner.jsonl (the Docker runner forwards orchestrator.runner records)
EROFS_MARKER = b"Read-only file system"
TAIL_BYTES = 8192
STDOUT, STDERR = 1, 2
# The wrapper's last stderr line (docker_agent.AGENT_WRAPPER_SCRIPT): files the agent
# left uncommitted, or "-" when not counted. Taken out of the stream before the
# parser or the stderr tail sees it, so the task's output reads as without the wrapper.
END_PREFIX = b"\n@@orchestrator-end="
END_LINE = re.compile(re.escape(END_PREFIX) + rb"(\d+|-)\n")
# How long a cancelled exec's output is read on while ``on_cancel`` ends the
# process: an agent's grace to exit (docker_core.AGENT_STOP_GRACE_S) and a margin.
DRAIN_S = 15.0
# Once ``on_cancel`` has returned, the process has exited (or will not): its last
# frames are in flight, not still being written.
DRAIN_AFTER_END_S = 2.0


@dataclass
class ExecOutput:
    outcome: AgentOutcome
    exit_code: int | None
    stderr_tail: bytes = b""
    stdout_tail: bytes = b""
    saw_erofs: bool = False
    events: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # Files the agent left uncommitted, as the wrapper counted them once it exited
    # (None: not counted, no wrapper, or it did not get to its last line).
    uncommitted: int | None = None
    # The wrapper's last line arrived: the engine passed on the whole output.
    ended: bool = False


def _raw_socket(sock: Any) -> Any:
    return getattr(sock, "_sock", sock)


class StreamBroken(Exception):
    """The output stream ended in a connection error or mid-frame, not cleanly between frames."""


def _read_frame(sock: Any, pending: bytearray | None = None) -> tuple[int, bytes] | None:
    """Next (stream, payload) of the multiplexed stream, ``pending`` (:func:`take_buffered`) first;
    None at a clean end between frames. A reset or a cut frame raises :class:`StreamBroken`, so it
    is reported instead of passing for a complete answer. (docker-py internals: pyproject pins
    docker below 8 and tests/test_docker_exec.py checks they are still there.)"""
    from docker.utils.socket import SocketError, read_exactly

    def exactly(n: int) -> bytes:
        got = b""
        if pending:
            got = bytes(pending[:n])
            del pending[:n]
        return got + read_exactly(sock, n - len(got)) if len(got) < n else got

    try:
        try:
            header = exactly(8)
        except SocketError:  # the stream ended before another frame began
            return None
        stream, size = struct.unpack(">BxxxL", header)
        return stream, (exactly(size) if size else b"")
    except (SocketError, OSError, ValueError, struct.error) as exc:
        raise StreamBroken(str(exc) or type(exc).__name__) from exc


def take_buffered(sock: Any) -> bytearray:
    """The exec's output that arrived with the response's headers, taken without waiting for more.

    docker-py hands over the socket from under the HTTP response's buffered reader, which read the
    headers and whatever else had arrived: on a loaded machine, the command's first lines. Reading
    the socket alone lost them (a command's first three lines, in a six-worker test run).
    """
    fp: Any = getattr(getattr(getattr(getattr(sock, "_response", None), "raw", None), "_fp", None), "fp", None)
    raw = _raw_socket(sock)
    if not hasattr(fp, "peek") or not hasattr(raw, "setblocking"):
        return bytearray()
    timeout = raw.gettimeout()
    raw.setblocking(False)  # peek reads the socket only when the reader holds nothing: never wait there
    try:
        held = fp.peek()
        if held:
            fp.read(len(held))
    except OSError:  # nothing held, and the socket had nothing either (TLS says so with an error)
        held = b""
    finally:
        raw.settimeout(timeout)
    return bytearray(held)


def _send_stdin(sock: Any, payload: bytes) -> None:
    raw = _raw_socket(sock)
    try:
        raw.sendall(payload)
    finally:
        with contextlib.suppress(OSError):
            raw.shutdown(pysocket.SHUT_WR)


def _append_tail(tail: bytearray, data: bytes) -> None:
    tail += data
    if len(tail) > TAIL_BYTES:
        del tail[: len(tail) - TAIL_BYTES]


class OutputReader:
    """What one exec's process wrote, parsed as it arrives (a Docker socket or a Kubernetes exec): stdout
    into the plugin's parser, the tails of both streams kept, the agent wrapper's end line taken out of
    stderr, and terminal codes removed from all of it."""

    def __init__(
        self, parser: StreamParser, on_event: Callable[[AgentEvent], Awaitable[None] | None], *, wrapped: bool
    ) -> None:
        self.parser, self.on_event, self.wrapped = parser, on_event, wrapped
        self.feed_stderr = getattr(parser, "feed_stderr", None)
        self.stderr_tail, self.stdout_tail = bytearray(), bytearray()
        self.saw_erofs = False
        self.n_events = 0
        self.uncommitted: int | None = None
        self.ended = False
        self.held = b""  # stderr bytes that may be the start of the wrapper's line, cut by a frame boundary

    async def emit(self, events: Iterable[AgentEvent]) -> None:
        for event in events:
            self.n_events += 1
            res = self.on_event(AgentEvent(kind=event.kind, data=plain(event.data)))
            if res is not None:
                await res

    async def take(self, stream: int, data: bytes) -> None:
        if EROFS_MARKER in data:
            self.saw_erofs = True
        if stream != STDERR:
            _append_tail(self.stdout_tail, data)
            await self.emit(self.parser.feed(data))
            return
        if self.wrapped:
            data, self.held, end = _take_end_line(self.held + data)
            if end is not None:
                self.ended = True
                self.uncommitted = int(end) if end.isdigit() else None
        await self._stderr(data)

    async def flush(self) -> None:
        """The stream ended inside what only looked like the wrapper's line: it was the agent's."""
        held, self.held = self.held, b""
        await self._stderr(held)

    async def _stderr(self, data: bytes) -> None:
        if data:
            _append_tail(self.stderr_tail, data)
            if self.feed_stderr is not None:
                await self.emit(list(self.feed_stderr(data) or []))

    def output(self, exit_code: int | None, stream_error: str | None = None) -> ExecOutput:
        return ExecOutput(
            outcome=_plain_outcome(self.parser.finish(exit_code)),
            exit_code=exit_code,
            stderr_tail=plain_bytes(bytes(self.stderr_tail)),
            stdout_tail=plain_bytes(bytes(self.stdout_tail)),
            saw_erofs=self.saw_erofs,
            events=self.n_events,
            extra={"stream_error": stream_error} if stream_error else {},
            uncommitted=self.uncommitted,
            ended=self.ended,
        )


async def _read_docker_stream(
    host: DockerHost, container: str, sock: Any, pending: bytearray, out: OutputReader
) -> str | None:
    """Frames from the exec's socket into ``out`` until the stream ends; why it broke, if it did."""
    while True:
        try:
            frame = await anyio.to_thread.run_sync(
                _read_frame, sock, pending, abandon_on_cancel=True, limiter=host.limiter
            )
        except StreamBroken as exc:
            # Also what a container stopped under the exec (Ctrl+C, timeout)
            # can look like: the exit code decides whether the exec
            # ended; the break itself goes to runner.jsonl and the output.
            _log.warning("the agent's output stream broke", extra={"container": container, "stream_error": str(exc)})
            await out.emit([AgentEvent(kind="error", data={"stream_error": str(exc)})])
            return str(exc)
        if frame is None:
            return None
        await out.take(*frame)


async def run_exec(
    host: DockerHost,
    container: str,
    argv: list[str],
    *,
    env: dict[str, str],
    parser: StreamParser,
    stdin_payload: bytes | None,
    on_event: Callable[[AgentEvent], Awaitable[None] | None],
    wrapped: bool = False,
    on_cancel: Callable[[], Awaitable[object]] | None = None,
) -> ExecOutput:
    """Run ``argv`` in ``container`` as ``node`` in /workspace and parse its stdout.

    ``wrapped``: ``argv`` runs under the wrapper, whose end line is taken out of stderr.
    ``on_cancel``: ends the process when the caller is cancelled, while the output is read on
    (:func:`drain_on_cancel`); without it the connection is closed at once. Raises
    :class:`ContainerError` when Docker cannot run the exec.
    """
    exec_id, sock, pending = await _start_exec(host, container, argv, env, stdin_payload is not None)
    out = OutputReader(parser, on_event, wrapped=wrapped)
    stream_error: str | None = None
    # With on_cancel, the reading below is shielded from the caller's cancellation,
    # which reaches `drain_on_cancel` instead: it ends the process and lets the
    # reading run to the stream's end, then cancels `reading`.
    reading = anyio.CancelScope()
    stream_done = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            if stdin_payload is not None:
                tg.start_soon(
                    lambda: anyio.to_thread.run_sync(_send_stdin, sock, stdin_payload, abandon_on_cancel=True)
                )
            if on_cancel is not None:
                tg.start_soon(drain_on_cancel, on_cancel, container, reading, stream_done)
            with anyio.CancelScope(shield=on_cancel is not None), reading:
                try:
                    stream_error = await _read_docker_stream(host, container, sock, pending, out)
                finally:
                    stream_done.set()
            tg.cancel_scope.cancel()
        await out.flush()
    finally:
        raw = _raw_socket(sock)
        with contextlib.suppress(OSError):
            raw.shutdown(pysocket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    exit_code = await _exit_code(host, exec_id, container)
    if stream_error is not None and exit_code is None:
        raise ContainerError(
            f"the agent's output stream broke ({stream_error}) and its exit status is unknown", retryable=True
        )
    return out.output(exit_code, stream_error)


async def _start_exec(
    host: DockerHost, container: str, argv: list[str], env: dict[str, str], want_stdin: bool
) -> tuple[str, Any, bytearray]:
    """The started exec: its id, its hijacked socket and the output already buffered with the headers."""
    api = (await host.client()).api

    def start() -> tuple[str, Any, bytearray]:
        exec_id = api.exec_create(
            container,
            argv,
            stdout=True,
            stderr=True,
            stdin=want_stdin,
            user="node",
            environment=env,
            workdir=WORKSPACE_MOUNT,
        )["Id"]
        sock = api.exec_start(exec_id, socket=True)
        pending = take_buffered(sock)
        api._disable_socket_timeout(sock)
        return exec_id, sock, pending

    started: tuple[str, Any, bytearray] = await host.call(f"exec in {container}", start)
    return started


async def drain_on_cancel(
    on_cancel: Callable[[], Awaitable[object]], container: str, reading: anyio.CancelScope, stream_done: anyio.Event
) -> None:
    """On the caller's cancellation: end the process, read on to the stream's end, then stop the reading.
    Started beside a reading shielded from that cancellation (``reading``, which sets ``stream_done``
    when it ends), for any exec stream whose output is read while its process ends (kube_exec's too)."""
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        if stream_done.is_set():  # the output ended first: nothing left to read
            raise
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(DRAIN_S):
                    try:
                        await on_cancel()
                    except Exception as exc:
                        # The caller's cancellation is what goes on (a Ctrl+C, a
                        # timeout): raised from here, this would replace it.
                        _log.warning(
                            f"could not end the exec's process when cancelled: {type(exc).__name__}: {exc}",
                            extra={"container": container},
                        )
                    with anyio.move_on_after(DRAIN_AFTER_END_S):
                        await stream_done.wait()
            finally:
                reading.cancel()  # whatever on_cancel did: the shielded reading must end
        raise


def _plain_outcome(outcome: AgentOutcome) -> AgentOutcome:
    """The outcome's texts without terminal codes (its ``structured_output`` is the agent's data: as given)."""
    error = outcome.error_message
    return msgspec.structs.replace(
        outcome,
        final_message=plain_text(outcome.final_message),
        error_message=plain_text(error) if error is not None else None,
    )


def _take_end_line(data: bytes) -> tuple[bytes, bytes, bytes | None]:
    """Split stderr bytes into (the task's bytes, bytes held for the next frame, the end line's value):
    the daemon's reads of the pipe may cut the wrapper's line, so a tail that could be its start waits."""
    value = None
    for m in END_LINE.finditer(data):
        value = m.group(1)
    if value is not None:
        data = END_LINE.sub(b"", data)
    cut = data.rfind(b"\n")
    if cut >= 0 and _could_start_line(data[cut:]):
        return data[:cut], data[cut:], value
    return data, b"", value


def _could_start_line(tail: bytes) -> bool:
    if len(tail) <= len(END_PREFIX):
        return END_PREFIX.startswith(tail)
    rest = tail[len(END_PREFIX) :]
    return tail.startswith(END_PREFIX) and (rest.isdigit() or rest == b"-")


async def _exit_code(host: DockerHost, exec_id: str, container_name: str) -> int | None:
    """Exit code of a finished exec. The stream has ended, so it is normally set at once."""
    delay = 0.005
    for _ in range(12):
        info = await host.api("inspect exec", "exec_inspect", exec_id)
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"])
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.5)
    if info.get("Running"):
        # A process whose stdout and stderr are still open: what ended was the
        # connection carrying them, not the agent.
        raise AgentStreamLostError(
            f"the connection carrying the agent's output in container {container_name} broke "
            "while the agent was still running (a dropped link to the engine)"
        )
    return None
