"""Several Docker engines for one run (``runner.hosts``, ``--docker-host``): which engines, and
which task goes where. Any engine but ``local`` is remote: the workspace travels through the
archive API (archive.py). Placement and an engine that stops answering: docs/scaling.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import anyio
import msgspec

from ..errors import ConfigError, ContainerError, HostDownError, PreflightError, RunnerError
from ..sanitize import default_sanitizer, redact_url
from .base import RunnerEventCallback
from .docker_containers import DEFAULT_CLIENT_TIMEOUT_S, DEFAULT_THREADS, DockerHost, default_client_factory
from .docker_core import TaskEvents, session_volume
from .transport import refuse_plain_tcp, transport_of
from .types import InstanceRequest, RunnerResult

if TYPE_CHECKING:
    from .docker_runner import DockerRunner

LOCAL = "local"
PROBE_INTERVAL_S = 30.0
WATCH_INTERVAL_S = 10.0
DEFAULT_HOST_SLOTS = 4
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_SCHEMES = ("ssh", "tcp", "unix", "npipe")


@dataclass(frozen=True)
class TLSFiles:
    """Where a tcp:// engine's TLS material is; docker-py's TLSConfig is built from it
    in the thread that makes the client (importing docker-py on the event loop while
    the launcher warms it up in another thread can fail half-way)."""

    ca: str | None  # None: the system's CAs (or none, unverified)
    cert: tuple[str, str] | None
    verify: bool

    def config(self) -> Any:
        import docker.tls

        return docker.tls.TLSConfig(client_cert=self.cert, ca_cert=self.ca, verify=self.verify)


@dataclass(frozen=True)
class HostSpec:
    """One configured engine, resolved to a URL (None: the local engine)."""

    name: str
    url: str | None
    max_parallel: int
    tls: TLSFiles | None = None  # tcp:// engines that use TLS
    insecure: bool = False  # plain tcp:// to another machine, accepted with a warning
    context: str | None = None  # the docker context the URL and TLS came from

    @property
    def remote(self) -> bool:
        return self.url is not None

    @property
    def transport(self) -> str:
        """ssh, TLS verified, TLS unverified, plain (loopback), plain (insecure) or local socket."""
        return transport_of(self)

    @property
    def shown_url(self) -> str:
        return redact_url(self.url)

    @property
    def shown(self) -> str:
        return f"{self.name} ({redact_url(self.url)})" if self.url else self.name


def _hide_secrets(url: str) -> None:
    """A password or query value in a host URL may show up in a library's error text:
    the sanitizer removes it from everything written."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    values = [userinfo.split(":", 1)[1]] if ":" in userinfo else []
    values += [v for _, v in parse_qsl(parts.query) if v]
    default_sanitizer().add_secrets(v for v in values if len(v) >= 4)


def parse_host_flag(text: str) -> dict[str, Any]:
    """``--docker-host NAME=URL[:N]`` as a ``runner.hosts`` entry.

    ``N`` is the host's slot count. A ``tcp://`` URL always names its port, so
    ``tcp://h:2376`` has no slot count and ``tcp://h:2376:8`` has 8; for
    ``ssh://`` a trailing number is the slot count (``ssh://u@h:2222:8`` for a
    custom ssh port). ``NAME=local[:N]`` is this machine's engine.
    """
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise ConfigError(f"--docker-host {text!r}: expected NAME=URL[:N], e.g. big1=ssh://ci@big1:16")
    slots: int | None = None
    head, colon, tail = rest.rpartition(":")
    if colon and tail.lstrip("-").isdigit():
        # The port of a tcp:// URL: nothing after its host (past any user:password@
        # and an IPv6 [address]) names one yet.
        hostpart = head.removeprefix("tcp://").rpartition("@")[2]
        is_tcp_port = head.startswith("tcp://") and ":" not in hostpart.rpartition("]")[2]
        if not is_tcp_port and (head == LOCAL or "://" in head):
            slots, rest = int(tail), head
            if slots < 1:  # said of the flag the user typed, not of runner.hosts' max_parallel
                raise ConfigError(
                    f"--docker-host {text!r}: its slot count N must be a whole number of at least 1, got {tail}"
                )
    entry: dict[str, Any] = {"name": name, "docker": rest}
    if slots is not None:
        entry["max_parallel"] = slots
    return entry


