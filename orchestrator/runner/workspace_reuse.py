"""A finished task's checkout, made as good as new for the next task of the run.

How and why (a new ``.git``, ``git clean``, the recorded index compared to the
nanosecond, ``git reset --hard`` of what an agent wrote, never with submodules):
docs/scaling.md, "A finished checkout serves the next task".
"""

from __future__ import annotations

import os
import stat
import struct
import time
from pathlib import Path
from typing import NamedTuple

from ..errors import GitError
from . import git_ops
from .git_cmd import run_git

# The stat comparison must see every write of the last agent: whatever the
# user's global config says, the change time and the inode are compared.
_STRICT = ("-c", "core.trustctime=true", "-c", "core.checkStat=default", "-c", "core.fsmonitor=false")


def reuse_workspace(
    workspace: Path,
    pristine: Path,
    base_branch: str,
    *,
    include_branches: tuple[str, ...] = (),
    object_store: Path,
) -> git_ops.WorkspaceInfo:
    """Make the finished checkout at ``workspace`` the fresh clone of ``base_branch``, from the index
    ``pristine`` recorded when it was made; GitError or OSError: the caller clones afresh."""
    workspace = Path(os.path.abspath(workspace))
    git_dir = workspace / ".git"
    object_format, base_commit = _store_branch(object_store, base_branch)
    with open(pristine, "rb") as fh:
        recorded_base, _, recorded = fh.read().partition(b"\n")
    entries = read_index(recorded, hash_size=len(base_commit) // 2)
    if any(e.mode == GITLINK for e in entries):
        raise GitError("the checkout has submodules, which git clean does not reach into")
    git_ops.remove_workspace(git_dir)  # the last agent's whole .git (or whatever it left there)
    init = ["init", "--quiet", f"--object-format={object_format}", f"--initial-branch={base_branch}"]
    run_git([*init, "--", str(workspace)], what="git init")
    head = git_dir / "refs" / "heads" / base_branch
    head.parent.mkdir(parents=True, exist_ok=True)
    head.write_text(base_commit + "\n", encoding="ascii")
    git_ops.borrow_from_store(workspace, object_store)
    git_ops.fetch_include_branches(workspace, object_store, base_branch, include_branches)
    (git_dir / "index").write_bytes(recorded)
    touched = _clean_and_compare(workspace, entries)
    if recorded_base.decode("ascii", "replace") != base_commit:  # the base moved meanwhile
        out = run_git([*_STRICT, "diff-index", "--cached", "--name-only", "-z", "HEAD"], cwd=workspace).stdout
        touched.extend(p for p in out.split("\0") if p)
    if touched:
        run_git([*_STRICT, "reset", "--quiet", "--hard", "HEAD"], cwd=workspace, what="git reset --hard")
        (git_dir / "ORIG_HEAD").unlink(missing_ok=True)  # a fresh clone has none
        _give_back(workspace, sorted(set(touched)))
    if git_ops._as_root():
        git_ops._chown_tree(git_dir, git_ops.CONTAINER_UID, git_ops.CONTAINER_GID)
    info = git_ops.WorkspaceInfo(path=workspace, base_branch=base_branch, base_commit=base_commit)
    git_ops._mark_whole(workspace, info)
    git_ops.save_pristine_index(workspace, base_commit)
    return info


def _store_branch(object_store: Path, branch: str) -> tuple[str, str]:
    """The store's object format and the commit ``branch`` names there."""
    out = run_git(
        ["rev-parse", "--show-object-format", "--verify", f"refs/heads/{branch}^{{commit}}"],
        cwd=object_store,
        what=f"reading branch {branch} in the run's object store",
    ).stdout.split()
    if len(out) != 2:
        raise GitError(f"unexpected answer reading branch {branch} in the run's object store: {out!r}")
    return out[0], out[1]


GITLINK = 0o160000


class IndexEntry(NamedTuple):
    path: str
    ctime: tuple[int, int]
    mtime: tuple[int, int]
    ino: int
    mode: int
    uid: int
    gid: int
    size: int


_FIXED = struct.Struct(">10I")


def read_index(data: bytes, *, hash_size: int = 20) -> list[IndexEntry]:
    """The entries of a git index file (versions 2 to 4), with the stat data git recorded."""
    if len(data) < 12 or data[:4] != b"DIRC":
        raise GitError("the recorded index is not a git index")
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        raise GitError(f"the recorded index has version {version}, which is not read here")
    entries: list[IndexEntry] = []
    pos, name = 12, b""
    try:
        for _ in range(count):
            start = pos
            csec, cnsec, msec, mnsec, _dev, ino, mode, uid, gid, size = _FIXED.unpack_from(data, pos)
            pos += _FIXED.size + hash_size
            (flags,) = struct.unpack_from(">H", data, pos)
            pos += 2
            if version >= 3 and flags & 0x4000:
                pos += 2
            if version == 4:
                strip, pos = _varint(data, pos)
                end = data.index(b"\0", pos)
                name = name[: len(name) - strip] + data[pos:end]
                pos = end + 1
            else:
                end = data.index(b"\0", pos)
                name = data[pos:end]
                pos = start + ((end - start + 8) & ~7)
            entries.append(IndexEntry(os.fsdecode(name), (csec, cnsec), (msec, mnsec), ino, mode, uid, gid, size))
    except (struct.error, ValueError) as exc:
        raise GitError(f"the recorded index is damaged: {exc}") from None
    return entries


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset encoding of the bytes a version-4 path drops from the one before it."""
    byte = data[pos]
    pos += 1
    value = byte & 0x7F
    while byte & 0x80:
        byte = data[pos]
        pos += 1
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, pos


def _clean_and_compare(workspace: Path, entries: list[IndexEntry]) -> list[str]:
    """Remove what ``git clean -ffdx`` would, and every tracked file whose stat data differ from the
    recorded ones; the tracked paths to write again. Not git's own check, which compares whole
    seconds (an agent can set a file's mtime back): the change time's nanoseconds and the inode
    cannot be faked. Tracked directories get a checkout's mode back (an agent may have locked
    one); nothing follows a link."""
    recorded = {e.path: e for e in entries}
    tracked_dirs = {""}
    for path in recorded:
        parent = os.path.dirname(path)
        while parent not in tracked_dirs:
            tracked_dirs.add(parent)
            parent = os.path.dirname(parent)
    mode = 0o777 & ~_umask()
    os.chmod(workspace, mode)
    seen: set[str] = set()
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(workspace / rel_dir) as it:
            found = list(it)
        for entry in found:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if rel == ".git":
                continue
            if entry.is_dir(follow_symlinks=False):
                if rel in tracked_dirs:
                    os.chmod(entry.path, mode)
                    pending.append(rel)
                else:
                    git_ops.remove_workspace(Path(entry.path))
                continue
            e = recorded.get(rel)
            if e is not None and _unchanged(e, entry.stat(follow_symlinks=False)):
                seen.add(rel)
            else:
                os.unlink(entry.path)
    return [path for path in recorded if path not in seen]


def _unchanged(e: IndexEntry, st: os.stat_result) -> bool:
    return e == IndexEntry(
        e.path,
        (st.st_ctime_ns // 10**9 & 0xFFFFFFFF, st.st_ctime_ns % 10**9),
        (st.st_mtime_ns // 10**9 & 0xFFFFFFFF, st.st_mtime_ns % 10**9),
        st.st_ino & 0xFFFFFFFF,
        e.mode if _same_kind(e.mode, st.st_mode) else st.st_mode,
        st.st_uid,
        st.st_gid,
        st.st_size & 0xFFFFFFFF,
    )


def _same_kind(recorded: int, actual: int) -> bool:
    """Whether a file's mode is the one git recorded (git keeps only the type and, for files, 755 or 644)."""
    if stat.S_ISLNK(actual):
        return recorded == 0o120000
    if stat.S_ISREG(actual):
        return recorded == (0o100755 if actual & 0o100 else 0o100644)
    return False


def _give_back(workspace: Path, changed: list[str]) -> None:
    """What ``reset`` wrote as root goes to the container user, dated as a checkout is,
    and the index is refreshed, so the next agent's first ``git add`` hashes nothing
    again (see :func:`~.git_ops._settle_index`)."""
    as_root = git_ops._as_root()
    uid, gid = git_ops.CONTAINER_UID, git_ops.CONTAINER_GID
    past = time.time() - 2
    for rel in changed:
        path = workspace / rel
        if not os.path.lexists(path):
            continue  # deleted in the new base
        os.utime(path, (past, past), follow_symlinks=False)
        if as_root:
            os.lchown(path, uid, gid)
            parent = path.parent
            while parent != workspace and os.lstat(parent).st_uid != uid:
                os.lchown(parent, uid, gid)
                parent = parent.parent
    run_git([*_STRICT, "update-index", "-q", "--refresh"], cwd=workspace, check=False)


def _umask() -> int:
    """This process's umask (a fresh checkout's directories' mode), read: ``os.umask`` would set it
    for every thread at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
