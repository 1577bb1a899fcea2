"""Replaying a recorded strategy execution from its event log alone, for reports (docs/strategies.md,
"Replaying a recorded run for a report"): no Docker, git or network, and nothing written to the run.
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel
import msgspec

from ..errors import BudgetExhausted, BudgetReached
from ..jsonlog import ComponentLog
from ..log.eventlog import LogReader
from ..log.events import Progress
from ..log.state import COMPLETED, FAILED, RunState, replay
from .context import Context, ContextCore, Handle
from .engine import StrategyFn, error_line, result_at
from .task_types import RetryPolicy, RetryPolicyDict

Ended = Literal["returned", "failed", "log_ended", "error"]


class ReplayOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How one strategy execution's replay ended (docs/strategies.md, "Replaying a recorded run for a report")."""

    strategy_execution_id: str
    ended: Ended
    result: Any = None
    error: str | None = None
    progress: tuple[Progress, ...] = ()  # every record it published, in order


class _EndOfLog(BaseException):
    """The run recorded no further clock reading: the replay stops here.

    A BaseException, so a strategy's own ``except Exception`` cannot mistake it for a failure.
    """


class ReplayContext(ContextCore):
    """A read-only ``ctx`` answering from a recorded run."""

    def __init__(self, state: RunState, events_path: Path, sid: str, out_dir: Path, base_branch: str) -> None:
        super().__init__(
            state.run_id, strategy_execution_id=sid, strategy_index=int(sid[1:]) if sid[1:].isdigit() else 1
        )
        self.base_branch = base_branch
        self.published: list[Progress] = []
        self._state, self._events, self._out = state, events_path, out_dir
        self._seq = 0
        self.answers = 0  # answers given so far: unchanged across a settle means the replay is stuck

    # -- tasks
    def _schedule(
        self, key: str, task: Mapping[str, Any], policy: RetryPolicy | RetryPolicyDict | None, refuse: str | None
    ) -> Handle[Any]:
        self.answers += 1
        handle: Handle[Any] = Handle(key=key)
        rec = self._state.tasks.get(key)
        if rec is not None and rec.state == COMPLETED and rec.result_offset is not None:
            with open(self._events, "rb") as log:
                handle._resolve(result_at(log, rec.result_offset))
            return handle
        if rec is not None and rec.state == FAILED:
            handle._fail(rec.error_type or "unknown", rec.message or "")
            return handle
        if refuse is not None:  # the strategy's own budget refused it, as it did in the run
            raise BudgetExhausted(refuse)
        if self._state.strategies[self.strategy_execution_id].status == "budget_reached":
            # The run's spending cap refused this task (it stopped the execution with every task
            # it had started finished): the replay takes the path the run took.
            if rec is None:
                raise BudgetReached(key, "the run's spending cap was reached")
            handle._fail("budget_reached", "the run's spending cap was reached")
        return handle  # never recorded: waiting on it stops the replay

    async def _arrive(self, handles: Sequence[Handle[Any]]) -> None:
        await anyio.lowlevel.checkpoint()
        self.answers += 1
        if not all(h.done for h in handles):
            await anyio.sleep_forever()  # never recorded: the replay stops here

    # -- recorded nondeterminism
    def _checkpoint(self, kind: str, produce: Callable[[], Any]) -> Any:
        recorded = self._state.strategies[self.strategy_execution_id].checkpoints
        if self._seq >= len(recorded):
            raise _EndOfLog()
        value = recorded[self._seq][1]
        self._seq += 1
        self.answers += 1
        return value

    async def sleep(self, seconds: float) -> None:
        self._checkpoint("sleep", float)  # the recorded deadline: a replay never waits for it
        await anyio.lowlevel.checkpoint()

    # -- facts and outputs
    def supports_output_schema(self, plugin: str | None = None) -> bool:
        """As recorded: a replay looks tasks up by key, so this only has to match what the run asked."""
        return any("output_schema" in (t.input or {}) for t in self._state.tasks.values())

    def output_dir(self) -> Path:
        self._out.mkdir(parents=True, exist_ok=True)
        return self._out

    def _publish(self, record: Progress) -> None:
        if not self.published or self.published[-1] != record:
            self.published.append(record)


if TYPE_CHECKING:

    def _replay_ctx_is_a_context(ctx: ReplayContext) -> Context:
        return ctx  # mypy checks here that the replay's ctx offers all of Context


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


async def _replay_one(
    fn: StrategyFn, state: RunState, events_path: Path, sid: str, out_dir: Path, prompt: str, base_branch: str
) -> tuple[ReplayContext, Ended, Any, BaseException | None]:
    ctx = ReplayContext(state, events_path, sid, out_dir, base_branch)
    params = dict(state.strategies[sid].params)
    box: dict[str, Any] = {}

    async with anyio.create_task_group() as tg:

        async def drive() -> None:
            try:
                box["result"] = await fn(prompt, base_branch, ctx, **params)
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException as exc:  # classified below, never lost
                box["exc"] = exc
            tg.cancel_scope.cancel()

        tg.start_soon(drive)
        # "Every task is blocked" is a heuristic: a task group whose last child just finished looks
        # blocked until the loop runs the completion callback. So let pending callbacks run and ask
        # again, until the replay makes no progress in between.
        while True:
            await anyio.wait_all_tasks_blocked()
            seen = ctx.answers
            for _ in range(5):
                await anyio.lowlevel.checkpoint()
            await anyio.wait_all_tasks_blocked()
            if ctx.answers == seen:
                break
        tg.cancel_scope.cancel()
    if "result" in box:
        return ctx, "returned", box["result"], None
    exc = box.get("exc")
    if exc is None:
        return ctx, "log_ended", None, None
    unexpected = [leaf for leaf in _leaves(exc) if not isinstance(leaf, _EndOfLog)]
    if not unexpected:
        return ctx, "log_ended", None, None
    recorded = state.strategies[sid]
    if recorded.status in ("failed", "budget_reached") and recorded.error in (
        error_line(exc),
        *map(error_line, unexpected),
    ):
        return ctx, "failed", None, None
    return ctx, "error", None, exc


def _run_id_of(events_path: Path) -> str:
    for _, ev in LogReader(events_path).events():
        return ev.run_id
    return ""


def _first_base_branch(state: RunState, sid: str) -> str:
    for task in state.tasks.values():  # scheduling order
        if task.strategy_execution_id == sid and task.input.get("base_branch"):
            return str(task.input["base_branch"])
    return "main"


def replay_strategy(
    events_path: str | Path,
    strategy_fn: StrategyFn,
    *,
    output_dir: str | Path | None = None,
    executions: Iterable[str] | None = None,
    prompt: str = "",
    base_branch: str | None = None,
    log: ComponentLog | None = None,
    select: Callable[[RunState, str], bool] | None = None,
) -> list[ReplayOutcome]:
    """Replay ``strategy_fn`` over each recorded execution of ``events_path``; one outcome each, by id.

    ``executions`` names the executions (default: every one recorded); ``select(state, sid)`` may
    narrow them by what the run recorded. The strategy gets its recorded ``-S`` parameters, the
    given ``prompt`` (agents' prompts are looked up by key, so it only matters to the strategy's
    own outputs), ``base_branch`` (default: the base of the execution's first task), and
    ``output_dir`` as ``ctx.output_dir()`` (default: a temporary directory, removed afterwards).
    Safe to call from synchronous code and from inside a running event loop.
    """
    events_path = Path(events_path)
    run_id = _run_id_of(events_path)
    state = replay(events_path, run_id=run_id)
    wanted = sorted(state.strategies) if executions is None else [s for s in executions if s in state.strategies]
    if select is not None:
        wanted = [s for s in wanted if select(state, s)]
    outcomes: list[ReplayOutcome] = []
    with tempfile.TemporaryDirectory(prefix="strategy-replay-") as tmp:
        out = Path(output_dir) if output_dir is not None else Path(tmp)
        for sid in wanted:
            base = base_branch or _first_base_branch(state, sid)
            # A loop of its own in a thread of its own: callable from sync code and from inside a
            # running loop (the CLI), and "every task is blocked" then only sees the replay's tasks.
            with ThreadPoolExecutor(max_workers=1) as pool:
                ctx, ended, result, exc = pool.submit(
                    anyio.run, _replay_one, strategy_fn, state, events_path, sid, out, prompt, base
                ).result()
            error = None
            if exc is not None:
                # the leaves say what went wrong; a task group's wrapper only says that something did
                error = "; ".join(error_line(leaf) for leaf in _leaves(exc) if not isinstance(leaf, _EndOfLog))
                path = events_path.parent / "orchestration.jsonl"
                with nullcontext(log) if log else closing(ComponentLog(path, "orchestration", run_id)) as olog:
                    olog.error(
                        f"replay of strategy execution {sid} raised {error}",
                        strategy_execution_id=sid,
                        traceback="".join(traceback.format_exception(exc)),
                    )
            outcomes.append(
                ReplayOutcome(
                    strategy_execution_id=sid, ended=ended, result=result, error=error, progress=tuple(ctx.published)
                )
            )
    return outcomes
