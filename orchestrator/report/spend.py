"""The report's spending-cap card: the run's spend over time against its cap, from the event log alone."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from ..log import events as E
from ..log.eventlog import LogReader
from .charts import line_chart_svg
from .sections import Series


def _seconds(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def spend_over_time(events_path: Path) -> dict[str, Any] | None:
    """``{cap_usd, cap_tokens, spent_usd, spent_tokens, reached_at_s, points}``; None for a run without a cap.

    ``points`` are (seconds since the first budget event, USD spent so far),
    one per ``budget.spend`` event: the live count as the run saw it.
    """
    by_task: dict[str, tuple[int, float]] = {}
    spent_usd, spent_tokens = 0.0, 0
    start: float | None = None
    out: dict[str, Any] | None = None
    for _, ev, p in LogReader(events_path).records():
        if not isinstance(p, (E.BudgetCap, E.BudgetSpend, E.BudgetReached)):
            continue
        t = _seconds(ev.ts)
        start = t if start is None else start
        if out is None:
            out = {"cap_usd": None, "cap_tokens": None, "reached_at_s": None, "points": [(0.0, 0.0)], "caps": []}
        if isinstance(p, E.BudgetCap):
            out["cap_usd"], out["cap_tokens"] = p.max_cost_usd, p.max_tokens
            out["reached_at_s"] = None  # a resume's cap: reached again only if its own event says so
            if out["cap_usd"] is not None:
                at = round(t - start, 3)
                if out["caps"]:  # a raised cap is a step, not a slope
                    out["caps"].append((at, out["caps"][-1][1]))
                out["caps"].append((at, float(out["cap_usd"])))
        elif isinstance(p, E.BudgetSpend) and p.task is not None:
            tokens, cost = p.tokens, float(p.cost_usd)
            old_tokens, old_cost = by_task.get(p.task, (0, 0.0))
            by_task[p.task] = (tokens, cost)
            spent_usd += cost - old_cost
            spent_tokens += tokens - old_tokens
            out["points"].append((round(t - start, 3), round(spent_usd, 6)))
        elif isinstance(p, E.BudgetReached) and out["reached_at_s"] is None:
            out["reached_at_s"] = round(t - start, 3)
    if out is None:
        return None
    out.update(spent_usd=round(spent_usd, 6), spent_tokens=spent_tokens)
    return out


def spend_chart_svg(spend: dict[str, Any]) -> str:
    """Spend (USD) over the run's seconds, with the cap as a flat line when it is in USD."""
    points = spend["points"]
    series = [Series(name="spent (USD)", points=points)]
    caps = list(spend.get("caps") or [])
    if caps:
        end = max(x for x, _ in points + caps) or 1.0
        caps.append((end, caps[-1][1]))
        series.append(Series(name=f"cap (now ${caps[-1][1]:.2f})", points=caps))
    return line_chart_svg(series, x_label="seconds since the run started", y_label="USD")
