"""The run report: ``results/<run_id>/report.html``, one self-contained page.

It answers the question a user has after a run: which branch to take, and
why. Every run writes it at the end; ``orchestrator --show-run RUN_ID --html``
rebuilds it from the event log. Strategy-specific parts come from the
strategy's ``report_sections(run)`` (see :mod:`orchestrator.report.sections`).
"""

from __future__ import annotations

from .render import report_path, write_report

__all__ = ["report_path", "write_report"]
