"""A byte-level proxy in front of a Docker engine's unix socket, for transport faults.

The product reaches a remote engine over a connection that can break at any
moment (an ssh pipe, a TCP link). This proxy sits between the ``orchestrator``
command and a private engine (tests/private_engine.py) and breaks the
connection at a chosen request, the way a dropped link does: both sides are
closed with nothing answered. Nothing in the product is stubbed; docker-py sees
a real broken connection.

It listens on a unix socket in the test's temporary directory (or, for the
plain ``tcp://`` tests, on 127.0.0.1 only) and forwards to the engine's socket,
so nothing listens on any other network address.
"""

from __future__ import annotations

import contextlib
import queue
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The answer to an exec create: {"Id":"<64 hex>"}.
EXEC_ID = re.compile(rb'"Id"\s*:\s*"([0-9a-f]{64})"')
# Anywhere in the client's bytes: on a kept-alive connection a request follows the
# previous one's body directly.
REQUEST_LINE = re.compile(rb"((?:GET|HEAD|POST|PUT|DELETE) /\S* HTTP/1\.[01])\r\n")


class EngineProxy:
    """Forward ``listen`` to ``upstream``; cut the connection carrying a request that matches.

    ``cut``: a regex over the client's bytes (for example the request line of
    ``PUT /…/containers/NAME/archive``); ``times``: how many such requests to
    cut before letting them through; ``after``: how many bytes of the cut
    request still reach the engine first (0: none, the request never arrives;
    more: the engine has begun to act on it, as when a link drops mid-upload).
    ``cuts`` counts what was cut.

    ``exec_of``: instead of ``cut``, a regex over the body of an exec create
    (the command it runs, such as the agent's); the proxy reads the exec's id
    from the engine's answer and cuts the connection that starts that exec,
    which carries its output stream. ``hold``: seconds the matched connection
    keeps streaming before it is cut (a link that drops while a long exec
    runs; the engine never hears of it).

    ``swallow``: with ``exec_of``, the matched exec's start is not cut: it runs
    to its end, and its stream ends cleanly after the engine's answer header,
    with none of the exec's output. That is what a busy engine does when it
    closes an exec's streams before copying what the process wrote (dockerd
    waits only so long for that copy once the process has exited).

    ``stall``: with ``exec_of``, the matched exec's start is not cut: the
    engine's answer header reaches the client, and everything after it (the
    exec's output) is held, in ``held``, until :meth:`release` forwards it and
    what follows. The client has not read a line the process already wrote: a
    loaded machine or a slow link, at the moment the user presses Ctrl+C.

    ``delay_ms``: every chunk is held that long in each direction before it is
    forwarded (a round trip costs about twice that), the way a distant link
    delays it; the bytes and their order are untouched.
    """

    def __init__(
        self,
        upstream: Path,
        listen: Path | None,
        *,
        cut: bytes | None = None,
        times: int = 1,
        after: int = 0,
        exec_of: bytes | None = None,
        hold: float = 0.0,
        delay_ms: float = 0.0,
        swallow: bool = False,
        stall: bool = False,
    ) -> None:
        self.upstream = str(upstream)
        self.listen = listen
        self._cut = re.compile(cut) if cut else None
        self._exec_of = re.compile(exec_of) if exec_of else None
        self._left = times
        self._after = after
        self._hold = hold
        self._swallow = swallow
        self._stall = stall
        self._released = False
        self._release = threading.Event()
        self._to_client: Callable[[bytes], None] | None = None
        self.held = bytearray()  # the stalled exec's output, not yet forwarded
        self._delay = delay_ms / 1000
        self.cuts = 0
        self.cut_exec: str | None = None  # the id of the exec whose stream was cut
        # Every request line the client sent, in order (API round trips).
        self.requests: list[str] = []
        # Bytes the client sent towards the engine (requests and their bodies).
        self.sent = 0
        self._lock = threading.Lock()
        if listen is None:  # plain TCP on loopback, the way `dockerd -H tcp://127.0.0.1:PORT` listens
            self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._server.bind(("127.0.0.1", 0))
            self.port = self._server.getsockname()[1]
            self.url = f"tcp://127.0.0.1:{self.port}"
        else:
            self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._server.bind(str(listen))
            self.url = f"unix://{listen}"
        self._server.listen(64)
        self._closed = False
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, name="engine-proxy", daemon=True)
        accept.start()
        self._threads.append(accept)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                engine.connect(self.upstream)
            except OSError:
                client.close()
                continue
            conn: dict[str, Any] = {}  # shared by the connection's two directions
            for src, dst, inspect in ((client, engine, True), (engine, client, False)):
                t = threading.Thread(target=self._pump, args=(src, dst, inspect, conn, client, engine), daemon=True)
                t.start()
                self._threads.append(t)

    def _should_cut(self, window: bytes) -> bool:
        if self._cut is None or not self._cut.search(window):
            return False
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            self.cuts += 1
            return True

    def _learn_exec(self, data: bytes) -> bool:
        """An exec create's answer on a connection whose request matched ``exec_of``: cut its start."""
        m = EXEC_ID.search(data)
        if m is None:
            return False
        with self._lock:
            if self._left > 0 and self._cut is None:
                self.cut_exec = m.group(1).decode()
                self._cut = re.compile(rb"POST /[^ ]*/exec/" + m.group(1) + rb"/start ")
        return True

    def _pump(
        self, src: socket.socket, dst: socket.socket, inspect: bool, conn: dict[str, Any], *pair: socket.socket
    ) -> None:
        # The tail of the previous read joins the next one, so a request line split
        # across two reads is still seen.
        tail = b""
        budget: int | None = None  # bytes still forwarded before a cut
        send, flush = self._delayed(dst) if self._delay else (dst.sendall, None)
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                window = tail + data
                tail_before, tail = tail, window[-512:]
                if inspect:
                    with self._lock:
                        self.sent += len(data)
                    # A request line split across two reads is seen whole in the window, and
                    # counted once: by the read that completes it.
                    self.requests.extend(
                        m.group(1).decode() for m in REQUEST_LINE.finditer(window) if m.end() > len(tail_before)
                    )
                if not inspect:
                    if "stall" in conn:
                        data = self._stalled(conn, data, send)
                        if not data:
                            continue
                    if "swallow" in conn:
                        data = self._swallowed(conn, data)
                        if not data:
                            continue
                    # Not the window: its tail may hold an earlier answer's "Id".
                    if conn.get("exec_create") and self._learn_exec(data):
                        conn["exec_create"] = False
                    send(data)
                    continue
                if self._exec_of is not None and self._cut is None and self._exec_of.search(window):
                    conn["exec_create"] = True
                if budget is None and self._should_cut(window):
                    if self._swallow or self._stall:
                        # Set before the request goes on: its answer cannot come sooner.
                        conn["swallow" if self._swallow else "stall"] = b""
                        send(data)
                        continue
                    if self._hold:
                        timer = threading.Timer(self._hold, self._drop, args=pair)
                        timer.daemon = True
                        timer.start()
                    else:
                        budget = self._after
                if budget is not None:
                    send(data[:budget])
                    budget -= min(budget, len(data))
                    if budget == 0:
                        break
                    continue
                send(data)
        except OSError:
            pass
        if flush is not None:
            flush()  # what was read before the end still arrives, late
        if "stall" in conn and not inspect:
            # The engine has ended the stream; its end reaches the client only after what was held.
            self._release.wait(timeout=300)
        self._drop(*pair)

    @staticmethod
    def _split_header(conn: dict[str, Any], key: str, data: bytes) -> tuple[bytes, bytes]:
        """(what of ``data`` is the engine's answer header, what comes after it) for a matched exec.

        ``conn[key]`` holds the header bytes seen so far, and None once it has passed.
        """
        seen = conn[key]
        if seen is None:
            return b"", data
        end = (seen + data).find(b"\r\n\r\n")
        if end < 0:
            conn[key] = seen + data
            return data, b""
        conn[key] = None
        cut = end + 4 - len(seen)
        return data[:cut], data[cut:]

    def _swallowed(self, conn: dict[str, Any], data: bytes) -> bytes:
        """What of the engine's bytes reaches the client of a swallowed exec: its answer's header only."""
        return self._split_header(conn, "swallow", data)[0]

    def _stalled(self, conn: dict[str, Any], data: bytes, send: Callable[[bytes], None]) -> bytes:
        """What of the engine's bytes reaches the client of a stalled exec now: up to its answer's header."""
        with self._lock:
            if self._released:
                return data
            header, rest = self._split_header(conn, "stall", data)
            if conn["stall"] is None:
                self._to_client = send
            self.held += rest
            return header

    def release(self) -> None:
        """Forward what the stalled exec wrote so far; what follows then flows as usual."""
        with self._lock:  # held: nothing newer can overtake what was held
            self._released = True
            if self._to_client is not None and self.held:
                with contextlib.suppress(OSError):
                    self._to_client(bytes(self.held))
        self._release.set()

    @staticmethod
    def _drop(*pair: socket.socket) -> None:
        for s in pair:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _delayed(self, dst: socket.socket) -> tuple[Callable[[bytes], None], Callable[[], None]]:
        """A send that forwards each chunk ``delay`` after it was read, in order, without holding up the reads."""
        q: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

        def writer() -> None:
            while True:
                due, data = q.get()
                if not data:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                try:
                    dst.sendall(data)
                except OSError:
                    return

        t = threading.Thread(target=writer, name="engine-proxy-delay", daemon=True)
        t.start()
        self._threads.append(t)

        def send(data: bytes) -> None:
            q.put((time.monotonic() + self._delay, data))

        def flush() -> None:
            q.put((0.0, b""))
            t.join()

        return send, flush

    def close(self) -> None:
        self._closed = True
        try:
            self._server.close()
        finally:
            if self.listen is not None:
                self.listen.unlink(missing_ok=True)
