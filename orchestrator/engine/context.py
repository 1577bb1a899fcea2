"""``ctx``: the whole surface a strategy sees.

Strategies are deterministic ``async def`` functions. Everything that could
differ between the first run and a replay (task results, time, randomness,
sleeping) comes from ``ctx`` and is recorded in the event log, so re-running
the function from the top after a crash takes exactly the same path.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, cast, overload

import anyio

from ..errors import AggregateTaskFailed, BudgetExhausted, BudgetReached, StrategyErrors, TaskFailed
from ..log.events import Progress, progress_record
from .task_types import (
    BranchCleanupResult,
    BranchCleanupTask,
    KeyedTaskInput,
    RetryPolicy,
    RetryPolicyDict,
    TaskInput,
    TaskResult,
)

if TYPE_CHECKING:
    from .engine import Engine

R = TypeVar("R")
# covariant: a Handle[TaskResult] is usable where any Handle is expected
R_co = TypeVar("R_co", covariant=True)


@dataclass(eq=False)
class Handle(Generic[R_co]):
    """A scheduled task. Opaque: pass it to ``ctx.wait``/``ctx.wait_all``.

    ``R_co`` is what waiting on it returns: :class:`TaskResult`, or
    :class:`BranchCleanupResult` for a ``delete_branches`` task.
    """

    key: str
    _done: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _result: Any = field(default=None, repr=False)
    _failure: tuple[str, str] | None = field(default=None, repr=False)

    def _resolve(self, result: Any) -> None:
        self._result = result
        self._done.set()

    def _fail(self, error_type: str, message: str) -> None:
        self._failure = (error_type, message)
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _outcome(self) -> R_co:
        if self._failure is not None:
            if self._failure[0] == "budget_reached":
                raise BudgetReached(self.key, self._failure[1])
            raise TaskFailed(self.key, *self._failure)
        assert self._result is not None
        return cast(R_co, self._result)


def parallel_items(tasks: Iterable[Any]) -> list[tuple[Any, str]]:
    """``ctx.parallel``'s items as ``(task, key)``: ``(task, key)`` pairs, or task dicts with a ``key`` entry."""
    out = []
    for item in tasks:
        if isinstance(item, tuple):
            task, key = item
        else:
            key = item["key"]
            task = {k: v for k, v in item.items() if k != "key"}
        out.append((task, key))
    return out


ParallelItems = Sequence[tuple[TaskInput, str] | KeyedTaskInput]


