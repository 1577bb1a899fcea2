"""The evaluation contract (parsing) and the built-in scoring, with exact expected values."""

from __future__ import annotations

import math

import pytest

from orchestrator.errors import ConfigError, TaskFailed
from strategies.evaluation import (
    EvalParseError,
    Evaluation,
    ScoringConfig,
    check_scoring,
    compare,
    evaluation_from_task,
    parse_eval_output,
    primary_regressed,
    to_json,
)


def ev(**metrics) -> Evaluation:
    return Evaluation(status="ok", metrics={k: float(v) for k, v in metrics.items()})


# ------------------------------------------------------------------ parsing


def test_last_line_is_parsed_and_earlier_output_ignored():
    out = (
        'warming up\n{"metrics": {"old": 1}}\nrunning...\n'
        '{"metrics": {"throughput": 120, "lat": 8.5}, "valid": true, "expected": 10, "ok": 10}\n\n'
    )
    e = parse_eval_output(out, commit="abc")
    assert e.metrics == {"throughput": 120.0, "lat": 8.5}
    assert (e.status, e.valid, e.expected, e.ok, e.commit, e.complete) == ("ok", True, 10, 10, "abc", True)


def test_nan_metric_is_accepted_as_nan():
    e = parse_eval_output('{"metrics": {"x": NaN}}')
    assert math.isnan(e.metrics["x"])


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "printed nothing"),
        ("all good\n", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"score": 3}', "'metrics' object"),
        ('{"metrics": {"x": "fast"}}', "metric 'x' is not a number"),
        ('{"metrics": {"x": true}}', "metric 'x' is not a number"),
        ('{"metrics": {}, "valid": "yes"}', "'valid' must be"),
        ('{"metrics": {}, "ok": 1.5}', "'ok' must be an integer"),
        ('{"metrics": {}, "recommendation": {"should_explore": true, "grade": "great"}}', "grade must be one of"),
    ],
)
def test_contract_violations_have_one_line_reasons(text, why):
    with pytest.raises(EvalParseError, match=why):
        parse_eval_output(text)


def test_incomplete_and_invalid_are_not_complete():
    assert not parse_eval_output('{"metrics": {"x": 1}, "expected": 10, "ok": 9}').complete
    assert not parse_eval_output('{"metrics": {"x": 1}, "valid": false}').complete
    assert parse_eval_output('{"metrics": {"x": 1}, "expected": 10}').complete  # ok not reported


def test_failed_task_and_unparsable_output_become_failed_evaluations():
    failed = evaluation_from_task(None, TaskFailed("k", "command", "exit 2\nTraceback: boom"))
    assert failed.status == "failed" and failed.error == "command: exit 2\nTraceback: boom"
    garbage = evaluation_from_task({"final_message": "oops", "artifact": {"commit": "c1"}})
    assert garbage.status == "failed" and garbage.commit == "c1"
    assert garbage.error.startswith("unparsable: last stdout line is not JSON")
    good = evaluation_from_task({"final_message": '{"metrics": {"t": 2}}', "artifact": {"commit": "c2"}})
    assert good.status == "ok" and good.commit == "c2" and good.metrics == {"t": 2.0}


# ------------------------------------------------------------------ scoring

CFG = ScoringConfig(primary_metric="throughput", direction="max", tolerance=0.01)


def test_clear_improvement_is_strong():
    c = compare(ev(throughput=110), ev(throughput=100), CFG)
    assert (c.primary_delta, c.primary_change, c.score, c.grade, c.should_explore) == (10.0, 0.1, 10.0, "strong", True)
    assert c.reasons == ["primary_metric_improved"]


def test_regression_is_weak_with_reason():
    c = compare(ev(throughput=95), ev(throughput=100), CFG)
    assert (c.primary_delta, c.score, c.grade, c.should_explore) == (-5.0, -5.0, "weak", False)
    assert c.reasons == ["primary_metric_regressed"] and primary_regressed(c, CFG)


def test_change_inside_tolerance_is_flat_and_mixed():
    c = compare(ev(throughput=100.5), ev(throughput=100), CFG)
    assert (c.primary_delta, c.score, c.grade, c.should_explore) == (0.5, 0.5, "mixed", False)
    assert c.reasons == ["primary_metric_flat"] and not primary_regressed(c, CFG)
    # -0.5 % is inside the 1 % band too: flat, not a regression
    d = compare(ev(throughput=99.5), ev(throughput=100), CFG)
    assert d.grade == "mixed" and not primary_regressed(d, CFG)


def test_min_direction_flips_the_sign():
    cfg = ScoringConfig(primary_metric="latency", direction="min", tolerance=0.01)
    c = compare(ev(latency=8), ev(latency=10), cfg)
    assert (c.primary_delta, c.primary_change, c.score, c.grade) == (2.0, 0.2, 20.0, "strong")
    worse = compare(ev(latency=12), ev(latency=10), cfg)
    assert (worse.primary_delta, worse.score, worse.grade) == (-2.0, -20.0, "weak")


