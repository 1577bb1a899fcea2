"""A strategy's own budget (``ctx.open_budget``): an engine hook, not a wrapping ctx; without Docker.

The scripted runner reports $0.01 per task, so a budget of $0.03 lets three
tasks start and refuses the fourth.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
import pytest
from engine_helpers import mypy, run_engine

from orchestrator.engine.budget import BudgetCap
from orchestrator.engine.testing import ScriptedRunner, success
from orchestrator.strategy import BudgetExhausted, Context, replay_strategy


async def spender(prompt: str, base_branch: str, ctx: Context, *, limit: float, steps: int = 10) -> dict[str, Any]:
    budget = ctx.open_budget(max_cost_usd=limit)
    done: list[int] = []
    stopped = None
    try:
        for i in range(steps):
            await ctx.wait(ctx.run({"prompt": f"step {i}"}, key=ctx.key("step", i)))
            done.append(i)
    except BudgetExhausted as exc:
        stopped = exc.message
    # A branch cleanup starts no agent and costs nothing: a spent budget does not hold it back.
    cleanup = await ctx.wait(ctx.run({"delete_branches": list(budget.branches)}, key=ctx.key("cleanup")))
    return {
        "done": done,
        "stopped": stopped,
        "stop_reason": budget.stop_reason,
        "summary": budget.summary(),
        "branches": list(budget.branches),
        "cleanup": cleanup["final_message"],
    }


def answer(req):
    # A real branch cleanup reports no cost; every other task $0.01.
    return success(req, cost=None) if req.delete_branches else success(req)


def step_keys(runner: ScriptedRunner) -> list[str]:
    return [c.task_key.split("/s1/")[1] for c in runner.calls]


async def cut_off_at_step(path, step: int, *, limit: float) -> ScriptedRunner:
    """Run ``spender`` until its task ``step/<step>`` starts, and cut the process off there.

    Returns the runner, which saw every task the cut-off process started.
    """
    reached = anyio.Event()

    async def hang_on_step(req):
        if req.task_key.endswith(f"/step/{step}"):
            reached.set()
            await anyio.sleep_forever()
        return answer(req)

    runner = ScriptedRunner(hang_on_step)
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(run_engine, path, spender, runner, params={"limit": limit}))
        await reached.wait()
        tg.cancel_scope.cancel()
    return runner


async def test_a_scoped_budget_stops_starting_tasks_and_the_strategy_ends_with_what_it_has(tmp_path):
    runner = ScriptedRunner(answer)
    engine, state = await run_engine(tmp_path, spender, runner, params={"limit": 0.03})
    s = state.strategies["s1"]
    assert s.status == "success", s.error
    result = s.result
    assert result["done"] == [0, 1, 2]
    assert result["stopped"] == result["stop_reason"] == "max_cost_usd reached: spent $0.0300 of $0.0300"
    assert result["summary"]["cost_usd"] == 0.03 and result["summary"]["max_cost_usd"] == 0.03
    assert step_keys(runner) == ["step/0", "step/1", "step/2", "cleanup"]
    # refused where the engine schedules it: the fourth step was never recorded at all
    assert "run_t/s1/step/3" not in state.tasks
    assert result["branches"] == [c.branch_name for c in runner.calls[:3]]
    # The replay takes the same path from the log alone and returns the same result.
    (outcome,) = replay_strategy(engine.paths.events, partial(spender))
    assert outcome.ended == "returned" and outcome.result == result


async def test_no_limit_reads_no_time_and_refuses_nothing(tmp_path):
    async def unlimited(prompt: str, base_branch: str, ctx: Context) -> dict[str, Any]:
        budget = ctx.open_budget()
        results = await ctx.parallel([({"prompt": f"p{i}"}, ctx.key("p", i)) for i in range(3)])
        return {
            "active": budget.active,
            "summary": budget.summary(),
            "branches": len(budget.branches),
            "n": len(results),
        }

    runner = ScriptedRunner()
    _, state = await run_engine(tmp_path, unlimited, runner)
    s = state.strategies["s1"]
    assert s.result == {"active": False, "summary": None, "branches": 3, "n": 3}
    assert s.checkpoints == []  # a run without a budget records no extra clock readings


async def test_a_scoped_budget_survives_resume_and_pays_for_nothing_twice(tmp_path):
    straight = ScriptedRunner(answer)
    _, ref = await run_engine(tmp_path / "straight", spender, straight, params={"limit": 0.03})

    first = await cut_off_at_step(tmp_path / "resumed", 2, limit=0.03)
    second = ScriptedRunner(answer)
    _, state = await run_engine(tmp_path / "resumed", spender, second, params={"limit": 0.03})
    result, expected = state.strategies["s1"].result, ref.strategies["s1"].result
    # the same decisions and spend; only the clock reading of the final summary is new
    assert result["summary"].pop("wall_s") >= 0 and expected["summary"].pop("wall_s") >= 0
    assert result == expected
    # only the step that was cut off runs again; the finished ones are read back from the log
    assert step_keys(first) == ["step/0", "step/1", "step/2"]
    assert step_keys(second) == ["step/2", "cleanup"]


async def test_a_task_the_run_recorded_is_never_refused(tmp_path):
    # The first process ran three steps under a generous budget and was cut off on the fourth.
    # Resumed under a budget spent after one step, the recorded steps are still answered from
    # the log (they cost nothing again); only the unfinished one is refused.
    await cut_off_at_step(tmp_path, 3, limit=1.0)
    second = ScriptedRunner(answer)
    _, state = await run_engine(tmp_path, spender, second, params={"limit": 0.01})
    result = state.strategies["s1"].result
    assert result["done"] == [0, 1, 2]
    assert result["stopped"] == "max_cost_usd reached: spent $0.0100 of $0.0100"
    assert step_keys(second) == ["cleanup"]


async def test_the_run_wide_cap_ends_a_budgeted_strategy_the_same_way(tmp_path):
    # No limit of its own: the open budget turns the cap's refusal into BudgetExhausted (not a
    # TaskFailed a helper might tolerate) and remembers it as its stop reason.
    runner = ScriptedRunner(answer)
    _, state = await run_engine(
        tmp_path,
        spender,
        runner,
        params={"limit": 10.0},
        budget=BudgetCap(max_cost_usd=0.02),
        budget_rates={"*": (3e-6, 15e-6)},
    )
    s = state.strategies["s1"]
    assert s.status == "budget_reached", s.error
    assert s.result["done"] == [0, 1]
    assert s.result["stopped"].startswith("the run's spending cap ($0.02) is reached")
    assert s.result["stop_reason"] == s.result["stopped"]
    assert step_keys(runner) == ["step/0", "step/1", "cleanup"]


async def test_a_limit_that_is_not_positive_is_refused(tmp_path):
    async def bad(prompt: str, base_branch: str, ctx: Context) -> None:
        ctx.open_budget(max_wall_s=0)

    _, state = await run_engine(tmp_path, bad, ScriptedRunner())
    assert state.strategies["s1"].error == "ValueError: max_wall_s must be a positive number, got 0"


CONFORMANCE = """\
from pathlib import Path

