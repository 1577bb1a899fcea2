"""The engine's replay service: a recorded strategy execution re-run from its log alone."""

from __future__ import annotations

import json

import anyio
import pytest
from engine_helpers import run_engine

from orchestrator.engine import replay_strategy
from orchestrator.engine.testing import ScriptedRunner, failure, success
from orchestrator.errors import ReplayError, StrategyError
from orchestrator.log.eventlog import read_events


async def steps(prompt, base_branch, ctx, *, n=3):
    """Asks the clock, runs one task per step, publishes its progress, writes a file at the end."""
    ctx.progress(phase="step", step=0, of_total=n)
    said = []
    for i in range(n):
        ctx.now()
        result = await ctx.wait(ctx.run({"prompt": f"step {i}"}, key=ctx.key("step", i)))
        said.append(result["final_message"])
        ctx.progress(phase="step", step=i + 1, of_total=n, text=result["final_message"])
    (ctx.output_dir() / "said.txt").write_text(",".join(said))
    return said


def speak(req):
    return success(req, final_message=f"did {req.task_key.rsplit('/', 1)[-1]}")


def orchestration_log(tmp_path) -> list[dict]:
    path = tmp_path / "logs" / "run_t" / "orchestration.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_finished_run_replays_to_its_result_progress_and_files(tmp_path):
    engine, state = await run_engine(tmp_path, steps, ScriptedRunner(speak))
    assert state.strategies["s1"].status == "success"
    recorded = [e.payload for e in read_events(engine.paths.events) if e.type == "strategy.progress"]
    assert [p["step"] for p in recorded] == [0, 1, 2, 3]
    assert state.strategies["s1"].progress.text == "did 2"

    (outcome,) = replay_strategy(engine.paths.events, steps, output_dir=tmp_path / "replayed")
    assert (outcome.strategy_execution_id, outcome.ended, outcome.error) == ("s1", "returned", None)
    assert outcome.result == ["did 0", "did 1", "did 2"]
    assert [p.step for p in outcome.progress] == [0, 1, 2, 3] and outcome.progress[-1] == state.strategies[
        "s1"
    ].progress
    assert (tmp_path / "replayed" / "said.txt").read_text() == "did 0,did 1,did 2"
    assert orchestration_log(tmp_path) == []


async def test_an_interrupted_run_replays_quietly_up_to_where_its_log_ends(tmp_path):
    async def hang_on_step_2(req):
        if req.task_key.endswith("step/2"):
            await anyio.sleep_forever()
        return speak(req)

    runner = ScriptedRunner(hang_on_step_2)
    with anyio.move_on_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_engine, tmp_path, steps, runner)
            while not runner.per_key.get("run_t/s1/step/2"):  # noqa: ASYNC110 - the scripted runner signals nothing
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()

    (outcome,) = replay_strategy(tmp_path / "logs" / "run_t" / "events.jsonl", steps, output_dir=tmp_path / "r")
    assert (outcome.ended, outcome.result, outcome.error) == ("log_ended", None, None)
    assert [p.text for p in outcome.progress] == ["", "did 0", "did 1"]  # as far as the log goes
    assert not (tmp_path / "r" / "said.txt").exists()
    assert orchestration_log(tmp_path) == []  # the normal end of a partial replay is not an error


async def test_a_strategy_that_failed_replays_to_the_same_failure_quietly(tmp_path):
    async def gives_up(prompt, base_branch, ctx):
        await ctx.wait(ctx.run({"prompt": "try"}, key=ctx.key("try")))
        raise StrategyError("nothing worth keeping")

    engine, state = await run_engine(tmp_path, gives_up, ScriptedRunner(lambda req: failure(req)))
    assert state.strategies["s1"].status == "failed"
    (outcome,) = replay_strategy(engine.paths.events, gives_up)
    assert outcome.ended == "failed" and outcome.error is None
    assert orchestration_log(tmp_path) == []


async def test_an_exception_the_run_never_raised_is_logged_with_its_traceback_and_reported(tmp_path):
    engine, _ = await run_engine(tmp_path, steps, ScriptedRunner(speak))

    async def buggy_report(prompt, base_branch, ctx, *, n=3):
        first = await ctx.wait(ctx.run({"prompt": "step 0"}, key=ctx.key("step", 0)))
        ctx.progress(phase="step", step=1, text=first["final_message"])
        return first["no such field"]

    (outcome,) = replay_strategy(engine.paths.events, buggy_report)
    assert outcome.ended == "error" and outcome.error == "KeyError: 'no such field'"
    assert [p.text for p in outcome.progress] == ["did 0"]  # what it got to is still there
    (line,) = [r for r in orchestration_log(tmp_path) if r["level"] == "error"]
    assert "replay of strategy execution s1 raised KeyError" in line["message"]
    assert 'return first["no such field"]' in line["traceback"] and "buggy_report" in line["traceback"]


async def test_tree_beam_report_says_when_its_replay_broke(tmp_path, monkeypatch):
    from tree_beam_helpers import run

    import strategies.tree_beam as tb
    from strategies.tree_beam import render_tree_report

    engine, _, _ = await run(tmp_path)
    real = tb.tree_beam

    async def breaks_after_the_root(prompt, base_branch, ctx, **params):
        class Ctx:  # the real strategy, until its first idea task: then a bug
            def __getattr__(self, name):
                return getattr(ctx, name)

            def run(self, task, *, key, policy=None):
                if "/ideas/" in key:
                    raise RuntimeError("report bug")
                return ctx.run(task, key=key, policy=policy)

        return await real(prompt, base_branch, Ctx(), **params)

    monkeypatch.setattr(tb, "tree_beam", breaks_after_the_root)
    with pytest.raises(ReplayError, match=r"s1: replaying the strategy raised RuntimeError: report bug"):
        render_tree_report(engine.paths.events, tmp_path / "r")
    tree = json.loads((tmp_path / "r" / "tree.json").read_text())  # written as far as it got: the root
    assert [n["id"] for n in tree["nodes"]] == ["n0"] and tree["stop_reason"] is None
    assert any("RuntimeError: report bug" in r.get("traceback", "") for r in orchestration_log(tmp_path))
    # --show-run's hook turns it into a problem line (exit 1) instead of a silent partial report
    from orchestrator.strategy import RunView

    state = engine.state
    view = RunView(
        run_id="run_t",
        prompt="do it",
        repo_path=str(tmp_path / "repo"),
        base_branch="main",
        events_path=engine.paths.events,
        logs_dir=tmp_path / "logs" / "run_t",
        output_dir=tmp_path / "results" / "run_t" / "strategy_output",
        executions={sid: s.status for sid, s in state.strategies.items()},
        task_keys=frozenset(state.tasks),
    )
    problems = tb.show_run_report(view)
    assert problems == [
        f"s1: replaying the strategy raised RuntimeError: report bug (the report shows the tree up "
        f"to there); traceback in {tmp_path / 'logs' / 'run_t' / 'orchestration.jsonl'}"
    ]
