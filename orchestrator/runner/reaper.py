"""Finished tasks' workspaces, deleted off the tasks' path.

Deleting a checkout costs about what making it did: on a disk that discards
freed blocks at once, a 2,000-file checkout takes longer to delete than to
clone, and almost all of that is waiting on the disk, not the CPU. No one needs
to wait for it. A finished task's workspace is moved aside at once, in one
atomic rename (a crash mid-delete never leaves a half-deleted workspace where a
resumed task would continue), and background threads delete it while the
next tasks run. Several at once: one thread falls behind four slots of tasks
(an unlink waits on the disk's journal, and others can wait beside it; four
threads delete eight checkouts 1.5x as fast as one). When deletions fall
``backlog`` behind, the next task waits for one to finish, so the disk never
holds more than that many extra checkouts. The runner waits for the rest when
it closes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path

import anyio.to_thread

from . import git_ops

BACKLOG = 8
WORKERS = 4


class WorkspaceReaper:
    """Deletes set-aside workspaces on its own threads, oldest first."""

    def __init__(
        self,
        *,
        backlog: int = BACKLOG,
        workers: int = WORKERS,
        delete: Callable[[Path, Path], None] = git_ops.delete_set_aside,
    ) -> None:
        self._delete = delete
        self._workers = workers
        self._queue: queue.Queue[tuple[Path, Path] | None] = queue.Queue(maxsize=backlog)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # (workspace, why it is still there): what the threads could not delete,
        # read by the runner from its own thread once they have stopped.
        self.failures: list[tuple[Path, str]] = []

    async def discard(self, workspace: Path) -> None:
        """Take ``workspace`` out of its place now; delete it in the background."""
        doomed = await anyio.to_thread.run_sync(git_ops.set_workspace_aside, workspace)
        if doomed is None:
            return
        if doomed == workspace:  # it could not be moved aside: deleted in place, before the task ends
            await anyio.to_thread.run_sync(self._delete, doomed, workspace)
            return
        self._start()
        # Blocks (on a worker thread) while the backlog is full. A task cancelled
        # meanwhile does not wait on: its workspace joins the backlog when there is room.
        await anyio.to_thread.run_sync(self._queue.put, (doomed, workspace), abandon_on_cancel=True)

    async def aclose(self) -> None:
        """Wait for every discarded workspace to be deleted, and stop the threads.

        Cancelled (a second Ctrl+C), it stops waiting; what is left is the
        set-aside directories, named ``<workspace>.deleting-*``.
        """
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

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            doomed, workspace = item
            try:
                self._delete(doomed, workspace)
            except Exception as exc:  # reported by the runner; one leftover must not stop the rest
                self.failures.append((workspace, f"{type(exc).__name__}: {exc}"))
