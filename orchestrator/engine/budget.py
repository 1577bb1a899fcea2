"""The run-wide spending cap (docs/cli.md, "The spending cap"), consulted when an agent task is scheduled or starts.

The spend is logged (``budget.spend``, ``budget.reached``), so a resumed run goes on from what was already paid; the
cap itself is not a task input, so raising it on ``--resume`` changes no fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from ..log import events as E
from ..runner.plugin import RunnerPlugin

# USD per token (input, output) used to price live usage lines when the
# configuration has no ``pricing`` entry for the model: Claude Sonnet's list
# price, which is also what the simulated agent of a dry run charges. The cost
# the tool reports at the end of each execution replaces the estimate.
DEFAULT_RATE = (3e-6, 15e-6)

OnReached = Literal["finish", "stop"]


class BudgetCap(msgspec.Struct, frozen=True, kw_only=True):
    """The cap of one run: USD, tokens (input + output), or both; ``None`` means no limit on it."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None
    on_reached: OnReached = "finish"

    @property
    def active(self) -> bool:
        return self.max_cost_usd is not None or self.max_tokens is not None

    def describe(self) -> str:
        parts = []
        if self.max_cost_usd is not None:
            parts.append(f"${self.max_cost_usd:.2f}")
        if self.max_tokens is not None:
            parts.append(f"{self.max_tokens:,} tokens")
        return " or ".join(parts)


def is_agent_task(plugin: RunnerPlugin) -> bool:
    """Whether a task of ``plugin`` runs an agent (spends), as opposed to a command or a branch cleanup."""
    return not plugin.capabilities.runs_command


def rate_for(model: str | None, rates: Mapping[str, tuple[float, float]]) -> tuple[float, float] | None:
    """The per-token rates of ``model``: its exact entry, the longest prefix, else the ``*`` entry."""
    if model and model in rates:
        return rates[model]
    prefixes = [k for k in rates if k != "*" and model and model.startswith(k)]
    if prefixes:
        return rates[max(prefixes, key=len)]
    return rates.get("*")


@dataclass(slots=True)
class _TaskSpend:
    tokens: int = 0  # paid by earlier attempts (and earlier processes)
    cost: float = 0.0
    live_tokens: int = 0  # the running attempt, from its usage lines
    live_cost: float = 0.0
    model: str | None = None

    @property
    def total(self) -> tuple[int, float]:
        return self.tokens + self.live_tokens, self.cost + self.live_cost


