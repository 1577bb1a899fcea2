"""The spending-cap engine hook (orchestrator/engine/budget.py) and its fold into state, without Docker."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.engine.budget import DEFAULT_RATE, Budget, BudgetCap, rate_for
from orchestrator.log.events import BUDGET_CAP, BUDGET_REACHED, BUDGET_SPEND
from orchestrator.log.state import RunState, apply, decode_snapshot, encode_snapshot


def _budget(cap: BudgetCap, reached: list[int] | None = None) -> tuple[Budget, RunState, list[tuple[str, dict]]]:
    state = RunState(run_id="r")
    written: list[tuple[str, dict[str, Any]]] = []

    def emit(etype: str, payload: dict[str, Any]) -> None:
        written.append((etype, payload))
        apply(state, etype, "", None, payload, len(written), f"2026-01-01T00:00:{len(written):02d}.000Z")

    budget = Budget(
        cap,
        rates={"*": DEFAULT_RATE},
        emit=emit,
        on_reached=(lambda: reached.append(1)) if reached is not None else None,
    )
    return budget, state, written


def test_live_usage_counts_until_the_reported_figures_replace_it_and_the_fold_agrees():
    reached: list[int] = []
    budget, state, written = _budget(BudgetCap(max_cost_usd=0.1), reached)
    budget.announce()
    budget.begin("a", "sonnet")
    budget.usage("a", {"input_tokens": 12000, "output_tokens": 10})
    assert budget.spent_cost == pytest.approx(12000 * 3e-6 + 10 * 15e-6)
    assert not budget.reached
    budget.usage("a", {"input_tokens": 12100, "output_tokens": 20})
    assert not budget.reached  # $0.073 < $0.10
    budget.begin("b", "sonnet")
    budget.usage("b", {"input_tokens": 12000, "output_tokens": 0})
    assert budget.reached and reached == [1]  # live: b has not finished
    # a ends reporting less than was counted live: the report wins
    budget.settle("a", {"tokens_in": 20000, "tokens_out": 30, "cost_usd": 0.05})
    assert budget.spent_tokens == 20030 + 12000
    assert budget.spent_cost == pytest.approx(0.05 + 0.036)
    assert [t for t, _ in written].count(BUDGET_REACHED) == 1
    assert state.budget is not None and state.budget.reached
    assert state.budget.spent_tokens == budget.spent_tokens
    assert state.budget.spent_cost_usd == pytest.approx(budget.spent_cost, abs=1e-6)
    assert state.budget.by_task["a"] == [20030, 0.05]


def test_an_interrupted_attempt_keeps_what_it_spent_and_a_resume_adds_to_it():
    budget, state, _ = _budget(BudgetCap(max_tokens=100_000))
    budget.announce()
    budget.begin("a", "sonnet")
    budget.usage("a", {"input_tokens": 30000, "output_tokens": 0})
    budget.interrupted("a")
    # a new process seeds from the fold, then the resumed session spends more
    again, _, _ = _budget(BudgetCap(max_tokens=100_000))
    assert state.budget is not None
    again.seed(state.budget.by_task)
    again.begin("a", "sonnet")
    again.settle("a", {"tokens_in": 40000, "tokens_out": 0, "cost_usd": 0.12})
    assert again.spent_tokens == 70000 and not again.reached


def test_a_task_without_reported_figures_keeps_its_live_count():
    budget, _, _ = _budget(BudgetCap(max_cost_usd=10))
    budget.begin("a", "m")
    budget.usage("a", {"input_tokens": 1000, "output_tokens": 100})
    budget.settle("a", {"tokens_in": 0, "tokens_out": 0, "cost_usd": None})
    assert budget.spent_tokens == 1100 and budget.spent_cost == pytest.approx(1000 * 3e-6 + 100 * 15e-6)


def test_a_raised_cap_clears_reached_until_the_spend_reaches_it_again():
    state = RunState(run_id="r")
    ts = "2026-01-01T00:00:00.000Z"
    apply(state, BUDGET_CAP, "", None, {"max_cost_usd": 0.1, "max_tokens": None, "on_reached": "stop"}, 1, ts)
    apply(state, BUDGET_SPEND, "", None, {"task": "a", "tokens": 100, "cost_usd": 0.2}, 2, ts)
    apply(state, BUDGET_REACHED, "", None, {}, 3, ts)
    assert state.budget is not None and state.budget.reached and state.budget.on_reached == "stop"
    apply(state, BUDGET_CAP, "", None, {"max_cost_usd": 1.0, "max_tokens": None, "on_reached": "finish"}, 4, ts)
    assert not state.budget.reached and state.budget.spent_cost_usd == pytest.approx(0.2)
    # the snapshot keeps the budget (a resume seeds from it)
    again = decode_snapshot(encode_snapshot(state))
    assert again.budget == state.budget


def test_prices_by_exact_model_then_prefix_then_the_default():
    rates = {"gpt-5": (1.0, 2.0), "gpt-5-mini": (0.1, 0.2), "*": (9.0, 9.0)}
    assert rate_for("gpt-5-mini-2025", rates) == (0.1, 0.2)
    assert rate_for("gpt-5", rates) == (1.0, 2.0)
    assert rate_for("other", rates) == (9.0, 9.0)
    assert rate_for("other", {"gpt-5": (1.0, 2.0)}) is None


@pytest.fixture
def shell_plugin(monkeypatch):
    """A command plugin named ``shell``, registered as a configuration would (its kind is its capabilities)."""
    import sys
    import types

    from orchestrator.runner import registry
    from runner_plugins.command import CommandPlugin

    class Shell(CommandPlugin):
        name = "shell"

    module = types.ModuleType("shell_plugin_probe")
    module.PLUGIN = Shell()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry.PLUGIN_MODULES, "shell", module.__name__)
    return "shell"


def test_max_cost_is_refused_for_a_command_plugin_of_any_name(shell_plugin):
    from orchestrator.app.run_budget import check_measurable
    from orchestrator.config import BudgetConfig, Config
    from orchestrator.errors import ConfigError
    from orchestrator.runner import get_plugin
    from orchestrator.runner.types import AuthConfig

    config = Config(budget=BudgetConfig(max_cost_usd=1.0))
    with pytest.raises(ConfigError, match="plugin shell runs no agent and spends nothing"):
        check_measurable(config, plugin=get_plugin(shell_plugin), model="sonnet", mode=None, auth=AuthConfig())
    # a tool that reports its cost, on a subscription, reports what is not paid
    with pytest.raises(ConfigError, match="subscription mode"):
        check_measurable(
            config, plugin=get_plugin("claude-code"), model="sonnet", mode="subscription", auth=AuthConfig()
        )


async def test_a_command_plugin_of_any_name_spends_nothing_and_runs_at_the_cap(tmp_path, shell_plugin):
    """Issue 45: a task's kind is its plugin's runs_command, recorded once; not the name ``command``."""
    from engine_helpers import run_engine

    from orchestrator.engine.testing import ScriptedRunner, success
    from orchestrator.errors import BudgetReached
    from orchestrator.log import events as E
    from orchestrator.log.eventlog import LogReader

    async def strategy(prompt, base_branch, ctx):
        await ctx.wait(ctx.run({"prompt": "spend"}, key=ctx.key("agent")))  # reaches the cap
        checked = await ctx.wait(ctx.run({"plugin": "shell", "command": "make check"}, key=ctx.key("check")))
        try:
            ctx.run({"prompt": "more"}, key=ctx.key("again"))
        except BudgetReached:
            return checked["final_message"]
        return "an agent task ran past the cap"

    runner = ScriptedRunner(lambda req: success(req, final_message=f"ran {req.plugin_name}", cost=0.05))
    _, state = await run_engine(
        tmp_path, strategy, runner, budget=BudgetCap(max_cost_usd=0.02), budget_rates={"*": DEFAULT_RATE}
    )
    assert state.strategies["s1"].result == "ran shell", state.strategies["s1"].error
    check = next(k for k in state.tasks if k.endswith("/check"))
    assert state.tasks[check].runs_command  # folded from what task.scheduled recorded
    assert state.budget is not None and check not in state.budget.by_task  # and not priced
    scheduled = {
        ev.key: ev.typed()
        for _, ev in LogReader(tmp_path / "logs" / "run_t" / "events.jsonl").events()
        if ev.type == E.TASK_SCHEDULED
    }
    assert [p.runs_command for _, p in sorted(scheduled.items())] == [False, True]


def test_the_spend_chart_places_a_malformed_timestamp_at_the_start_not_before_it():
    """A hand-edited log's unreadable time must not draw a point decades before the run began."""
    from orchestrator.log.state import BudgetState, RunState
    from orchestrator.report.spend import spend_over_time

    state = RunState(run_id="r")
    state.budget = BudgetState(
        max_cost_usd=1.0,
        first_at="2026-11-28T10:00:00.000Z",
        spent_over_time=[("2026-11-28T10:00:02.500Z", 0.1), ("not a time", 0.2)],
        caps_over_time=[("2026-11-28T10:00:00.000Z", 1.0)],
    )
    spend = spend_over_time(state)
    assert spend is not None
    assert spend["points"] == [(0.0, 0.0), (2.5, 0.1), (0.0, 0.2)]
