"""Containers and volumes: everything the runner asks of the Docker daemon.

docker-py calls block, so each goes through :meth:`DockerHost.call` (a worker thread
under one shared limiter and one client per process), which turns library errors into
:class:`~orchestrator.errors.ContainerError`, retryable when transient. Mounts and
hardening: docs/docker.md. Credentials are *not* part of the container configuration
(``docker inspect`` would show them while the container is retained): each exec gets them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread

from ..errors import ContainerError, RunnerError
from ..jsonlog import utc_now_iso
from .types import WORKSPACE_MOUNT, Hardening, InstanceRequest

T = TypeVar("T")

DEFAULT_CLIENT_TIMEOUT_S = 60
DEFAULT_THREADS = 32
HOME_MOUNT = "/home/node"
# Remote engines (archive path): the per-task volume that holds /workspace.
WORKSPACE_VOLUME_PREFIX = "orc_ws_"
# Remote engines: where the engine's object cache (object_cache.py) is mounted, read-only.
OBJECT_CACHE_MOUNT = "/orchestrator-objects"
TMPFS_OPTIONS = "rw,exec,nosuid,nodev,size=256m,mode=1777"
# An offline container on the local engine gets no network from the engine at all (``network_disabled``):
# Docker then skips the network namespace it sets up even for ``network_mode: none`` (two re-runs of
# dockerd's own binary and the kernel's namespace set-up and tear-down: about 0.2 CPU-seconds and 0.3 s
# per container on a 2-core machine; bench/container_start.py). It also writes no /etc/hosts, so this
# one, kept in the run's folder, is bound in its place: ``localhost`` must resolve for tools that use
# the container's own loopback.
OFFLINE_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
OFFLINE_HOSTS_NAME = ".offline-hosts"
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")

# Docker errors a retry can outlive: the daemon or the network was briefly
# unreachable or slow. Every daemon error message starts with "Error
# response from daemon", so that phrase is removed before matching "daemon".
_TRANSIENT = re.compile(
    r"(?i)connection refused|no such host|timeout|timed out|daemon|cannot connect|connection reset"
    r"|ECONNREFUSED|ETIMEDOUT|ENETUNREACH"
)
_DAEMON_PREFIX = re.compile(r"(?i)error response from daemon")

DOCKER_START_HINT = (
    "start Docker (Linux: `sudo systemctl start docker`; macOS/Windows: open Docker Desktop) "
    "and make sure your user can reach the socket (DOCKER_HOST or /var/run/docker.sock)"
)


def is_transient(message: str) -> bool:
    return bool(_TRANSIENT.search(_DAEMON_PREFIX.sub("", message)))


def default_client_factory(timeout: int = DEFAULT_CLIENT_TIMEOUT_S, max_pool_size: int = DEFAULT_THREADS):
    """``docker.from_env`` with a bounded API timeout and a pool as large as the thread limiter."""
    import docker

    return docker.from_env(timeout=timeout, max_pool_size=max_pool_size)


class OncePerKey(Generic[T]):
    """Values worked out once per key (an image): a run's tasks start together, one works it out, the rest wait."""

    def __init__(self, known: dict[str, T] | None = None) -> None:
        self.values: dict[str, T] = dict(known or {})
        self._locks: dict[str, anyio.Lock] = {}

    async def get(self, key: str, compute: Callable[[], Awaitable[T]]) -> T:
        if key not in self.values:
            async with self._locks.setdefault(key, anyio.Lock()):
                if key not in self.values:  # a compute that raised kept nothing: this asker tries again
                    self.values[key] = await compute()
        return self.values[key]


