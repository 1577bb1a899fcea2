import pytest

from orchestrator.strategy import BudgetScope


def _res(key, cost):
    return {"key": key, "metrics": {"cost_usd": cost}}


def test_cost_budget_counts_each_task_once_and_stops_at_the_limit():
    b = BudgetScope(lambda: 101.0, max_cost_usd=1.0, max_wall_s=None)
    b.charge(_res("a", 0.6))
    b.charge(_res("a", 0.6))  # the same task seen again on resume or re-wait
    assert b.exhausted() is None
    b.charge(_res("b", 0.4))
    assert "max_cost_usd" in b.exhausted()


def test_unknown_cost_counts_as_zero_and_wall_clock_limits():
    clock = [0.0]
    b = BudgetScope(lambda: clock[0], max_cost_usd=None, max_wall_s=60)
    b.charge({"key": "x", "metrics": {"cost_usd": None}})
    b.charge(None)
    assert b.cost_usd == 0.0
    clock[0] = 59.9
    assert b.exhausted() is None
    clock[0] = 60.0
    assert "max_wall_s" in b.exhausted()


def test_non_positive_limits_are_refused():
    with pytest.raises(ValueError, match="max_cost_usd"):
        BudgetScope(lambda: 0.0, max_cost_usd=0, max_wall_s=None)
