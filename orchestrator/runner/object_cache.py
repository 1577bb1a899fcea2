"""A remote engine's cache of the repository's objects, so history crosses each link once.

Per engine and repository a Docker volume holds a bare repository; a short-lived
helper container indexes a pack of what it lacks, and task containers mount it
read-only. What is sent, what it guarantees and when it is dropped:
docs/scaling.md, "A remote engine's object cache".
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec

from ..errors import ContainerError, GitError, RunnerError
from .docker_containers import OBJECT_CACHE_MOUNT, DockerHost
from .git_cmd import git_env, ws_git
from .types import InstanceRequest

CACHE_ALTERNATE = f"{OBJECT_CACHE_MOUNT}/objects"
VOLUME_PREFIX = "orc_objcache_"
LABEL = "orchestrator.object-cache"
REPO_LABEL = "orchestrator.object-cache.repo"
HELPER_LABEL = "orchestrator.object-cache-helper"
STAMP = "orchestrator-last-used"
# Where the helper mounts the cache read-write; never a task container.
_HELPER_MOUNT = "/cache"
# A helper left behind by a process that died exits (and is removed) by itself.
_HELPER_LIFETIME_S = 3600

# Prints the cache's state: "empty", or last=<epoch> kb=<size> and tip=<sha> lines.
_STATE_SCRIPT = (
    'cd "$1" || exit 2\n'
    "[ -f HEAD ] || { echo empty; exit 0; }\n"
    'echo "last=$(cat ' + STAMP + ' 2>/dev/null || echo 0)"\n'
    'echo "kb=$(du -sk . | cut -f1)"\n'
    "git -c safe.directory='*' for-each-ref --format='tip=%(objectname)' refs/tips/\n"
)
# $1 the cache, $2 the pack sent (may be "-": nothing sent), then the commits to name.
# The refs come after the pack is indexed: a named commit has all its objects.
_UPDATE_SCRIPT = (
    'cd "$1" || exit 2\n'
    "g() { git -c safe.directory='*' \"$@\"; }\n"
    # Another process may be making the repository at the same moment (its lock files):
    # retried until it is whole, whoever made it.
    "n=0\n"
    'until [ -f HEAD ] && [ "$(g config gc.auto)" = 0 ]; do\n'
    "  { [ -f HEAD ] || g init -q --bare .; } >/dev/null 2>&1\n"
    "  g config gc.auto 0 2>/dev/null && g config maintenance.auto false 2>/dev/null\n"
    "  n=$((n + 1)); [ $n -lt 50 ] || exit 3; sleep 0.1\n"
    "done\n"
    "pack=$2; shift 2\n"
    'if [ "$pack" != - ]; then\n'
    '  g index-pack --stdin < "incoming/$pack" >/dev/null || { rm -f "incoming/$pack"; exit 4; }\n'
    '  rm -f "incoming/$pack"\n'
    "fi\n"
    'for sha in "$@"; do\n'
    "  n=0\n"
    # Another process naming the same commit at the same moment holds the ref's lock:
    # its value is the same, so a retry (or finding it set) is enough.
    '  until g update-ref "refs/tips/$sha" "$sha" 2>/dev/null; do\n'
    '    [ "$(g rev-parse -q --verify "refs/tips/$sha")" = "$sha" ] && break\n'
    "    n=$((n + 1)); [ $n -lt 20 ] || exit 5; sleep 0.1\n"
    "  done\n"
    "done\n"
    # Packs a process that died never indexed: nobody else will.
    "find incoming -type f -mmin +60 -delete 2>/dev/null\n"
    "date +%s > " + STAMP + ".$$ && mv -f " + STAMP + ".$$ " + STAMP + "\n"
    "echo updated\n"
)


class ObjectCacheSettings(msgspec.Struct, frozen=True, kw_only=True):
    """``runner.object_cache_max_mb`` (0: no cache, full copies) and ``runner.object_cache_expiry_days``."""

    max_mb: int = 20480
    expiry_days: float = 14


def cache_key(repo_path: str | os.PathLike[str]) -> str:
    """The same repository (its real path on this machine) gets the same cache on every run."""
    return hashlib.sha256(os.path.realpath(repo_path).encode()).hexdigest()[:16]


def volume_name(repo_path: str | os.PathLike[str]) -> str:
    return f"{VOLUME_PREFIX}{cache_key(repo_path)}"


def workspace_wants(workspace: Path, base_commit: str, include_branches: Sequence[str]) -> list[str]:
    """The commits a task's clone borrows: its base and its ``include_branches``."""
    wants = [base_commit]
    for name in include_branches:
        proc = ws_git(workspace, ["rev-parse", "-q", "--verify", f"refs/heads/{name}^{{commit}}"], check=False)
        if proc.returncode == 0:
            wants.append(proc.stdout.strip())
    return wants