from orchestrator.engine.context import Context, ContextCore, StrategyContext
from orchestrator.engine.replay import ReplayContext


def engine_ctx(ctx: StrategyContext) -> Context:
    return ctx


def replay_ctx(ctx: ReplayContext) -> Context:
    return ctx


class WithoutFacts(ContextCore):  # the core alone lacks what each context knows of its run
    pass


def bare(ctx: WithoutFacts) -> Context:
    return ctx  # E: "WithoutFacts"


class Mistyped(ReplayContext):
    def output_dir(self) -> str:  # type: ignore[override]
        return "somewhere"


def mistyped(ctx: Mistyped) -> Context:
    return ctx  # E: "Mistyped"
"""


@pytest.mark.slow
def test_every_context_is_checked_against_the_protocol(tmp_path):
    """The engine's and the replay's ctx are Contexts to mypy, and the check bites on a missing or mistyped member."""
    (tmp_path / "conformance.py").write_text(CONFORMANCE)
    out = mypy(tmp_path / "conformance.py", cwd=tmp_path)
    errors = [line for line in out.splitlines() if ": error: " in line]
    lines = CONFORMANCE.splitlines()
    flagged = sorted({int(line.split(":")[1]) for line in errors})
    expected = [i for i, text in enumerate(lines, 1) if "# E: " in text]
    assert flagged == expected, out
    for i in expected:
        word = lines[i - 1].split("# E: ")[1]
        assert any(f":{i}: error:" in e and word in e for e in errors), out
    assert "def output_dir(self) -> str" in out  # mypy names the mistyped member
