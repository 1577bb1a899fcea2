"""A second, private Docker engine for tests that must stop, kill or restart one.

The host's own engine is shared by everyone on the machine: a test never stops
it. Instead it starts its own ``dockerd`` with its own unix socket, data root,
exec root, pid file and bridge, and signals only the pid in that pid file.

The bridge is made by hand: ``--bridge=none`` would make the new engine delete
the host engine's ``docker0`` (every later container on the host then fails to
start), so the engine gets a bridge of its own (``--iptables=false`` keeps it
from touching the host's firewall rules), deleted when the engine is gone.
Containers on it are meant to run with the product's offline mode (no network).

It shares no images with the host engine: ``load_image`` streams
``docker save | docker load`` into it. Nothing on it is reachable from the host
through bind mounts either, unless it runs on the same filesystem (it does here:
tests that need it to look remote use the archive path, which never bind mounts).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _cmd(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network already on an interface or in the routing table."""
    nets = []
    for line in _cmd("ip", "-4", "-o", "addr", "show").stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    for line in _cmd("ip", "-4", "route", "show").stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        if "/" in first:
            nets.append(ipaddress.ip_network(first, strict=False))
    return nets


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _openssl(*args: str) -> None:
    _cmd("openssl", *args)


def make_ca(directory: Path, name: str = "test-ca") -> tuple[Path, Path]:
    """A throwaway certificate authority: (ca.pem, ca-key.pem)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, key = directory / "ca.pem", directory / "ca-key.pem"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", str(key), "-out", str(ca), "-subj", f"/CN={name}",
    )  # fmt: skip
    return ca, key


def sign_cert(ca: tuple[Path, Path], cert: Path, key: Path, usage: str) -> None:
    """A key and a certificate for 127.0.0.1 signed by ``ca``; usage serverAuth or clientAuth."""
    csr = cert.with_suffix(".csr")
    ext = cert.with_suffix(".ext")
    ext.write_text(f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()


def client_cert_dir(directory: Path, ca: tuple[Path, Path]) -> Path:
    """A DOCKER_CERT_PATH-style directory (ca.pem, cert.pem, key.pem) for a client of ``ca``."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(ca[0], directory / "ca.pem")
    sign_cert(ca, directory / "cert.pem", directory / "key.pem", "clientAuth")
    return directory


