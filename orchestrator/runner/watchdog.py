"""Watch a running task for a runaway agent: a fork bomb, a full /tmp, a workspace that keeps growing.

The container's limits keep the machine safe but do not end the task; what is
looked at, and when, is in docs/docker.md (local engine only: see
``AgentExec._probe`` in docker_agent.py).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import msgspec

WATCH_INTERVAL_S = 2.0
# Walking the workspace costs tens of ms for 2,000 files and a few hundred for 20,000
# (bench_containment.py): every 5th look (10 s) keeps that to a few percent of a CPU per agent,
# while the process and /tmp checks, a few microseconds, run on every look.
WORKSPACE_EVERY = 5


class Probe(msgspec.Struct, kw_only=True):
    """Where one container's numbers are read; fields are None when not visible from here."""

    pids_events: str | None = None
    tmp_path: str | None = None
    workspace: str | None = None
    workspace_start_bytes: int = 0
    max_workspace_bytes: int | None = None
    pids_limit: int = 0
    # the cgroup's counter covers the container's whole life: a reused container starts above 0
    pids_refused_start: int = 0
    # free bytes of the workspace's filesystem when the task started: a drop past the limit
    # triggers the (costlier) walk at once instead of at the next scheduled one
    fs_free_start: int | None = None


def cgroup_pids_events(container_id: str) -> str | None:
    """The container's ``pids.events`` (cgroup v1 or v2; systemd or cgroupfs driver), or None."""
    if not container_id:
        return None
    for pattern in (
        f"/sys/fs/cgroup/docker/{container_id}/pids.events",
        f"/sys/fs/cgroup/pids/docker/{container_id}/pids.events",
        f"/sys/fs/cgroup/pids/system.slice/docker-{container_id}.scope/pids.events",
        f"/sys/fs/cgroup/*/docker-{container_id}.scope/pids.events",
    ):
        found = glob.glob(pattern)
        if found:
            return found[0]
    return None


def _refused_forks(path: str) -> int:
    fields = dict(line.split() for line in Path(path).read_text().splitlines() if line.strip())
    return int(fields.get("max", "0"))


def _fs_free(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def tree_size(root: str) -> int:
    """Apparent size of every file under ``root`` (symlinks not followed)."""
    total = 0
    stack = [root]
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as entries:
                for e in entries:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:
                            total += e.stat(follow_symlinks=False).st_size
                    except OSError:
                        pass
        except OSError:
            pass
    return total


def make_probe(inspect: dict, *, workspace: Path | None, pids_limit: int, max_workspace_mb: int) -> Probe:
    pid = (inspect.get("State") or {}).get("Pid") or 0
    tmp = f"/proc/{pid}/root/tmp" if pid and os.path.isdir(f"/proc/{pid}/root/tmp") else None
    ws = str(workspace) if workspace is not None and workspace.is_dir() else None
    events = cgroup_pids_events(inspect.get("Id", ""))
    try:
        refused = _refused_forks(events) if events else 0
    except (OSError, ValueError):
        events, refused = None, 0
    return Probe(
        pids_events=events,
        pids_refused_start=refused,
        tmp_path=tmp,
        workspace=ws,
        fs_free_start=_fs_free(ws) if ws else None,
        workspace_start_bytes=tree_size(ws) if ws else 0,
        max_workspace_bytes=max_workspace_mb * 1024 * 1024 if max_workspace_mb else None,
        pids_limit=pids_limit,
    )


def check(probe: Probe, *, workspace: bool = True) -> str | None:
    """The limit the task hit, as a sentence for the user, or None (``workspace=False``: skip the walk)."""
    if probe.pids_events:
        try:
            if _refused_forks(probe.pids_events) > probe.pids_refused_start:
                return (
                    f"the agent hit the container's process limit ({probe.pids_limit} processes): a fork bomb "
                    "or a runaway process; raise runner.container_limits.pids_limit if the task needs more"
                )
        except (OSError, ValueError):
            pass
    if probe.tmp_path and _fs_free(probe.tmp_path) == 0:
        return "the agent filled /tmp (its tmpfs has no space left); the task was stopped"
    if probe.workspace and probe.max_workspace_bytes and not workspace and probe.fs_free_start is not None:
        # A fast writer fills gigabytes between two walks; the filesystem's free space is
        # read in microseconds, and a drop past the limit walks the workspace now.
        free = _fs_free(probe.workspace)
        workspace = free is not None and probe.fs_free_start - free > probe.max_workspace_bytes
    if workspace and probe.workspace and probe.max_workspace_bytes:
        grown = tree_size(probe.workspace) - probe.workspace_start_bytes
        if grown > probe.max_workspace_bytes:
            return (
                f"the agent wrote more than runner.max_workspace_mb ({probe.max_workspace_bytes // 2**20} MB) "
                f"into its workspace ({grown // 2**20} MB); the task was stopped"
            )
    return None