class DockerHost:
    """One docker client plus the thread limiter every blocking call runs under."""

    def __init__(
        self,
        client_factory: Callable[[], Any] | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        *,
        name: str | None = None,
        archive: bool = False,
    ) -> None:
        self._factory = client_factory or default_client_factory
        # name: the configured host (runner.hosts) this engine is, None without hosts.
        # archive: the engine cannot see this machine's directories, so the workspace
        # travels as a tar stream into a per-task volume (see archive.py).
        self.name = name
        self.archive = archive
        self._client: Any = None
        self._client_lock = threading.Lock()
        self.limiter = limiter or anyio.CapacityLimiter(DEFAULT_THREADS)
        # images whose fresh session volumes get a node-owned /home/node
        self.home_writable: OncePerKey[bool] = OncePerKey()

    async def client(self) -> Any:
        if self._client is None:
            try:
                return await anyio.to_thread.run_sync(self._connect, limiter=self.limiter)
            except RunnerError:
                raise  # the client factory already said what is wrong (a host's TLS files, say)
            except Exception as exc:
                raise self._unreachable(exc) from exc
        return self._client

    def _unreachable(self, exc: Exception) -> RunnerError:
        return ContainerError(f"cannot connect to Docker: {exc}; {DOCKER_START_HINT}", retryable=True)

    @staticmethod
    def _translate(exc: BaseException, what: str) -> RunnerError:
        """docker-py/requests/OS errors as :class:`ContainerError`, retryable when transient (KubeHost: its client's)."""
        retryable = (
            isinstance(exc, OSError)
            or is_transient(str(exc))
            or type(exc).__name__ in ("ConnectionError", "ReadTimeout", "ConnectTimeout", "Timeout")
        )
        return ContainerError(f"{what}: {exc}", retryable=retryable)

    def _connect(self) -> Any:
        # The tasks of a run ask at the same moment: one connects (a /version round
        # trip) and the others wait for its client. A thread lock, because the
        # process-wide host outlives event loops (tests run one per test).
        with self._client_lock:
            if self._client is None:
                self._client = self._factory()
            return self._client

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on a worker thread; docker errors become :class:`ContainerError`."""
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self.limiter)
        except RunnerError:
            raise
        except Exception as exc:
            raise self._translate(exc, what) from exc

    async def api(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``client.api.<method>`` on a worker thread."""
        client = await self.client()
        return await self.call(what, getattr(client.api, method), *args, **kwargs)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await anyio.to_thread.run_sync(client.close, limiter=self.limiter)

    # ---- small queries ---------------------------------------------------

    async def _unless_missing(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``client.api.<method>(...)``, or None when Docker has no such object."""
        import docker.errors

        client = await self.client()

        def run() -> Any:
            try:
                return getattr(client.api, method)(*args, **kwargs)
            except docker.errors.NotFound:  # ImageNotFound too
                return None

        return await self.call(what, run)

    async def inspect_container(self, name: str) -> dict | None:
        return await self._unless_missing(f"inspect container {name}", "inspect_container", name)

    async def inspect_image(self, image: str) -> dict | None:
        return await self._unless_missing(f"inspect image {image}", "inspect_image", image)

    async def image_exists(self, image: str) -> bool:
        return await self.inspect_image(image) is not None

    # `timeout` is Docker's grace period before SIGKILL, not a deadline for this call.
    async def stop(self, name: str, *, timeout: float = 2) -> None:  # noqa: ASYNC109
        await self._unless_missing(f"stop container {name}", "stop", name, timeout=max(0, int(timeout)))

    async def remove(self, name: str) -> None:
        import docker.errors

        client = await self.client()

        def _rm():
            try:
                client.api.remove_container(name, force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                # Another process (a second run's orphan scan) is removing it right now: it goes either way.
                if exc.status_code != 409 or "already in progress" not in str(exc):
                    raise

        await self.call(f"remove container {name}", _rm)

    async def exec_simple(self, name: str, cmd: list[str], *, user: str = "node") -> tuple[int, bytes]:
        """Run a short command to completion; returns (exit code, combined output)."""
        client = await self.client()

        def _run():
            exec_id = client.api.exec_create(name, cmd, user=user, stdout=True, stderr=True)["Id"]
            out = client.api.exec_start(exec_id)
            code = client.api.exec_inspect(exec_id).get("ExitCode")
            return (code if code is not None else -1), out

        return await self.call(f"exec in {name}", _run)

    @property
    def image_source(self) -> DockerHost:
        """The engine whose copy of a task's image the workspace seed is taken from."""
        return self

    # ---- what the task pipeline asks of an engine ---------------------------
    # The phases (docker_workspace, docker_agent, docker_collect, archive) reach the
    # engine only through these methods and the ones above, so another place to run
    # tasks (a Kubernetes namespace: kube_host.KubeHost) is this class's surface again.

    async def ensure_container(
        self,
        request: InstanceRequest,
        *,
        workspace: Path,
        volume: str,
        fresh_workspace: bool = False,
        hardening: Hardening | None = None,
        object_cache: str | None = None,
    ) -> ContainerReady:
        """Reuse, start, replace or create the task's container: in the common case one worker-thread
        hop (create, which creates a missing session volume, and start); a name conflict decides.

        ``fresh_workspace``: the first container of this task in this process. A container
        still *running* then belongs to a process that died (SIGKILL leaves ``sleep infinity``
        and any agent exec running): its agent must not keep writing beside the resumed one,
        and after a re-clone its bind mount points at the deleted directory (an exec in it
        fails, exit 126). It is restarted instead: the stop ends the orphaned agent, the start
        binds the directory again.
        """
        client = await self.client()
        name = request.container_name
        objects = None
        if request.isolation_mode == "shared_objects" and not self.archive:  # a remote engine gets full copies
            from .git_ops import object_store_objects

            objects = object_store_objects(workspace, request.repo_path)
        mounts = TaskMounts(
            workspace,
            volume,
            workspace_read_only(request),
            workspace_volume=f"{WORKSPACE_VOLUME_PREFIX}{name}" if self.archive else None,
            objects=objects,
            object_cache=object_cache,
        )
        spec: dict[str, Any] = {
            "image": request.docker_image,
            "command": ["sleep", "infinity"],
            "name": name,
            "user": "node",
            "working_dir": WORKSPACE_MOUNT,
            "environment": base_environment(request),
            "labels": host_labels(request, self.name),
        }
        # A remote engine cannot bind a file of this machine: its offline containers keep network_mode none.
        no_network = request.network_egress == "offline" and not self.archive
        if no_network:
            spec["network_disabled"] = True

        def host_config() -> dict[str, Any]:
            offline_hosts = offline_hosts_file(workspace.parent) if no_network else None
            return host_config_kwargs(request, mounts, hardening, offline_hosts)

        create = functools.partial(_create_and_start, client, name, host_config, spec)
        existing = await self.call(f"create container {name}", create)
        action, reason = "created", ""
        if existing is not None:
            ok, reason = mounts_match(existing, mounts)
            if not request.reuse_container:
                ok, reason = False, "reuse_container is false"
            if ok:
                return await self._start_existing(name, volume, existing, fresh_workspace)
            await self.remove(name)
            existing = await self.call(f"create container {name}", create)
            if existing is not None:
                raise ContainerError(f"container {name} was re-created by someone else while being replaced")
            action = "replaced"
        await _ensure_home_writable(self, request, volume)
        return ContainerReady(name, action, volume, reason)

    async def _start_existing(self, name: str, volume: str, existing: dict, fresh_workspace: bool) -> ContainerReady:
        """An existing container with the right mounts: reused when running, else started (restarted when fresh)."""
        running = bool((existing.get("State") or {}).get("Running"))
        if running and not fresh_workspace:
            return ContainerReady(name, "reused", volume)
        if running:
            await self.stop(name, timeout=0)
        await self.api(f"start container {name}", "start", name)
        return ContainerReady(
            name,
            "restarted" if running else "started",
            volume,
            "left running by a process that exited" if running else "",
        )

    async def run_exec(self, container: str, argv: list[str], **kwargs: Any) -> Any:
        """One streamed exec of a task's process (see :func:`.docker_exec.run_exec`)."""
        from .docker_exec import run_exec

        return await run_exec(self, container, argv, **kwargs)

    async def put_archive(self, container: str, path: str, chunks: Iterable[bytes], *, read_only: bool = False) -> bool:
        """Extract a tar stream into ``path`` in the container; False when the engine refuses it."""
        return bool(await self.api(f"copy workspace into {container}", "put_archive", container, path, chunks))

    async def read_file(self, container: str, path: str) -> bytes:
        """The contents of one file in the container (through the archive API)."""
        import io
        import tarfile

        stream, _stat = await self.api(f"read {path} from {container}", "get_archive", container, path)
        raw = await self.call(f"read {path} from {container}", lambda: b"".join(stream))
        try:
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
                member = next((m for m in tar.getmembers() if m.isfile()), None)
                src = tar.extractfile(member) if member is not None else None
                if src is None:
                    raise ContainerError(f"{path} read from {container} is not a file")
                return src.read()
        except (tarfile.TarError, EOFError) as exc:
            raise ContainerError(f"{path} read from {container} came back damaged: {exc}") from exc

    async def kill(self, name: str) -> None:
        """SIGKILL the container at once (a runaway agent)."""
        await self.api(f"kill container {name}", "kill", name)

    async def list_containers(self, run_id: str | None = None) -> list[dict]:
        filters = {"label": ["orchestrator=true"] + ([f"run_id={run_id}"] if run_id else [])}
        rows = await self.api("list containers", "containers", all=True, filters=filters)
        return [
            {
                "name": (r.get("Names") or ["/?"])[0].lstrip("/"),
                "labels": r.get("Labels") or {},
                "status": r.get("State"),
                "created": r.get("Created"),
            }
            for r in rows
        ]

    async def remove_run_volumes(self, run_id: str) -> list[str]:
        names = await run_volumes(run_id, host=self)
        for name in names:
            await self._unless_missing(f"remove volume {name}", "remove_volume", name, force=True)
        return names


# ---- container specification -------------------------------------------


def selinux_enabled() -> bool:
    return os.path.exists("/sys/fs/selinux")


def workspace_read_only(request: InstanceRequest) -> bool:
    """Decision tree rule 1: review tasks get a read-only /workspace."""
    return request.import_policy == "never" and request.review_workspace_mode == "ro"


def base_environment(request: InstanceRequest) -> dict[str, str]:
    """Container environment (git identity, the task's names), without credentials."""
    env = {
        "GIT_AUTHOR_NAME": "AI Agent",
        "GIT_AUTHOR_EMAIL": "agent@orchestrator.local",
        "GIT_COMMITTER_NAME": "AI Agent",
        "GIT_COMMITTER_EMAIL": "agent@orchestrator.local",
        "PYTHONUNBUFFERED": "1",
        "TASK_KEY": request.task_key,
        "SESSION_GROUP_KEY": request.session_group_key or request.task_key,
    }
    if request.network_egress == "proxy":
        # Proxy egress: the default bridge network, and only the host's proxy
        # settings are passed through, so tools that honour them go via the proxy.
        env.update({k: v for k, v in os.environ.items() if k in PROXY_VARS})
    return env


def host_labels(request: InstanceRequest, host_name: str | None) -> dict[str, str]:
    labels = {
        **request.labels,
        "orchestrator": "true",
        "run_id": request.run_id,
        "strategy_execution_id": request.strategy_execution_id,
        "strategy_index": str(request.strategy_index),
        "task_key": request.task_key,
        "session_group_key": request.session_group_key or request.task_key,
        "instance_id": request.instance_id,
        "orchestrator.last_active_ts": utc_now_iso(),
    }
    if host_name is not None:
        labels["orchestrator.host"] = host_name
    return labels


def volume_labels(request: InstanceRequest) -> dict[str, str]:
    return {"orchestrator": "true", "run_id": request.run_id}


def offline_hosts_file(run_folder: Path) -> Path:
    """The run folder's /etc/hosts for offline containers, written once (blocking: call it on a worker thread)."""
    path = run_folder / OFFLINE_HOSTS_NAME
    with contextlib.suppress(OSError):
        if path.read_text("utf-8") == OFFLINE_HOSTS:
            return path
    tmp = path.with_name(f"{OFFLINE_HOSTS_NAME}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(OFFLINE_HOSTS, "utf-8")
    os.chmod(tmp, 0o644)  # the agent runs as node: whatever the umask, it must read it
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class TaskMounts:
    """What a task's container mounts: it is created with these, and an existing one is reused only with these."""

    workspace: Path
    volume: str  # the session volume, at /home/node
    read_only: bool  # the workspace
    # A remote engine's per-task volume for /workspace instead of the bind mount
    # (writable, so the archive copy can land in it).
    workspace_volume: str | None = None
    # The run's object store (``shared_objects``), mounted read-only at the path the
    # clone's (relative) alternates name in the container.
    objects: Path | None = None
    # A remote engine's object cache volume (object_cache.py), mounted read-only
    # where the copied-in clone's alternates name it.
    object_cache: str | None = None


def host_config_kwargs(
    request: InstanceRequest, mounts: TaskMounts, hardening: Hardening | None = None, offline_hosts: Path | None = None
) -> dict[str, Any]:
    """``offline_hosts``: an offline container created with ``network_disabled`` (local
    engine) gets this file as its /etc/hosts instead of ``network_mode: none``."""
    from docker.types import Mount, Ulimit

    hardening = hardening or Hardening()
    relabel = ",z" if selinux_enabled() else ""
    binds = []
    if not mounts.workspace_volume:
        binds.append(f"{mounts.workspace}:{WORKSPACE_MOUNT}:{'ro' if mounts.read_only else 'rw'}{relabel}")
    if mounts.objects is not None:
        from .git_ops import store_mount_point

        # Read-only: no container can add, change or delete what every task borrows.
        binds.append(f"{mounts.objects}:{store_mount_point(mounts.objects)}:ro{relabel}")
    if offline_hosts is not None:
        binds.append(f"{offline_hosts}:/etc/hosts:ro{relabel}")
    # The daemon creates a missing named volume with these labels as part of the
    # container create (no separate volume call per task); an existing one (the
    # session group's, or a resumed run's) is mounted as it is.
    volumes = [Mount(target=HOME_MOUNT, source=mounts.volume, type="volume", labels=volume_labels(request))]
    if mounts.workspace_volume:
        # A read-only workspace volume starts empty and root-owned (no_copy: not filled
        # from the image's node-owned /workspace), so the agent cannot add files to it.
        volumes.append(
            Mount(
                target=WORKSPACE_MOUNT,
                source=mounts.workspace_volume,
                type="volume",
                labels=volume_labels(request),
                no_copy=mounts.read_only,
            )
        )
    if mounts.object_cache:
        # Read-only: no task can add, change or delete what the engine's tasks borrow.
        volumes.append(Mount(target=OBJECT_CACHE_MOUNT, source=mounts.object_cache, type="volume", read_only=True))
    kwargs: dict[str, Any] = {
        "binds": binds,
        "mounts": volumes,
        "tmpfs": {"/tmp": TMPFS_OPTIONS},
        "read_only": True,
        "nano_cpus": int(float(request.container_limits.cpus) * 1_000_000_000),
        "mem_limit": request.container_limits.memory,
        # The agent runs as node and needs no capability: dropping them all takes
        # NET_RAW (raw sockets, ARP spoofing on the bridge), CHOWN, SETUID and
        # the rest from a compromised agent. Docker's default seccomp profile
        # stays on (no security_opt overrides it), which also blocks mount and
        # unshare.
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": hardening.pids_limit,
        "ulimits": [Ulimit(name="nofile", soft=hardening.nofile, hard=hardening.nofile)],
    }
    if request.network_egress == "offline" and offline_hosts is None:
        kwargs["network_mode"] = "none"
    return kwargs


def mounts_match(info: dict, want: TaskMounts) -> tuple[bool, str]:
    """Whether an existing container has exactly the mounts this request needs."""
    mounts = {m.get("Destination"): m for m in info.get("Mounts") or []}
    if want.object_cache is not None:
        cache = mounts.get(OBJECT_CACHE_MOUNT)
        if cache is None or cache.get("RW") or cache.get("Name") != want.object_cache:
            return False, "the object cache must be mounted read-only"
    if want.objects is not None:
        from .git_ops import store_mount_point

        store = mounts.get(store_mount_point(want.objects))
        if store is None or store.get("RW") or os.path.realpath(store.get("Source", "")) != str(want.objects):
            return False, "the object store must be mounted read-only at the path the alternates name"
    ws = mounts.get(WORKSPACE_MOUNT)
    home = mounts.get(HOME_MOUNT)
    if ws is None or home is None:
        return False, "missing /workspace or /home/node mount"
    if want.workspace_volume is not None:
        if ws.get("Name") != want.workspace_volume:
            return False, "workspace volume changed"
    elif os.path.realpath(ws.get("Source", "")) != os.path.realpath(want.workspace):
        return False, "workspace path changed"
    if bool(ws.get("RW")) == want.read_only:
        return False, "workspace must be read-only" if want.read_only else "workspace must be writable"
    if home.get("Name") != want.volume:
        return False, "session volume changed"
    return True, ""


@dataclass(frozen=True)
class ContainerReady:
    name: str
    action: str  # created | reused | started | restarted | replaced
    volume: str
    reason: str = ""


def _create_and_start(client: Any, name: str, host_config: Callable[[], dict], spec: dict) -> dict | None:
    """Create+start; returns the existing container's inspect data on a name conflict."""
    import docker.errors

    config = client.api.create_host_config(**host_config())
    try:
        created = client.api.create_container(host_config=config, **spec)
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise
        try:
            inspected: dict = client.api.inspect_container(name)
            return inspected
        except docker.errors.NotFound:  # removed meanwhile: try once more
            created = client.api.create_container(host_config=config, **spec)
    client.api.start(created["Id"])
    return None


async def _ensure_home_writable(host: DockerHost, request: InstanceRequest, volume: str) -> None:
    """Make a fresh session volume writable for uid 1000. Docker fills an empty named volume from the
    image's /home/node (node's in our images), so this is one cheap check per image. Without that
    directory the volume root is root's, and an exec as root cannot chown it (a container whose user is
    non-root gets no capabilities, even for ``exec --user root``): a short-lived root container does."""

    async def writable() -> bool:
        code, _ = await host.exec_simple(request.container_name, ["test", "-w", HOME_MOUNT])
        return code == 0

    if await host.home_writable.get(request.docker_image, writable):
        return
    from docker.types import Mount

    client = await host.client()

    def _fix():
        client.containers.run(
            request.docker_image,
            ["chown", "1000:1000", HOME_MOUNT],
            entrypoint=[],
            user="0",
            remove=True,
            network_disabled=True,  # no network namespace to set up for a chown
            mounts=[Mount(target=HOME_MOUNT, source=volume, type="volume")],
        )

    await host.call(f"chown session volume {volume}", _fix)


# ---- helpers for orchestration -------------------------------------------

_shared_host: DockerHost | None = None


def shared_host() -> DockerHost:
    """The process-wide client used by the module-level helpers below."""
    global _shared_host
    if _shared_host is None:
        _shared_host = DockerHost()
    return _shared_host


# `timeout` is docker-py's socket timeout inside the worker thread: a cancel scope
# cannot interrupt a blocking call in a thread.
# A stopped engine is refused at once; only a busy or hung one uses this time. A
# loaded machine's engine can take several seconds over its first answers, and
# calling it "not running" then sends the user after a problem they do not have.
DOCKER_ANSWER_TIMEOUT = 20.0


async def docker_available(*, timeout: float = DOCKER_ANSWER_TIMEOUT) -> tuple[bool, str]:  # noqa: ASYNC109
    """Pre-flight check: can we reach the Docker daemon? Returns (ok, message)."""

    def _ping():
        client = default_client_factory(timeout=max(1, int(timeout)))
        try:
            client.ping()
            return client.version().get("Version", "?")
        finally:
            client.close()

    try:
        with anyio.fail_after(timeout + 1):
            version = await anyio.to_thread.run_sync(_ping, abandon_on_cancel=True)
    except TimeoutError:
        return False, f"Docker did not answer within {timeout:.0f}s (not running, or hung); {DOCKER_START_HINT}"
    except Exception as exc:
        return False, f"Docker is not reachable ({type(exc).__name__}: {exc}); {DOCKER_START_HINT}"
    return True, f"Docker {version} is reachable"


async def image_exists(name: str, *, host: DockerHost | None = None) -> bool:
    return await (host or shared_host()).image_exists(name)


async def container_exists(name: str, *, host: DockerHost | None = None) -> bool:
    return await (host or shared_host()).inspect_container(name) is not None


async def list_containers(run_id: str | None = None, *, host: DockerHost | None = None) -> list[dict]:
    """Orchestrator containers (optionally of one run): name, labels, status, created."""
    return await (host or shared_host()).list_containers(run_id)


# `timeout` is Docker's grace period before SIGKILL, not a deadline for this call.
async def stop_run_containers(run_id: str, *, timeout: float = 2, host: DockerHost | None = None) -> int:  # noqa: ASYNC109
    """Stop every running container of ``run_id`` in parallel; returns how many were stopped."""
    host = host or shared_host()
    running = [c["name"] for c in await list_containers(run_id, host=host) if c["status"] == "running"]
    async with anyio.create_task_group() as tg:
        for name in running:
            tg.start_soon(functools.partial(host.stop, name, timeout=timeout))
    return len(running)


async def remove_containers(names: Iterable[str], *, host: DockerHost | None = None) -> None:
    """Force-remove the named containers (missing ones are ignored), in parallel."""
    host = host or shared_host()
    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(host.remove, name)


async def run_volumes(run_id: str, *, host: DockerHost | None = None) -> list[str]:
    """The session volumes of ``run_id`` (``orc_home_<run_id>_g*``; global-scope ones are every run's)."""
    from ..naming import safe_component

    host = host or shared_host()
    prefix = f"orc_home_{safe_component(run_id)}_g"
    listing = await host.api("list volumes", "volumes", filters={"name": prefix})
    return [v["Name"] for v in (listing or {}).get("Volumes") or [] if v["Name"].startswith(prefix)]


async def remove_run_volumes(run_id: str, *, host: DockerHost | None = None) -> list[str]:
    """Remove the session volumes of ``run_id`` (:func:`run_volumes`); returns their names."""
    return await (host or shared_host()).remove_run_volumes(run_id)
