"""Moving a task's work in and out of a container without a shared disk (a remote engine).

The clone goes in as a tar stream through the Docker archive API; the agent's
commits come back as a ``git bundle``, verified and fetched into the task's local
clone before the usual import, so a corrupt bundle reaches nothing of the user's
repository (docs/scaling.md, "What crosses the network per task").
"""

from __future__ import annotations

import functools
import io
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import anyio.to_thread

from ..errors import ContainerError, GitError
from .docker_containers import WORKSPACE_MOUNT, DockerHost
from .git_cmd import run_git
from .git_ops import CONTAINER_UID

# Inside the clone's .git, so it is never part of the agent's work tree.
BUNDLE_PATH = f"{WORKSPACE_MOUNT}/.git/orchestrator-result.bundle"
# Run in the container after the agent: $1 the workspace, $2 the base commit.
# Prints head=SHA; when the agent committed, bundles its commits (HEAD --not the
# base) to BUNDLE_PATH and prints "bundled". Exit 3: no HEAD to read.
BUNDLE_SCRIPT = (
    'head=$(git -C "$1" rev-parse --verify "HEAD^{commit}" 2>&1) || { echo "$head"; exit 3; }\n'
    'echo "head=$head"\n'
    '[ "$head" = "$2" ] && exit 0\n'
    f'git -C "$1" bundle create -q {BUNDLE_PATH} HEAD --not "$2" 2>&1 || exit 4\n'
    "echo bundled\n"
)
# Spill the tar to disk beyond this size: a 20k-file clone should not sit in memory.
SPOOL_BYTES = 32 << 20
# The copy-in's first and last tar member: the engine extracts in order and the
# last one overwrites the first, so "partial" is left only by a copy cut off
# midway. A kept workspace volume is trusted only without it.
COPY_MARK = ".git/orchestrator-copy-in"
COPY_MARK_PATH = f"{WORKSPACE_MOUNT}/{COPY_MARK}"


