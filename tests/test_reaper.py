"""Finished tasks' workspaces are deleted in the background, in bounded numbers, and none is lost track of."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import anyio
import pytest

from orchestrator.runner import git_ops
from orchestrator.runner.docker_runner import DockerRunner
from orchestrator.runner.reaper import WorkspaceReaper

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def workspace(root: Path, name: str) -> Path:
    ws = root / name
    (ws / ".git" / "objects").mkdir(parents=True)
    (ws / "a.txt").write_text("a\n")
    (ws / ".git" / "objects" / "ro").write_text("x")
    (ws / ".git" / "objects" / "ro").chmod(0o444)
    return ws


async def test_a_discarded_workspace_leaves_its_place_at_once_and_is_gone_once_the_reaper_closes(tmp_path):
    reaper = WorkspaceReaper()
    spaces = [workspace(tmp_path, f"k_{i}") for i in range(3)]
    for ws in spaces:
        await reaper.discard(ws)
        assert not ws.exists()  # a new task of the same key never finds the old one
    await reaper.aclose()
    assert list(tmp_path.iterdir()) == []
    assert reaper.failures == []


async def test_the_task_does_not_wait_for_the_deletion_until_the_backlog_is_full(tmp_path):
    release, taken = threading.Event(), threading.Event()
    deleted: list[Path] = []

    def slow_delete(doomed: Path, ws: Path) -> None:
        taken.set()
        release.wait(30)
        git_ops.delete_set_aside(doomed, ws)
        deleted.append(ws)

    reaper = WorkspaceReaper(backlog=1, workers=1, delete=slow_delete)
    first, second, third = (workspace(tmp_path, f"k_{i}") for i in range(3))
    with anyio.fail_after(10):
        await reaper.discard(first)  # the thread takes it and waits on the disk
        assert await anyio.to_thread.run_sync(taken.wait, 10)
        await reaper.discard(second)  # the one place in the backlog
    with anyio.move_on_after(0.5) as waited:
        await reaper.discard(third)
    assert waited.cancelled_caught, "a third discard went past a full backlog"
    assert deleted == [] and not third.exists()
    release.set()
    with anyio.fail_after(30):
        await reaper.discard(workspace(tmp_path, "k_3"))
        await reaper.aclose()
    # The cancelled task stopped waiting, and its workspace was deleted all the same.
    assert sorted(deleted) == sorted([first, second, third, tmp_path / "k_3"])
    assert list(tmp_path.iterdir()) == []


async def test_a_workspace_that_cannot_be_deleted_is_reported_and_the_rest_still_go(tmp_path):
    def picky_delete(doomed: Path, ws: Path) -> None:
        if ws.name == "k_0":
            raise OSError("device busy")
        git_ops.delete_set_aside(doomed, ws)

    reaper = WorkspaceReaper(delete=picky_delete)
    for i in range(3):
        await reaper.discard(workspace(tmp_path, f"k_{i}"))
    await reaper.aclose()
    assert reaper.failures == [(tmp_path / "k_0", "OSError: device busy")]
    assert [p.name.split(".")[0] for p in tmp_path.iterdir()] == ["k_0"]


async def test_the_runner_waits_for_its_deletions_when_it_closes_and_logs_what_is_left(tmp_path):
    runner = DockerRunner(logs_dir=tmp_path / "logs")

    def refuse(doomed: Path, ws: Path) -> None:
        raise OSError("read-only file system")

    runner.reaper = WorkspaceReaper(delete=refuse)
    await runner.reaper.discard(workspace(tmp_path / "ws", "k_0"))
    done = WorkspaceReaper()
    await done.discard(workspace(tmp_path / "ws2", "k_1"))
    await done.aclose()
    await runner.aclose()
    lines = [json.loads(x) for x in (tmp_path / "logs" / "runner.jsonl").read_text().splitlines()]
    (left,) = [x for x in lines if x["message"] == "runner.workspace.not_removed"]
    assert left["workspace"] == str(tmp_path / "ws" / "k_0")
    assert left["error"] == "OSError: read-only file system"
    assert list((tmp_path / "ws2").iterdir()) == []


async def test_a_workspace_that_cannot_be_moved_aside_is_deleted_before_the_task_ends(tmp_path):
    # A name with no room for the ".deleting-…" suffix: the rename fails (ENAMETOOLONG).
    deleted: list[Path] = []

    def slow_delete(doomed: Path, ws: Path) -> None:
        time.sleep(0.3)  # in the background this would still be running when discard returns
        git_ops.delete_set_aside(doomed, ws)
        deleted.append(doomed)

    reaper = WorkspaceReaper(delete=slow_delete)
    ws = workspace(tmp_path, "k_" + "x" * 240)
    await reaper.discard(ws)
    assert deleted == [ws] and not ws.exists()
    await reaper.aclose()
    assert list(tmp_path.iterdir()) == []


async def test_finished_checkouts_kept_for_reuse_are_bounded_handed_out_once_and_deleted_at_the_end(tmp_path):
    """A checkout offered for reuse travels with its recorded index; past the limit,
    or without a record, it is deleted as before; what no task took goes at close."""
    store, other = tmp_path / "objects_a.git", tmp_path / "objects_b.git"
    reaper = WorkspaceReaper(spares=2)
    spaces = [workspace(tmp_path, f"k_{i}") for i in range(4)]
    for ws in spaces[:3]:
        record = git_ops.pristine_index_path(ws)
        record.parent.mkdir(exist_ok=True)
        record.write_bytes(b"base\nDIRC")
    for ws in spaces:
        await reaper.discard(ws, reuse_for=store)
        assert not ws.exists()
    records = tmp_path / ".pristine-index"
    assert reaper.take(other) is None
    first, second = reaper.take(store), reaper.take(store)
    assert first is not None and second is not None and reaper.take(store) is None
    for kept, record in (first, second):
        assert (kept / "a.txt").read_text() == "a\n" and record.read_bytes() == b"base\nDIRC"
        assert record.parent == records and ".deleting-" in kept.name
    # the third had a record but no room, the fourth no record: both deleted, records too
    assert sorted(p.name for p in records.iterdir()) == sorted([first[1].name, second[1].name])
    kept_again = workspace(tmp_path, "k_9")
    git_ops.pristine_index_path(kept_again).write_bytes(b"base\nDIRC")
    await reaper.discard(kept_again, reuse_for=store)
    await reaper.aclose()  # kept_again was never taken: it goes, with its record
    assert reaper.failures == []
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("k_"))
    assert left == sorted([first[0].name, second[0].name])  # what was taken is the taker's
    assert sorted(p.name for p in records.iterdir()) == sorted([first[1].name, second[1].name])
