"""Rebuild tree-beam trees from an event log alone, without running anything.

The strategy is deterministic in its task results, so feeding it the recorded
results again rebuilds exactly the tree it built. :class:`ReplayContext` is a
read-only ``ctx``: a recorded key returns its recorded result (or failure), an
unrecorded key blocks forever. Once every task of the replay is blocked, the
tree has got as far as the log goes; an interrupted run renders as a partial
tree with no stop reason. Nothing here touches Docker, git or the network.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec

from orchestrator.engine.context import collect_outcomes
from orchestrator.engine.engine import task_result_from_payload
from orchestrator.errors import StrategyErrors, TaskFailed
from orchestrator.eventlog import iter_lines
from orchestrator.events import decode_line
from orchestrator.state import COMPLETED, FAILED, RunState, replay


class _EndOfLog(Exception):
    """The recorded run asked for no more clock readings: it got no further."""


class _Handle:
    def __init__(self, key: str, result: dict[str, Any] | None, failure: tuple[str, str] | None) -> None:
        self.key, self.result, self.failure = key, result, failure

    @property
    def done(self) -> bool:
        return self.result is not None or self.failure is not None

    def outcome(self) -> dict[str, Any]:
        if self.failure is not None:
            raise TaskFailed(self.key, *self.failure)
        assert self.result is not None, "outcome() of a task that has not finished"
        return self.result


class ReplayContext:
    """A ``ctx`` answering from a recorded run (see module docstring)."""

    errors = StrategyErrors

    def __init__(self, state: RunState, events_path: Path, sid: str, out_dir: Path, base_branch: str) -> None:
        self.run_id = state.run_id
        self.strategy_execution_id = sid
        self._state, self._events, self._out = state, events_path, out_dir
        self._prefix = f"{state.run_id}/{sid}/"
        self.base_branch = base_branch
        self.tree = None
        self._seq = 0
        self.progress = 0  # answers given so far: unchanged across a settle means truly stuck

    def observe_tree(self, tree) -> None:
        self.tree = tree

    def now(self) -> float:
        """The recorded clock readings, in order; past the log's end the replay stops here."""
        recorded = self._state.strategies[self.strategy_execution_id].checkpoints
        if self._seq >= len(recorded):
            raise _EndOfLog()
        value = recorded[self._seq][1]
        self._seq += 1
        self.progress += 1
        return value

    def key(self, *parts: Any) -> str:
        return self._prefix + "/".join(str(p) for p in parts)

    def supports_output_schema(self, plugin: str | None = None) -> bool:
        """As recorded: a replay looks tasks up by key, so this only has to match what the run asked."""
        return any("output_schema" in (t.input or {}) for t in self._state.tasks.values())

    def output_dir(self) -> Path:
        self._out.mkdir(parents=True, exist_ok=True)
        return self._out

    def _payload(self, offset: int) -> dict[str, Any]:
        with open(self._events, "rb") as fh:
            fh.seek(offset)
            return decode_line(fh.readline()).payload

    def run(self, task: dict[str, Any], *, key: str, policy: Any = None) -> _Handle:
        self.progress += 1
        fq = key if key.startswith(self._prefix) else self._prefix + key
        rec = self._state.tasks.get(fq)
        if rec is not None and rec.state == COMPLETED and rec.result_offset is not None:
            return _Handle(fq, task_result_from_payload(self._payload(rec.result_offset)), None)
        if rec is not None and rec.state == FAILED:
            return _Handle(fq, None, (rec.error_type or "unknown", rec.message or ""))
        return _Handle(fq, None, None)

    async def wait(self, handle: _Handle) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        self.progress += 1
        if not handle.done:
            await anyio.sleep_forever()  # never recorded: the replay stops here
        return handle.outcome()

    async def wait_all(self, handles: list[_Handle], tolerate_failures: bool = False):
        await anyio.lowlevel.checkpoint()
        if not all(h.done for h in handles):
            await anyio.sleep_forever()  # never recorded: the replay stops here
        return collect_outcomes([h.outcome for h in handles], tolerate_failures)


def tree_executions(state: RunState) -> list[str]:
    """Strategy executions that ran tree-beam (they evaluated a root under ``root/eval``)."""
    return sorted(sid for sid in state.strategies if f"{state.run_id}/{sid}/root/eval" in state.tasks)


async def _replay_one(state: RunState, events_path: Path, sid: str, scratch: Path) -> dict[str, Any] | None:
    from .tree_beam import tree_beam

    root_task = state.tasks[f"{state.run_id}/{sid}/root/eval"]
    base_branch = root_task.input.get("base_branch", "main")
    ctx = ReplayContext(state, events_path, sid, scratch, base_branch)
    params = dict(state.strategies[sid].params)

    async with anyio.create_task_group() as tg:
        async def drive() -> None:
            with contextlib.suppress(Exception):
                await tree_beam("", base_branch, ctx, **params)
            tg.cancel_scope.cancel()

        tg.start_soon(drive)
        # "Every task is blocked" is a heuristic: a task group whose last child just finished looks
        # blocked until the loop runs the completion callback. So let pending callbacks run and ask
        # again, until the replay makes no progress in between.
        while True:
            await anyio.wait_all_tasks_blocked()
            seen = ctx.progress
            for _ in range(5):
                await anyio.lowlevel.checkpoint()
            await anyio.wait_all_tasks_blocked()
            if ctx.progress == seen:
                break
        tg.cancel_scope.cancel()
    return None if ctx.tree is None else ctx.tree.to_json()


def _run_id_of(events_path: Path) -> str:
    for _, line in iter_lines(events_path):
        try:
            return decode_line(line).run_id
        except msgspec.DecodeError:
            continue
    return ""


def replay_trees(events_path: Path, *, only: str | None = None, scratch: Path | None = None) -> dict[str, dict[str, Any]]:
    """``{sid: tree}`` for every tree-beam execution recorded in ``events_path``."""
    import tempfile

    state = replay(Path(events_path), run_id=_run_id_of(Path(events_path)))
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tree-replay-") as tmp:
        for sid in tree_executions(state):
            if only is not None and sid != only:
                continue
            # A loop of its own in a thread of its own: callable from sync code and from inside a
            # running loop (the CLI), and "every task is blocked" then only sees the replay's tasks.
            with ThreadPoolExecutor(max_workers=1) as pool:
                tree = pool.submit(anyio.run, _replay_one, state, Path(events_path), sid,
                                   Path(scratch or tmp)).result()
            if tree is not None:
                out[sid] = tree
    return out
