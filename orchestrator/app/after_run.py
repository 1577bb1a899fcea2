"""After a run: the branches the strategy no longer needs, the report, orphans of earlier runs."""

from __future__ import annotations

import contextlib
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import anyio

from ..config import Config
from ..jsonlog import ComponentLog
from ..log.runs import RunDirs, RunManifest


async def _delete_unneeded_branches(prep, dirs: RunDirs, manifest: RunManifest, state, olog: ComponentLog) -> None:
    """After a finished run: the git layer deletes the branches the strategy's hook names that this run
    created and nobody moved or checked out since; a failed clean-up never fails a finished run."""
    hook = prep.strategy.hooks.branches_to_delete
    if hook is None:
        return
    from ..runner import delete_run_branches
    from .results import run_view

    run_id = manifest.run_id
    try:
        names = list(hook(run_view(dirs, manifest, state)) or [])
        if not names:
            return
        outcome = await delete_run_branches(prep.repo, names, run_id=run_id)
    except Exception as exc:
        olog.warning(f"branch cleanup after {prep.strategy.name} failed: {exc}")
        print(f"warning: branch cleanup after {prep.strategy.name} failed: {exc}", file=sys.stderr)
        return
    deleted = sum(1 for how in outcome.values() if how == "deleted")
    kept = {name: how for name, how in outcome.items() if how not in ("deleted", "missing")}
    line = f"{prep.strategy.name}: deleted {deleted} branch(es) it no longer needs" + (
        f"; kept {len(kept)}: " + ", ".join(f"{n} ({how})" for n, how in kept.items()) if kept else ""
    )
    print(line, file=sys.stderr)
    olog.info(line, outcome=outcome)


async def _release_run_folder(manifest: RunManifest, olog: ComponentLog) -> None:
    """After a finished run: its object store and pristine indexes go now, not at some later start's retention."""
    from ..runner import release_run_folder

    try:
        removed = await release_run_folder(manifest.run_id, manifest.repo_path)
    except Exception as exc:  # the retention removes them later; cleanup must not fail a finished run
        olog.warning(f"the run's object store was not removed: {exc}")
        print(f"warning: the run's object store was not removed: {exc}", file=sys.stderr)
        return
    if removed:
        olog.info("removed the run's object store and pristine indexes", removed=removed)


async def _write_report(dirs: RunDirs, manifest: RunManifest, hooks, olog: ComponentLog, *, state=None):
    """results/<run_id>/report.html from ``state`` (the fold, when held) or the log; never fails the run."""
    from ..report import write_report

    try:
        return await anyio.to_thread.run_sync(lambda: write_report(dirs, manifest, hooks=hooks, state=state))
    except Exception as exc:
        olog.warning(f"run report not written: {exc}")
        print(
            f"warning: run report not written: {exc} (rebuild it with orchestrator --show-run "
            f"{manifest.run_id} --html)",
            file=sys.stderr,
        )
        return None


ORPHAN_SCAN_INTERVAL_S = 300


async def _clean_orphans(dirs: RunDirs, config: Config, olog: ComponentLog, run_id: str) -> None:
    """Remove other runs' containers past retention, at most every ORPHAN_SCAN_INTERVAL_S per state dir: listing
    costs the daemon ~0.25 ms per container, hosts keep thousands, and none is due before hours of retention."""
    from .manage import clean_orphans
    from .retention import expire_leftovers

    marker = _orphan_scan_marker(dirs)
    try:
        age = time.time() - marker.stat().st_mtime
    except OSError:
        age = None
    if age is not None and 0 <= age < ORPHAN_SCAN_INTERVAL_S:
        olog.info("orphan cleanup skipped: this state directory was scanned recently", seconds_ago=round(age))
        return
    failed = False
    # Two independent clean-ups: one that fails must not keep the other from running.
    for what, cleanup in (
        ("orphan cleanup", clean_orphans),
        ("expiry of old workspaces and volumes", expire_leftovers),
    ):
        try:
            await cleanup(dirs, config, olog, current=run_id)
        except Exception as exc:  # cleanup must never stop a run
            failed = True
            olog.warning(f"{what} skipped: {first_cause(exc)}")
    if failed:
        return  # the next start scans again
    with contextlib.suppress(OSError):  # the next start scans again
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def first_cause(exc: BaseException) -> BaseException:
    """The first real error inside a task group's ExceptionGroup: a line that says what failed."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _orphan_scan_marker(dirs: RunDirs) -> Path:
    # Outside the state directory, whose entries are the runs (users and tools list them).
    key = hashlib.sha256(str(dirs.state.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "orchestrator-orphan-scans" / key
