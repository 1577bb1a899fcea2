"""Run directories, run ids and the run manifest.

A run lives in three places under the current directory (or the
``ORCHESTRATOR_{LOGS,STATE,RESULTS}_DIR`` overrides): ``logs/<run_id>/``
(events.jsonl, component logs), ``orchestrator_state/<run_id>/`` (state.json
and ``run.json``, the manifest that ``--resume`` reads) and
``results/<run_id>/``. Nothing is created before pre-flight has passed.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from ..errors import UsageError
from .eventlog import WriterLock
from .events import utc_ts
from .state import FINISHED_OUTCOMES, write_snapshot_bytes


class RunDirs(msgspec.Struct, frozen=True, kw_only=True):
    logs: Path
    state: Path
    results: Path

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, cwd: Path | None = None) -> RunDirs:
        env = os.environ if environ is None else environ
        cwd = cwd or Path.cwd()
        return cls(
            logs=Path(env.get("ORCHESTRATOR_LOGS_DIR") or cwd / "logs").absolute(),
            state=Path(env.get("ORCHESTRATOR_STATE_DIR") or cwd / "orchestrator_state").absolute(),
            results=Path(env.get("ORCHESTRATOR_RESULTS_DIR") or cwd / "results").absolute(),
        )

    def events(self, run_id: str) -> Path:
        return self.logs / run_id / "events.jsonl"

    def lock(self, run_id: str) -> Path:
        return self.logs / run_id / "events.jsonl.lock"

    def manifest(self, run_id: str) -> Path:
        return self.state / run_id / "run.json"


class RunManifest(msgspec.Struct, kw_only=True):
    run_id: str
    created_at: str
    prompt: str
    strategy_spec: str
    strategy_name: str
    params: dict[str, Any]
    runs: int
    repo_path: str
    base_branch: str
    model: str
    plugin: str
    docker_image: str
    max_parallel: int
    dry_run: bool = False
    mode: str | None = None
    status: str = "running"  # running | completed | failed | interrupted
    finished_at: str | None = None
    exit_code: int | None = None
    # The fully resolved configuration (defaults included): what --resume uses.
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    # Runs started before strategies asked for structured answers recorded
    # free-text JSON tasks; a resume must ask the same way or every recorded
    # key would conflict. Absent in their run.json, so False for them.
    structured_outputs: bool = False
    # Where it came from, so --resume can tell what changed since: the --config
    # file (absolute) and the command-line overrides.
    config_file: str | None = None
    cli_overrides: dict[str, Any] = msgspec.field(default_factory=dict)
    version: int = 1


now_iso = utc_ts  # a manifest's times are written as an event's are


def host_claims() -> Path:
    # Container, volume and branch names derive from the run id, and Docker is
    # shared by every directory on this host: ids must be unique host-wide,
    # not just within one orchestrator_state/ folder. (Also where a run records
    # its owning directories: retention.record_owner.)
    return Path(tempfile.gettempdir()) / "orchestrator-run-ids"


def claim_run_id(dirs: RunDirs, when: datetime | None = None) -> str:
    """``run_YYYYMMDD_HHMMSS``, unique on this host (``_2``, ``_3``... when two start in the same second)."""
    when = when or datetime.now()
    base = when.strftime("run_%Y%m%d_%H%M%S")
    dirs.state.mkdir(parents=True, exist_ok=True)
    claims = host_claims()
    claims.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        run_id = base if n == 1 else f"{base}_{n}"
        n += 1
        try:
            (claims / run_id).mkdir()
        except FileExistsError:
            continue
        try:
            (dirs.state / run_id).mkdir()
        except FileExistsError:
            continue
        return run_id


def write_manifest(dirs: RunDirs, manifest: RunManifest) -> None:
    from ..sanitize import default_sanitizer

    data = msgspec.json.encode(default_sanitizer().scrub(msgspec.to_builtins(manifest)))
    write_snapshot_bytes(data, [dirs.manifest(manifest.run_id)])


def read_manifest(dirs: RunDirs, run_id: str) -> RunManifest:
    path = dirs.manifest(run_id)
    if not path.exists():
        known = ", ".join(r for r in list_run_ids(dirs)[-5:]) or "none"
        raise UsageError(f"no run {run_id!r} under {dirs.state} (recent runs: {known}); see orchestrator --list-runs")
    try:
        return msgspec.json.decode(path.read_bytes(), type=RunManifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UsageError(f"run manifest {path} is unreadable: {exc}") from None


def list_run_ids(dirs: RunDirs) -> list[str]:
    if not dirs.state.exists():
        return []
    return sorted(p.name for p in dirs.state.iterdir() if (p / "run.json").exists())


def is_live(dirs: RunDirs, run_id: str) -> bool:
    return WriterLock.is_held(dirs.lock(run_id))


# Container label holding the absolute path of the run's events.jsonl.lock: from
# any directory, a container's run can be told live (a process holds the lock)
# or dead, whichever state directory started it.
RUN_LOCK_LABEL = "orchestrator.run_lock"


# Container label holding the absolute path of the run's run.json: a run that
# can still be resumed keeps its containers, whichever directory started it.
RUN_MANIFEST_LABEL = "orchestrator.run_manifest"


def manifest_status(path: str | None) -> str:
    """The status in the run.json at ``path``; ``"gone"`` when there is none, ``"unknown"`` when unreadable.

    A container without the label (an older orchestrator's) counts as gone, as
    such containers always did.
    """
    if not path:
        return "gone"
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "unknown"
    try:
        return msgspec.json.decode(data, type=RunManifest).status
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "unknown"


def lock_holder(path: str | None) -> str:
    """``"live"``, ``"dead"`` or ``"unknown"`` for the run whose lock file is ``path``.

    Dead only when it is provable: the file is there, no process holds its
    lock, and it was not last taken on another host (whose locks this host's
    kernel cannot see). Anything else is unknown.
    """
    if not path or not Path(path).is_absolute():
        return "unknown"
    lock = Path(path)
    try:
        if not lock.is_file():
            return "unknown"
        if WriterLock.is_held(lock):
            return "live"
    except OSError:
        return "unknown"
    meta = WriterLock.read_meta(lock)
    if meta and meta.get("hostname") not in (None, socket.gethostname()):
        return "unknown"
    return "dead"


def remove_run_state(dirs: RunDirs, run_id: str) -> None:
    shutil.rmtree(dirs.state / run_id, ignore_errors=True)


def is_resumable(dirs: RunDirs, run_id: str) -> bool:
    """The run has a manifest and did not finish: ``--resume`` continues it from its log.

    A manifest still saying ``running`` without a live writer is a run that
    crashed (kill -9, power loss): resumable too.
    """
    try:
        return read_manifest(dirs, run_id).status not in FINISHED_OUTCOMES
    except UsageError:
        return False


def cleanup_old_logs(dirs: RunDirs, retention_days: float, *, keep: set[str]) -> list[str]:
    """Delete ``logs/<run>`` folders older than the retention, never a live or resumable run's.

    A resumable run's events.jsonl is all that lets ``--resume`` skip the work
    already paid for; it goes only after ``--cleanup-run`` (which removes the
    run's manifest) and then ages past the retention like any other.
    """
    if retention_days <= 0 or not dirs.logs.exists():
        return []
    cutoff = datetime.now().timestamp() - retention_days * 86400
    removed = []
    for path in dirs.logs.iterdir():
        if not path.is_dir() or path.name in keep or not path.name.startswith("run_"):
            continue
        try:
            newest = max((p.stat().st_mtime for p in path.iterdir()), default=path.stat().st_mtime)
        except OSError:
            continue
        if newest < cutoff and not is_live(dirs, path.name) and not is_resumable(dirs, path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed
