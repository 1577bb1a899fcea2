"""``ctx``: the whole surface a strategy sees.

Strategies are deterministic ``async def`` functions. Everything that could
differ between the first run and a replay (task results, time, randomness,
sleeping) comes from ``ctx`` and is recorded in the event log, so re-running
the function from the top after a crash takes exactly the same path.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, cast, overload

import anyio

from ..errors import AggregateTaskFailed, BudgetReached, StrategyErrors, TaskFailed
from ..log.events import progress_record
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
    scheduled_at: float
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
        result: R_co = self._result
        return result


def parallel_items(tasks: Iterable[Any]) -> list[tuple[Any, str]]:
    """``ctx.parallel``'s items as ``(task, key)``: ``(task, key)`` pairs, or task dicts with a ``key`` entry.

    Every context (the engine's, a replay's, a strategy's wrapper) reads them the same way through this.
    """
    out = []
    for item in tasks:
        if isinstance(item, tuple):
            task, key = item
        else:
            key = item["key"]
            task = {k: v for k, v in item.items() if k != "key"}
        out.append((task, key))
    return out


@overload
def collect_outcomes(outcomes: Iterable[Callable[[], R]], tolerate_failures: Literal[False]) -> list[R]: ...
@overload
def collect_outcomes(
    outcomes: Iterable[Callable[[], R]], tolerate_failures: Literal[True]
) -> tuple[list[R], list[TaskFailed]]: ...
@overload
def collect_outcomes(
    outcomes: Iterable[Callable[[], R]], tolerate_failures: bool
) -> list[R] | tuple[list[R], list[TaskFailed]]: ...
def collect_outcomes(
    outcomes: Iterable[Callable[[], R]], tolerate_failures: bool
) -> list[R] | tuple[list[R], list[TaskFailed]]:
    """``wait_all`` semantics over outcome callables (each returns a result or raises TaskFailed)."""
    successes: list[R] = []
    failures: list[TaskFailed] = []
    for outcome in outcomes:
        try:
            successes.append(outcome())
        except TaskFailed as exc:
            failures.append(exc)
    if tolerate_failures:
        return successes, failures
    if failures:
        raise AggregateTaskFailed([f.key for f in failures], failures)
    return successes


ParallelItems = Sequence[tuple[TaskInput, str] | KeyedTaskInput]


class Context(Protocol):
    """What a strategy's ``ctx`` offers: annotate ``ctx: Context`` (from :mod:`orchestrator.strategy`).

    The engine hands strategies a :class:`StrategyContext`; a wrapper that adds
    behaviour around ``ctx`` (a budget, a replay for reporting) offers the same.
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
    ) -> None: ...


class StrategyContext:
    """The ``ctx`` object handed to one strategy execution."""

    errors = StrategyErrors

    def __init__(self, engine: Engine, *, strategy_execution_id: str, strategy_index: int) -> None:
        self._engine = engine
        self.run_id = engine.config.run_id
        self.strategy_execution_id = strategy_execution_id
        self.strategy_index = strategy_index
        self._prefix = f"{self.run_id}/{strategy_execution_id}/"
        self._checkpoint_seq = 0
        self.requested_keys: set[str] = set()

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

    # -- tasks
    @overload
    def run(
        self, task: BranchCleanupTask, *, key: str, policy: RetryPolicy | RetryPolicyDict | None = None
    ) -> Handle[BranchCleanupResult]: ...
    @overload
    def run(
        self, task: TaskInput, *, key: str, policy: RetryPolicy | RetryPolicyDict | None = None
    ) -> Handle[TaskResult]: ...
    def run(
        self, task: TaskInput | BranchCleanupTask, *, key: str, policy: RetryPolicy | RetryPolicyDict | None = None
    ) -> Handle[Any]:
        """Schedule a durable task and return its handle at once.

        Completed keys return their recorded result without running again; the
        same key with a different input raises ``KeyConflictDifferentFingerprint``.
        """
        fq = self._qualify(key)
        self.requested_keys.add(fq)
        return self._engine.schedule(self, fq, task, policy)

    async def wait(self, handle: Handle[R]) -> R:
        """The task's result, or ``TaskFailed(key, error_type, message)``."""
        await handle._done.wait()
        return handle._outcome()

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
    async def wait_all(
        self, handles: Sequence[Handle[R]], tolerate_failures: bool = False
    ) -> list[R] | tuple[list[R], list[TaskFailed]]:
        """Results in handle order, whatever order the tasks finished in.

        With ``tolerate_failures=True`` returns ``(successes, failures)`` where
        failures are ``TaskFailed`` errors; otherwise any failure raises
        ``AggregateTaskFailed`` once every task has finished.
        """
        for h in handles:
            await h._done.wait()
        return collect_outcomes([h._outcome for h in handles], tolerate_failures)

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
    async def parallel(
        self, tasks: ParallelItems, tolerate_failures: bool = False
    ) -> list[TaskResult] | tuple[list[TaskResult], list[TaskFailed]]:
        """Schedule many and wait for all: items are ``(task, key)`` pairs or dicts with a ``key`` entry."""
        handles: list[Handle[TaskResult]] = [
            self.run(cast(TaskInput, task), key=key) for task, key in parallel_items(tasks)
        ]
        return await self.wait_all(handles, tolerate_failures=tolerate_failures)

    # -- recorded nondeterminism
    def _checkpoint(self, kind: str, produce: Callable[[], Any]) -> Any:
        seq = self._checkpoint_seq
        self._checkpoint_seq += 1
        return self._engine.checkpoint(self, seq, kind, produce)

    def now(self) -> float:
        """Wall-clock seconds since the epoch, recorded on first run and replayed after."""
        return self._checkpoint("now", time.time)

    def rand(self) -> float:
        """A float in [0, 1), recorded on first run and replayed after."""
        return self._checkpoint("rand", random.random)

    async def sleep(self, seconds: float) -> None:
        """Sleep until a recorded deadline: a resumed run sleeps only for what is left."""
        deadline = self._checkpoint("sleep", lambda: time.time() + float(seconds))
        remaining = deadline - time.time()
        if remaining > 0:
            await anyio.sleep(remaining)

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
        return self._engine.strategy_output_dir()

    # -- output for people watching
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
        self._engine.publish_progress(
            self.strategy_execution_id,
            progress_record(
                {
                    "phase": phase,
                    "step": step,
                    "of_total": of_total,
                    "best": best,
                    "frontier": frontier,
                    "done": done,
                    "total": total,
                    "text": text,
                }
            ),
        )


if TYPE_CHECKING:

    def _engine_ctx_is_a_context(ctx: StrategyContext) -> Context:
        return ctx  # mypy checks here that StrategyContext offers all of Context
