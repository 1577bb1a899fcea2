"""Retention of workspaces and session volumes: they expire after ``failure_retention_hours``, never while the run can
be resumed (docs/cli.md). The workspace root and Docker are shared by every directory on the host, so each run
records the directories that own it; a run this host does not know is left alone."""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec

from ..config import Config
from ..errors import UsageError
from ..jsonlog import ComponentLog
from ..log.runs import RunDirs, host_claims, is_live, read_manifest

# A run in one of these can go on (--resume): what it leaves is what the resume needs.
RESUMABLE = ("running", "interrupted", "budget_reached")


class Owner(msgspec.Struct, frozen=True):
    state: str
    logs: str
    results: str = ""  # absent in records written before management commands read them


def record_owner(dirs: RunDirs, run_id: str) -> None:
    """Remember which directories hold ``run_id`` (read by other directories' cleanup and by ``--show-run``)."""
    path = host_claims() / run_id / "owner.json"
    with contextlib.suppress(OSError):  # without it, this run's leftovers are only expired from its own directory
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(
            msgspec.json.encode(Owner(state=str(dirs.state), logs=str(dirs.logs), results=str(dirs.results)))
        )


def owner_dirs(run_id: str) -> RunDirs | None:
    """The directories ``run_id`` was written to, from its host-wide record, or None without one."""
    try:
        owner = msgspec.json.decode((host_claims() / run_id / "owner.json").read_bytes(), type=Owner)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    state = Path(owner.state)
    # Records from before results were recorded: the default layout puts results beside the state.
    results = Path(owner.results) if owner.results else state.parent / "results"
    return RunDirs(state=state, logs=Path(owner.logs), results=results)


def _retention_hours(run_id: str, here: RunDirs, config: Config) -> tuple[float | None, float]:
    """(retention in hours or None to keep, reference time) for the run's leftovers; kept when no directory owns it."""
    from ..log.state import parse_ts

    dirs = owner_dirs(run_id) or (here if here.manifest(run_id).exists() else None)
    if dirs is None or is_live(dirs, run_id):
        return None, 0.0
    if not dirs.manifest(run_id).exists():
        # Its owner removed the state (--cleanup-run): it can no longer be resumed.
        return config.runner.failure_retention_hours, 0.0
    try:
        manifest = read_manifest(dirs, run_id)
    except UsageError:
        return None, 0.0
    if manifest.status in RESUMABLE:
        return None, 0.0
    # What is left is a failed task's (a successful one's workspace goes at import),
    # even in a run whose strategy succeeded: the failure retention applies.
    return config.runner.failure_retention_hours, parse_ts(manifest.finished_at) or 0.0


def _newest_mtime(path: Path) -> float:
    try:
        return max([path.stat().st_mtime, *(p.stat().st_mtime for p in path.iterdir())])
    except OSError:
        return time.time()


def expired_workspaces(root: Path, dirs: RunDirs, config: Config, *, current: str | None) -> list[Path]:
    """Run folders under the workspace root whose run is not resumable and whose retention is over."""
    if not root.is_dir():
        return []
    now = time.time()
    out = []
    for path in sorted(root.iterdir()):
        run_id = path.name
        if not path.is_dir() or run_id == current or not run_id.startswith("run_"):
            continue
        hours, finished = _retention_hours(run_id, dirs, config)
        if hours is None:
            continue
        if now - max(finished, _newest_mtime(path)) >= hours * 3600:
            out.append(path)
    return out


async def expire_leftovers(dirs: RunDirs, config: Config, olog: ComponentLog, *, current: str | None) -> None:
    """Remove expired workspaces and run-scoped session volumes of runs that cannot be resumed."""
    import anyio.to_thread

    from ..naming import safe_component
    from ..runner import shared_host, workspace_root

    root = workspace_root()
    stale = await anyio.to_thread.run_sync(lambda: expired_workspaces(root, dirs, config, current=current))
    for path in stale:
        await anyio.to_thread.run_sync(functools.partial(shutil.rmtree, path, ignore_errors=True))
    if stale:
        olog.info("removed expired workspaces", workspaces=[str(p) for p in stale])

    host = shared_host()
    listing = await host.api("list volumes", "volumes", filters={"label": ["orchestrator=true"]})
    by_run: dict[str, list[str]] = {}
    for v in (listing or {}).get("Volumes") or []:
        run_id = (v.get("Labels") or {}).get("run_id", "")
        # Global-scope volumes (orc_home_g*) are shared by every run: never expired here.
        if run_id and run_id != current and v["Name"].startswith(f"orc_home_{safe_component(run_id)}_g"):
            by_run.setdefault(run_id, []).append(v["Name"])

    def _due(run_id: str) -> bool:
        hours, finished = _retention_hours(run_id, dirs, config)
        return hours is not None and finished > 0 and time.time() - finished >= hours * 3600

    # One worker-thread trip for all the file checks: hosts keep hundreds of runs' volumes.
    due = await anyio.to_thread.run_sync(lambda: [r for r in by_run if _due(r)])
    removed = [name for run_id in due for name in by_run[run_id] if await _remove_volume(host, name)]
    if removed:
        olog.info("removed expired session volumes", volumes=removed)


async def _remove_volume(host: Any, name: str) -> bool:
    try:
        await host.api(f"remove volume {name}", "remove_volume", name)
    except Exception:  # in use by a retained container, or already gone: the next scan tries again
        return False
    return True
