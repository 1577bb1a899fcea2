"""Where a run's folders are (``--list-runs``, ``--show-run``, ``--cleanup-run``, ``--resume``): under the directory
it was started from, found by id from anywhere through its host-wide owner record (:func:`.retention.record_owner`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

from ..errors import UsageError
from ..log.runs import RunDirs, RunManifest, host_claims, list_run_ids, read_manifest
from .retention import owner_dirs

if TYPE_CHECKING:
    from ..log.state import RunState

KEPT_MANIFEST = "run.json"  # in logs/<run_id>/ after --cleanup-run


class Located(msgspec.Struct, frozen=True, kw_only=True):
    dirs: RunDirs
    manifest: RunManifest
    cleaned: bool  # --cleanup-run removed its state: logs and results only, no resume


def kept_manifest(dirs: RunDirs, run_id: str) -> Path:
    return dirs.logs / run_id / KEPT_MANIFEST


def check_run_id(run_id: str) -> str:
    if not run_id or run_id in (".", "..") or any(c in run_id for c in ("/", "\\", "\0")):
        raise UsageError(
            f"{run_id!r} is not a run id (they look like run_20250114_123456); see orchestrator --list-runs"
        )
    return run_id


def repository_dirs(repo: str) -> RunDirs:
    """The run folders a run started from inside ``repo`` has by default."""
    return RunDirs.from_env(environ={}, cwd=repository_top(repo))


def repository_top(repo: str) -> Path:
    from ..errors import PreflightError
    from ..runner import open_repository

    try:
        return open_repository(repo)[0]
    except PreflightError:
        return Path(os.path.realpath(repo))


def _read(dirs: RunDirs, run_id: str) -> Located | None:
    if dirs.manifest(run_id).exists():
        return Located(dirs=dirs, manifest=read_manifest(dirs, run_id), cleaned=False)
    path = kept_manifest(dirs, run_id)
    if path.exists():
        try:
            manifest = msgspec.json.decode(path.read_bytes(), type=RunManifest)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UsageError(f"run manifest {path} is unreadable: {exc}") from None
        return Located(dirs=dirs, manifest=manifest, cleaned=True)
    return None


def locate_run(run_id: str, *, repo: str | None = None, here: RunDirs | None = None) -> Located:
    """The run ``run_id``: under the current run folders, else where it was written, else in ``repo``'s; else a
    :class:`UsageError` naming every place looked in."""
    check_run_id(run_id)
    here = here or RunDirs.from_env()
    places = [here]
    owner = owner_dirs(run_id)
    if owner is not None:
        places.append(owner)
    if repo is not None:
        places.append(repository_dirs(repo))
    for dirs in _distinct(places):
        found = _read(dirs, run_id)
        if found is not None:
            return found
    looked = ", ".join(str(dirs.state) for dirs in _distinct(places))
    known = ", ".join(list_run_ids(here)[-5:]) or "none"
    raise UsageError(f"no run {run_id!r} under {looked} (recent runs here: {known}); see orchestrator --list-runs")


def run_folders(repo: str | None, here: RunDirs) -> list[RunDirs]:
    """Where to list runs: the current run folders; with ``repo``, also its own and every recorded one."""
    places = [here]
    if repo is not None:
        places.append(repository_dirs(repo))
        try:
            ids = sorted(os.listdir(host_claims()))
        except OSError:
            ids = []
        places += [dirs for dirs in map(owner_dirs, ids) if dirs is not None]
    return _distinct(places)


def _distinct(places: list[RunDirs]) -> list[RunDirs]:
    """The first of the places that share a state folder."""
    out: dict[Path, RunDirs] = {}
    for dirs in places:
        out.setdefault(dirs.state, dirs)
    return list(out.values())


def runs_in(dirs: RunDirs) -> list[Located]:
    """Every run in these folders, cleaned-up ones (logs and results kept) included."""
    out = []
    ids = set(list_run_ids(dirs))
    if dirs.logs.is_dir():
        ids |= {p.name for p in dirs.logs.iterdir() if (p / KEPT_MANIFEST).exists()}
    for run_id in sorted(ids):
        try:
            found = _read(dirs, run_id)
        except UsageError:
            continue
        if found is not None:
            out.append(found)
    return out


def not_here_hint(run_id: str, here: RunDirs) -> str | None:
    """For ``--resume``: one line saying why ``run_id`` is not under ``here`` and what to do, or None."""
    dirs = owner_dirs(run_id)
    for place in (here, dirs):
        if place is not None and not place.manifest(run_id).exists() and kept_manifest(place, run_id).exists():
            return (
                f"run {run_id} was cleaned up (--cleanup-run) and cannot be resumed; "
                f"orchestrator --show-run {run_id} shows its kept logs and results"
            )
    if dirs is None or dirs.state == here.state or not dirs.manifest(run_id).exists():
        return None
    default = RunDirs.from_env(environ={}, cwd=dirs.state.parent)
    how = (
        f"cd {dirs.state.parent} && orchestrator --resume {run_id}"
        if default == dirs
        else f"ORCHESTRATOR_STATE_DIR={dirs.state} ORCHESTRATOR_LOGS_DIR={dirs.logs} "
        f"ORCHESTRATOR_RESULTS_DIR={dirs.results} orchestrator --resume {run_id}"
    )
    return f"run {run_id} was started from another folder (its state is under {dirs.state}); resume it with: {how}"


def run_state(dirs: RunDirs, run_id: str) -> RunState:
    """The run's fold: its snapshot (the state's, else the copy kept with the logs) and the log after it."""
    from ..log.state import recover

    return recover(run_id, dirs.events(run_id), [dirs.state / run_id / "state.json", dirs.logs / run_id / "state.json"])


async def warn_unreadable_lines(events_path: Path) -> None:
    """One line on stderr about lines of a run's event log that are not events (the log is read on a worker thread)."""
    from ..log.eventlog import describe_skipped, skipped_lines

    skipped = await anyio.to_thread.run_sync(lambda: skipped_lines(events_path) if events_path.exists() else [])
    if skipped:
        print(describe_skipped(events_path, skipped), file=sys.stderr, flush=True)
