"""Money and wall-clock budgets of the search strategies (tree-beam).

Counting evaluations alone can still spend without bound. Time is read only through
``ctx.now()`` and cost only from task results, both recorded: a resumed run decides the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Budget:
    """Spending limits of one strategy run (None: no limit): :meth:`charge` every finished result, then ask
    :meth:`exhausted` before starting new work."""

    def __init__(self, *, max_cost_usd: float | None, max_wall_s: float | None, started_at: float) -> None:
        for name, value in (("max_cost_usd", max_cost_usd), ("max_wall_s", max_wall_s)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        self.max_cost_usd = max_cost_usd
        self.max_wall_s = max_wall_s
        self.started_at = started_at
        self.cost_usd = 0.0
        self._charged: set[str] = set()

    def charge(self, result: Mapping[str, Any] | None, key: str | None = None) -> None:
        """Add one task's reported cost, once per key (an unknown cost counts as 0)."""
        if not result:
            return
        ident = key or result.get("key")
        if ident is not None:
            if ident in self._charged:
                return
            self._charged.add(ident)
        cost = (result.get("metrics") or {}).get("cost_usd")
        if isinstance(cost, (int, float)) and cost > 0:
            self.cost_usd += float(cost)

    def exhausted(self, now: float) -> str | None:
        """The reason no new task may start, or ``None`` while within budget."""
        if self.max_cost_usd is not None and self.cost_usd >= self.max_cost_usd:
            return f"max_cost_usd reached: spent ${self.cost_usd:.4f} of ${self.max_cost_usd:.4f}"
        if self.max_wall_s is not None and now - self.started_at >= self.max_wall_s:
            return f"max_wall_s reached: {now - self.started_at:.0f}s of {self.max_wall_s:.0f}s"
        return None
