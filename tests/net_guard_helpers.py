"""The network guard for tests that must touch no address but loopback: an audit hook that ``sitecustomize`` installs
in the ``orchestrator`` subprocess records any name lookup or connection to anything else (and, for one made-up
name, answers 127.0.0.1), and the tests assert it recorded none."""

from __future__ import annotations

from pathlib import Path

from cli_helpers import cli_env

GUARD = """
import ipaddress, os, socket, sys

_log = os.environ["NET_GUARD_LOG"]
_alias = {os.environ["NET_GUARD_ALIAS"]: "127.0.0.1"} if os.environ.get("NET_GUARD_ALIAS") else {}
_inet = (socket.AF_INET, socket.AF_INET6)


def _note(line):
    with open(_log, "a") as f:
        f.write(line + "\\n")


def _loopback(host):
    host = host.decode() if isinstance(host, bytes) else str(host)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _hook(event, args):
    if event == "socket.getaddrinfo" and args[0] is not None and not _loopback(args[0]):
        _note(f"lookup {args[0]!r}")
    elif event.startswith("socket.gethostby"):
        _note(f"{event} {args!r}")
    elif event == "socket.connect" and args[0].family in _inet and not _loopback(args[1][0]):
        _note(f"connect {args[1]!r}")


sys.addaudithook(_hook)
_note("guard on")

if _alias:
    _real = socket.getaddrinfo

    def _getaddrinfo(host, *a, **k):
        name = host.decode() if isinstance(host, bytes) else host
        return _real(_alias.get(name, host), *a, **k)

    socket.getaddrinfo = _getaddrinfo
"""


def guarded_env(tmp_path: Path, alias: str | None = None, **extra: str) -> dict[str, str]:
    """cli_env for an ``orchestrator`` whose every lookup and connection is checked."""
    site = tmp_path / "guard"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(GUARD)
    # No TLS files from the environment: a tcp:// URL here is plain unless the test says so.
    certs = tmp_path / "no-certs"
    certs.mkdir(exist_ok=True)
    env = cli_env(tmp_path, **extra, DOCKER_CERT_PATH=str(certs), NET_GUARD_LOG=str(site / "net.log"))
    env["PYTHONPATH"] = str(site)
    if alias:
        env["NET_GUARD_ALIAS"] = alias
    return env


def guard_log(env: dict[str, str]) -> list[str]:
    """What the guard saw; its first line proves it ran at all."""
    lines = Path(env["NET_GUARD_LOG"]).read_text().splitlines()
    assert lines and lines[0] == "guard on", lines
    return [line for line in lines if line != "guard on"]