def test_weighted_tradeoffs_promising_and_mixed():
    cfg = ScoringConfig(primary_metric="throughput", weights={"mem": -0.5}, tolerance=0.01)
    # +10 % throughput, +10 % memory at weight -0.5 -> 10 - 5 = 5: improved but a metric regressed
    c = compare(ev(throughput=110, mem=110), ev(throughput=100, mem=100), cfg)
    assert (c.score, c.grade, c.should_explore) == (5.0, "promising", True)
    assert c.reasons == ["primary_metric_improved", "mem_regressed"]
    # +10 % throughput, +40 % memory -> 10 - 20 = -10: a net loss despite the primary gain
    m = compare(ev(throughput=110, mem=140), ev(throughput=100, mem=100), cfg)
    assert (m.score, m.grade, m.should_explore) == (-10.0, "mixed", False)
    # flat primary, memory down 20 % -> 0 + 10 = 10: promising without a primary gain
    p = compare(ev(throughput=100, mem=80), ev(throughput=100, mem=100), cfg)
    assert (p.score, p.grade, p.reasons) == (10.0, "promising", ["primary_metric_flat", "mem_improved"])
    # flat primary, memory up 20 % -> -10: weak
    w = compare(ev(throughput=100, mem=120), ev(throughput=100, mem=100), cfg)
    assert (w.score, w.grade) == (-10.0, "weak")


def test_missing_weighted_metric_is_reported_not_scored():
    cfg = ScoringConfig(primary_metric="throughput", weights={"mem": -1.0})
    c = compare(ev(throughput=120), ev(throughput=100), cfg)
    assert (c.score, c.grade, c.reasons) == (20.0, "strong", ["primary_metric_improved", "mem_missing"])


def test_zero_baseline_uses_tolerance_as_absolute_band():
    c = compare(ev(throughput=0.005), ev(throughput=0), CFG)
    assert (c.primary_change, c.grade) == (0.005, "mixed")
    d = compare(ev(throughput=0.5), ev(throughput=0), CFG)
    assert (d.primary_change, d.score, d.grade) == (0.5, 50.0, "strong")


def test_missing_or_nan_primary_has_no_score():
    for cand in (ev(other=1), Evaluation(status="ok", metrics={"throughput": float("nan")})):
        c = compare(cand, ev(throughput=100), CFG)
        assert (c.score, c.primary_delta, c.grade, c.should_explore) == (None, None, "weak", False)
        assert c.reasons[0] == "primary_metric_missing"


def test_incomplete_candidate_never_should_explore():
    cand = Evaluation(status="ok", metrics={"throughput": 150.0}, expected=10, ok=9)
    c = compare(cand, ev(throughput=100), CFG)
    assert (c.score, c.grade, c.should_explore) == (50.0, "strong", False)
    assert c.reasons == ["primary_metric_improved", "incomplete_evaluation"]
    invalid = compare(Evaluation(status="ok", metrics={"throughput": 150.0}, valid=False), ev(throughput=100), CFG)
    assert invalid.should_explore is False and "invalid_evaluation" in invalid.reasons


def test_recommendation_replaces_builtin_scoring_but_keeps_the_delta():
    rec = {"should_explore": True, "grade": "mixed", "score": 3.5, "reasons": ["custom"]}
    cand = Evaluation(status="ok", metrics={"throughput": 90.0}, recommendation=rec)
    c = compare(cand, ev(throughput=100), CFG)
    assert (c.source, c.score, c.grade, c.should_explore, c.reasons) == (
        "recommendation",
        3.5,
        "mixed",
        True,
        ["custom"],
    )
    assert c.primary_delta == -10.0 and primary_regressed(c, CFG)  # the numeric guard still sees the regression


def test_to_json_turns_nan_into_null():
    assert to_json(Evaluation(status="ok", metrics={"x": float("nan")}))["metrics"] == {"x": None}


def test_scoring_parameter_checks():
    def params(primary, direction, weights, tolerance):
        return {"primary_metric": primary, "direction": direction, "weights": weights, "tolerance": tolerance}

    check_scoring({**params("t", "max", {"m": -1}, 0.01), "eval_command": "x"})
    with pytest.raises(ConfigError, match="primary_metric"):
        check_scoring({**params(None, "max", {}, 0.01), "eval_command": "python bench.py"})
    with pytest.raises(ConfigError, match="direction"):
        check_scoring({**params("t", "up", {}, 0.01), "eval_command": "x"})
    with pytest.raises(ConfigError, match="weights"):
        check_scoring({**params("t", "max", {"m": "big"}, 0.01), "eval_command": "x"})
    with pytest.raises(ConfigError, match="tolerance"):
        check_scoring({**params("t", "max", {}, -1), "eval_command": "x"})