def cache_volume(host: DockerHost, cache: ObjectCache, request: InstanceRequest) -> str | None:
    """The object cache volume a task's container mounts on this engine, or None."""
    return volume_name(request.repo_path) if cache.applies(host, request.isolation_mode) else None


class ObjectCache:
    """One engine's caches, as one runner (one engine) of this process uses them."""

    def __init__(self, settings: ObjectCacheSettings | None = None) -> None:
        self.settings = settings or ObjectCacheSettings()
        self._locks: dict[str, anyio.Lock] = {}
        # Commits each cache is known to hold, learnt in this process.
        self._known: dict[str, set[str]] = {}

    def applies(self, host: DockerHost, isolation_mode: str) -> bool:
        """Remote engines with ``shared_objects`` (the default); ``full_copy`` keeps the whole tar."""
        return host.archive and self.settings.max_mb > 0 and isolation_mode == "shared_objects"

    async def sync(
        self, host: DockerHost, image: str, repo_path: str, workspace: Path, wants: list[str]
    ) -> dict[str, Any]:
        """Make the engine's cache of ``repo_path`` hold the commits ``wants`` (and their history),
        from ``workspace``. Returns ``bytes`` sent, ``sent``, ``dropped`` (why an old cache was
        removed, or "") and ``volume``; raises GitError or ContainerError (never a partial cache)."""
        volume = volume_name(repo_path)
        wants = list(dict.fromkeys(wants))
        result: dict[str, Any] = {"volume": volume, "bytes": 0, "sent": False, "dropped": "", "checked": False}
        async with self._locks.setdefault(volume, anyio.Lock()):
            known = self._known.get(volume)
            if known is not None and set(wants) <= known:
                return result
            result["checked"] = True
            await _ensure_volume(host, volume, repo_path)
            helper = await _start_helper(host, image, volume)
            try:
                state = await _state(host, helper, volume)
                if known is None:  # first use in this process: is the cache still worth keeping?
                    why = self._too_old_or_big(state)
                    if why:
                        await host.remove(helper)
                        if await _drop(host, volume):
                            result["dropped"] = why
                            await _ensure_volume(host, volume, repo_path)
                            helper = await _start_helper(host, image, volume)
                            state = await _state(host, helper, volume)
                        else:
                            result["dropped"] = f"not dropped ({why}): a container still mounts it"
                            helper = await _start_helper(host, image, volume)
                tips: set[str] = state["tips"]
                missing = [w for w in wants if w not in tips]
                pack_name = "-"
                if missing:
                    haves = await anyio.to_thread.run_sync(_local_haves, workspace, sorted(tips), limiter=host.limiter)
                    with tempfile.TemporaryDirectory(prefix="orc-objcache-", dir=workspace.parent) as tmp:
                        pack = Path(tmp) / "objects.pack"
                        await anyio.to_thread.run_sync(
                            _make_pack, workspace, missing, haves, pack, limiter=host.limiter
                        )
                        pack_name = f"{uuid.uuid4().hex}.pack"
                        result["bytes"] = await _put_pack(host, helper, pack, pack_name)
                        result["sent"] = True
                code, out = await host.exec_simple(
                    helper, ["sh", "-c", _UPDATE_SCRIPT, "update", _HELPER_MOUNT, pack_name, *missing], user="0"
                )
                text = (out or b"").decode("utf-8", "replace").strip()
                if code == 0 and "updated" not in text.splitlines():
                    # An engine that just restarted can lose an exec's output while the
                    # command succeeded: the cache itself says whether the commits are in.
                    after = await _state(host, helper, volume)
                    if set(wants) <= after["tips"]:
                        text = "updated"
                if code != 0 or "updated" not in text.splitlines():
                    raise GitError(
                        f"updating the object cache {volume} on host {host.name} failed (exit {code}): {text[-400:]}"
                    )
            finally:
                # Best effort: a helper left behind exits (and is removed) within the hour.
                with contextlib.suppress(RunnerError):
                    await host.remove(helper)
            self._known[volume] = tips | set(wants)
        return result

    def _too_old_or_big(self, state: dict[str, Any]) -> str:
        if state["empty"]:
            return ""
        if state["kb"] > self.settings.max_mb * 1024:
            return f"{state['kb'] // 1024} MB, over runner.object_cache_max_mb={self.settings.max_mb}"
        age = time.time() - state["last"]
        if state["last"] and age > self.settings.expiry_days * 86400:
            return (
                f"unused for {age / 86400:.1f} days, over runner.object_cache_expiry_days={self.settings.expiry_days}"
            )
        return ""


