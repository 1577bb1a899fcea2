"""One process in a task's Pod through the ``exec`` subresource, streamed.

The exec websocket's channels: 0 stdin, 1 stdout, 2 stderr, 3 the status. Protocol v4 (the only
one servers before 1.29 speak) cannot close stdin, so every exec starts under :data:`STDIN_SHIM`,
which reads exactly the bytes it is told: first the environment (``export K='V'`` lines: the
credentials are in no command line, URL, Pod spec or audit log), then the payload, which becomes
the process's stdin (else ``/dev/null``). It ``exec``s the command, which keeps its pid (where
``END_AGENT_SCRIPT`` looks for the agent).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import anyio.to_thread

from ..errors import AgentStreamLostError, ContainerError, RunnerError
from .docker_exec import ExecOutput, OutputReader, drain_on_cancel
from .plugin import AgentEvent, StreamParser

_log = logging.getLogger(__name__)
STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3
CHUNK = 1 << 20
# How often a running exec asks whether its Pod is still there (see stream_exec).
WATCH_S = 10.0
# $1: bytes of environment; $2: bytes of payload, -1 for none, or "pipe" when the
# command reads exactly its bytes from stdin itself (a large tar: no copy in /tmp);
# $3: open files per process (soft = hard), "-" to keep the runtime's.
STDIN_SHIM = (
    "# orchestrator-exec-stdin\n"
    # A Pod spec cannot set it: lowered here, for the command and all it starts.
    '[ "$3" = - ] || ulimit -n "$3" 2>/dev/null || ulimit -S -n "$3" 2>/dev/null || true\n'
    'e=$(head -c "$1") || exit 121\n'
    'eval "$e" || exit 121\n'
    'case "$2" in\n'
    "  pipe) ;;\n"
    "  -1) exec < /dev/null ;;\n"
    "  *)\n"
    "    f=$(mktemp /tmp/.orc-stdin.XXXXXX) || exit 121\n"
    '    head -c "$2" > "$f" || exit 121\n'
    '    exec < "$f"\n'
    '    rm -f "$f" ;;\n'
    "esac\n"
    "shift 3\n"
    'exec "$@"\n'
)


def env_block(env: dict[str, str]) -> bytes:
    """``export K='V'`` lines, quoted for sh (read by :data:`STDIN_SHIM`)."""
    lines = []
    for key, value in env.items():
        if not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ContainerError(f"environment variable name {key!r} cannot be passed to a Pod's exec")
        quoted = "'" + value.replace("'", "'\"'\"'") + "'"
        lines.append(f"export {key}={quoted}\n")
    return "".join(lines).encode()


def shim_argv(
    argv: list[str], env: dict[str, str], payload_size: int | None, *, pipe: bool = False, nofile: int | None = None
) -> tuple[list[str], bytes]:
    """The exec's command and the stdin prefix that carries ``env``."""
    block = env_block(env)
    size = "pipe" if pipe else -1 if payload_size is None else payload_size
    files = "-" if nofile is None else str(int(nofile))
    return ["sh", "-c", STDIN_SHIM, "orchestrator-exec", str(len(block)), str(size), files, *argv], block


def exit_status(raw: bytes | str) -> tuple[int | None, str]:
    """(exit code, message) from the status channel; None when the process's end is unknown."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if not text.strip():
        return None, ""
    try:
        status = json.loads(text)
    except ValueError:
        return None, text.strip()[:300]
    if status.get("status") == "Success":
        return 0, ""
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message")), ""
            except (TypeError, ValueError):
                break
    return None, str(status.get("message") or text)[:300]


class ExecStream:
    """A started exec: blocking reads and writes, each called on a worker thread."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.status = b""

    def send(self, chunks: Iterable[bytes]) -> None:
        for chunk in chunks:
            for i in range(0, len(chunk), CHUNK):
                self.ws.write_channel(STDIN, bytes(chunk[i : i + CHUNK]))

    def read(self, timeout: float = 0.5) -> list[tuple[int, bytes]] | None:
        """The frames that arrived within ``timeout`` (stdout, stderr); None once the exec has ended."""
        ws = self.ws
        if not ws.is_open():
            self.status += _take(ws, STATUS)
            return None
        ws.update(timeout=timeout)
        out: list[tuple[int, bytes]] = []
        for channel in (STDOUT, STDERR):
            data = _take(ws, channel)
            if data:
                out.append((channel, data))
        self.status += _take(ws, STATUS)
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


