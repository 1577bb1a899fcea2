"""How each Docker engine's traffic is protected, and the refusal of plain TCP.

What each transport protects, and why plain ``tcp://`` to another machine is
refused: docs/scaling.md ("Security"). The decision is taken from the URL alone:
resolving a name would itself be network traffic.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..errors import PreflightError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .hosts import HostSpec

LOCAL_SOCKET = "local socket"
SSH = "ssh"
TLS_VERIFIED = "TLS verified"
TLS_UNVERIFIED = "TLS unverified"
PLAIN_LOOPBACK = "plain (loopback)"
PLAIN_INSECURE = "plain (insecure)"
# Only this name counts as loopback without a lookup; any other is another machine.
LOOPBACK_NAMES = ("localhost", "localhost.")


def is_loopback(url: str) -> bool:
    """Whether a ``tcp://`` URL names this machine's loopback, decided without DNS."""
    host = urlsplit(url).hostname or ""
    if host in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def transport_of(spec: HostSpec) -> str:
    """One of the labels above: what protects this engine's traffic."""
    url = spec.url
    if url is None or not url.startswith(("tcp://", "ssh://")):
        return LOCAL_SOCKET  # this machine's engine, unix:// or npipe://: no network in between
    if url.startswith("ssh://"):
        return SSH
    if spec.tls is not None:
        return TLS_VERIFIED if spec.tls.verify else TLS_UNVERIFIED
    return PLAIN_LOOPBACK if is_loopback(url) else PLAIN_INSECURE


def refuse_plain_tcp(spec: HostSpec) -> None:
    """Pre-flight, before any connection: plain ``tcp://`` to another machine needs ``insecure: true``."""
    if transport_of(spec) != PLAIN_INSECURE or spec.insecure:
        return
    where = f"docker context {spec.context!r} points it at " if spec.context else ""
    host = urlsplit(spec.url or "").hostname or "HOST"
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    raise PreflightError(
        f"Docker host {spec.name}: {where}{spec.shown_url} is plain TCP without TLS, so every agent's API key "
        "and the repository would cross the network in clear text (and the engine gives root to anyone who "
        f"reaches its port); use ssh://USER@{host}, or TLS: cert_path in runner.hosts (a directory with "
        "ca.pem, cert.pem and key.pem), or a docker context created with ca=, cert= and key="
    )


@dataclass(frozen=True)
class Risk:
    """What an engine reached without protection exposes, and the fix."""

    how: str  # how it is reached, as the warning says it
    exposed: str
    fix: str
    why: str = ""  # the setting that made it so, when the label does not say


def transport_risk(spec: HostSpec) -> Risk | None:
    """The risk of an engine reached without protection; None when its traffic is protected."""
    label = transport_of(spec)
    if label == PLAIN_INSECURE:
        return Risk(
            "plain TCP (insecure: true)",
            "every agent's API key and the repository cross the network in clear text",
            "use ssh:// or TLS (see docs/scaling.md)",
        )
    if label == TLS_UNVERIFIED:
        why = (
            f"docker context {spec.context!r} has SkipTLSVerify" if spec.context else "DOCKER_TLS_VERIFY is empty or 0"
        )
        return Risk(
            "TLS without checking the engine's certificate",
            "anyone on the path can pose as the engine and read every agent's API key and the repository",
            "give it the engine's CA (ca.pem) and verify the certificate",
            why,
        )
    return None


def transport_warnings(specs: Sequence[HostSpec]) -> list[str]:
    """The warnings a run prints on every start, one per engine reached without protection."""
    warnings = []
    for spec in specs:
        risk = transport_risk(spec)
        if risk is not None:
            how = f"{risk.how} ({risk.why})" if risk.why else risk.how
            warnings.append(f"Docker host {spec.name} ({spec.shown_url}) uses {how}: {risk.exposed}; {risk.fix}")
    return warnings