def _context_endpoint(context: str) -> tuple[str, TLSFiles | None]:
    """The engine URL (and TLS settings) of a ``docker context``."""
    try:
        proc = subprocess.run(["docker", "context", "inspect", context], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError(f"cannot read docker context {context!r}: {exc}") from None
    if proc.returncode != 0:
        raise PreflightError(f"docker context {context!r} not found; list them with `docker context ls`")
    info = json.loads(proc.stdout)[0]
    endpoint = (info.get("Endpoints") or {}).get("docker") or {}
    url = endpoint.get("Host")
    if not url:
        raise PreflightError(f"docker context {context!r} has no Docker endpoint")
    tls: TLSFiles | None = None
    tls_dir = Path((info.get("Storage") or {}).get("TLSPath") or "") / "docker"
    skip_verify = bool(endpoint.get("SkipTLSVerify"))
    # As the Docker CLI does: TLS when the context has TLS files or skips verification
    # (TLS with no CA of its own then; the connection is encrypted, the engine unchecked).
    has_files = any((tls_dir / f).exists() for f in ("ca.pem", "cert.pem"))
    if url.startswith("tcp://") and (has_files or skip_verify):
        tls = _tls_config(tls_dir, verify=not skip_verify)
    return url, tls


def _tls_config(cert_dir: Path, verify: bool) -> TLSFiles:
    cert = (str(cert_dir / "cert.pem"), str(cert_dir / "key.pem")) if (cert_dir / "cert.pem").exists() else None
    ca = str(cert_dir / "ca.pem") if (cert_dir / "ca.pem").exists() else None
    return TLSFiles(ca=ca, cert=cert, verify=verify)


def _tls_from_env(url: str) -> TLSFiles | None:
    """``tcp://`` engines use TLS the way the Docker CLI does: DOCKER_CERT_PATH or ~/.docker."""
    if not url.startswith("tcp://"):
        return None
    cert_dir = Path(os.environ.get("DOCKER_CERT_PATH") or Path.home() / ".docker")
    if not (cert_dir / "ca.pem").exists():
        return None
    return _tls_config(cert_dir, verify=os.environ.get("DOCKER_TLS_VERIFY", "1") not in ("", "0"))


def _tls_from_cert_path(name: str, url: str | None, cert_path: str) -> TLSFiles:
    """A host's own ``cert_path``: ca.pem, cert.pem and key.pem, always verified."""
    if not url or not url.startswith("tcp://"):
        raise ConfigError(f"runner.hosts: host {name!r} has cert_path but TLS is only for tcp:// URLs")
    cert_dir = Path(cert_path).expanduser()
    missing = [f for f in ("ca.pem", "cert.pem", "key.pem") if not (cert_dir / f).is_file()]
    if missing:
        raise ConfigError(
            f"runner.hosts: host {name!r} cert_path {str(cert_dir)!r} lacks {', '.join(missing)} "
            "(it needs ca.pem, cert.pem and key.pem, as DOCKER_CERT_PATH does)"
        )
    return _tls_config(cert_dir, verify=True)


def resolve_hosts(entries: Sequence[Any]) -> list[HostSpec]:
    """Validate ``runner.hosts`` entries (HostConfig structs or dicts) into specs."""
    specs: list[HostSpec] = []
    seen: set[str] = set()
    for raw in entries:
        entry = msgspec.to_builtins(raw) if not isinstance(raw, dict) else raw
        name = str(entry.get("name") or "")
        if not _NAME_RE.match(name):
            raise ConfigError(f"runner.hosts: host name {name!r} must be letters, digits, '.', '_' or '-'")
        if name in seen:
            raise ConfigError(f"runner.hosts: host {name!r} is listed twice; give each engine its own name")
        seen.add(name)
        url, context = entry.get("docker"), entry.get("context")
        if url == LOCAL:
            url = None  # `--docker-host NAME=local`: this machine's engine under another name
        if url and context:
            raise ConfigError(f"runner.hosts: host {name!r} has both docker and context; keep one")
        slots = entry.get("max_parallel")
        if slots is not None and (not isinstance(slots, int) or slots < 1):
            raise ConfigError(f"runner.hosts: host {name!r} max_parallel must be a whole number of at least 1")
        tls: TLSFiles | None = None
        if context and entry.get("cert_path"):
            raise ConfigError(f"runner.hosts: host {name!r} has cert_path and context; a context keeps its own TLS")
        insecure = entry.get("insecure", False)  # a bool: HostConfig's type, and the flag never sets it
        if context:
            url, tls = _context_endpoint(context)
        elif url:
            _hide_secrets(url)
            scheme = urlsplit(url).scheme
            if scheme not in _SCHEMES:
                raise ConfigError(
                    f"runner.hosts: host {name!r} URL {redact_url(url)!r} must start with ssh://, tcp:// or unix://"
                )
            cert_path = entry.get("cert_path")
            tls = _tls_from_cert_path(name, url, cert_path) if cert_path else _tls_from_env(url)
        elif name != LOCAL and entry.get("docker") != LOCAL:
            raise ConfigError(
                f"runner.hosts: host {name!r} needs docker: URL or context: NAME "
                f"(only the host named {LOCAL!r} means this machine's engine)"
            )
        if insecure and not (url or "").startswith("tcp://"):
            raise ConfigError(
                f"runner.hosts: host {name!r} has insecure: true, which only plain tcp:// engines need; remove it"
            )
        spec = HostSpec(
            name=name,
            url=url,
            max_parallel=slots or DEFAULT_HOST_SLOTS,
            tls=tls,
            insecure=insecure,
            context=context or None,
        )
        # Here, before any client exists: making one already talks to the engine.
        refuse_plain_tcp(spec)
        specs.append(spec)
    return specs


def _tls_error(tls: TLSFiles, text: str) -> ContainerError:
    """A failed TLS handshake as its fix: which file to change, not "start Docker"."""
    ca = tls.ca or "the system's CAs"
    reason = re.search(r"certificate verify failed: ([^('\"]+)", text)
    if reason:
        return ContainerError(
            f"the engine's TLS certificate is not trusted by {ca} ({reason.group(1).strip()}); "
            "use the ca.pem of the CA that signed the engine's certificate"
        )
    # The engine's alert about the certificate this client showed (or did not show).
    refused = re.search(r"ALERT_(BAD_CERTIFICATE|UNKNOWN_CA|CERTIFICATE_\w+)|CERTIFICATE_REQUIRED", text)
    if refused:
        shown = tls.cert[0] if tls.cert else None
        return ContainerError(
            f"the engine refused this client's TLS certificate ({refused.group(0).lower()}): "
            + (
                f"replace {shown} and its key.pem with a client certificate signed by the CA the engine "
                "was started with (--tlscacert)"
                if shown
                else f"put cert.pem and key.pem signed by the engine's CA (--tlscacert) beside {ca}"
            )
        )
    detail = re.search(r"SSLError\((.*)\)\)", text)
    return ContainerError(
        f"TLS handshake with the engine failed ({(detail.group(1) if detail else text)[:200]}); "
        f"check that {ca} and the client certificate {tls.cert[0] if tls.cert else '(none)'} "
        "come from the CA the engine was started with (--tlscacert)"
    )


def _keep_engine_ca(api: Any, url: str) -> None:
    """requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE replace the CA a session was
    given, so with either set (common where a proxy re-signs traffic) the engine's own
    CA was never used and every TLS engine failed verification. The environment is
    no longer consulted for this client; its proxy settings are copied in by hand."""
    import requests.utils

    api.trust_env = False
    api.proxies.update(requests.utils.get_environ_proxies("https://" + url.split("://", 1)[1]))


def client_factory(spec: HostSpec, timeout: int = DEFAULT_CLIENT_TIMEOUT_S) -> Callable[[], Any]:
    if spec.url is None:
        return lambda: default_client_factory(timeout=timeout)

    url = spec.url
    ssh = url.startswith("ssh://")

    def make():
        if ssh:
            # first: it hands docker-py the ssh transport that DockerClient looks up below
            from .ssh_transport import use_pooled_ssh
        import docker
        import docker.constants

        if spec.tls and not spec.tls.verify:
            import warnings

            import urllib3

            # urllib3 would say so on stderr, mid-run, with a source line; the run
            # already warns once per start, naming the host (transport.py).
            warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
        try:
            client = docker.DockerClient(
                base_url=url,
                tls=spec.tls.config() if spec.tls else False,
                timeout=timeout,
                max_pool_size=DEFAULT_THREADS,
                use_ssh_client=ssh,
                # With TLS or ssh, the API version is asked for only once the
                # transport is set up below.
                version=docker.constants.MINIMUM_DOCKER_API_VERSION if spec.tls or ssh else None,
            )
            api: Any = client.api
            if spec.tls:
                _keep_engine_ca(api, url)
            if ssh:
                use_pooled_ssh(api, url, timeout, DEFAULT_THREADS)
            if spec.tls or ssh:
                api._version = api._retrieve_server_version()
            return client
        except Exception as exc:
            # docker-py repeats the URL it was given, password and all, and this
            # text reaches the terminal (only the files the run writes are sanitized).
            text = str(exc)
            if spec.tls and "SSL" in text:
                raise _tls_error(spec.tls, text) from None
            if url not in text:
                raise
            raise ContainerError(text.replace(url, redact_url(url)), retryable=True) from None

    return make


def docker_host(spec: HostSpec, limiter: anyio.CapacityLimiter | None = None) -> DockerHost:
    return DockerHost(client_factory(spec), limiter, name=spec.name, archive=spec.remote)


# ---------------------------------------------------------------- placement


@dataclass
class _Slot:
    spec: HostSpec
    runner: DockerRunner
    running: int = 0
    down: bool = False
    next_probe: float = 0.0
    reason: str = ""

    @property
    def free(self) -> int:
        return 0 if self.down else self.spec.max_parallel - self.running


class AllHostsDown(HostDownError):
    """Every configured engine has stopped answering."""


class MultiHostRunner:
    """A TaskRunner that places each task on one of several Docker engines."""

    def __init__(
        self,
        specs: Sequence[HostSpec],
        make_runner: Callable[[DockerHost], DockerRunner],
        *,
        on_host_event: Callable[[dict[str, Any]], None] | None = None,
        on_all_down: Callable[[], None] | None = None,
    ) -> None:
        if not specs:
            raise ConfigError("runner.hosts is empty")
        self.slots = [_Slot(spec, make_runner(docker_host(spec))) for spec in specs]
        # Each DockerRunner forwards the git layer's log lines to runner.jsonl; one is enough.
        for slot in self.slots[1:]:
            slot.runner.stop_log_forwarding()
        # set, and replaced, whenever a slot frees or a host goes down or comes back
        self._changed = anyio.Event()
        self._on_host_event = on_host_event
        # Called once when every host is down: the run stops, resumably, instead of
        # failing its tasks one by one (without it, placement raises AllHostsDown).
        self._on_all_down = on_all_down
        self._all_down_told = False
        # Told the whole host table whenever a host goes down or comes back (the
        # orchestration records it as a hosts.status event, which the dashboard reads).
        self.on_status: Callable[[list[dict[str, Any]]], None] | None = None
        # instance_id -> (slot, request as placed, the session reset to tell once run() has its callback)
        self._reserved: dict[str, tuple[_Slot, InstanceRequest, dict[str, Any]]] = {}

    # ---- status ---------------------------------------------------------

    def status_table(self) -> list[dict[str, Any]]:
        """The hosts, their slots and whether each is down: the ``hosts.status`` payload's list."""
        return [
            {
                "name": s.spec.name,
                "max_parallel": s.spec.max_parallel,
                "down": s.down,
                **({"reason": s.reason} if s.down and s.reason else {}),
            }
            for s in self.slots
        ]

    def _status_changed(self) -> None:
        if self.on_status is not None:
            self.on_status(self.status_table())

    @property
    def _task_event(self) -> TaskEvents:
        """A placement event of one task: through the runner's own emitter (runner.jsonl, scrubbed to the caller)."""
        return self.slots[0].runner.emit_event

    def _event(self, type_: str, **fields: Any) -> None:
        if self._on_host_event is not None:
            self._on_host_event({"type": type_, **fields})

    # ---- health -----------------------------------------------------------

    async def _answers(self, slot: _Slot, within_s: float = 10.0) -> bool:
        try:
            with anyio.fail_after(within_s):
                await slot.runner.host.api(f"ping {slot.spec.name}", "ping")
            return True
        except (RunnerError, TimeoutError):
            return False

    def _mark_down(self, slot: _Slot, reason: str) -> None:
        if not slot.down:
            slot.down, slot.reason = True, reason
            self._event("runner.host.down", host=slot.spec.name, reason=reason)
            self._status_changed()
        slot.next_probe = time.monotonic() + PROBE_INTERVAL_S
        self._notify()

    async def _probe_down_hosts(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.down and now >= slot.next_probe:
                slot.next_probe = now + PROBE_INTERVAL_S
                await slot.runner.host.aclose()  # a fresh connection: the old pool may be dead
                if await self._answers(slot):
                    slot.down, slot.reason = False, ""
                    self._all_down_told = False
                    self._event("runner.host.up", host=slot.spec.name)
                    self._status_changed()
                    self._notify()

    # ---- placement ----------------------------------------------------------

    async def _session_home(self, request: InstanceRequest) -> _Slot | None:
        """The engine that holds this task's session volume, if any answers."""
        volume = session_volume(request)
        for slot in (s for s in self.slots if not s.down):
            with contextlib.suppress(RunnerError):
                await slot.runner.host.api(f"inspect volume {volume}", "inspect_volume", volume)
                return slot
        return None

    def _pick(self, exclude: set[str]) -> _Slot | None:
        free = [s for s in self.slots if s.spec.name not in exclude and s.free > 0]
        return max(free, key=lambda s: s.free, default=None)  # the first of equals: the host listed first

    async def _acquire(self, exclude: set[str], prefer: _Slot | None) -> _Slot:
        while True:
            await self._probe_down_hosts()
            slot = prefer if prefer is not None and not prefer.down and prefer.free > 0 else self._pick(exclude)
            if slot is not None:
                slot.running += 1
                return slot
            if all(s.down or s.spec.name in exclude for s in self.slots):
                names = ", ".join(s.spec.name for s in self.slots)
                if not self._stop_when_all_down():
                    raise AllHostsDown(
                        f"every Docker host is down or already failed this task ({names}); "
                        "fix the hosts and resume the run"
                    )
                # Every host is down: the caller was told to stop the run (resumably);
                # until it does, keep probing in case a host comes back.
            with anyio.move_on_after(1.0):  # also wakes for the next probe of a down host
                await self._changed.wait()

    def _stop_when_all_down(self) -> bool:
        """True when every host is down and the caller stops the run on that (told once)."""
        if self._on_all_down is None or not all(s.down for s in self.slots):
            return False
        if not self._all_down_told:
            self._all_down_told = True
            self._on_all_down()
        return True

    def _release(self, slot: _Slot) -> None:
        slot.running -= 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _first_slot(self, request: InstanceRequest) -> tuple[_Slot, InstanceRequest, dict[str, Any]]:
        """The task's engine, and (placed without its session) the session reset to tell."""
        prefer = await self._session_home(request) if request.session_id else None
        slot = await self._acquire(set(), prefer)
        if not request.session_id or prefer is not None:
            return slot, request, {}
        # No answering engine holds the session volume (its host is gone or no
        # longer configured): the agent starts a fresh session where it is placed.
        self._event(
            "runner.host.session_lost", task_key=request.task_key, session_id=request.session_id, host=slot.spec.name
        )
        reset = {
            "reason": "host_gone",
            "host": slot.spec.name,
            "previous_session_id": request.session_id,
            "detail": f"no answering Docker host holds the session volume {session_volume(request)}; "
            f"a fresh session starts on host {slot.spec.name}",
        }
        return slot, msgspec.structs.replace(request, session_id=None), reset

    async def reserve(self, request: InstanceRequest) -> str:
        """Choose the task's engine (and take its slot) before it starts, so the
        ``task.started`` record can name it; the next :meth:`run` of the task uses it."""
        self._reserved[request.instance_id] = await self._first_slot(request)
        return self._reserved[request.instance_id][0].spec.name

    async def run(self, request: InstanceRequest, *, on_event: RunnerEventCallback | None = None) -> RunnerResult:
        reserved = self._reserved.pop(request.instance_id, None)
        slot, request, reset = reserved if reserved is not None else await self._first_slot(request)
        if reset:
            self._task_event(request, on_event, "runner.session.reset", "warn", **reset)
        tried: set[str] = set()
        while True:
            name = slot.spec.name
            self._task_event(request, on_event, "runner.host.assigned", host=name)
            try:
                result = await self._run_watched(slot, request, on_event)
            except RunnerError as exc:
                result = _failed(request, error_type=exc.category, error=str(exc))
            finally:
                self._release(slot)
            if result.status == "success" or result.error_type not in ("container", "docker"):
                return result
            if not slot.down and await self._answers(slot):
                return result
            # The engine itself is gone, not just the container: a "docker" failure
            # naming the host, and the task moves to another host.
            message = f"Docker host {name} stopped answering: {result.error or 'no answer'}"
            self._mark_down(slot, message)
            tried.add(name)
            failed = host_lost(self._task_event, request, on_event, result, name, message)
            if all(s.down or s.spec.name in tried for s in self.slots) and not self._stop_when_all_down():
                return failed
            slot = await self._acquire(tried, None)
            detail = f"{message}; the task starts afresh on host {slot.spec.name}"
            request = start_afresh(self._task_event, request, on_event, slot.spec.name, detail)

    async def _run_watched(
        self, slot: _Slot, request: InstanceRequest, on_event: RunnerEventCallback | None
    ) -> RunnerResult:
        """The task on its engine, while the engine is asked every ``WATCH_INTERVAL_S``
        whether it still answers: a dead engine would otherwise cost the runner's
        whole retry schedule (minutes) before the task could move elsewhere."""
        outcome: dict[str, Any] = {}

        async def task(scope: anyio.CancelScope) -> None:
            try:
                outcome["result"] = await slot.runner.run(request, on_event=on_event)
            except Exception as exc:
                # Kept inside the group and raised below as itself: leaving the group it
                # would be wrapped in an ExceptionGroup, which the caller's `except
                # RunnerError` misses (a git failure would be reported as our own bug).
                outcome["error"] = exc
            scope.cancel()

        async def watch(scope: anyio.CancelScope) -> None:
            while True:
                await anyio.sleep(WATCH_INTERVAL_S)
                if slot.down or not await self._answers(slot):
                    self._mark_down(slot, f"Docker host {slot.spec.name} stopped answering")
                    scope.cancel()
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(task, tg.cancel_scope)
            tg.start_soon(watch, tg.cancel_scope)
        if "error" in outcome:
            raise outcome["error"]
        if "result" in outcome:
            return outcome["result"]
        # The watcher stopped the task: the runner has stopped what it could, shielded.
        return _failed(request, error_type="docker", error="no answer while the task ran")

    async def discard_workspace(self, request: InstanceRequest) -> None:
        # Workspaces are on this machine whichever engine ran the task.
        await self.slots[0].runner.discard_workspace(request)

    async def aclose(self) -> None:
        for slot in self.slots:
            await slot.runner.aclose()


def _failed(request: InstanceRequest, **error: Any) -> RunnerResult:
    return RunnerResult(
        status="failed", instance_id=request.instance_id, container_name=request.container_name, **error
    )


def host_lost(
    emit: TaskEvents,
    request: InstanceRequest,
    on_event: RunnerEventCallback | None,
    result: RunnerResult,
    host: str | None,
    why: str,
) -> RunnerResult:
    """The engine (or Pod) a task ran on went away: told, and the result as a "docker" failure."""
    emit(request, on_event, "runner.host.replaced", "warn", host=host, error=why, error_type="docker")
    return msgspec.structs.replace(result, error_type="docker", error=why)


def start_afresh(
    emit: TaskEvents, request: InstanceRequest, on_event: RunnerEventCallback | None, host: str | None, detail: str
) -> InstanceRequest:
    """The task placed again after :func:`host_lost`, fresh: its session and its agent's
    work in the workspace stayed with what was lost."""
    fields = {"reason": "host_down", "host": host, "previous_session_id": request.session_id, "error_type": "docker"}
    emit(request, on_event, "runner.session.reset", "warn", **fields, detail=detail)
    return msgspec.structs.replace(request, session_id=None, resume_workspace=False)
