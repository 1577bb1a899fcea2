"""Recorded histories replay exactly; a strategy that changed is caught (Temporal-style replayer).

``tests/golden/judge.jsonl`` is a real event log recorded from ``golden_strategies.judge``.
Each test starts from a copy of it with the final ``strategy.completed`` line removed, as
if the process died just before finishing, and runs the engine again: a faithful strategy
is satisfied entirely from the log, without a single runner call.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from engine_helpers import make_config  # noqa: E402
from golden_strategies import judge, judge_changed_prompt, judge_fewer_candidates  # noqa: E402

from orchestrator.engine.engine import Engine  # noqa: E402
from orchestrator.log.eventlog import read_events  # noqa: E402


class NoRunner:
    """Any call means the replay was not satisfied from the log."""

    def __init__(self) -> None:
        self.calls = []

    async def run(self, request, *, on_event=None):
        self.calls.append(request.task_key)
        raise AssertionError(f"replay called the runner for {request.task_key}")

    async def aclose(self):
        pass


def recorded_result() -> dict:
    last = json.loads((GOLDEN / "judge.jsonl").read_text().splitlines()[-1])
    assert last["type"] == "strategy.completed"
    return last["payload"]["result"]


def staged(tmp_path: Path) -> Path:
    logs = tmp_path / "logs" / "run_golden"
    logs.mkdir(parents=True)
    lines = (GOLDEN / "judge.jsonl").read_bytes().splitlines(keepends=True)
    (logs / "events.jsonl").write_bytes(b"".join(lines[:-1]))  # drop strategy.completed
    return logs / "events.jsonl"


async def replay_with(tmp_path, fn):
    events = staged(tmp_path)
    runner = NoRunner()
    engine = Engine(make_config(tmp_path, run_id="run_golden"), runner)
    await engine.run(fn, prompt="add a flag", params={})
    return engine, runner, events


async def test_recorded_history_replays_with_no_runner_calls_and_the_same_result(tmp_path):
    engine, runner, events = await replay_with(tmp_path, judge)
    assert runner.calls == []
    strat = engine.state.strategies["s1"]
    assert strat.status == "success" and strat.result == recorded_result()
    # the recorded ctx.rand() value was replayed, not drawn again
    assert strat.result["pick"] == round(strat.checkpoints[0][1], 6)
    appended = [e.type for e in read_events(events)][23:]
    assert appended == ["strategy.completed"]


async def test_changed_task_input_fails_as_nondeterministic(tmp_path):
    engine, runner, _ = await replay_with(tmp_path, judge_changed_prompt)
    strat = engine.state.strategies["s1"]
    assert runner.calls == []
    assert strat.status == "failed" and "KeyConflictDifferentFingerprint" in strat.error
    assert "run_golden/s1/gen/0" in strat.error


async def test_strategy_that_stopped_asking_for_recorded_keys_is_reported(tmp_path):
    _engine, runner, events = await replay_with(tmp_path, judge_fewer_candidates)
    completed = [e for e in read_events(events) if e.type == "strategy.completed"][-1]
    assert runner.calls == []
    unvisited = completed.payload["unvisited_keys"]
    assert "run_golden/s1/gen/2" in unvisited and "run_golden/s1/gen/3" in unvisited
    assert all("/score/" in k or k.endswith(("gen/2", "gen/3")) for k in unvisited)


def test_golden_log_is_intact():
    # offsets of the committed history still seek to their own lines
    path = GOLDEN / "judge.jsonl"
    with open(path, "rb") as fh:
        for ev in read_events(path):
            fh.seek(ev.start_offset)
            assert json.loads(fh.readline())["id"] == ev.id