# ---- the engine side ----------------------------------------------------------


async def _ensure_volume(host: DockerHost, volume: str, repo_path: str) -> None:
    labels = {"orchestrator": "true", LABEL: cache_key(repo_path), REPO_LABEL: Path(repo_path).name[:100]}
    await host.api(f"create the object cache volume {volume}", "create_volume", volume, labels=labels)


async def _start_helper(host: DockerHost, image: str, volume: str) -> str:
    """A container of the task's image (it has git) with the cache mounted read-write."""
    from docker.types import Mount

    client = await host.client()
    name = f"orc_objcache_helper_{uuid.uuid4().hex[:12]}"

    def _run() -> None:
        host_config = client.api.create_host_config(
            mounts=[Mount(target=_HELPER_MOUNT, source=volume, type="volume")],
            auto_remove=True,
            read_only=True,
            tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
        )
        created = client.api.create_container(
            image,
            command=["sleep", str(_HELPER_LIFETIME_S)],
            name=name,
            user="0",
            labels={HELPER_LABEL: volume, "orchestrator.host": host.name or ""},
            host_config=host_config,
            # No network at all, not even the namespace the engine sets up for network_mode none.
            network_disabled=True,
        )
        client.api.start(created["Id"])

    await host.call(f"start the object cache helper for {volume}", _run)
    return name


async def _state(host: DockerHost, helper: str, volume: str) -> dict[str, Any]:
    code, out = await host.exec_simple(helper, ["sh", "-c", _STATE_SCRIPT, "state", _HELPER_MOUNT], user="0")
    text = (out or b"").decode("utf-8", "replace")
    if code != 0:
        raise GitError(
            f"cannot read the object cache {volume} on host {host.name} (exit {code}): {text.strip()[-400:]}; "
            f"remove it with --clean-containers, the next run builds it again"
        )
    lines = text.split()
    state: dict[str, Any] = {"empty": "empty" in lines, "last": 0, "kb": 0, "tips": set()}
    for line in lines:
        key, _, value = line.partition("=")
        if key == "tip":
            state["tips"].add(value)
        elif key in ("last", "kb") and value.isdigit():
            state[key] = int(value)
    return state


async def _drop(host: DockerHost, volume: str) -> bool:
    """Remove the cache volume; False when Docker refuses because a container mounts it."""
    # The helper was just removed (its auto-remove finishes a moment later): ask a few times.
    for _ in range(10):
        if await _drop_once(host, volume):
            return True
        await anyio.sleep(0.2)
    return False


def _tar_stream(pack: Path, arcname: str) -> Iterator[bytes]:
    """One file in a tar, streamed: a copy of a pack of hundreds of MB is not written to disk again."""
    info = tarfile.TarInfo(arcname)
    info.size = pack.stat().st_size
    info.mode = 0o600
    info.mtime = int(time.time())
    yield info.tobuf(format=tarfile.GNU_FORMAT)
    with pack.open("rb") as fh:
        while block := fh.read(1 << 20):
            yield block
    pad = -info.size % tarfile.BLOCKSIZE
    yield b"\0" * (pad + 2 * tarfile.BLOCKSIZE)


