"""The run report: ``results/<run_id>/report.html``, one self-contained page.

It answers the question a user has after a run: which branch to take, and
why. Every run writes it at the end; ``orchestrator --show-run RUN_ID --html``
rebuilds it from the event log. Strategy-specific parts come from the
strategy's ``report_sections(run)`` (see :mod:`orchestrator.report.sections`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..log.runs import RunDirs, RunManifest

if TYPE_CHECKING:
    from ..log.state import RunState
    from ..strategy import StrategyHooks
from .render import render_report

__all__ = ["report_path", "write_report"]


def report_path(dirs: RunDirs, run_id: str) -> Path:
    return dirs.results / run_id / "report.html"


def write_report(
    dirs: RunDirs,
    manifest: RunManifest,
    *,
    hooks: StrategyHooks | None = None,
    state: RunState | None = None,
    live: bool = False,
) -> Path:
    """Render and atomically write the report; return its path.

    Blocking (it reads the log and runs git): call it from a worker thread in
    async code. ``hooks`` are the strategy's when the caller has it loaded;
    otherwise it is loaded from the manifest's strategy spec. ``state`` is the
    run's fold when the caller holds it (otherwise the log is folded here);
    ``live``: a process is running the run now.
    """
    from ..log.state import write_snapshot_bytes

    data = render_report(dirs, manifest, hooks=hooks, state=state, live=live)
    target = report_path(dirs, manifest.run_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_snapshot_bytes(data, [target])
    return target
