"""A byte-level proxy in front of a Docker engine's unix socket, for transport faults.

The product reaches a remote engine over a connection that can break at any
moment (an ssh pipe, a TCP link). This proxy sits between the ``orchestrator``
command and a private engine (tests/private_engine.py) and breaks the
connection at a chosen request, the way a dropped link does: both sides are
closed with nothing answered. Nothing in the product is stubbed; docker-py sees
a real broken connection.

It listens on a unix socket in the test's temporary directory and forwards to
the engine's socket, so nothing listens on any network address.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from pathlib import Path


class EngineProxy:
    """Forward ``listen`` to ``upstream``; cut the connection carrying a request that matches.

    ``cut``: a regex over the client's bytes (for example the request line of
    ``PUT /…/containers/NAME/archive``); ``times``: how many such requests to
    cut before letting them through; ``after``: how many bytes of the cut
    request still reach the engine first (0: none, the request never arrives;
    more: the engine has begun to act on it, as when a link drops mid-upload).
    ``cuts`` counts what was cut.
    """

    def __init__(
        self, upstream: Path, listen: Path, *, cut: bytes | None = None, times: int = 1, after: int = 0
    ) -> None:
        self.upstream = str(upstream)
        self.listen = listen
        self.url = f"unix://{listen}"
        self._cut = re.compile(cut) if cut else None
        self._left = times
        self._after = after
        self.cuts = 0
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(listen))
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
            for src, dst, inspect in ((client, engine, True), (engine, client, False)):
                t = threading.Thread(target=self._pump, args=(src, dst, inspect, client, engine), daemon=True)
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

    def _pump(self, src: socket.socket, dst: socket.socket, inspect: bool, *pair: socket.socket) -> None:
        # The tail of the previous read joins the next one, so a request line split
        # across two reads is still seen.
        tail = b""
        budget: int | None = None  # bytes still forwarded before a cut
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if inspect and budget is None:
                    window = tail + data
                    if self._should_cut(window):
                        budget = self._after
                    tail = window[-512:]
                if budget is not None:
                    dst.sendall(data[:budget])
                    budget -= min(budget, len(data))
                    if budget == 0:
                        break
                    continue
                dst.sendall(data)
        except OSError:
            pass
        for s in pair:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._closed = True
        try:
            self._server.close()
        finally:
            self.listen.unlink(missing_ok=True)
