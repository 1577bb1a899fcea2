"""A finished run's folder under the workspace root, given back (docs/results.md).

A failed task's workspace, kept for a post-mortem, borrowed its history from the run's object store:
its alternates are pointed at your repository's own objects first, which hold everything the store
held, so ``git log`` still works there.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path

import anyio.to_thread

from ..errors import GitError
from .git_cmd import run_git
from .git_ops import OBJECT_STORE_PREFIX, remove_workspace, workspace_root

logger = logging.getLogger(__name__)

PRISTINE_DIR = ".pristine-index"
# Files the run's machinery leaves in its folder that mean nothing once the tasks are done.
_SCAFFOLDING = (".offline-hosts",)


def _is_store_part(name: str) -> bool:
    """The store, a half-made one (``.partial``) or its lock file (``.objects_<8 hex>.git.lock``)."""
    return name.startswith((OBJECT_STORE_PREFIX, f".{OBJECT_STORE_PREFIX}")) and ".git" in name


def _repository_objects(repo_path: str | os.PathLike[str]) -> Path | None:
    try:
        proc = run_git(["rev-parse", "--git-path", "objects"], cwd=Path(repo_path), check=False)
    except GitError:
        return None
    found = proc.stdout.strip()
    if proc.returncode != 0 or not found:
        return None
    path = Path(os.path.realpath(Path(repo_path) / found))
    return path if path.is_dir() else None


def _borrow_from_repository(workspace: Path, objects: Path | None) -> None:
    alternates = workspace / ".git" / "objects" / "info" / "alternates"
    try:
        line = alternates.read_text(encoding="utf-8").strip()
    except OSError:
        return  # objects of its own (full_copy), or not a clone at all
    if OBJECT_STORE_PREFIX not in line:
        return
    if objects is None:
        alternates.unlink()  # git then names the missing objects, rather than a store that is gone
    else:
        alternates.write_text(f"{objects}\n", encoding="utf-8")


def _release_sync(run_id: str, repo_path: str | os.PathLike[str]) -> list[str]:
    folder = workspace_root() / run_id
    if not folder.is_dir():
        return []
    entries = list(folder.iterdir())
    stores = [p for p in entries if _is_store_part(p.name)]
    kept = [p for p in entries if p.is_dir() and p.name.startswith("k_") and ".deleting-" not in p.name]
    if stores and kept:
        objects = _repository_objects(repo_path)
        for workspace in kept:
            _borrow_from_repository(workspace, objects)
    removed = []
    for path in [*stores, folder / PRISTINE_DIR]:
        if os.path.lexists(path):
            remove_workspace(path)
            removed.append(path.name)
    if all(p.name in _SCAFFOLDING or p in stores or p.name == PRISTINE_DIR for p in entries):
        remove_workspace(folder)
        removed.append(str(folder))
    return removed


async def release_run_folder(run_id: str, repo_path: str | os.PathLike[str]) -> list[str]:
    """After a finished run: remove its object store and pristine indexes (and its folder once empty);
    returns what was removed. Only once the run's runner is closed and the run cannot be resumed."""
    removed = await anyio.to_thread.run_sync(partial(_release_sync, run_id, repo_path))
    if removed:
        logger.info("gave back the finished run's folder", extra={"run_id": run_id, "removed": removed})
    return removed
