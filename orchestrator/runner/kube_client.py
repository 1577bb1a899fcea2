"""Reaching a Kubernetes API server: the kubeconfig, the refusal of plain HTTP, error translation.

The official ``kubernetes`` client is synchronous (urllib3 for requests,
websocket-client for exec), like docker-py: every call runs on a worker thread
under the runner's :class:`anyio.CapacityLimiter` (see :class:`.kube_host.KubeHost`).
The library is imported only here and in the modules that drive Pods, and only
when a run uses a cluster: importing it costs about a second.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ContainerError, PreflightError, RunnerError
from .transport import is_loopback

# The reasons a server gives that a retry can outlive.
_TRANSIENT_STATUS = (429, 500, 502, 503, 504)


@dataclass(frozen=True)
class ClusterSpec:
    """Where the cluster is and which namespace the run's Pods go to (``runner.kubernetes``)."""

    kubeconfig: str | None
    context: str | None
    namespace: str
    insecure: bool = False

    @classmethod
    def of(cls, kube: Any) -> ClusterSpec:
        """From ``runner.kubernetes`` (a KubernetesConfig)."""
        return cls(kubeconfig=kube.kubeconfig, context=kube.context, namespace=kube.namespace, insecure=kube.insecure)

    @property
    def shown(self) -> str:
        where = self.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        return f"{where}" + (f" (context {self.context})" if self.context else "") + f", namespace {self.namespace}"


def load_configuration(spec: ClusterSpec) -> Any:
    """The client's Configuration for ``spec`` (blocking: reads files, may run an exec credential
    plugin); PreflightError naming the file and what is wrong, or a plain-HTTP server."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    # The kubeconfig file as kubectl finds it (the first of KUBECONFIG's list).
    if spec.kubeconfig:
        path = str(Path(spec.kubeconfig).expanduser())
    else:
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
    if not Path(path).is_file():
        raise PreflightError(f"kubeconfig {path} not found; pass --kubeconfig FILE or set runner.kubernetes.kubeconfig")
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=path, context=spec.context, client_configuration=configuration)
    except ConfigException as exc:
        raise PreflightError(f"kubeconfig {path}: {exc}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PreflightError(f"kubeconfig {path} cannot be read ({type(exc).__name__}: {exc})") from None
    refuse_plain_http(configuration.host, spec.insecure)
    return configuration


def refuse_plain_http(server: str, insecure: bool) -> None:
    """Plain ``http://`` to another machine needs ``runner.kubernetes.insecure: true``."""
    if urlsplit(server).scheme != "http" or insecure or is_loopback(server):
        return
    raise PreflightError(
        f"Kubernetes API server {server} is plain HTTP to another machine, so every agent's API key and the "
        "repository would cross the network in clear text; use the server's https:// address (a kubeconfig "
        "with its certificate-authority), an ssh tunnel to a loopback port, or set runner.kubernetes.insecure: "
        "true to accept the risk"
    )


def translate(exc: BaseException, what: str) -> RunnerError:
    """A client error as :class:`ContainerError`, retryable when a retry can outlive it."""
    if isinstance(exc, RunnerError):
        return exc
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        reason = api_message(exc)
        return ContainerError(f"{what}: {reason}", retryable=exc.status in _TRANSIENT_STATUS)
    transient = isinstance(exc, OSError) or type(exc).__name__ in (
        "MaxRetryError",
        "NewConnectionError",
        "ProtocolError",
        "ReadTimeoutError",
        "WebSocketConnectionClosedException",
        "WebSocketTimeoutException",
    )
    return ContainerError(f"{what}: {type(exc).__name__}: {exc}", retryable=transient)


def api_message(exc: Any) -> str:
    """The server's own message of an ApiException (its Status body), else its HTTP reason."""
    body = getattr(exc, "body", None)
    if body:
        try:
            data = json.loads(body)
            if isinstance(data, dict) and data.get("message"):
                return f"{data['message']} (HTTP {exc.status})"
        except ValueError:
            pass
    return f"HTTP {exc.status} {exc.reason}"


def _api_status(exc: BaseException) -> int | None:
    from kubernetes.client.exceptions import ApiException

    return exc.status if isinstance(exc, ApiException) else None


def is_not_found(exc: BaseException) -> bool:
    return _api_status(exc) == 404


def is_conflict(exc: BaseException) -> bool:
    return _api_status(exc) == 409
