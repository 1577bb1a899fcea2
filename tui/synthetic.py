"""Synthetic runs: realistic ``events.jsonl`` + ``state.json`` without Docker or agents.

Used by the TUI tests and ``bench/bench_tui.py``, and handy for trying layouts
without running any instance::

    python -m tui.synthetic --run-id demo --tasks 60 --duration 30 &
    python -m tui --run-id demo

The schedule is simulated on a virtual clock (a pool of ``max_parallel``
workers, random durations from a seeded RNG) and replayed in real time,
compressed into ``duration`` seconds (0 = as fast as possible).
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import anyio

from orchestrator.log import events as E
from orchestrator.log.eventlog import EventLog
from orchestrator.log.events import (
    STRATEGY_COMPLETED,
    STRATEGY_STARTED,
    TASK_COMPLETED,
    TASK_FAILED,
    TASK_SCHEDULED,
    TASK_STARTED,
    EventPayload,
    payload_dict,
)
from orchestrator.log.state import RunState, apply, encode_snapshot, write_snapshot_bytes
from orchestrator.naming import branch_name, container_name, instance_id


class SynthEvent(NamedTuple):
    vt: float  # virtual seconds since the run started
    type: str
    sid: str
    key: str | None
    record: EventPayload | Mapping[str, Any]  # (a test may hand a JSON object, decoded where it is folded)

    @property
    def payload(self) -> dict[str, Any]:
        return payload_dict(self.record)


def synthetic_run(
    run_id: str,
    n_tasks: int,
    *,
    executions: int = 1,
    max_parallel: int = 8,
    strategy: str = "best-of-n",
    model: str = "sonnet",
    seed: int = 0,
    fail_every: int = 17,
    finish: bool = True,
) -> list[SynthEvent]:
    """Events of a run with ``n_tasks`` tasks split over ``executions`` strategy executions.

    Every ``fail_every``-th task fails (0: none); every 20th reports cost N/A.
    With ``finish=False`` the run stops half way with tasks still running.
    """
    rng = random.Random(seed)
    events: list[SynthEvent] = []
    sids = [f"s{i + 1}" for i in range(executions)]
    for index, sid in enumerate(sids):
        events.append(
            SynthEvent(
                0.0,
                STRATEGY_STARTED,
                sid,
                None,
                E.StrategyStarted(name=strategy, params={"n": n_tasks // executions or 1}, index=index),
            )
        )
    tasks = [(sids[i % executions], f"{run_id}/{sids[i % executions]}/task/{i}") for i in range(n_tasks)]
    for i, (sid, key) in enumerate(tasks):
        events.append(SynthEvent(0.01 * i, TASK_SCHEDULED, sid, key, _scheduled(run_id, sid, key, i, strategy, model)))
    free = [0.01 * n_tasks] * max_parallel  # when each worker slot is next free
    heapq.heapify(free)
    ends = []
    for i, (sid, key) in enumerate(tasks):
        start = heapq.heappop(free)
        duration = rng.uniform(20, 300)
        end = start + duration
        heapq.heappush(free, end)
        container = container_name(run_id, int(sid[1:]) - 1, key)
        inst = instance_id(run_id, sid, key)
        started = E.TaskStarted(key=key, instance_id=inst, container_name=container, model=model)
        events.append(SynthEvent(start, TASK_STARTED, sid, key, started))
        cost = None if i % 20 == 19 else round(rng.uniform(0.02, 0.6), 4)
        tokens_in, tokens_out = rng.randint(2000, 40000), rng.randint(200, 6000)
        metrics = E.Metrics(tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost, duration_s=duration)
        failed = bool(fail_every) and i % fail_every == fail_every - 1
        ended = (
            _failed(key, inst, i, metrics, duration)
            if failed
            else _completed(run_id, key, inst, i, metrics, strategy, rng)
        )
        events.append(SynthEvent(end, TASK_FAILED if failed else TASK_COMPLETED, sid, key, ended))
        ends.append(end)
    last = max(ends, default=0.0)
    if finish:
        for sid in sids:
            events.append(
                SynthEvent(
                    last + 0.5, STRATEGY_COMPLETED, sid, None, E.StrategyCompleted(status="success", result=None)
                )
            )
    events.sort(key=lambda e: e.vt)  # stable: same-time events keep their causal order
    if not finish:
        events = [e for e in events if e.vt <= last / 2]
    return events


def _scheduled(run_id: str, sid: str, key: str, i: int, strategy: str, model: str) -> E.TaskScheduled:
    return E.TaskScheduled(
        key=key,
        instance_id=instance_id(run_id, sid, key),
        container_name=container_name(run_id, int(sid[1:]) - 1, key),
        model=model,
        task_fingerprint_hash=f"{i:064x}",
        branch_name=branch_name(strategy, run_id, key),
        plugin="claude-code",
        input={"prompt": f"Implement variant {i} of the feature", "model": model},
    )


def _failed(key: str, inst: str, i: int, metrics: E.Metrics, duration: float) -> E.TaskFailed:
    return E.TaskFailed(
        key=key,
        instance_id=inst,
        error_type="timeout",
        message=f"Timeout after {int(duration)}s waiting for the agent",
        metrics=metrics,
        session_id=f"sess-{i}",
        status="timeout",
        retry_attempts=2,
    )


def _completed(
    run_id: str, key: str, inst: str, i: int, metrics: E.Metrics, strategy: str, rng: random.Random
) -> E.TaskCompleted:
    added = rng.randint(1, 200)
    branch = branch_name(strategy, run_id, key)
    artifact = E.Artifact(
        branch_planned=branch,
        branch_final=branch,
        base="main",
        commit=f"{i:040x}",
        has_changes=True,
        commit_count=1,
        lines_added=added,
        lines_deleted=added // 3,
    )
    return E.TaskCompleted(
        key=key,
        instance_id=inst,
        artifact=artifact,
        metrics=metrics,
        final_message=f"Implemented variant {i}: added {added} lines and tests.",
        session_id=f"sess-{i}",
        exit_code=0,
    )


async def write_run(
    events: list[SynthEvent],
    *,
    run_id: str,
    logs_dir: Path,
    state_dir: Path,
    duration: float = 0.0,
    snapshot_every_s: float = 1.0,
) -> None:
    """Append ``events`` with the real event-log writer, paced over ``duration`` seconds,
    writing ``state.json`` (primary + duplicate) like the engine does."""
    path = Path(logs_dir) / run_id / "events.jsonl"
    snapshots = [Path(state_dir) / run_id / "state.json", Path(logs_dir) / run_id / "state.json"]
    state = RunState(run_id=run_id)
    span = max((e.vt for e in events), default=0.0) or 1.0
    async with EventLog(path, run_id=run_id) as log:
        t0 = last_snapshot = time.monotonic()
        for ev in events:
            if duration:
                delay = t0 + ev.vt / span * duration - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
            if isinstance(ev.record, EventPayload):
                offset, ts, written = log.write(ev.record, strategy_execution_id=ev.sid, key=ev.key)
                apply(state, ev.type, ev.sid, ev.key, written, offset, ts)
            else:  # a test's JSON object
                offset, ts, fields = log.append(ev.type, strategy_execution_id=ev.sid, payload=ev.record, key=ev.key)
                apply(state, ev.type, ev.sid, ev.key, fields, offset, ts)
            if time.monotonic() - last_snapshot >= snapshot_every_s:
                await log.flush()
                await anyio.to_thread.run_sync(write_snapshot_bytes, encode_snapshot(state), snapshots)
                last_snapshot = time.monotonic()
        await log.flush()
        write_snapshot_bytes(encode_snapshot(state), snapshots)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tui.synthetic", description="Write a synthetic run for the TUI.")
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--executions", type=int, default=1)
    ap.add_argument("--max-parallel", type=int, default=8)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of real time the run takes")
    ap.add_argument("--logs-dir", type=Path, default=Path("logs"))
    ap.add_argument("--state-dir", type=Path, default=Path("orchestrator_state"))
    ap.add_argument("--unfinished", action="store_true", help="stop half way, leaving tasks running")
    args = ap.parse_args(argv)
    events = synthetic_run(
        args.run_id, args.tasks, executions=args.executions, max_parallel=args.max_parallel, finish=not args.unfinished
    )
    anyio.run(
        lambda: write_run(
            events, run_id=args.run_id, logs_dir=args.logs_dir, state_dir=args.state_dir, duration=args.duration
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