class Budget:
    """Spend so far against the cap; ``emit(type, payload)`` writes run-level budget events."""

    def __init__(
        self,
        cap: BudgetCap,
        *,
        rates: Mapping[str, tuple[float, float]],
        emit: Callable[[str, E.EventPayload], object],
        on_reached: Callable[[], None] | None = None,
    ) -> None:
        self.cap = cap
        self.rates = dict(rates)
        self._emit = emit
        self._on_reached = on_reached
        self._tasks: dict[str, _TaskSpend] = {}
        self.spent_tokens = 0
        self.spent_cost = 0.0
        self.reached = False
        # Strategy executions that were refused an agent task: they end as budget_reached.
        self.refused: set[str] = set()

    # ------------------------------------------------------------ start
    def seed(self, by_task: Mapping[str, Any]) -> None:
        """What earlier processes of this run paid (``state.budget.by_task``)."""
        for key, value in by_task.items():
            tokens, cost = int(value[0]), float(value[1])
            self._tasks[key] = _TaskSpend(tokens, cost)
            self.spent_tokens += tokens
            self.spent_cost += cost

    def announce(self) -> None:
        """Record the cap in force for this process (a resume may have raised it), then check it."""
        cap = self.cap
        self._emit(
            E.BUDGET_CAP,
            E.BudgetCap(max_cost_usd=cap.max_cost_usd, max_tokens=cap.max_tokens, on_reached=cap.on_reached),
        )
        self._check()

    # ------------------------------------------------------------ counting
    def over(self) -> bool:
        c = self.cap
        return (c.max_cost_usd is not None and self.spent_cost >= c.max_cost_usd - 1e-12) or (
            c.max_tokens is not None and self.spent_tokens >= c.max_tokens
        )

    def _task(self, key: str) -> _TaskSpend:
        return self._tasks.setdefault(key, _TaskSpend())

    def begin(self, key: str, model: str | None) -> None:
        """An attempt of ``key`` starts: its usage lines count from zero."""
        spend = self._task(key)
        spend.model = model
        spend.live_tokens, spend.live_cost = 0, 0.0

    def usage(self, key: str, data: Mapping[str, Any]) -> None:
        """One usage line of a running agent: ``{input_tokens, output_tokens}`` it just spent."""
        # (claude-code's parser already adds cache reads and writes in; codex's input_tokens includes its cached ones)
        tokens_in = _int(data.get("input_tokens"))
        tokens_out = _int(data.get("output_tokens"))
        if not tokens_in and not tokens_out:
            return
        spend = self._task(key)
        rate = rate_for(spend.model, self.rates)
        cost = (tokens_in * rate[0] + tokens_out * rate[1]) if rate else 0.0
        self._change(
            key, spend, live_tokens=spend.live_tokens + tokens_in + tokens_out, live_cost=spend.live_cost + cost
        )

    def settle(self, key: str, metrics: Mapping[str, Any] | None) -> None:
        """The attempt ended with the figures the tool reported; without any, what was counted live stays."""
        spend = self._task(key)
        m = metrics or {}
        tokens_in, tokens_out = _int(m.get("tokens_in")), _int(m.get("tokens_out"))
        reported = m.get("cost_usd")
        if not tokens_in and not tokens_out and reported is None:
            tokens, cost = spend.live_tokens, spend.live_cost
        else:
            tokens = tokens_in + tokens_out
            rate = rate_for(spend.model, self.rates)
            if isinstance(reported, (int, float)):
                cost = float(reported)
            elif rate is not None:
                cost = tokens_in * rate[0] + tokens_out * rate[1]
            else:
                cost = spend.live_cost
        self._change(key, spend, tokens=spend.tokens + tokens, cost=spend.cost + cost, live_tokens=0, live_cost=0.0)

    def interrupted(self, key: str) -> None:
        """The attempt was cut off: what it spent so far is paid (its total is already in the log)."""
        spend = self._tasks.get(key)
        if spend is not None:
            spend.tokens += spend.live_tokens
            spend.cost += spend.live_cost
            spend.live_tokens, spend.live_cost = 0, 0.0

    def _change(self, key: str, spend: _TaskSpend, **fields: Any) -> None:
        before_tokens, before_cost = spend.total
        for name, value in fields.items():
            setattr(spend, name, value)
        tokens, cost = spend.total
        if (tokens, round(cost, 9)) == (before_tokens, round(before_cost, 9)):
            return
        self.spent_tokens += tokens - before_tokens
        self.spent_cost += cost - before_cost
        self._emit(E.BUDGET_SPEND, E.BudgetSpend(task=key, tokens=tokens, cost_usd=round(cost, 6)))
        self._check()

    def _check(self) -> None:
        if self.reached or not self.over():
            return
        self.reached = True
        self._emit(E.BUDGET_REACHED, E.BudgetReached(**self.figures()))
        if self._on_reached is not None:
            self._on_reached()

    def figures(self) -> dict[str, Any]:
        return {
            "spent_cost_usd": round(self.spent_cost, 6),
            "spent_tokens": self.spent_tokens,
            "max_cost_usd": self.cap.max_cost_usd,
            "max_tokens": self.cap.max_tokens,
            "on_reached": self.cap.on_reached,
        }

    def message(self) -> str:
        return f"the run's spending cap ({self.cap.describe()}) is reached: {spent_line(self.spent_cost, self.spent_tokens)}"


def spent_line(cost: float, tokens: int) -> str:
    return f"${cost:.4f} and {tokens:,} tokens spent"


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
