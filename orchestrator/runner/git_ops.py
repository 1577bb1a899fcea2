"""Git isolation for task workspaces: an agent never touches the host repository directly.

The workspace is a disconnected clone of the base branch, made into the empty
directory the starting container bind-mounts; its HEAD is imported back as a
branch (:mod:`.git_import`). Only refs and notes of the host repository change
(docs/architecture.md, "Git isolation"). Every function has a synchronous core
(``_*_sync``) for threads; the async wrapper runs it on a worker thread.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ..errors import GitError, PreflightError, UsageError
from ..naming import is_run_branch, short8
from .git_cmd import QUIET_FETCH, WORKSPACE_UPLOAD_PACK, check_branch_name, dir_lock, in_thread, run_git, ws_git
from .git_import import _import_branch_sync as _import_branch_sync
from .git_import import import_branch as import_branch
from .types import IsolationMode

logger = logging.getLogger("orchestrator.runner")

CONTAINER_UID = 1000
CONTAINER_GID = 1000
OBJECT_STORE_PREFIX = "objects_"
DEFAULT_BASE_BRANCH = "main"


class RepoInfo(msgspec.Struct, frozen=True, kw_only=True):
    path: Path  # realpath of the worktree top (the git dir for a bare repository)
    git_dir: Path  # realpath of `git rev-parse --git-dir`
    base_branch: str
    base_commit: str
    dirty: bool
    base_branch_chosen: str = ""  # how it was chosen when none was given ("" when it was)


class WorkspaceInfo(msgspec.Struct, frozen=True, kw_only=True):
    path: Path
    base_branch: str
    base_commit: str


# ---------------------------------------------------------------------------
# Paths


def workspace_root() -> Path:
    override = os.environ.get("ORCHESTRATOR_WORKSPACE_ROOT")
    if override:
        return Path(override)
    return Path(tempfile.gettempdir()) / "orchestrator"


def workspace_path(run_id: str, task_key: str) -> Path:
    if not run_id or run_id in (".", "..") or any(sep in run_id for sep in ("/", "\\", "\0")):
        raise UsageError(f"run id {run_id!r} cannot be used as a directory name")
    return workspace_root() / run_id / f"k_{short8(task_key)}"


def object_store_path(workspace: Path, repo_path: str | os.PathLike[str]) -> Path:
    """The run's object store for ``repo_path``: in the run's folder beside the task
    workspaces, so it goes with them (retention, ``--cleanup-run``)."""
    run_dir = Path(os.path.realpath(Path(os.path.abspath(workspace)).parent))
    return run_dir / f"{OBJECT_STORE_PREFIX}{short8(os.path.realpath(repo_path))}.git"


def object_store_objects(workspace: Path, repo_path: str | os.PathLike[str]) -> Path:
    """The objects directory a ``shared_objects`` workspace borrows from, on this machine."""
    return object_store_path(workspace, repo_path) / "objects"


def store_mount_point(objects: Path) -> str:
    """Where a container mounts the store's ``objects``: the path the workspace's relative
    alternates (:func:`store_alternate`) reach from ``/workspace``, as they reach the store
    beside the workspace here. Not the host's own path: under one the image has and the
    container user cannot enter (``/root``) the store would be unreadable."""
    return f"/{objects.parent.name}/objects"


def store_alternate(objects: Path) -> str:
    """The alternates line for a workspace next to the store (see :func:`store_mount_point`)."""
    return f"../../..{store_mount_point(objects)}"


def dissociate_workspace(workspace: Path) -> bool:
    """Copy the objects a kept workspace borrows from the run's store into it (it continues
    on a remote engine, which has no such store); whether there was anything to copy."""
    alternates = Path(workspace) / ".git" / "objects" / "info" / "alternates"
    if not alternates.exists():
        return False
    # repack without -l also packs what the alternates provide
    ws_git(Path(workspace), ["repack", "-a", "-d", "-q"])
    alternates.unlink()
    if _as_root():
        _chown_tree(Path(workspace) / ".git" / "objects", CONTAINER_UID, CONTAINER_GID)
    return True


def point_at_store(workspace: Path, object_store: Path) -> None:
    """Make a kept workspace's alternates name ``object_store`` relatively: an older version
    named it by its absolute path, which containers no longer mount."""
    alternates = Path(workspace) / ".git" / "objects" / "info" / "alternates"
    line = store_alternate(Path(os.path.realpath(object_store)) / "objects")
    try:
        if alternates.read_text(encoding="utf-8").strip() != line:
            alternates.write_text(line + "\n", encoding="utf-8")
    except FileNotFoundError:
        return  # a clone with objects of its own borrows nothing
    except OSError as exc:
        raise GitError(f"cannot point workspace {workspace} at the run's object store: {exc}") from exc


# ---------------------------------------------------------------------------
# Preflight


class BaseBranch(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    commit: str
    # How it was chosen without --base-branch, for the one line a run prints
    # ("" when it was named by the user or the configuration).
    chosen: str = ""


def validate_repository(
    repo_path: str | os.PathLike[str], base_branch: str | None, *, ignore: Sequence[str | os.PathLike[str]] = ()
) -> RepoInfo:
    """``repo_path`` checked to be a repository with ``base_branch`` (None: :func:`resolve_base_branch`);
    ``ignore``: folders whose contents never make the tree dirty (the orchestrator's own output)."""
    top, git_dir, bare = open_repository(repo_path)
    base = resolve_base_branch(top, base_branch)
    dirty = False
    if not bare:
        excluded = [f":(exclude,literal){rel}" for rel in paths_inside(top, ignore)]
        status = run_git(["status", "--porcelain", "--", ".", *excluded], cwd=top, check=False)
        dirty = status.returncode != 0 or bool(status.stdout.strip())
    return RepoInfo(
        path=top,
        git_dir=git_dir,
        base_branch=base.name,
        base_commit=base.commit,
        dirty=dirty,
        base_branch_chosen=base.chosen,
    )


def open_repository(repo_path: str | os.PathLike[str]) -> tuple[Path, Path, bool]:
    """``(top, git_dir, bare)`` of the repository at ``repo_path``; PreflightError if it has no commit."""
    path = Path(repo_path).expanduser()
    if not path.exists():
        raise PreflightError(f"repository path does not exist: {path}")
    if not path.is_dir():
        raise PreflightError(f"repository path is not a directory: {path}")
    try:
        proc = run_git(["rev-parse", "--absolute-git-dir", "--is-bare-repository"], cwd=path, check=False)
    except GitError as exc:
        raise PreflightError(str(exc)) from exc
    if proc.returncode != 0:
        raise PreflightError(f"not a git repository: {path}")
    git_dir_s, bare_s = ([*proc.stdout.splitlines(), "", ""])[:2]
    git_dir = Path(os.path.realpath(git_dir_s))
    bare = bare_s.strip() == "true"
    if bare:
        top = git_dir
    else:
        top_proc = run_git(["rev-parse", "--show-toplevel"], cwd=path, check=False)
        if top_proc.returncode != 0 or not top_proc.stdout.strip():
            raise PreflightError(f"not a git work tree: {path}")
        top = Path(os.path.realpath(top_proc.stdout.strip()))
    if not _local_branches(top) and run_git(["rev-parse", "--verify", "-q", "HEAD"], cwd=top, check=False).returncode:
        raise PreflightError(f"repository has no commits yet: {top} (make an initial commit first)")
    return top, git_dir, bare


def resolve_base_branch(top: Path, requested: str | None) -> BaseBranch:
    """The base branch and its commit: ``requested``, or without one ``main``, else the current
    branch; :class:`PreflightError` with one line that says what to do."""
    chosen = ""
    if requested is None:
        current = current_branch(top)
        if _branch_commit(top, DEFAULT_BASE_BRANCH) is not None:
            requested, chosen = DEFAULT_BASE_BRANCH, "the default"
        elif current is not None and _branch_commit(top, current) is not None:
            requested, chosen = current, f"the current branch; there is no {DEFAULT_BASE_BRANCH}"
        else:
            where = "HEAD is detached" if current is None else f"the current branch {current!r} has no commits"
            raise PreflightError(
                f"no base branch: {top} has no {DEFAULT_BASE_BRANCH!r} and {where}; "
                f"pass --base-branch {_branch_list(top)}"
            )
    try:
        check_branch_name(requested, what="base branch name", repo=top)
    except GitError as exc:
        raise PreflightError(str(exc).replace("\n", " ")) from exc
    fmt = run_git(["check-ref-format", "--branch", requested], cwd=top, check=False)
    if fmt.returncode != 0 or fmt.stdout.strip() != requested:
        raise PreflightError(f"invalid base branch name {requested!r}: not a valid branch name")
    commit = _branch_commit(top, requested)
    if commit is None:
        raise PreflightError(_missing_branch(top, requested))
    return BaseBranch(name=requested, commit=commit, chosen=chosen)


def current_branch(top: Path) -> str | None:
    """The branch HEAD names (born or not), or None when HEAD is detached."""
    proc = run_git(["symbolic-ref", "-q", "--short", "HEAD"], cwd=top, check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def _branch_commit(top: Path, name: str) -> str | None:
    proc = run_git(["rev-parse", "--verify", "-q", f"refs/heads/{name}^{{commit}}"], cwd=top, check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def _missing_branch(top: Path, name: str) -> str:
    remotes = run_git(["for-each-ref", "--format=%(refname:short)", "refs/remotes/"], cwd=top, check=False)
    tracking = [r for r in remotes.stdout.splitlines() if r and not r.endswith("/HEAD")]
    if name in tracking:
        # --base-branch origin/x: a remote-tracking branch, which a clone cannot start from by that name.
        remote, _, local = name.partition("/")
        return (
            f"base branch {name!r} is a remote-tracking branch, not a local one; make it local with "
            f"git fetch {remote} && git branch {local} {name}, then pass --base-branch {local}"
        )
    on_remote = [r for r in tracking if r.partition("/")[2] == name]
    if on_remote:
        remote = on_remote[0].partition("/")[0]
        return (
            f"base branch {name!r} exists only on remote {remote} ({on_remote[0]}); make it local with "
            f"git fetch {remote} && git branch {name} {on_remote[0]}"
        )
    hint = " (or git fetch it first if it is on a remote)" if tracking else ""
    return f"base branch {name!r} not found in {top}; pass --base-branch {_branch_list(top)}{hint}"


def _branch_list(top: Path, limit: int = 8) -> str:
    heads = _local_branches(top)
    if not heads:
        return "NAME (the repository has no branches)"
    # The names a user most likely meant come first, not whatever sorts first; the
    # branches runs made (best-of-n_run_..._k1a2b3c4d, one per candidate) are counted,
    # not listed: they would bury the user's own.
    current = current_branch(top)
    likely = [b for b in dict.fromkeys((DEFAULT_BASE_BRANCH, "master", current)) if b in heads]
    own = [b for b in heads if b not in likely and not is_run_branch(b)]
    runs = len(heads) - len(likely) - len(own)
    ordered = likely + own
    listing = "git branch --list '*_run_*'"
    if not ordered:
        return f"NAME (the repository's {runs} branches are all orchestrator runs': {listing})"
    shown = ", ".join(ordered[:limit]) + (f", ... ({len(ordered)} in all)" if len(ordered) > limit else "")
    if runs:
        shown += f" (and {runs} branch{'es' if runs > 1 else ''} of orchestrator runs: {listing})"
    return f"with one of: {shown}"


def paths_inside(top: Path, paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The ``paths`` that lie inside the work tree ``top``, relative to it (``/``-separated), not ``top`` itself."""
    out = []
    for p in paths:
        try:
            rel = Path(os.path.realpath(p)).relative_to(top)
        except ValueError:
            continue
        if rel.parts:
            out.append(rel.as_posix())
    return out


EXCLUDE_HEADER = "# orchestrator output folders (added by orchestrator; never committed)"


def exclude_locally(repo: str | os.PathLike[str], paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Add the ``paths`` inside the work tree to ``.git/info/exclude``; returns the lines added.

    ``info/exclude`` is the repository's own, untracked ignore list: the user's
    ``.gitignore`` (a tracked file) is never touched.
    """
    top = Path(os.path.realpath(repo))
    wanted = [f"/{rel}/" for rel in paths_inside(top, paths)]
    if not wanted:
        return []
    where = run_git(["rev-parse", "--git-path", "info/exclude"], cwd=top, what="locating .git/info/exclude")
    exclude = Path(where.stdout.strip())
    exclude = exclude if exclude.is_absolute() else top / exclude
    try:
        text = exclude.read_text("utf-8")
    except FileNotFoundError:
        text = ""
    present = {line.strip() for line in text.splitlines()}
    missing = [w for w in wanted if w not in present]
    if not missing:
        return []
    block = ([] if EXCLUDE_HEADER in present else [EXCLUDE_HEADER]) + missing
    prefix = "" if not text or text.endswith("\n") else "\n"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with open(exclude, "a", encoding="utf-8") as fh:
        fh.write(prefix + "\n".join(block) + "\n")
    return missing


def _local_branches(repo: Path) -> list[str]:
    proc = run_git(["for-each-ref", "--format=%(refname:short)", "refs/heads/"], cwd=repo, check=False)
    return [ln for ln in proc.stdout.splitlines() if ln]


# ---------------------------------------------------------------------------
# Workspace preparation


def _existing_repo(repo_path: str | os.PathLike[str]) -> Path:
    repo = Path(os.path.realpath(repo_path))
    if not repo.is_dir():
        raise GitError(f"repository path does not exist: {repo}")
    return repo


def _ensure_object_store_sync(
    repo_path: str | os.PathLike[str], workspace: Path, branches: Sequence[str], *, hardlinks: bool = True
) -> Path:
    """Make or refresh the run's object store that ``shared_objects`` workspaces borrow from; its path.
    Made once per run, then only fetched into, never pruned (docs/architecture.md, "Git isolation")."""
    for name in branches:
        check_branch_name(name, what="branch name")
    repo = _existing_repo(repo_path)
    store = object_store_path(workspace, repo)
    store.parent.mkdir(parents=True, exist_ok=True)
    with dir_lock(store.parent, f".{store.name}.lock"):
        if store.is_dir():
            refspecs = [f"+refs/heads/{b}:refs/heads/{b}" for b in dict.fromkeys(branches)]
            if refspecs:
                # The pack protocol, not a file copy: consistent against a gc in the
                # user's repository, and only the objects the store lacks travel.
                run_git(
                    [*QUIET_FETCH, f"--upload-pack={WORKSPACE_UPLOAD_PACK}", "--", str(repo), *refspecs],
                    cwd=store,
                    what=f"refreshing the run's object store {store}",
                )
            return store
        # Built aside and renamed into place: a crash leaves no half-made store.
        partial = store.with_name(f"{store.name}.partial")
        if os.path.lexists(partial):
            remove_workspace(partial)
        partial.mkdir()
        clone = ["clone", "--quiet", "--bare"] + ([] if hardlinks else ["--no-hardlinks"])
        _clone_retrying_races(clone, repo, partial, "full_copy")
        borrowed = partial / "objects" / "info" / "alternates"
        if borrowed.exists():
            # Your repository borrows objects itself (a `clone --shared`, a
            # `--reference`): the clone copied those alternates, which name paths no
            # container has. Copy the borrowed objects in, once per run, instead.
            run_git(["repack", "-a", "-d", "-q"], cwd=partial, what="copying borrowed objects into the store")
            borrowed.unlink()
        run_git(["config", "gc.auto", "0"], cwd=partial, what="configuring the object store")
        run_git(["config", "maintenance.auto", "false"], cwd=partial, what="configuring the object store")
        run_git(["remote", "remove", "origin"], cwd=partial, check=False)
        os.rename(partial, store)
        logger.info(
            "made the run's object store %s from %s",
            store,
            repo,
            extra={"object_store": str(store), "hardlinks": hardlinks},
        )
    return store


ensure_object_store = in_thread(_ensure_object_store_sync)


def _prepare_workspace_sync(
    repo_path: str | os.PathLike[str],
    base_branch: str,
    workspace: Path,
    *,
    isolation_mode: IsolationMode = "full_copy",
    include_branches: Sequence[str] = (),
    into_empty_dir: bool = False,
    object_store: Path | None = None,
) -> WorkspaceInfo:
    """Clone ``base_branch`` of ``repo_path`` into ``workspace`` (replacing any old one, or into
    the empty one :func:`reset_workspace` made with ``into_empty_dir``). ``object_store``: the
    ``shared_objects`` store just made or refreshed (made here when not given)."""
    if isolation_mode not in ("full_copy", "shared_objects"):
        raise UsageError(f"unknown isolation_mode {isolation_mode!r}; use 'full_copy' or 'shared_objects'")
    check_branch_name(base_branch, what="base branch name")
    for name in include_branches:
        check_branch_name(name, what="include_branches entry")
    repo = _existing_repo(repo_path)
    workspace = Path(os.path.abspath(workspace))

    if into_empty_dir:
        # The runner created this directory and bind-mounted it into a container
        # that is starting while we clone: it must stay the same inode.
        if not workspace.is_dir() or workspace.is_symlink() or any(os.scandir(workspace)):
            raise GitError(f"workspace {workspace} is not the empty directory the runner created")
    else:
        if os.path.lexists(workspace):  # left over from an earlier attempt: start fresh
            remove_workspace(workspace)
        workspace.parent.mkdir(parents=True, exist_ok=True)

    clone = ["clone", "--quiet", f"--branch={base_branch}", "--single-branch"]
    source = repo
    if isolation_mode == "shared_objects":
        if object_store is None:
            object_store = _ensure_object_store_sync(repo, workspace, [base_branch, *include_branches])
        source = object_store
        # Noted, not warned: the store is read-only in the container and outlives any
        # gc in the user's repository, so borrowing costs no isolation (it is the default).
        logger.info(
            "isolation_mode=shared_objects: workspace %s borrows objects via git alternates from the run's "
            "read-only object store %s",
            workspace,
            object_store,
            extra={"workspace": str(workspace), "isolation_mode": isolation_mode},
        )
        clone.append("--shared")
    else:
        clone.append("--no-hardlinks")
    _clone_retrying_races(clone, source, workspace, isolation_mode)
    info = _finish_clone(workspace, source, base_branch, include_branches, object_store)
    if isolation_mode == "full_copy" and (workspace / ".git" / "objects" / "info" / "alternates").exists():
        raise GitError(f"full_copy clone {workspace} unexpectedly has an alternates file; isolation broken")
    as_root = _as_root()
    if as_root:
        _chown_tree(workspace, CONTAINER_UID, CONTAINER_GID)
    if object_store is not None:
        _settle_index(workspace)
        if as_root:
            os.lchown(workspace / ".git" / "index", CONTAINER_UID, CONTAINER_GID)
    _mark_whole(workspace, info)
    if object_store is not None:
        save_pristine_index(workspace, info.base_commit)
    return info


def _as_root() -> bool:
    return os.name == "posix" and hasattr(os, "geteuid") and os.geteuid() == 0


def _finish_clone(
    workspace: Path, source: Path, base_branch: str, include_branches: Sequence[str], object_store: Path | None
) -> WorkspaceInfo:
    """What every clone of a task's workspace gets after ``git clone``: no remote, the
    ``include_branches``, and (borrowing from the run's store) alternates that name the
    store relatively, so that they hold on this machine and in the container."""
    run_git(["remote", "remove", "origin"], cwd=workspace, what="git remote remove origin")
    # git < 2.40 leaves the clone's refs/remotes/origin/HEAD symref behind,
    # pointing at the branch it just deleted: `git fsck` in the workspace then
    # fails on an "invalid sha1 pointer", which an agent would take for damage.
    run_git(["update-ref", "-d", "--no-deref", "refs/remotes/origin/HEAD"], cwd=workspace, check=False)
    fetch_include_branches(workspace, source, base_branch, include_branches)
    base_commit = run_git(["rev-parse", "--verify", "HEAD^{commit}"], cwd=workspace).stdout.strip()
    if object_store is not None:
        borrow_from_store(workspace, object_store)
    return WorkspaceInfo(path=workspace, base_branch=base_branch, base_commit=base_commit)


def fetch_include_branches(workspace: Path, source: Path, base_branch: str, include_branches: Sequence[str]) -> None:
    extra = [b for b in dict.fromkeys(include_branches) if b != base_branch]
    if extra:
        refspecs = [f"refs/heads/{b}:refs/heads/{b}" for b in extra]
        run_git(
            [*QUIET_FETCH, "--", str(source), *refspecs],
            cwd=workspace,
            what=f"fetching include_branches {', '.join(extra)}",
        )


def borrow_from_store(workspace: Path, object_store: Path) -> None:
    """Alternates that name the run's store relatively: it is found on this machine and in the container."""
    alternates = workspace / ".git" / "objects" / "info" / "alternates"
    alternates.parent.mkdir(parents=True, exist_ok=True)
    alternates.write_text(store_alternate(Path(os.path.realpath(object_store)) / "objects") + "\n", encoding="utf-8")


def _mark_whole(workspace: Path, info: WorkspaceInfo) -> None:
    """The markers that make the workspace one a resumed task continues in. Written last: a crash
    before it belongs to the container user leaves files the agent cannot write (clone again)."""
    git_dir = workspace / ".git"
    for name, value in (("BASE_BRANCH", info.base_branch), ("BASE_COMMIT", info.base_commit)):
        (git_dir / name).write_text(value + "\n", encoding="utf-8")
        if _as_root():
            os.lchown(git_dir / name, CONTAINER_UID, CONTAINER_GID)


def unmark_whole(workspace: Path) -> None:
    """Take the markers away: the workspace is no longer one a resumed task continues in."""
    for name in ("BASE_COMMIT", "BASE_BRANCH"):
        (workspace / ".git" / name).unlink(missing_ok=True)


def pristine_index_path(workspace: Path) -> Path:
    """Where the index of a fresh ``shared_objects`` checkout is kept, out of its agent's reach: it
    says which files are still as checked out when :mod:`.workspace_reuse` reuses the checkout."""
    workspace = Path(os.path.abspath(workspace))
    return workspace.parent / ".pristine-index" / workspace.name


def save_pristine_index(workspace: Path, base_commit: str) -> None:
    """Record the checkout's index (after its base commit, on a line of its own)."""
    target = pristine_index_path(workspace)
    target.parent.mkdir(mode=0o700, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with open(workspace / ".git" / "index", "rb") as src, open(partial, "wb") as dst:
        dst.write(base_commit.encode("ascii") + b"\n" + src.read())
    os.replace(partial, target)


# A local-path clone copies the source's objects directory file by file; a
# `git gc`/`repack`/`maintenance` or a commit in the user's repository at the
# same moment deletes or renames files the copy has already listed, so the
# copy dies with one of these. A commit landing meanwhile moves the branch, read
# after the copy, past the objects copied: "nonexistent object" (and, through the
# pack protocol, "not our ref"). Nothing is wrong with the repository itself.
_RACE_MARKERS = (
    "nonexistent object",
    "not our ref",
    "did not send all necessary objects",
    "failed to copy file",
    "failed to create link",
    "failed to start iterator",
    "failed to iterate",
    "No such file or directory",
    "unable to read",
    "bad object",
    "missing blob",
    "missing tree",
    "is corrupt",
    "repository corruption",
)
_NOT_RACES = ("No space left on device", "Disk quota exceeded", "Permission denied")
LOCAL_CLONE_ATTEMPTS = 3


def empty_dir(path: Path) -> None:
    # The directory itself stays (it may be bind-mounted into a starting container).
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            remove_workspace(Path(entry.path))
        else:
            os.unlink(entry.path)


def _clone_retrying_races(clone: list[str], repo: Path, workspace: Path, isolation_mode: IsolationMode) -> None:
    """Clone, repeating when the source's object store changed under the copy. After
    ``LOCAL_CLONE_ATTEMPTS`` file copies, a ``full_copy`` clones once through the pack protocol
    (``--no-local``: consistent against a repack, at the cost of packing every object);
    ``shared_objects`` cannot, its clone borrows the live store."""
    # Parallel checkout (one worker per CPU) roughly halves the clone of a large
    # tree; it is command-line config only, nothing is written anywhere.
    base = ["-c", "checkout.workers=0", *clone]
    attempts = [base] * LOCAL_CLONE_ATTEMPTS
    if isolation_mode == "full_copy":
        attempts.append([*base, "--no-local"])
    failures: list[str] = []
    for n, args in enumerate(attempts, 1):
        try:
            run_git([*args, "--", str(repo), str(workspace)], what="git clone")
            return
        except GitError as exc:
            message = str(exc)
            # A full disk also fails the copy, but another attempt cannot help.
            if not any(m in message for m in _RACE_MARKERS) or any(m in message for m in _NOT_RACES):
                raise
            failures.append(message.strip().splitlines()[-1] if message.strip() else message)
            logger.warning(
                "clone of %s failed (attempt %d of %d), most likely a concurrent git gc/repack in it: %s",
                repo,
                n,
                len(attempts),
                failures[-1],
                extra={"workspace": str(workspace)},
            )
            # git removes what it cloned on failure, but not the directory we made.
            if workspace.is_dir():
                empty_dir(workspace)
    raise GitError(
        f"could not clone {repo} after {len(attempts)} attempts: reading its objects kept failing "
        f"(a git gc, repack or maintenance running in it: let it finish and rerun; "
        f"or a damaged repository: check it with `git -C {repo} fsck`). Last error: {failures[-1]}"
    )


prepare_workspace = in_thread(_prepare_workspace_sync)


def reset_workspace(workspace: Path) -> None:
    """A new, empty directory at ``workspace``, which the runner bind-mounts while the clone
    fills it (``prepare_workspace(..., into_empty_dir=True)``)."""
    workspace = Path(os.path.abspath(workspace))
    if os.path.lexists(workspace):  # left over from an earlier attempt: start fresh
        remove_workspace(workspace)
    workspace.parent.mkdir(parents=True, exist_ok=True)
    workspace.mkdir()
    if _as_root():
        os.chown(workspace, CONTAINER_UID, CONTAINER_GID)


def kept_workspace(workspace: Path) -> WorkspaceInfo | str:
    """The workspace an interrupted task left, or why it cannot be continued (without
    ``BASE_COMMIT``, written last, its clone was cut off and it holds no agent work)."""
    workspace = Path(os.path.abspath(workspace))
    if not os.path.lexists(workspace):
        return f"the workspace {workspace} no longer exists"
    if workspace.is_symlink() or not workspace.is_dir():
        return f"{workspace} is not a directory"
    git_dir = workspace / ".git"
    if git_dir.is_symlink() or not git_dir.is_dir():
        return f"the workspace {workspace} has no .git directory"
    try:
        base_branch = (git_dir / "BASE_BRANCH").read_text(encoding="utf-8").strip()
        base_commit = (git_dir / "BASE_COMMIT").read_text(encoding="utf-8").strip()
    except OSError:
        base_branch = base_commit = ""
    if not base_branch or not base_commit:
        return f"the workspace {workspace} was not completely prepared (its clone was cut off)"
    if ws_git(workspace, ["rev-parse", "--verify", "-q", "HEAD^{commit}"], check=False).returncode != 0:
        return f"the workspace {workspace} is no longer a git repository with a commit (damaged or partly deleted)"
    return WorkspaceInfo(path=workspace, base_branch=base_branch, base_commit=base_commit)


def _settle_index(workspace: Path) -> None:
    """Make the checkout look unchanged to the agent's first ``git add``, which would hash and
    write again every file whose stat data the chown changed and every "racily clean" one (most
    of a fresh checkout): into the workspace, since the read-only store cannot be freshened.
    Files dated two seconds back, and the index refreshed, avoid it."""
    past = time.time() - 2
    for dirpath, dirnames, filenames in os.walk(workspace):
        if dirpath == str(workspace):
            dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            os.utime(os.path.join(dirpath, name), (past, past), follow_symlinks=False)
    run_git(["update-index", "-q", "--refresh"], cwd=workspace, check=False)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give the tree to the container user so it can commit (we run as root)."""
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


# ---------------------------------------------------------------------------
# Cleanup


def remove_workspace(workspace: Path) -> None:
    """Delete a workspace; a missing one is fine. Read-only files are handled."""
    doomed = set_workspace_aside(workspace)
    if doomed is not None:
        delete_set_aside(doomed, Path(workspace))


_aside = itertools.count()


def set_workspace_aside(workspace: Path) -> Path | None:
    """Move a workspace out of its place in one step (a crash mid-deletion must not leave half a
    workspace for a resumed task); the directory left to delete (itself if unmovable), or None."""
    path = Path(workspace)
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return None
    doomed = path.with_name(f"{path.name}.deleting-{os.getpid()}-{next(_aside)}")
    try:
        os.rename(path, doomed)
    except OSError:
        return path
    return doomed


def delete_set_aside(doomed: Path, workspace: Path) -> None:
    """Delete what :func:`set_workspace_aside` left of ``workspace``."""

    def _retry(func, p, _exc):  # Windows: pack files are read-only
        try:
            os.chmod(p, stat.S_IWRITE | stat.S_IREAD | stat.S_IEXEC)
            func(p)
        except FileNotFoundError:
            pass

    shutil.rmtree(doomed, onerror=_retry)
    if os.path.lexists(doomed) or (doomed == workspace and os.path.lexists(workspace)):
        raise GitError(f"could not remove workspace {workspace}")