def private_engine_missing() -> str:
    """Why a private engine cannot start here, or '' when it can."""
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    for tool in ("dockerd", "ip", "docker"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return ""


class PrivateEngine:
    """One private ``dockerd``; ``start``/``stop``/``kill``/``restart`` touch only its own pid."""

    def __init__(self, name: str = "orc2", tls: bool = False) -> None:
        # Short paths: the engine's containerd socket lives under the exec root and
        # unix socket paths are limited to 108 bytes.
        self.root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir="/tmp"))
        self.socket = self.root / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.pidfile = self.root / "docker.pid"
        self.log = self.root / "dockerd.log"
        self.bridge = f"{name}{os.getpid() % 100000}"[:15]
        self.pid: int | None = None
        self.image = ""  # the image tag loaded into it (the conftest fixture pins one)
        self._bridge_made = False
        # tls: the engine also listens on tcp://127.0.0.1:<tls_port> and wants a client
        # certificate signed by its own throwaway CA (self.ca; client_cert_dir makes one).
        self.tls_url = ""
        self.ca: tuple[Path, Path] | None = None
        if tls:
            self.ca = make_ca(self.root / "tls")
            sign_cert(self.ca, self.root / "tls" / "server.pem", self.root / "tls" / "server-key.pem", "serverAuth")
            self.tls_url = f"tcp://127.0.0.1:{free_port()}"

    # ------------------------------------------------------------ the bridge

    def _make_bridge(self) -> None:
        used = _used_networks()
        start = os.getpid() % 200
        for i in range(250):
            net = ipaddress.ip_network(f"10.213.{(start + i) % 250 + 1}.0/24")
            if any(net.overlaps(u) for u in used):
                continue
            _cmd("ip", "link", "add", self.bridge, "type", "bridge")
            self._bridge_made = True
            _cmd("ip", "addr", "add", f"{next(net.hosts())}/24", "dev", self.bridge)
            _cmd("ip", "link", "set", self.bridge, "up")
            return
        raise RuntimeError("no free 10.213.x.0/24 network for the private engine's bridge")

    def _delete_bridge(self) -> None:
        if self._bridge_made:
            _cmd("ip", "link", "delete", self.bridge, check=False)
            self._bridge_made = False

    # ------------------------------------------------------------ the daemon

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["DOCKER_HOST"] = self.url
        return env

    def docker(self, *args: str, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", "-H", self.url, *args], capture_output=True, text=True, check=check, timeout=timeout
        )

    def answering(self) -> bool:
        try:
            return self.docker("info", timeout=20).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def start(self) -> None:
        # dockerd gives its own containerd only a few seconds to come up; on a busy
        # machine that is not always enough, and a second try finds it started (the
        # new dockerd reuses the containerd named in its exec root's pid file).
        for attempt in range(3):
            try:
                return self._start_once()
            except RuntimeError:
                if attempt == 2:
                    raise
                time.sleep(2)

    def _start_once(self) -> None:
        if not self._bridge_made:
            self._make_bridge()
        config = self.root / "daemon.json"
        config.write_text(json.dumps({}))  # never the host's /etc/docker/daemon.json
        args = [
            "dockerd",
            "--config-file",
            str(config),
            "--host",
            self.url,
            "--data-root",
            str(self.root / "data"),
            "--exec-root",
            str(self.root / "exec"),
            "--pidfile",
            str(self.pidfile),
            f"--bridge={self.bridge}",
            "--iptables=false",
            "--ip-masq=false",
        ]
        if self.tls_url:
            tls = self.root / "tls"
            args += [
                "--host", self.tls_url, "--tlsverify", f"--tlscacert={tls / 'ca.pem'}",
                f"--tlscert={tls / 'server.pem'}", f"--tlskey={tls / 'server-key.pem'}",
            ]  # fmt: skip
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = proc.pid
        deadline = time.time() + 90
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"private dockerd exited with {proc.returncode}: {self._log_tail()}")
            if self.answering():
                return
            time.sleep(0.5)
        raise RuntimeError(f"private dockerd did not answer within 90 s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(no log)"

    def _signal_and_wait(self, sig: int, timeout: float) -> None:
        pid = self.pid
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)  # this engine's own pid: nothing else is signalled
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid if not Path(f"/proc/{pid}").exists() else 0
            if done == pid:
                break
            time.sleep(0.2)
        else:
            if sig != signal.SIGKILL:
                self._signal_and_wait(signal.SIGKILL, 30)
                return
        self.pid = None
        # The engine's own containerd (started under its exec root) goes with it on a
        # clean stop; after SIGKILL it may linger, so end it by its own pid file too.
        if sig == signal.SIGKILL:
            self._kill_own_containerd()

    def _kill_own_containerd(self) -> None:
        pidfile = self.root / "exec" / "containerd" / "containerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists() and str(self.root) in cmdline.read_text(errors="replace"):
            os.kill(pid, signal.SIGKILL)
            deadline = time.time() + 30
            while Path(f"/proc/{pid}").exists() and time.time() < deadline:
                time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM: the engine stops its containers and exits."""
        self._signal_and_wait(signal.SIGTERM, 60)

    def kill(self) -> None:
        """SIGKILL: what a machine that stops answering looks like to a client."""
        self._signal_and_wait(signal.SIGKILL, 30)

    def restart(self) -> None:
        self.stop()
        self.start()

    def load_image(self, image: str, source_env: dict[str, str] | None = None) -> None:
        """``docker save IMAGE | docker -H private load`` from the host engine."""
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, env=source_env)
        load = subprocess.run(
            ["docker", "-H", self.url, "load", "-q"], stdin=save.stdout, capture_output=True, text=True, timeout=900
        )
        save.stdout.close()
        if save.wait(timeout=60) != 0 or load.returncode != 0:
            raise RuntimeError(f"docker save | docker load of {image} failed: {load.stderr.strip()}")

    def close(self) -> None:
        """Stop the engine, delete its bridge and its directories."""
        try:
            if self.pid is not None:
                self.stop()
        finally:
            self._delete_bridge()
            # Whatever the engine left mounted under its roots must go before the files.
            mounts = [
                line.split()[1]
                for line in Path("/proc/mounts").read_text().splitlines()
                if line.split()[1].startswith(str(self.root))
            ]
            for mount in sorted(mounts, key=len, reverse=True):
                _cmd("umount", "-l", mount, check=False)
            shutil.rmtree(self.root, ignore_errors=True)