def tar_workspace(
    workspace: Path, *, read_only: bool, alternates: str | None = None, skip: frozenset[str] = frozenset()
) -> tempfile.SpooledTemporaryFile:
    """The clone as a tar stream rooted at ``.``, owned by the container user (uid 1000), or for a
    read-only workspace by root without write bits: its volume is mounted writable for the copy,
    so the ownership is what keeps the agent from changing it.

    ``alternates``: the engine's object cache in the container, replacing the clone's own
    alternates. ``skip``: files the container checks out itself (the copy mark stays "partial"
    until it has).
    """
    # Handed to the caller, who streams it to Docker and closes it.
    out = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115

    def owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uname = info.gname = ""
        # Whole seconds: a fractional mtime costs every member a PAX header (1 KiB),
        # which doubled the stream for a 20k-file clone.
        info.mtime = int(info.mtime)
        if read_only:
            info.uid = info.gid = 0
            info.mode &= 0o755
        else:
            info.uid = info.gid = CONTAINER_UID
        return info

    def add(tar: tarfile.TarFile, name: str, text: bytes) -> None:
        info = owner(tarfile.TarInfo(name))
        info.size, info.mode = len(text), 0o644
        tar.addfile(info, io.BytesIO(text))

    own_alternates = "./.git/objects/info/alternates"

    def member(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if alternates is not None and (
            info.name == own_alternates
            # git's sample hooks (never run): a third of a fresh clone's .git by size.
            or (info.name.startswith("./.git/hooks/") and info.name.endswith(".sample"))
        ):
            return None
        if skip and not info.isdir() and info.name[2:] in skip:
            return None
        return owner(info)

    # Without its files the copy is mostly tar headers and padding, which gzip (the
    # engine takes it as it is) shrinks tenfold; a whole clone is sent plain, since
    # its objects are compressed already.
    with tarfile.open(fileobj=out, mode="w:gz" if skip else "w", format=tarfile.PAX_FORMAT) as tar:
        add(tar, COPY_MARK, b"partial\n")
        tar.add(str(workspace), arcname=".", recursive=True, filter=member)
        if alternates is not None:
            add(tar, own_alternates, (alternates + "\n").encode())
        if not skip:
            add(tar, COPY_MARK, b"complete\n")
    out.seek(0)
    return out


# Run in the container after a copy-in without the tracked files: $1 the workspace.
# Checks them out from the objects the alternates name, then marks the copy whole.
CHECKOUT_SCRIPT = (
    'git -C "$1" -c core.fsmonitor=false reset -q --hard HEAD 2>&1 || exit 4\n'
    f'echo complete > "$1/{COPY_MARK}" && echo checked-out\n'
)


def tracked_files(workspace: Path) -> frozenset[str]:
    """The files of the clone's HEAD (what a checkout in the container writes)."""
    out = run_git(["ls-files", "-z"], cwd=workspace, what="listing the clone's files").stdout
    return frozenset(p for p in out.split("\0") if p) | {".git/index"}


async def copy_in(
    host: DockerHost,
    container: str,
    workspace: Path,
    *,
    read_only: bool,
    alternates: str | None = None,
    checkout: bool = False,
) -> int:
    """Copy the local clone into the container's /workspace; the bytes sent. ``checkout``: the
    container checks the tracked files out from ``alternates`` (:func:`tar_workspace`) instead."""

    def make() -> tempfile.SpooledTemporaryFile:
        skip = tracked_files(workspace) if checkout else frozenset()
        return tar_workspace(workspace, read_only=read_only, alternates=alternates, skip=skip)

    data = await anyio.to_thread.run_sync(make, limiter=host.limiter)
    try:
        size = data.seek(0, os.SEEK_END)
        data.seek(0)
        chunks = iter(functools.partial(data.read, 1 << 20), b"")
        ok = await host.put_archive(container, WORKSPACE_MOUNT, chunks, read_only=read_only)
    finally:
        data.close()
    if not ok:
        raise ContainerError(f"the engine refused the workspace copy into {container}")
    if checkout:
        # As the files' owner (see empty_workspace).
        code, out = await _exec(
            host, container, ["sh", "-c", CHECKOUT_SCRIPT, "checkout", WORKSPACE_MOUNT], "root" if read_only else "node"
        )
        # The exit status alone: the script exits non-zero when the reset or the mark
        # fails, and a busy engine can end an exec's output unread (exit 0, nothing).
        if code != 0:
            raise GitError(
                f"checking out the workspace in {container} from the engine's object cache failed "
                f"(exit {code}): {out[-500:]}"
            )
    return size


async def _exec(host: DockerHost, container: str, cmd: list[str], user: str = "node") -> tuple[int, str]:
    code, out = await host.exec_simple(container, cmd, user=user)
    return code, (out or b"").decode("utf-8", "replace").strip()


async def workspace_holds_a_clone(host: DockerHost, container: str) -> bool:
    """Whether the container's /workspace holds a whole copied-in clone: not when empty or its mark
    says partial; one from before the mark existed does (its agent's uncommitted work is kept)."""
    script = f'[ -e "{WORKSPACE_MOUNT}/.git" ] && ! grep -qx partial "{COPY_MARK_PATH}" 2>/dev/null'
    code, _ = await _exec(host, container, ["sh", "-c", script])
    return code == 0


async def empty_workspace(host: DockerHost, container: str, *, read_only: bool) -> None:
    """Remove everything in the container's /workspace volume, as the files' owner: root there has
    no capabilities to remove the agent's files, nor the agent's user a read-only copy's."""
    find = ["find", WORKSPACE_MOUNT, "-mindepth", "1", "-maxdepth", "1", "-exec", "rm", "-rf", "{}", "+"]
    code, out = await _exec(host, container, find, "root" if read_only else "node")
    if code != 0:
        raise GitError(f"could not empty the workspace in {container}: {out[-500:]}")


# The lock files a git command killed mid-way leaves in .git and that block the
# next one: the index (every add and commit), HEAD, config and packed refs, and
# any ref's own lock under refs/ (a commit killed while it moves its branch
# leaves refs/heads/<branch>.lock: "cannot lock ref").
STALE_LOCK_NAMES = ("index.lock", "HEAD.lock", "config.lock", "packed-refs.lock")


async def clear_stale_git_locks(host: DockerHost, container: str) -> list[str]:
    """Remove the git locks an agent killed mid-command left in /workspace (the container was
    restarted, so nothing holds them; left over, they fail every commit); the paths removed."""
    script = (
        'cd "$1/.git" 2>/dev/null || exit 0\n'
        "shift\n"
        # a ref name holds no blank, so find's lines split safely
        "refs=$(find refs -name '*.lock' -type f 2>/dev/null | LC_ALL=C sort)\n"
        'for f in "$@" $refs; do if [ -e "$f" ] && rm -f "$f"; then echo "removed=$f"; fi; done\n'
    )
    code, out = await _exec(host, container, ["sh", "-c", script, "clear-locks", WORKSPACE_MOUNT, *STALE_LOCK_NAMES])
    if code != 0:
        raise GitError(f"could not clear stale git locks in {container}: {out[-500:]}")
    return [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("removed=")]


async def bundle_out(host: DockerHost, container: str, workspace: Path, base_commit: str) -> dict[str, Any]:
    """Bring the agent's commits back into the local clone ``workspace``: ``{"head": sha, "bytes": n}``
    (0 bytes when the agent made no commit: the clone stays at the base commit)."""
    # One exec for both steps: over a distant link every exec costs three round trips.
    cmd = ["sh", "-c", BUNDLE_SCRIPT, "bundle-out", WORKSPACE_MOUNT, base_commit]
    # The engine now and then loses the output of a short exec that succeeded
    # (an exit 0 with nothing to read). The script may run again as it is: it
    # only reads HEAD and rewrites the bundle.
    for _ in range(3):
        code, out = await _exec(host, container, cmd)
        if code != 0 or out:
            break
    lines = out.splitlines()
    head = next((ln.split("=", 1)[1] for ln in lines if ln.startswith("head=")), "")
    if code == 3 or not head:
        raise GitError(f"cannot read the workspace HEAD in {container}: {out[-500:]}")
    if code != 0:
        raise GitError(f"git bundle of the agent's commits failed in {container}: {out[-500:]}")
    if head == base_commit:
        return {"head": head, "bytes": 0}
    if "bundled" not in lines:  # never taken for "no commits": the agent's work would be dropped
        raise GitError(f"git bundle of the agent's commits in {container} did not report success: {out[-500:]}")
    try:
        raw = await host.read_file(container, BUNDLE_PATH)
    except ContainerError as exc:
        if "damaged" not in str(exc) and "not a file" not in str(exc):
            raise
        raise GitError(f"the result bundle read from the container is unusable: {exc}") from exc
    target = workspace / ".git" / "orchestrator-result.bundle"
    await anyio.to_thread.run_sync(target.write_bytes, raw, limiter=host.limiter)
    await anyio.to_thread.run_sync(import_bundle, workspace, target, head, limiter=host.limiter)
    return {"head": head, "bytes": len(raw)}


def import_bundle(workspace: Path, bundle: Path, head: str) -> None:
    """Verify ``bundle`` and move the local clone's branch to ``head`` from it; GitError, the clone
    untouched, unless git checked the whole bundle and it holds the commit the container reported."""
    size = bundle.stat().st_size

    def said(proc) -> str:
        return "; ".join((proc.stderr or proc.stdout).strip().splitlines())[-300:]

    # `bundle verify` reads the header (refs, prerequisites); a pack cut short
    # shows only when the fetch indexes it.
    verify = run_git(["bundle", "verify", "-q", str(bundle)], cwd=workspace, check=False)
    if verify.returncode != 0:
        raise GitError(f"the result bundle is corrupt or truncated ({size} bytes): {said(verify)}")
    fetch = run_git(
        ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", str(bundle), "HEAD:refs/orchestrator/result"],
        cwd=workspace,
        check=False,
    )
    if fetch.returncode != 0:
        raise GitError(f"the result bundle is corrupt or truncated ({size} bytes): fetching it failed: {said(fetch)}")
    got = run_git(["rev-parse", "--verify", "refs/orchestrator/result^{commit}"], cwd=workspace).stdout.strip()
    if got != head:
        raise GitError(f"the result bundle holds {got[:12]}, but the container's HEAD is {head[:12]}")
    # The import reads only commits (HEAD, its history and diffs), so moving the branch
    # is enough; `reset --hard` would also re-read every file of the work tree, whose
    # index the chown to the container user has made stale (7 s on 20k files).
    run_git(
        ["update-ref", "-m", "orchestrator: the agent's commits from the result bundle", "HEAD", head],
        cwd=workspace,
        what="moving the clone to the agent's commit",
    )
    run_git(["update-ref", "-d", "refs/orchestrator/result"], cwd=workspace, check=False)
    bundle.unlink(missing_ok=True)