def _take(ws: Any, channel: int) -> bytes:
    data = ws._channels.pop(channel, b"")  # read_channel() would wait for an update first
    return data.encode() if isinstance(data, str) else bytes(data)


async def stream_exec(
    start: Callable[[list[str]], ExecStream],
    limiter: anyio.CapacityLimiter,
    argv: list[str],
    *,
    parser: StreamParser,
    env: dict[str, str] | None = None,
    stdin_payload: bytes | Iterable[bytes] | None = None,
    payload_size: int | None = None,
    on_event: Callable[[AgentEvent], Awaitable[None] | None] = lambda event: None,
    wrapped: bool = False,
    on_cancel: Callable[[], Awaitable[object]] | None = None,
    lost: Callable[[], Awaitable[None]] | None = None,
    pipe: bool = False,
    nofile: int | None = None,
) -> ExecOutput:
    """Run ``argv`` (under the shim) and parse its stdout as :func:`.docker_exec.run_exec` does.

    ``lost``: raises the error that explains a Pod gone (deleted, ended, its node lost). Asked
    every :data:`WATCH_S` (an exec through a node that stopped answering neither ends nor fails)
    and when the exec ended without an exit status (with the Pod there: AgentStreamLostError).
    ``pipe``: the command reads exactly ``payload_size`` bytes of stdin itself.
    """
    if isinstance(stdin_payload, bytes):
        payload_size = len(stdin_payload)
        chunks: Iterable[bytes] = [stdin_payload]
    else:
        chunks = stdin_payload or []
    size = payload_size if stdin_payload is not None else None
    command, block = shim_argv(argv, env or {}, size, pipe=pipe, nofile=nofile)
    stream = await anyio.to_thread.run_sync(start, command, limiter=limiter)
    output = OutputReader(parser, on_event, wrapped=wrapped)
    write_error: list[BaseException] = []
    try:
        await _pump(stream, limiter, [block, *chunks], output, write_error, on_cancel, lost)
        await output.flush()
    finally:
        await anyio.to_thread.run_sync(stream.close, limiter=limiter)

    exit_code, why = exit_status(stream.status)
    if exit_code == 121 and not output.n_events and write_error:
        raise ContainerError(f"the exec could not read its input: {write_error[0]}", retryable=True)
    if exit_code is None:
        if lost is not None:
            await lost()
        raise AgentStreamLostError(
            "the connection carrying the process's output in its Pod broke while it may still be running"
            + (f" ({why})" if why else "")
        )
    return output.output(exit_code)


async def _pump(
    stream: ExecStream,
    limiter: anyio.CapacityLimiter,
    chunks: Iterable[bytes],
    output: OutputReader,
    write_error: list[BaseException],
    on_cancel: Callable[[], Awaitable[object]] | None,
    lost: Callable[[], Awaitable[None]] | None,
) -> None:
    """Stdin in, stdout and stderr out until the exec ends (or its Pod is found lost: raised).

    With ``on_cancel``, a cancellation first runs it (the agent is told to end)
    and reads what the process still writes, for a bounded time.
    """

    def write() -> None:
        try:
            stream.send(chunks)
        except Exception as exc:  # the process exited early: its status says why
            write_error.append(exc)

    reading = anyio.CancelScope()
    stream_done = anyio.Event()
    gone: list[RunnerError] = []

    async def watch() -> None:
        assert lost is not None
        while True:
            await anyio.sleep(WATCH_S)
            try:
                await lost()
            except RunnerError as exc:
                gone.append(exc)
                reading.cancel()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: anyio.to_thread.run_sync(write, abandon_on_cancel=True))
        if on_cancel is not None:
            tg.start_soon(drain_on_cancel, on_cancel, "its Pod", reading, stream_done)
        if lost is not None:
            tg.start_soon(watch)
        with anyio.CancelScope(shield=on_cancel is not None), reading:
            try:
                while (frames := await anyio.to_thread.run_sync(stream.read, limiter=limiter)) is not None:
                    for channel, data in frames:
                        await output.take(channel, data)
            finally:
                stream_done.set()
        tg.cancel_scope.cancel()
    if gone:
        raise gone[0]
