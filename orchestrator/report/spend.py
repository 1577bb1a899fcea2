"""The report's spending-cap card: the run's spend over time against its cap, as the run's fold keeps it."""

from __future__ import annotations

from typing import Any

from ..log.state import RunState, parse_ts
from .charts import line_chart_svg
from .sections import Series


def spend_over_time(state: RunState) -> dict[str, Any] | None:
    """``{cap_usd, cap_tokens, spent_usd, spent_tokens, reached_at_s, points}``; None for a run without a cap.

    ``points`` are (seconds since the first budget event, USD spent so far),
    one per ``budget.spend`` event: the live count as the run saw it
    (:class:`~orchestrator.log.state.BudgetState` keeps them).
    """
    budget = state.budget
    if budget is None:
        return None
    start = parse_ts(budget.first_at) or 0.0

    def since_start(ts: str) -> float:
        return round((parse_ts(ts) or start) - start, 3)  # a malformed stamp: at the start, not before it

    caps: list[tuple[float, float]] = []
    for ts, cap in budget.caps_over_time:
        if caps:  # a raised cap is a step, not a slope
            caps.append((since_start(ts), caps[-1][1]))
        caps.append((since_start(ts), cap))
    return {
        "cap_usd": budget.max_cost_usd,
        "cap_tokens": budget.max_tokens,
        # (a resume's cap is reached again only if its own event says so: the fold forgets the earlier one)
        "reached_at_s": since_start(budget.reached_at) if budget.reached_at else None,
        "points": [(0.0, 0.0)] + [(since_start(ts), usd) for ts, usd in budget.spent_over_time],
        "caps": caps,
        "spent_usd": budget.spent_cost_usd,
        "spent_tokens": budget.spent_tokens,
    }


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
