"""docker-py without paramiko, unless an ``ssh://`` engine needs docker-py's ssh module.

``import docker`` loads paramiko (docs/performance.md), which our ``ssh://``
engines never use (ssh_transport.py). :func:`install` keeps docker-py's ssh module
from loading it, as where paramiko is not installed; :func:`ssh_transport_module`
loads that module when an ``ssh://`` engine is configured.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from types import FrameType, ModuleType
from typing import Any

_SSHCONN = "docker.transport.sshconn"
_lock = threading.Lock()


class _NoParamikoForDocker(importlib.abc.MetaPathFinder):
    """Refuses ``import paramiko`` to docker-py's ssh module only, until an ssh engine needs it."""

    allowed = False

    def find_spec(self, name, path=None, target=None):
        if name != "paramiko" or self.allowed:
            return None
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_globals.get("__name__") == _SSHCONN:
                raise ModuleNotFoundError("paramiko is loaded only for ssh:// engines", name=name)
            frame = frame.f_back
        return None  # somebody else's import of paramiko: not ours to refuse


_finder = _NoParamikoForDocker()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    with _lock:
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def ssh_transport_module() -> ModuleType:
    """docker-py's ssh module (with paramiko), and its transport given back to docker-py's client."""
    with _lock:
        _finder.allowed = True
    import docker.api.client
    import docker.transport
    from docker.transport import sshconn

    # Imported without it, docker-py's client names no ssh adapter and refuses
    # ssh:// URLs ("Install paramiko package"): the names it would have had.
    adapter: Any = sshconn.SSHHTTPAdapter
    modules: tuple[Any, ...] = (docker.transport, docker.api.client)
    for module in modules:
        module.SSHHTTPAdapter = adapter
    return sshconn
