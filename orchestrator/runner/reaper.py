"""Finished tasks' workspaces, deleted off the tasks' path (docs/scaling.md, "Deleting a
finished task's checkout no longer holds the task's slot").

The rename aside is atomic: a crash mid-delete never leaves a half-deleted workspace
where a resumed task would continue. Several threads, since one falls behind four slots
of tasks (four threads delete eight checkouts 1.5x as fast as one).
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

import anyio.to_thread

from . import git_ops

# Finished checkouts kept for the next tasks of the run (see workspace_reuse.py):
# one per slot of a 4-task run is enough, since each is taken as the next task starts.
SPARES = 4


class WorkspaceReaper:
    """Deletes set-aside workspaces on its own threads, oldest first."""

    def __init__(
        self,
        *,
        backlog: int = 8,
        workers: int = 4,
        delete: Callable[[Path, Path], None] = git_ops.delete_set_aside,
        spares: int = SPARES,
    ) -> None:
        self._delete = delete
        self._max_spares = spares
        # the run's object store -> [(a finished checkout set aside, its pristine index)]
        self._spares: dict[Path, list[tuple[Path, Path]]] = {}
        self._workers = workers
        self._backlog = backlog
        self._queue: queue.Queue[tuple[Path, Path] | None] = queue.Queue()
        self._room = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # (workspace, why it is still there): what the threads could not delete,
        # read by the runner from its own thread once they have stopped.
        self.failures: list[tuple[Path, str]] = []

    async def discard(self, workspace: Path, *, reuse_for: Path | None = None) -> None:
        """Take ``workspace`` out of its place now; delete it in the background. ``reuse_for``: the run's
        object store it borrows from, when a later task may take it (its container is stopped): kept while
        fewer than ``spares`` are, handed out by :meth:`take`."""
        doomed = await anyio.to_thread.run_sync(git_ops.set_workspace_aside, workspace)
        pristine = await anyio.to_thread.run_sync(_pristine_aside, workspace, doomed)
        if doomed is None:
            return
        spares = self._spares.setdefault(reuse_for, []) if reuse_for is not None else None
        # a pristine index is only kept for a workspace that was moved aside
        if spares is not None and pristine is not None and len(spares) < self._max_spares:
            spares.append((doomed, pristine))
            return
        if pristine is not None:
            await anyio.to_thread.run_sync(functools.partial(pristine.unlink, missing_ok=True))
        if doomed == workspace:  # it could not be moved aside: deleted in place, before the task ends
            await anyio.to_thread.run_sync(self._delete, doomed, workspace)
            return
        self._start()
        # Queued at once, then the task waits (on a worker thread) while the backlog is
        # over its bound. A task cancelled meanwhile stops waiting and its workspace is
        # deleted in its turn all the same: a put left waiting on an abandoned thread
        # could land after aclose's stop marks, and that workspace was never deleted.
        self._queue.put((doomed, workspace))
        if self._queue.qsize() > self._backlog:  # no thread to start when there is room
            await anyio.to_thread.run_sync(self._wait_for_room, abandon_on_cancel=True)

    def take(self, object_store: Path) -> tuple[Path, Path] | None:
        """A finished checkout borrowing from ``object_store`` and its pristine index, or None."""
        spares = self._spares.get(object_store)
        return spares.pop() if spares else None

    async def aclose(self) -> None:
        """Wait for every discarded workspace to be deleted, and stop the threads. Cancelled (a second
        Ctrl+C), it stops waiting, leaving the set-aside ``<workspace>.deleting-*`` directories."""
        spares = [spare for kept in self._spares.values() for spare in kept]
        self._spares.clear()
        for doomed, pristine in spares:
            await anyio.to_thread.run_sync(functools.partial(pristine.unlink, missing_ok=True))
            self._start()
            self._queue.put((doomed, doomed))
        with self._lock:
            threads, self._threads = self._threads, []
        if threads:
            await anyio.to_thread.run_sync(self._stop, threads, abandon_on_cancel=True)

    def _start(self) -> None:
        with self._lock:
            if not self._threads:
                self._threads = [
                    threading.Thread(target=self._work, name=f"workspace-reaper-{i}", daemon=True)
                    for i in range(self._workers)
                ]
                for thread in self._threads:
                    thread.start()

    def _stop(self, threads: list[threading.Thread]) -> None:
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join()

    def _wait_for_room(self) -> None:
        with self._room:
            self._room.wait_for(lambda: self._queue.qsize() <= self._backlog)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            with self._room:
                self._room.notify_all()
            if item is None:
                return
            doomed, workspace = item
            try:
                self._delete(doomed, workspace)
            except Exception as exc:  # reported by the runner; one leftover must not stop the rest
                self.failures.append((workspace, f"{type(exc).__name__}: {exc}"))


def _pristine_aside(workspace: Path, doomed: Path | None) -> Path | None:
    """The workspace's pristine index, renamed to go with its set-aside directory."""
    pristine = git_ops.pristine_index_path(workspace)
    if not os.path.lexists(pristine):
        return None
    if doomed is None or doomed == workspace:
        pristine.unlink(missing_ok=True)
        return None
    paired = pristine.with_name(doomed.name)
    os.rename(pristine, paired)
    return paired
