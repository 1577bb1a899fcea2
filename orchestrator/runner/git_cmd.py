"""Running git safely, validating ref names, and the per-repository import lock.

Every git call of the runner goes through :func:`run_git`. It never raises
``CalledProcessError``: a failure becomes :class:`~orchestrator.errors.GitError`
carrying the last lines of git's stderr. Names that reach git as arguments are
checked first by :func:`check_branch_name`, so ``--upload-pack=x`` or ``../``
can never turn into an option or a path.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

import anyio.to_thread

from ..errors import GitError
from ..filelock import file_lock

# Environment variables that would redirect git to another repository or index
# if the orchestrator itself runs inside a git hook or a `git rebase -x` shell.
_STRIP_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)

# The workspace is owned by the container user (uid 1000) while the host side
# runs as another user, so git's ownership check must be waived for our calls.
# "-c" is command-line scope, which git honours for safe.directory; nothing is
# written to any config file.
_BASE_ARGS = ("-c", "safe.directory=*")

# Extra settings when git reads a workspace the agent could have tampered
# with: no fsmonitor daemon command, no hooks.
WORKSPACE_HARDENING = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/nonexistent-orchestrator-hooks")

# `git fetch <local path>` runs upload-pack in the source repository with a
# scrubbed environment (GIT_CONFIG_PARAMETERS is dropped), so "-c" does not
# reach it. Fetching from a workspace therefore names an upload-pack command
# that carries the waiver itself. Run through `sh -c` by git: keep it quoted.
WORKSPACE_UPLOAD_PACK = "git -c 'safe.directory=*' -c core.fsmonitor=false upload-pack"

# A fetch that writes only the refs it names: no tags, no FETCH_HEAD, no gc after it.
QUIET_FETCH = ("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-auto-gc")

_STDERR_LINES = 5


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _STRIP_ENV}
    env.update(
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
        LANGUAGE="C",
        # Read-only commands (status) must not rewrite the user's index.
        GIT_OPTIONAL_LOCKS="0",
    )
    if extra:
        env.update(extra)
    return env


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # git puts the actionable line first ("fatal: Unable to create '.../x.lock':
    # File exists.") and explanations after it: never cut that line off.
    head = [ln for ln in lines[:-_STDERR_LINES] if ln.startswith(("fatal:", "error:"))][:2]
    return " | ".join(head + lines[-_STDERR_LINES:])


def run_git(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    env: dict[str, str] | None = None,
    what: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """With ``check``, a non-zero exit raises :class:`GitError` naming the operation, ending with git's stderr."""
    argv = ["git", *_BASE_ARGS, *(os.fspath(a) for a in args)]
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=git_env(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
    except FileNotFoundError as exc:
        raise GitError("git executable not found on PATH; install git") from exc
    except OSError as exc:
        raise GitError(f"could not run git: {exc}") from exc
    if check and proc.returncode != 0:
        label = what or f"git {_first_command(args)}"
        detail = _tail(proc.stderr) or _tail(proc.stdout) or "no output"
        raise GitError(f"{label} failed (exit {proc.returncode}): {detail}")
    return proc


def _first_command(args: Sequence[str | os.PathLike[str]]) -> str:
    skip = False
    for a in args:
        a = os.fspath(a)
        if skip:
            skip = False
            continue
        if a in ("-c", "-C"):
            skip = True
            continue
        if not a.startswith("-"):
            return a
    return ""


def ws_git_dir(workspace: Path) -> Path:
    """The ``.git`` directory of a workspace; never a ``gitdir:`` file or a symlink the agent put
    there to point somewhere else on the host."""
    git_dir = Path(workspace) / ".git"
    if git_dir.is_symlink() or not git_dir.is_dir():
        raise GitError(f"workspace {workspace} has no .git directory (or it was replaced by a link)")
    return git_dir


def ws_git(workspace: Path, args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a read-only git command against a workspace's object store."""
    git_dir = ws_git_dir(workspace)
    return run_git([*WORKSPACE_HARDENING, f"--git-dir={git_dir}", *args], check=check)


def check_branch_name(name: str, *, what: str = "branch name", repo: Path | None = None) -> str:
    """``name`` if it is a safe, valid branch name, else GitError: not what git would misread (a
    leading ``-``, ``@{...}``, ``HEAD``), nor what ``git check-ref-format`` refuses."""
    if not isinstance(name, str) or not name:
        raise GitError(f"invalid {what}: empty")
    if name.startswith("-") or "@{" in name or name == "HEAD" or name.startswith("refs/"):
        raise GitError(f"invalid {what} {name!r}: not allowed as a branch name")
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        raise GitError(f"invalid {what} {name!r}: contains control characters")
    # Names made only of letters, digits, "_" and "-" (slash-separated) pass every
    # rule of check-ref-format, as the orchestrator's own branch names do: no git
    # process for them. Others ask git once per name.
    if not _PLAIN_NAME.fullmatch(name) and name not in _valid_ref_names:
        proc = run_git(["check-ref-format", f"refs/heads/{name}"], check=False, cwd=repo)
        if proc.returncode != 0:
            raise GitError(f"invalid {what} {name!r}: git check-ref-format rejects it")
        if len(_valid_ref_names) < 4096:
            _valid_ref_names.add(name)
    return name


# Names `git check-ref-format` accepted; that check depends on the name only.
_valid_ref_names: set[str] = set()
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*")


# The per-repository lock, in its git dir, that imports and branch deletions take.
IMPORT_LOCK = ".orc_import.lock"


@contextlib.contextmanager
def dir_lock(directory: Path, name: str) -> Iterator[None]:
    """Hold the lock file ``<directory>/<name>`` exclusively (threads and processes)."""
    path = os.path.join(os.path.realpath(directory), name)
    held = contextlib.ExitStack()
    try:
        held.enter_context(file_lock(path))
    except OSError as exc:  # only taking the lock: what the caller's block raises is its own
        raise GitError(f"cannot open lock file {path}: {exc}") from exc
    with held:
        yield


P = ParamSpec("P")
T = TypeVar("T")


def in_thread(fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """``fn`` run on a worker thread that is not abandoned on cancellation: git work that
    started finishes (and releases its locks) before the caller sees the cancellation."""

    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    return run