async def _put_pack(host: DockerHost, helper: str, pack: Path, name: str) -> int:
    """Send ``pack`` into the helper's cache under ``incoming/``; returns the bytes streamed."""
    sent = 0

    def counted() -> Iterator[bytes]:
        nonlocal sent
        for block in _tar_stream(pack, f"incoming/{name}"):
            sent += len(block)
            yield block

    ok = await host.api(
        f"send objects into the object cache ({helper})", "put_archive", helper, _HELPER_MOUNT, counted()
    )
    if not ok:
        raise ContainerError(f"the engine refused the objects sent into the object cache ({helper})")
    return sent


# ---- this machine's side ------------------------------------------------------


def _git(workspace: Path, args: list[str], **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", "-c", "core.fsmonitor=false", *args],
        cwd=workspace,
        env=git_env(),
        **kw,
    )


def _local_haves(workspace: Path, tips: list[str]) -> list[str]:
    """The cache's commits this clone also has: what need not be sent."""
    if not tips:
        return []
    proc = _git(
        workspace,
        ["cat-file", "--batch-check=%(objectname) %(objecttype)"],
        input="\n".join(tips) + "\n",
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise GitError(f"cannot compare the object cache with {workspace}: {proc.stderr.strip()[-300:]}")
    return [line.split()[0] for line in proc.stdout.splitlines() if line.endswith(" commit")]


def _make_pack(workspace: Path, wants: list[str], haves: list[str], out: Path) -> None:
    """A self-contained pack of ``wants`` and their history, minus what ``haves`` reach."""
    revs = "\n".join([*wants, *(f"^{h}" for h in haves)]) + "\n"
    with out.open("wb") as fh:
        proc = _git(
            workspace,
            ["pack-objects", "--revs", "--stdout", "-q", "--delta-base-offset"],
            input=revs.encode(),
            stdout=fh,
            stderr=subprocess.PIPE,
        )
    if proc.returncode != 0:
        detail = proc.stderr.decode("utf-8", "replace").strip()[-300:]
        raise GitError(f"packing the objects for the remote object cache failed in {workspace}: {detail}")


# ---- listing and removal (--hosts, --clean-containers) ---------------------------


async def list_caches(host: DockerHost, image: str | None = None) -> list[dict[str, Any]]:
    """The engine's object caches: name, repo, and (when ``image`` is there to read them) size and last use."""
    listing = await host.api("list object caches", "volumes", filters={"label": [LABEL]})
    rows = [
        {"name": v["Name"], "repo": (v.get("Labels") or {}).get(REPO_LABEL, "?"), "kb": None, "last": None}
        for v in (listing or {}).get("Volumes") or []
    ]
    if image is None or not rows or not await host.image_exists(image):
        return rows
    from docker.types import Mount

    client = await host.client()
    script = (
        'for d in /c/*; do echo "$(basename "$d") $(cat "$d/'
        + STAMP
        + '" 2>/dev/null || echo 0) $(du -sk "$d" | cut -f1)"; done'
    )

    def _read() -> bytes:
        return client.containers.run(
            image,
            ["sh", "-c", script],
            entrypoint=[],
            user="0",
            remove=True,
            network_disabled=True,
            mounts=[Mount(target=f"/c/{r['name']}", source=r["name"], type="volume", read_only=True) for r in rows],
        )

    out = await host.call("read the object caches' size and last use", _read)
    seen = {}
    for line in (out or b"").decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            seen[parts[0]] = (int(parts[1]), int(parts[2]))
    for r in rows:
        if r["name"] in seen:
            r["last"], r["kb"] = seen[r["name"]]
    return rows


async def remove_caches(host: DockerHost) -> tuple[list[str], list[str]]:
    """Remove every object cache on the engine; returns (removed, kept because a container mounts it)."""
    removed: list[str] = []
    kept: list[str] = []
    for row in await list_caches(host):
        (removed if await _drop_once(host, row["name"]) else kept).append(row["name"])
    return removed, kept


async def _drop_once(host: DockerHost, volume: str) -> bool:
    import docker.errors

    client = await host.client()

    def _rm() -> bool:
        try:
            client.api.remove_volume(volume)
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                return False
            raise
        return True

    return await host.call(f"remove the object cache volume {volume}", _rm)
