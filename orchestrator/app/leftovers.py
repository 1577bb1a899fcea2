"""What a run leaves behind (its branches; its containers and volumes on every engine it used), with which every
summary ends, and the one command that removes what is safe to remove (``--cleanup-run`` keeps the branches)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ..log.runs import RunManifest
from .retention import RESUMABLE

if TYPE_CHECKING:
    from ..runner import HostSpec

# Counting must never hold up a summary: an engine that does not answer is named instead.
COUNT_TIMEOUT_S = 20.0


async def count_leftovers(run_id: str, hosts: Sequence[HostSpec] = ()) -> dict[str, Any]:
    """The run's containers and volumes on each of ``hosts`` (none: the local engine): ``{containers, running,
    volumes}``, or ``None`` counts with ``not_counted`` (why) when an engine did not answer."""
    from ..runner import list_containers, run_volumes
    from .hosts_cli import engines, workspace_volumes

    containers = running = volumes = 0
    failures: list[str] = []
    for label, host in engines(hosts):
        try:
            with anyio.fail_after(COUNT_TIMEOUT_S):
                found = await list_containers(run_id, host=host)
                containers += len(found)
                running += sum(1 for c in found if c["status"] == "running")
                volumes += len(await run_volumes(run_id, host=host))
                if host.archive:  # a remote engine keeps each kept task's workspace in a volume
                    volumes += len(await workspace_volumes(host, run_id, []))
        except Exception as exc:  # no engine, a dropped link: the summary says so and goes on
            failures.append(f"{label}: {str(exc) or type(exc).__name__}")
        finally:
            with anyio.CancelScope(shield=True):
                await host.aclose()
    if failures:
        return {"containers": None, "running": None, "volumes": None, "not_counted": "; ".join(failures)}
    return {"containers": containers, "running": running, "volumes": volumes}


async def count_recorded_leftovers(manifest: RunManifest, where: str) -> dict[str, Any]:
    """:func:`count_leftovers` on the engines the run recorded; one that no longer resolves (its docker context was
    removed since) leaves the counts out and says why: showing a finished run must not depend on it."""
    from ..config import recorded_config
    from ..errors import OrchestratorError
    from .hosts_cli import host_specs

    try:  # the engines the run recorded; none (the local engine) in a record this version cannot read
        config = recorded_config(manifest.config, where) if manifest.config else None
    except Exception:
        config = None
    try:
        hosts = await host_specs(config)
    except OrchestratorError as exc:
        return {"containers": None, "running": None, "volumes": None, "not_counted": str(exc)}
    return await count_leftovers(manifest.run_id, hosts)


def counted(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def leftover_lines(summary: dict[str, Any]) -> list[str]:
    """The summary's last lines: what the run leaves, and the command that removes what is safe to remove."""
    left = summary.get("leftovers")
    run_id, status = summary["run_id"], summary["status"]
    if not left or status == "live":  # still at work: nothing is left yet
        return []
    parts = [counted(left["branches"], "branch", "branches")]
    if left.get("containers") is None:
        why = left.get("not_counted") or "Docker did not answer"
        return ["", f"Left behind: {parts[0]}; containers and volumes not counted ({why})"]
    stopped = left["containers"] - (left.get("running") or 0)
    parts.append(counted(stopped, "stopped container"))
    if left.get("running"):
        parts.append(f"{left['running']} running")
    parts.append(counted(left["volumes"], "volume"))
    listed = ", ".join(parts[:-1]) + f" and {parts[-1]}"
    resumable = status in RESUMABLE
    lines = ["", f"Kept for orchestrator --resume {run_id}: {listed}" if resumable else f"Left behind: {listed}"]
    if left["containers"] or left["volumes"]:
        todo = "To give the run up instead" if resumable else "To remove the containers and volumes"
        lines.append(f"{todo} (the branches stay): orchestrator --cleanup-run {run_id}")
    return lines