class Context(Protocol):
    """What a strategy's ``ctx`` offers: annotate ``ctx: Context`` (from :mod:`orchestrator.strategy`).

    The engine hands strategies a :class:`StrategyContext`; a replay for reporting
    hands them its own subclass of the same :class:`ContextCore`. A strategy's
    budget is not a wrapper around ``ctx`` but a scope it opens with ``ctx.open_budget``.
    """

    @property
    def errors(self) -> type[StrategyErrors]:
        """``ctx.errors.TaskFailed``, ``.AggregateTaskFailed``, ``.NoViableCandidates``, ..."""
        ...

    @property
    def run_id(self) -> str: ...

    @property
    def strategy_execution_id(self) -> str:
        """``s1`` … ``sN`` for the executions of ``--runs N``."""
        ...

    @property
    def base_branch(self) -> str: ...

    def key(self, *parts: object) -> str: ...

    @overload
    def run(
        self, task: BranchCleanupTask, *, key: str, policy: RetryPolicy | RetryPolicyDict | None = None
    ) -> Handle[BranchCleanupResult]: ...
    @overload
    def run(
        self, task: TaskInput, *, key: str, policy: RetryPolicy | RetryPolicyDict | None = None
    ) -> Handle[TaskResult]: ...

    async def wait(self, handle: Handle[R]) -> R: ...

    @overload
    async def wait_all(self, handles: Sequence[Handle[R]], tolerate_failures: Literal[False] = False) -> list[R]: ...
    @overload
    async def wait_all(
        self, handles: Sequence[Handle[R]], tolerate_failures: Literal[True]
    ) -> tuple[list[R], list[TaskFailed]]: ...
    @overload
    async def wait_all(
        self, handles: Sequence[Handle[R]], tolerate_failures: bool
    ) -> list[R] | tuple[list[R], list[TaskFailed]]: ...

    @overload
    async def parallel(self, tasks: ParallelItems, tolerate_failures: Literal[False] = False) -> list[TaskResult]: ...
    @overload
    async def parallel(
        self, tasks: ParallelItems, tolerate_failures: Literal[True]
    ) -> tuple[list[TaskResult], list[TaskFailed]]: ...
    @overload
    async def parallel(
        self, tasks: ParallelItems, tolerate_failures: bool
    ) -> list[TaskResult] | tuple[list[TaskResult], list[TaskFailed]]: ...

    def open_budget(self, *, max_cost_usd: float | None = None, max_wall_s: float | None = None) -> BudgetScope:
        """A budget of the strategy's own: from now on no new task starts once it is spent (``BudgetExhausted``)."""
        ...

    def now(self) -> float: ...

    def rand(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    def supports_output_schema(self, plugin: str | None = None) -> bool: ...

    def output_dir(self) -> Path: ...

    def progress(
        self,
        *,
        phase: str = "",
        step: int | None = None,
        of_total: int | None = None,
        best: float | None = None,
        frontier: int | None = None,
        done: int | None = None,
        total: int | None = None,
        text: str = "",
    ) -> None:
        """Publish where this execution has got to: a ``strategy.progress`` event the TUI shows.

        The fields are those of :class:`orchestrator.log.events.Progress`. It is an
        output, not a recorded input: it changes no key or fingerprint, and a resumed
        run may publish it again.
        """
        ...


class BudgetScope:
    """A strategy's own budget, opened with ``ctx.open_budget`` (docs/strategies.md, "A budget of the strategy's own").

    It reads time only through ``ctx.now()`` (recorded) and cost only from
    recorded results, so a resumed run or a replay reaches the same decisions.
    Without a limit it reads no time at all: a run without a budget records no
    extra checkpoints.
    """

    def __init__(self, now: Callable[[], float], *, max_cost_usd: float | None, max_wall_s: float | None) -> None:
        for name, value in (("max_cost_usd", max_cost_usd), ("max_wall_s", max_wall_s)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        self.max_cost_usd = max_cost_usd
        self.max_wall_s = max_wall_s
        self._now = now
        self.started_at = now() if self.active else 0.0
        self.cost_usd = 0.0
        # Why no new task may start (remembered once true), or None.
        self.stop_reason: str | None = None
        # Every branch a finished task left in the user's repository, in the order seen.
        self.branches: list[str] = []
        self._charged: set[str] = set()

    @property
    def active(self) -> bool:
        return self.max_cost_usd is not None or self.max_wall_s is not None

    def exhausted(self) -> str | None:
        """Why no new task may start, or None; reads ``ctx.now()`` while it has a limit and is not yet spent."""
        if self.stop_reason is None and self.active:
            now = self._now()
            if self.max_cost_usd is not None and self.cost_usd >= self.max_cost_usd:
                self.stop_reason = f"max_cost_usd reached: spent ${self.cost_usd:.4f} of ${self.max_cost_usd:.4f}"
            elif self.max_wall_s is not None and now - self.started_at >= self.max_wall_s:
                self.stop_reason = f"max_wall_s reached: {now - self.started_at:.0f}s of {self.max_wall_s:.0f}s"
        return self.stop_reason

    def charge(self, result: Mapping[str, Any] | None) -> None:
        """One result the strategy got: its cost (each key once) and the branch it left."""
        if not result:
            return
        key = result.get("key")
        if key is not None:
            if key in self._charged:
                return
            self._charged.add(key)
        cost = (result.get("metrics") or {}).get("cost_usd")
        if isinstance(cost, (int, float)) and cost > 0:
            self.cost_usd += float(cost)
        branch = (result.get("artifact") or {}).get("branch_final")
        if branch and branch not in self.branches:
            self.branches.append(branch)

    def summary(self) -> dict[str, Any] | None:
        """What it spent against its limits (reads ``ctx.now()``); None without a limit."""
        if not self.active:
            return None
        return {
            "cost_usd": round(self.cost_usd, 6),
            "wall_s": round(self._now() - self.started_at, 3),
            "max_cost_usd": self.max_cost_usd,
            "max_wall_s": self.max_wall_s,
        }


class ContextCore:
    """What every ``ctx`` shares: keys, ``run``/``wait``/``wait_all``/``parallel``, recorded time, budgets, progress.

    The engine's :class:`StrategyContext` and the replay's context are subclasses
    that say how a task is scheduled (``_schedule``), how a handle is awaited
    (``_arrive``), where a recorded value comes from (``_checkpoint``) and where a
    progress record goes (``_publish``).
    """

    errors = StrategyErrors

    def __init__(self, run_id: str, *, strategy_execution_id: str, strategy_index: int) -> None:
        self.run_id = run_id
        self.strategy_execution_id = strategy_execution_id
        self.strategy_index = strategy_index
        self._prefix = f"{run_id}/{strategy_execution_id}/"
        self.requested_keys: set[str] = set()
        self._budgets: list[BudgetScope] = []

    # -- what a subclass provides
    def _schedule(
        self, key: str, task: Mapping[str, Any], policy: RetryPolicy | RetryPolicyDict | None, refuse: str | None
    ) -> Handle[Any]:
        """The handle of ``key``; a task not yet recorded raises ``BudgetExhausted(refuse)`` when refuse is set."""
        raise NotImplementedError

    async def _arrive(self, handles: Sequence[Handle[Any]]) -> None:
        raise NotImplementedError

    def _checkpoint(self, kind: str, produce: Callable[[], Any]) -> Any:
        raise NotImplementedError

    def _publish(self, record: Progress) -> None:
        raise NotImplementedError

    # -- keys
    def key(self, *parts: object) -> str:
        """A durable key namespaced by run and strategy execution: ``run/sid/<parts joined by />``."""
        if not parts:
            raise ValueError("ctx.key() needs at least one part")
        return self._prefix + "/".join(str(p) for p in parts)

    def _qualify(self, key: str) -> str:
        if not isinstance(key, str) or not key:
            raise ValueError("ctx.run() needs a non-empty key; build it with ctx.key(...)")
        return key if key.startswith(self._prefix) else self._prefix + key

    # -- tasks (typed for strategies by the overloads of Context)
    def run(
        self, task: TaskInput | BranchCleanupTask, *, key: str, policy: RetryPolicy | RetryPolicyDict | None = None
    ) -> Handle[Any]:
        """Schedule a durable task and return its handle at once (a recorded key is answered from the log)."""
        fq = self._qualify(key)
        self.requested_keys.add(fq)
        refuse = None
        if not task.get("delete_branches"):  # a branch cleanup costs nothing: no budget holds it back
            for budget in self._budgets:
                refuse = refuse or budget.exhausted()
        try:
            return self._schedule(fq, task, policy, refuse)
        except BudgetReached as exc:
            if not self._budgets:
                raise
            # Under a budget of its own the strategy ends at the run's cap the same way as at its budget.
            for budget in self._budgets:
                budget.stop_reason = budget.stop_reason or exc.message
            raise BudgetExhausted(exc.message) from None

    def _seen(self, results: Iterable[Any]) -> None:
        for result in results:
            for budget in self._budgets:
                budget.charge(result)

    async def wait(self, handle: Handle[R]) -> R:
        """The task's result, or ``TaskFailed(key, error_type, message)``."""
        await self._arrive([handle])
        result = handle._outcome()
        self._seen([result])
        return result

    async def wait_all(self, handles: Sequence[Handle[Any]], tolerate_failures: bool = False) -> Any:
        """Results in handle order; ``(successes, failures)`` with ``tolerate_failures``, else ``AggregateTaskFailed``."""
        await self._arrive(handles)
        successes: list[Any] = []
        failures: list[TaskFailed] = []
        for handle in handles:
            try:
                successes.append(handle._outcome())
            except TaskFailed as exc:
                failures.append(exc)
        if failures and not tolerate_failures:
            raise AggregateTaskFailed([f.key for f in failures], failures)
        self._seen(successes)
        return (successes, failures) if tolerate_failures else successes

    async def parallel(self, tasks: ParallelItems, tolerate_failures: bool = False) -> Any:
        """Schedule many and wait for all: items are ``(task, key)`` pairs or dicts with a ``key`` entry."""
        handles = [self.run(task, key=key) for task, key in parallel_items(tasks)]
        return await self.wait_all(handles, tolerate_failures=tolerate_failures)

    # -- a budget of the strategy's own
    def open_budget(self, *, max_cost_usd: float | None = None, max_wall_s: float | None = None) -> BudgetScope:
        """Limit what this execution spends from now on (``None``: no limit on it): see :class:`BudgetScope`."""
        budget = BudgetScope(self.now, max_cost_usd=max_cost_usd, max_wall_s=max_wall_s)
        self._budgets.append(budget)
        return budget

    # -- recorded nondeterminism
    def now(self) -> float:
        """Wall-clock seconds since the epoch, recorded on first run and replayed after."""
        return cast(float, self._checkpoint("now", time.time))

    def rand(self) -> float:
        """A float in [0, 1), recorded on first run and replayed after."""
        return cast(float, self._checkpoint("rand", random.random))

    async def sleep(self, seconds: float) -> None:
        """Sleep until a recorded deadline: a resumed run sleeps only for what is left."""
        deadline = self._checkpoint("sleep", lambda: time.time() + float(seconds))
        remaining = deadline - time.time()
        if remaining > 0:
            await anyio.sleep(remaining)

    # -- output for people watching
    def progress(self, **fields: Any) -> None:
        """Publish where this execution has got to (the fields are :meth:`Context.progress`'s)."""
        self._publish(progress_record(fields))


class StrategyContext(ContextCore):
    """The ``ctx`` object handed to one strategy execution."""

    def __init__(self, engine: Engine, *, strategy_execution_id: str, strategy_index: int) -> None:
        super().__init__(
            engine.config.run_id, strategy_execution_id=strategy_execution_id, strategy_index=strategy_index
        )
        self._engine = engine
        self._checkpoint_seq = 0

    def _schedule(
        self, key: str, task: Mapping[str, Any], policy: RetryPolicy | RetryPolicyDict | None, refuse: str | None
    ) -> Handle[Any]:
        return self._engine.schedule(self, key, task, policy, refuse=refuse)

    async def _arrive(self, handles: Sequence[Handle[Any]]) -> None:
        for h in handles:
            await h._done.wait()

    def _checkpoint(self, kind: str, produce: Callable[[], Any]) -> Any:
        seq = self._checkpoint_seq
        self._checkpoint_seq += 1
        return self._engine.checkpoint(self, seq, kind, produce)

    def _publish(self, record: Progress) -> None:
        self._engine.publish_progress(self.strategy_execution_id, record)

    # -- read-only facts a strategy may use
    @property
    def base_branch(self) -> str:
        return self._engine.config.base_branch

    def supports_output_schema(self, plugin: str | None = None) -> bool:
        """Whether an agent task on ``plugin`` (default: the run's plugin) may carry ``output_schema``.

        Strategies fall back to reading JSON from free text when it cannot (the ``command`` plugin),
        and in a resumed run that started before structured answers existed.
        """
        from ..runner.registry import get_plugin

        if not self._engine.config.structured_outputs:
            return False
        return get_plugin(plugin or self._engine.config.defaults.plugin_name).capabilities.supports_output_schema

    def output_dir(self) -> Path:
        """``results/<run_id>/strategy_output/``: where a strategy writes its own files.

        Writing files is a side effect; write only data derived from task results
        so a replay writes the same bytes.
        """
        path = self._engine.paths.results / "strategy_output"
        path.mkdir(parents=True, exist_ok=True)
        return path


if TYPE_CHECKING:

    def _engine_ctx_is_a_context(ctx: StrategyContext) -> Context:
        return ctx  # mypy checks here that StrategyContext offers all of Context
