"""``ssh://`` engines: pooled connections through the user's own ``ssh`` (docs/scaling.md).

docker-py's shell-out ssh transport made a new connection pool for every
request, so every API call paid a whole handshake, and ``sshd`` dropped those
beyond its ``MaxStartups``, which reached the tasks as ``Broken pipe``. Here the
pool is kept, at most :data:`HANDSHAKES` handshakes per host run at once, and a
connection counts as made only once the remote end has answered, so a dropped
handshake is tried again before any request is sent on it. ``ssh``'s own
messages go to the error text instead of the user's terminal.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import tempfile
import threading
import time
from typing import Any

from .docker_py import ssh_transport_module

sshconn = ssh_transport_module()

# Below sshd's default MaxStartups (10): a burst never has handshakes dropped.
HANDSHAKES = 4
HANDSHAKE_TRIES = 4
CONNECT_TIMEOUT_S = 30
READY = b"orchestrator-ssh-ready\n"
# The remote shell says so before it becomes the engine's stdio bridge.
REMOTE_COMMAND = f"printf '{READY.decode().strip()}\\n' && exec docker system dial-stdio"

# docker-py's classes, as Any: its type stubs do not describe these internals.
_SSHSocket: Any = sshconn.SSHSocket
_SSHConnection: Any = sshconn.SSHConnection
_SSHConnectionPool: Any = sshconn.SSHConnectionPool
_SSHHTTPAdapter: Any = sshconn.SSHHTTPAdapter

_gates: dict[str, threading.BoundedSemaphore] = {}
_gates_lock = threading.Lock()


def _gate(host: str) -> threading.BoundedSemaphore:
    with _gates_lock:
        return _gates.setdefault(host, threading.BoundedSemaphore(HANDSHAKES))


def ssh_command(host: str, user: str | None = None, port: str | None = None) -> list[str]:
    """The ``ssh`` command line of one connection. Host keys are checked as the user's ``ssh`` does
    (``BatchMode``: an unknown or changed key fails instead of asking; a man in the middle would
    get the agents' credentials)."""
    args = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
    # A link that died is noticed within a minute and a half instead of never.
    args += ["-o", "ServerAliveInterval=30", "-o", "ServerAliveCountMax=3"]
    if user:
        args += ["-l", user]
    if port:
        args += ["-p", str(port)]
    return [*args, "--", host, REMOTE_COMMAND]


class _Socket(_SSHSocket):
    def connect(self, **kwargs: Any) -> None:
        args = ssh_command(self.host, self.user, self.port)
        env = dict(os.environ)
        env.pop("LD_LIBRARY_PATH", None)
        env.pop("SSL_CERT_FILE", None)
        reason = ""
        with _gate(f"{self.user}@{self.host}:{self.port}"):
            for attempt in range(HANDSHAKE_TRIES):
                # A file, not a pipe: nobody reads ssh's stderr while it runs.
                err = tempfile.TemporaryFile()  # noqa: SIM115  (closed below or with the process)
                # Its own session: Ctrl+C is the orchestrator's to handle, and the
                # connection must outlive it long enough to stop the agents through it.
                proc = subprocess.Popen(
                    args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True
                )
                assert proc.stdout is not None
                if proc.stdout.readline() == READY:
                    self.proc = proc
                    self._err = err
                    return
                proc.wait()
                err.seek(0)
                lines = err.read().decode("utf-8", "replace").strip().splitlines()
                err.close()
                reason = lines[-1] if lines else f"ssh exited with {proc.returncode}"
                if "Permission denied" in reason or "Host key verification failed" in reason:
                    break  # trying again cannot help
                time.sleep(0.2 * 2**attempt)
        raise ConnectionError(f"ssh to {self.host} failed: {reason}")

    def makefile(self, mode: str) -> _KeepOpen:
        # http.client closes the file it reads a response from; docker-py's
        # socket hands out the ssh process's own stdout, so the first response
        # closed the connection for good. One reader, kept open for every
        # response the connection serves; the socket closes it.
        if not self.proc:
            self.connect()
        return _KeepOpen(self.proc.stdout, self)

    def close(self) -> None:
        # docker-py's close writes to ssh's stdin, which raises once ssh has
        # exited (the engine ended an exec stream's connection): closing a
        # connection that is already gone is not an error.
        self._done = True
        proc: Any = self.proc
        if proc is None:
            return
        for f in (proc.stdin, proc.stdout, getattr(self, "_err", None)):
            with contextlib.suppress(OSError, ValueError):
                if f is not None:
                    f.close()
        if proc.poll() is None:
            proc.terminate()

    @property
    def reusable(self) -> bool:
        """Whether another request may go over this connection: not once an exec stream took it over
        (the engine ends it with the exec), nor when ssh exited or unasked-for data waits."""
        proc: Any = self.proc
        if getattr(self, "_done", False) or proc is None or proc.poll() is not None:
            return False
        ready, _, _ = select.select([proc.stdout.fileno()], [], [], 0)
        return not ready


class _KeepOpen:
    """The ssh process's stdout as http.client's response file, which it may close."""

    def __init__(self, raw: Any, sock: _Socket) -> None:
        self._raw = raw
        self._sock = sock

    @property
    def channel(self) -> _Socket:
        # docker-py takes the socket from here when an exec stream takes the
        # connection over: it is not handed out again.
        self._sock._done = True
        return self._sock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def close(self) -> None:
        pass


class _Connection(_SSHConnection):
    def connect(self) -> None:
        sock = _Socket(self.ssh_host)
        sock.settimeout(self.timeout)
        sock.connect()
        self.sock = sock


class _Pool(_SSHConnectionPool):
    def _new_conn(self) -> _Connection:
        return _Connection(None, self.timeout, self.ssh_host)

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)
        sock = getattr(conn, "sock", None)
        if isinstance(sock, _Socket) and not sock.reusable:
            conn.close()
            return self._new_conn()
        return conn


class PooledSSHAdapter(_SSHHTTPAdapter):
    """docker-py's shell-out ssh adapter, with one connection pool kept per adapter."""

    def __init__(self, base_url: str, timeout: int, max_pool_size: int) -> None:
        super().__init__(base_url, timeout, max_pool_size=max_pool_size, shell_out=True)

    def get_connection(self, url: Any, proxies: Any = None) -> Any:
        with self.pools.lock:
            pool = self.pools.get(url)
            if pool is None:
                pool = _Pool(timeout=self.timeout, maxsize=self.max_pool_size, host=self.ssh_host)
                self.pools[url] = pool
        return pool


def use_pooled_ssh(api: Any, url: str, timeout: int, max_pool_size: int) -> None:
    """Replace an ``ssh://`` APIClient's transport with :class:`PooledSSHAdapter`."""
    adapter = PooledSSHAdapter(url, timeout, max_pool_size)
    api.mount("http+docker://ssh", adapter)
    api._custom_adapter = adapter
