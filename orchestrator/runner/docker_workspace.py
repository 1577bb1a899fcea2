"""A task's workspace and first container: a fresh clone, or the workspace a resumed task left.

On a remote engine (``host.archive``) the local clone is also copied into the
container's ``/workspace`` volume.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec

from ..errors import GitError, RunnerError
from . import archive, git_ops
from .base import RunnerEventCallback
from .docker_containers import ContainerReady, DockerHost, selinux_enabled, workspace_read_only
from .docker_core import TaskEvents, TaskFailed, session_volume
from .object_cache import CACHE_ALTERNATE, ObjectCache, cache_volume, workspace_wants
from .reaper import WorkspaceReaper
from .seed import SeedCache, copy_seed
from .types import Hardening, InstanceRequest, IsolationMode
from .workspace_reuse import reuse_workspace

MIN_FREE_BYTES = 200 << 20
# Sends of the object cache's pack tried before a dropped link fails the task.
SYNC_ATTEMPTS = 3


def _reset_workspace(workspace: Path) -> None:
    """An empty directory at ``workspace``; fails first when its filesystem is nearly full."""
    probe = workspace
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        raise GitError(
            f"insufficient disk space for the workspace: {free // (1 << 20)} MiB free under {probe} "
            f"(need at least {MIN_FREE_BYTES >> 20} MiB); free space or set ORCHESTRATOR_WORKSPACE_ROOT"
        )
    git_ops.reset_workspace(workspace)


def _move_in(spare: tuple[Path, Path], workspace: Path) -> tuple[Path, Path] | None:
    """Put a finished checkout where the empty directory :func:`_reset_workspace` made is
    (None, and that directory back, when it cannot be moved there: the task then clones)."""
    try:
        # Its last task's markers go first: killed before the checkout is made new, the
        # task must not find a "kept" workspace holding another task's commits (it clones).
        git_ops.unmark_whole(spare[0])
        os.rmdir(workspace)
        os.rename(spare[0], workspace)
    except OSError:
        git_ops.reset_workspace(workspace)
        git_ops.remove_workspace(spare[0])
        spare[1].unlink(missing_ok=True)
        return None
    return spare


@dataclass(eq=False)
class WorkspaceSetup:
    """The workspace phase: the task's clone (or the workspace it left) and its first container."""

    host: DockerHost
    hardening: Hardening
    seeds: SeedCache
    emit_event: TaskEvents
    object_cache: ObjectCache
    # finished checkouts a new task may start in (see workspace_reuse.py)
    spares: WorkspaceReaper

    async def prepare(
        self, request: InstanceRequest, workspace: Path, on_event: RunnerEventCallback | None
    ) -> tuple[InstanceRequest, dict[str, Any]]:
        """The workspace, while the first container starts; an interrupted task continues in the
        workspace it left, with its session. Returns the request (without its session when the kept
        workspace is gone) and ``{"ws_info", "ready" | "error", "duration_s"}``: the first attempt's
        container, or why it did not start (an attempt error, retried as such); a workspace failure
        is raised as :class:`TaskFailed`.
        """
        if request.resume_workspace:
            kept = await anyio.to_thread.run_sync(git_ops.kept_workspace, workspace)
            if not isinstance(kept, str):
                return request, await self._kept_workspace_and_container(request, kept, on_event)
            # Its session refers to files that are gone: both start afresh.
            self.emit_event(
                request,
                on_event,
                "runner.session.reset",
                "warn",
                reason="workspace_missing",
                detail=kept,
                previous_session_id=request.session_id,
            )
            request = msgspec.structs.replace(request, session_id=None, resume_workspace=False)
        return request, await self._workspace_and_container(request, workspace, on_event)

    async def ensure_container(self, request: InstanceRequest, workspace: Path, *, fresh: bool) -> ContainerReady:
        """The task's container, running on ``workspace`` with its session volume and object cache."""
        return await self.host.ensure_container(
            request,
            workspace=workspace,
            volume=session_volume(request),
            fresh_workspace=fresh,
            hardening=self.hardening,
            object_cache=cache_volume(self.host, self.object_cache, request),
        )

    async def _workspace_and_container(
        self, request: InstanceRequest, workspace: Path, on_event: RunnerEventCallback | None
    ) -> dict[str, Any]:
        """Clone the workspace and create/start the first attempt's container at the same time.

        The container is the slowest step before the agent runs (about 0.2 s of daemon, runc and
        kernel work), so it does not wait for the clone: it bind-mounts the emptied workspace
        directory, which the clone then fills (same inode, so the container sees it). On SELinux
        hosts the ``z`` relabel happens at the create, so there the clone comes first.
        """
        t = time.monotonic()
        first: dict[str, Any] = {}
        failures: list[RunnerError] = []
        unexpected: list[BaseException] = []  # re-raised below, outside the task group, unwrapped
        cached = self.object_cache.applies(self.host, request.isolation_mode)
        try:
            mode, store, spare = await self._empty_workspace(request, workspace, cached, on_event)
        except RunnerError as exc:
            failures.append(exc)
        else:
            clone = functools.partial(
                self._clone, request, workspace, mode, store, spare, first, failures, unexpected, t, on_event
            )
            container = functools.partial(self._first_container, request, workspace, first, unexpected)
            if selinux_enabled() or cached:
                await clone()
                if cached and not failures and not unexpected:
                    # Before the container: a cache too old or too big is dropped, which
                    # Docker allows only while no container mounts it.
                    failure = await self._sync_object_cache(request, workspace, first["ws_info"].base_commit, on_event)
                    failures.extend([failure] if failure is not None else [])
                if not failures and not unexpected:
                    await container()
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(container)
                    await clone()
        # Ctrl+C while the clone's thread finished: the container task was cancelled
        # and the group exits without raising, so the cancellation is only pending.
        # Deliver it here; going on would find no container and fail the task
        # (a KeyError), recording an interrupted task as failed for good.
        await anyio.lowlevel.checkpoint_if_cancelled()
        if unexpected:
            raise unexpected[0]
        if not failures and self.host.archive and first.get("ready") is not None:
            self._copy_failed_is_attempt_error(
                first, await self.archive_copy_in(request, workspace, first["ready"], on_event, fresh=True)
            )
        if failures:
            raise TaskFailed("workspace", failures[0].category, str(failures[0]), stop="ready" in first)
        # duration_s: the workspace's own time (reset + clone), not the wait for the container
        self.emit_event(
            request,
            on_event,
            "runner.workspace.prepared",
            phase="workspace",
            workspace_path=str(workspace),
            base_commit=first["ws_info"].base_commit,
            reused=first.pop("reused", False),
            duration_s=first.pop("clone_s"),
        )
        return first

    async def _empty_workspace(
        self, request: InstanceRequest, workspace: Path, cached: bool, on_event: RunnerEventCallback | None
    ) -> tuple[IsolationMode, Path | None, tuple[Path, Path] | None]:
        """The emptied workspace directory the container mounts: its isolation mode, object store and spare checkout."""
        mode: IsolationMode = request.isolation_mode
        store: Path | None = None
        spare: tuple[Path, Path] | None = None
        await anyio.to_thread.run_sync(_reset_workspace, workspace, limiter=self.host.limiter)
        if mode == "shared_objects" and self.host.archive and not cached:
            mode = "full_copy"
            # A remote engine cannot mount this machine's object store. Informational, not a
            # warning: shared_objects is the default, and remote tasks have always had full copies.
            self.emit_event(
                request,
                on_event,
                "runner.workspace.full_copy",
                phase="workspace",
                host=self.host.name,
                detail=(
                    f"the run's object store is on this machine; "
                    f"this task on host {self.host.name} gets a full copy of the repository"
                ),
            )
        elif mode == "shared_objects":
            # Before the container: it mounts the store, which must exist by then.
            store = await self._object_store(request, workspace)
            spare = self.spares.take(store) if not self.host.archive else None
            if spare is not None:
                # before the container too: it mounts the directory now at this path
                spare = await anyio.to_thread.run_sync(_move_in, spare, workspace, limiter=self.host.limiter)
        return mode, store, spare

    async def _clone(
        self,
        request: InstanceRequest,
        workspace: Path,
        mode: IsolationMode,
        store: Path | None,
        spare: tuple[Path, Path] | None,
        first: dict[str, Any],
        failures: list[RunnerError],
        unexpected: list[BaseException],
        t: float,
        on_event: RunnerEventCallback | None,
    ) -> None:
        """The fresh clone at ``workspace`` (a spare checkout made it when it can be), seeded."""
        try:
            if spare is not None:
                reused = await self._reuse(request, workspace, spare, store, on_event)
                if reused is not None:
                    first["ws_info"], first["reused"] = reused, True
            if "ws_info" not in first:
                first["ws_info"] = await git_ops.prepare_workspace(
                    request.repo_path,
                    request.base_branch,
                    workspace,
                    isolation_mode=mode,
                    include_branches=request.include_branches,
                    into_empty_dir=True,
                    object_store=store,
                )
            seed = await self.seeds.for_image(self.host.image_source, request.docker_image)
            if seed is not None:
                await anyio.to_thread.run_sync(copy_seed, seed, workspace, limiter=self.host.limiter)
        except RunnerError as exc:
            failures.append(exc)
        except Exception as exc:
            unexpected.append(exc)
        first["clone_s"] = round(time.monotonic() - t, 4)

    async def _first_container(
        self, request: InstanceRequest, workspace: Path, first: dict[str, Any], unexpected: list[BaseException]
    ) -> None:
        tc = time.monotonic()
        try:
            first["ready"] = await self.ensure_container(request, workspace, fresh=True)
        except RunnerError as exc:
            first["error"] = exc
        except Exception as exc:
            unexpected.append(exc)
        first["duration_s"] = round(time.monotonic() - tc, 4)

    async def _reuse(
        self,
        request: InstanceRequest,
        workspace: Path,
        spare: tuple[Path, Path],
        store: Path | None,
        on_event: RunnerEventCallback | None,
    ) -> git_ops.WorkspaceInfo | None:
        """The finished checkout now at ``workspace``, made the fresh clone; None when it
        cannot be (the directory is then emptied for a clone)."""
        assert store is not None
        fn = functools.partial(
            reuse_workspace,
            workspace,
            spare[1],
            request.base_branch,
            include_branches=tuple(request.include_branches),
            object_store=store,
        )
        try:
            info = await anyio.to_thread.run_sync(fn, limiter=self.host.limiter)
        except (GitError, OSError) as exc:
            self.emit_event(request, on_event, "runner.workspace.not_reused", "warn", error=str(exc))
            await anyio.to_thread.run_sync(git_ops.empty_dir, workspace, limiter=self.host.limiter)
            return None
        finally:
            await anyio.to_thread.run_sync(
                functools.partial(spare[1].unlink, missing_ok=True), limiter=self.host.limiter
            )
        return info

    async def _kept_workspace_and_container(
        self, request: InstanceRequest, kept: git_ops.WorkspaceInfo, on_event: RunnerEventCallback | None
    ) -> dict[str, Any]:
        """The container for a task that continues in the workspace it left. One still running belongs
        to the process that died: restarting it ends that agent before its stale git locks are cleared."""
        t = time.monotonic()
        first: dict[str, Any] = {"ws_info": kept}
        cached = self.object_cache.applies(self.host, request.isolation_mode)
        if cached:
            # The engine's cache may have been removed or dropped since the task
            # started: it gets the base's objects again (the clone's own travel with it).
            failure = await self._sync_object_cache(request, kept.path, kept.base_commit, on_event)
            if failure is not None:
                raise TaskFailed("workspace", failure.category, str(failure))
        try:
            if request.isolation_mode == "shared_objects" and not self.host.archive:
                # The container mounts the store its clone borrows from.
                store = await self._object_store(request, kept.path)
                await anyio.to_thread.run_sync(git_ops.point_at_store, kept.path, store, limiter=self.host.limiter)
            elif self.host.archive and not cached:
                # A clone kept from the local engine borrows from a store this engine
                # lacks: it must take its objects along (as a full copy would have).
                await anyio.to_thread.run_sync(git_ops.dissociate_workspace, kept.path, limiter=self.host.limiter)
            first["ready"] = await self.ensure_container(request, kept.path, fresh=True)
        except RunnerError as exc:
            first["error"] = exc
        first["duration_s"] = round(time.monotonic() - t, 4)
        if self.host.archive and first.get("ready") is not None:
            # A remote engine: the workspace volume keeps the work when it holds a
            # whole clone; otherwise the kept clone travels in through the archive API.
            self._copy_failed_is_attempt_error(
                first, await self.archive_copy_in(request, kept.path, first["ready"], on_event, fresh=False)
            )
        removed: list[str] = []
        if "ready" in first:
            # In the container, where the agent's git ran: on a remote engine the work is in its volume.
            try:
                removed = await archive.clear_stale_git_locks(self.host, request.container_name)
            except RunnerError as exc:
                raise TaskFailed("workspace", exc.category, str(exc)) from None
        self.emit_event(
            request,
            on_event,
            "runner.workspace.kept",
            phase="workspace",
            workspace_path=str(kept.path),
            base_commit=kept.base_commit,
            session_id=request.session_id,
            stale_locks_removed=removed,
        )
        return first

    async def archive_copy_in(
        self,
        request: InstanceRequest,
        workspace: Path,
        ready: ContainerReady,
        on_event: RunnerEventCallback | None,
        *,
        fresh: bool,
    ) -> RunnerError | None:
        """Remote engine: the clone travels into the container's /workspace volume.

        ``fresh``: the first attempt on a fresh clone, so the volume must hold that clone only (one an
        existing container kept is emptied first). Otherwise (a retry, or a kept workspace) the volume
        keeps the agent's work when it holds a whole clone; an earlier attempt may have failed before or
        during its copy-in (a broken link), and an agent must never run in an empty or half-copied one."""
        name = request.container_name
        try:
            if not fresh and await archive.workspace_holds_a_clone(self.host, name):
                return None
            read_only = workspace_read_only(request)
            if not (fresh and ready.action == "created"):
                await archive.empty_workspace(self.host, name, read_only=read_only)
            t = time.monotonic()
            cached = self.object_cache.applies(self.host, request.isolation_mode)
            sent = await archive.copy_in(
                self.host,
                name,
                workspace,
                read_only=read_only,
                alternates=CACHE_ALTERNATE if cached else None,
                # A fresh clone's files are the base's: checked out there, from the cache.
                checkout=cached and fresh,
            )
        except RunnerError as exc:
            return exc
        self.emit_event(
            request,
            on_event,
            "runner.archive.copied_in",
            phase="workspace",
            host=self.host.name,
            bytes=sent,
            duration_s=round(time.monotonic() - t, 4),
        )
        return None

    async def _sync_object_cache(
        self, request: InstanceRequest, workspace: Path, base_commit: str, on_event: RunnerEventCallback | None
    ) -> RunnerError | None:
        """Remote engine: its object cache gets what this task's clone borrows and it lacks."""
        t = time.monotonic()
        try:
            wants = await anyio.to_thread.run_sync(
                workspace_wants, workspace, base_commit, request.include_branches, limiter=self.host.limiter
            )
        except RunnerError as exc:
            return exc
        # The pack can be the whole history, the longest transfer on the link: a link
        # that drops midway is sent again, as a broken copy-in is, and the task goes on.
        for attempt in range(1, SYNC_ATTEMPTS + 1):
            try:
                done = await self.object_cache.sync(
                    self.host, request.docker_image, request.repo_path, workspace, wants
                )
                break
            except RunnerError as exc:
                if not exc.retryable or attempt == SYNC_ATTEMPTS:
                    return exc
                self.emit_event(
                    request,
                    on_event,
                    "runner.object_cache.retry",
                    "warn",
                    phase="workspace",
                    host=self.host.name,
                    attempt=attempt,
                    error=str(exc),
                )
                await anyio.sleep(attempt)
        if done["checked"]:
            self.emit_event(
                request,
                on_event,
                "runner.object_cache.synced",
                "warn" if done["dropped"] else "info",
                phase="workspace",
                host=self.host.name,
                volume=done["volume"],
                bytes=done["bytes"],
                dropped=done["dropped"],
                duration_s=round(time.monotonic() - t, 4),
            )
        return None

    async def _object_store(self, request: InstanceRequest, workspace: Path) -> Path:
        """Make or refresh the run's object store (``shared_objects``, local engine): hard links where the
        filesystem allows, except under SELinux, whose ``z`` relabel would relabel the user's object files."""
        return await git_ops.ensure_object_store(
            request.repo_path,
            workspace,
            [request.base_branch, *request.include_branches],
            hardlinks=not selinux_enabled(),
        )

    @staticmethod
    def _copy_failed_is_attempt_error(first: dict[str, Any], failure: RunnerError | None) -> None:
        """A failed copy-in fails the first attempt, as a container that did not start
        does: a transient one (a link to the engine that broke) is retried, and the
        retry copies the clone in again (see ``archive_copy_in``)."""
        if failure is not None:
            first.pop("ready")
            first["error"] = failure
