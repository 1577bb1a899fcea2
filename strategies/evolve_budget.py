"""A ``ctx`` that refuses new tasks once a money or wall-clock budget is spent.

evolve and review-loop schedule tasks from many helpers (measure, fix, merge,
bisect; the per-idea pipeline). Rather than threading a budget check through
each of them, they get this wrapper instead of ``ctx``: every ``run`` first
asks :class:`strategies.budget.Budget` whether a new task may start, and every
finished result is charged. When the budget is spent, ``run`` raises
:class:`BudgetExhausted`, which the strategy catches where it can end cleanly
with the best it has so far. Tasks already started are still awaited.

Time is read through ``ctx.now()`` only when a limit is set, so a run without
a budget records no extra checkpoints and replays exactly as before.
"""

from __future__ import annotations

from typing import Any

from orchestrator.strategy import BudgetReached, parallel_items

from .budget import Budget


class BudgetExhausted(Exception):
    """No new task may start: the message says which limit was reached."""


def make_budget(ctx, max_cost_usd: float | None, max_wall_s: float | None) -> Budget | None:
    if max_cost_usd is None and max_wall_s is None:
        return None
    return Budget(max_cost_usd=max_cost_usd, max_wall_s=max_wall_s, started_at=ctx.now())


class BudgetedContext:
    """Wraps a strategy's ``ctx``; everything but ``run``/``wait``/``wait_all``/``parallel`` passes through.

    It also remembers the branches its tasks created (``branches``), so a
    strategy can delete its working branches at the end.
    """

    def __init__(self, ctx, budget: Budget | None) -> None:
        self._ctx = ctx
        self.budget = budget
        self.stop_reason: str | None = None
        # Every branch a finished task left in the user's repository, in the order seen.
        self.branches: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def exhausted(self) -> str | None:
        """Why no new task may start (remembered once true), or None."""
        if self.stop_reason is None and self.budget is not None:
            self.stop_reason = self.budget.exhausted(self._ctx.now())
        return self.stop_reason

    def run(self, task: dict[str, Any], *, key: str, policy: Any = None):
        reason = self.exhausted()
        if reason is not None:
            raise BudgetExhausted(reason)
        try:
            return self._ctx.run(task, key=key, policy=policy)
        except BudgetReached as exc:
            # The run-wide cap (an engine hook) ends the strategy the same way as its own budget.
            self.stop_reason = exc.message
            raise BudgetExhausted(exc.message) from None

    def _seen(self, result) -> None:
        if self.budget is not None:
            self.budget.charge(result)
        branch = ((result or {}).get("artifact") or {}).get("branch_final")
        if branch and branch not in self.branches:
            self.branches.append(branch)

    async def wait(self, handle):
        result = await self._ctx.wait(handle)
        self._seen(result)
        return result

    async def wait_all(self, handles, tolerate_failures: bool = False):
        out = await self._ctx.wait_all(handles, tolerate_failures=tolerate_failures)
        for result in out[0] if tolerate_failures else out:
            self._seen(result)
        return out

    async def parallel(self, tasks, tolerate_failures: bool = False):
        handles = [self.run(task, key=key) for task, key in parallel_items(tasks)]
        return await self.wait_all(handles, tolerate_failures=tolerate_failures)

    async def delete_branches(self, names: list[str], key: str) -> dict[str, Any]:
        """Delete these branches of this run from the user's repository, as one durable housekeeping task.

        The git layer deletes only branches whose tip this run created and that
        nobody has checked out; the rest are reported as kept, with the reason.
        Runs even when the budget is spent: it costs nothing and starts no agent.
        """
        if not names:
            return {"deleted": [], "kept": {}}
        try:
            result = await self._ctx.wait(
                self._ctx.run(
                    {"prompt": f"delete {len(names)} working branch(es)", "delete_branches": list(names)}, key=key
                )
            )
        except self._ctx.errors.TaskFailed as exc:
            return {"deleted": [], "kept": {n: f"cleanup failed: {exc.message}" for n in names}}
        deleted, kept = [], {}
        for line in (result.get("final_message") or "").splitlines():
            state, sep, name = line.removeprefix("@@branch ").partition(": ")
            if not sep or not line.startswith("@@branch "):
                continue
            if state == "deleted":
                deleted.append(name)
            else:
                kept[name] = state
        return {"deleted": deleted, "kept": kept}

    def summary(self) -> dict[str, Any] | None:
        return None if self.budget is None else self.budget.summary(self._ctx.now())
