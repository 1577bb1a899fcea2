"""The evaluation contract and the built-in scoring shared by tree-beam and review-loop (docs/tree-beam.md).

Pure functions of their inputs, so a resumed run decides exactly as the first one did.
"""

from __future__ import annotations

import json
import math
from functools import partial
from typing import Any, Literal

import msgspec

Direction = Literal["max", "min"]
GRADES = ("strong", "promising", "mixed", "weak")


class Evaluation(msgspec.Struct, frozen=True, kw_only=True):
    """One evaluation outcome: parsed metrics, or why there are none."""

    status: Literal["ok", "failed"]
    metrics: dict[str, float] = {}
    valid: bool = True
    expected: int | None = None
    ok: int | None = None
    recommendation: dict[str, Any] | None = None
    commit: str | None = None  # the commit evaluated (the task's base commit)
    error: str | None = None
    # Repeated measurements (tree-beam's eval_repeats): metrics above are medians and
    # ``stats`` holds each metric's n, median, mean and confidence interval.
    samples: int = 1
    stats: dict[str, dict[str, Any]] | None = None

    @property
    def complete(self) -> bool:
        """Valid, and ``ok == expected`` when the command reported both."""
        if self.status != "ok" or not self.valid:
            return False
        return self.expected is None or self.ok is None or self.ok == self.expected


class ScoringConfig(msgspec.Struct, frozen=True, kw_only=True):
    primary_metric: str
    direction: Direction = "max"
    weights: dict[str, float] = {}
    tolerance: float = 0.01


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """A candidate scored against one baseline."""

    primary_baseline: float | None
    primary_candidate: float | None
    primary_delta: float | None  # in the good direction: positive = better
    primary_change: float | None  # relative, in the good direction
    score: float | None
    grade: str
    should_explore: bool
    reasons: list[str]
    source: Literal["builtin", "recommendation"] = "builtin"


class EvalParseError(ValueError):
    """The eval command's last stdout line is not the contract's JSON object."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _check_recommendation(rec: Any) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise EvalParseError("'recommendation' must be an object")
    if not isinstance(rec.get("should_explore"), bool):
        raise EvalParseError("recommendation.should_explore must be true or false")
    if rec.get("grade") not in GRADES:
        raise EvalParseError(f"recommendation.grade must be one of {', '.join(GRADES)}")
    score = rec.get("score")
    if score is not None and _number(score) is None:
        raise EvalParseError("recommendation.score must be a number or null")
    reasons = rec.get("reasons", [])
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise EvalParseError("recommendation.reasons must be a list of strings")
    return {
        "should_explore": rec["should_explore"],
        "grade": rec["grade"],
        "score": None if score is None else float(score),
        "reasons": list(reasons),
    }


def parse_eval_output(stdout: str, *, commit: str | None = None) -> Evaluation:
    """Parse the last non-empty stdout line; raises :class:`EvalParseError` with a one-line reason."""
    lines = [ln for ln in (stdout or "").splitlines() if ln.strip()]
    if not lines:
        raise EvalParseError("the eval command printed nothing; its last stdout line must be a JSON object")
    last = lines[-1].strip()
    try:
        data = json.loads(last)  # the stdlib accepts NaN/Infinity, which benchmarks do print
    except ValueError:
        raise EvalParseError(f"last stdout line is not JSON: {last[:120]!r}") from None
    if not isinstance(data, dict):
        raise EvalParseError("last stdout line must be a JSON object")
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        raise EvalParseError("the JSON object needs a 'metrics' object of numbers")
    clean: dict[str, float] = {}
    for name, value in metrics.items():
        number = _number(value)
        if number is None:
            raise EvalParseError(f"metric {name!r} is not a number: {value!r}")
        clean[str(name)] = number
    valid = data.get("valid", True)
    if not isinstance(valid, bool):
        raise EvalParseError("'valid' must be true or false")
    counters: dict[str, int | None] = {}
    for field in ("expected", "ok"):
        value = data.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise EvalParseError(f"'{field}' must be an integer")
        counters[field] = value
    rec = data.get("recommendation")
    return Evaluation(
        status="ok",
        metrics=clean,
        valid=valid,
        expected=counters["expected"],
        ok=counters["ok"],
        recommendation=None if rec is None else _check_recommendation(rec),
        commit=commit,
    )


def evaluation_from_task(result: dict[str, Any] | None, failure: Exception | None = None) -> Evaluation:
    if failure is not None or result is None:
        error_type = getattr(failure, "error_type", "unknown")
        message = getattr(failure, "message", str(failure))
        return Evaluation(status="failed", error=f"{error_type}: {_tail(message)}")
    return evaluation_of_output(result.get("final_message") or "", (result.get("artifact") or {}).get("commit"))


def evaluation_of_output(stdout: str, commit: str | None) -> Evaluation:
    """:func:`parse_eval_output`'s evaluation, or a failed one saying why the output is not the contract's."""
    try:
        return parse_eval_output(stdout, commit=commit)
    except EvalParseError as exc:
        return Evaluation(status="failed", commit=commit, error=f"unparsable: {exc}")


def _tail(text: str, limit: int = 400) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def fmt_number(x: Any) -> str:
    """A number as the strategies' Markdown and verdicts show it: ``8.5``, ``1e-05``; ``-`` when unknown."""
    return "-" if x is None else (f"{x:g}" if isinstance(x, (int, float)) else str(x))


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _relative(candidate: float, baseline: float) -> float:
    return (candidate - baseline) / (abs(baseline) if baseline != 0 else 1.0)


def _round(x: float) -> float:
    # Round away float noise so scores are stable, comparable and readable in JSON.
    return round(x, 9)


def compare(candidate: Evaluation, baseline: Evaluation, cfg: ScoringConfig) -> Comparison:
    """Score ``candidate`` against ``baseline`` (both must have status ok to score)."""
    base_p = _finite(baseline.metrics.get(cfg.primary_metric)) if baseline.status == "ok" else None
    cand_p = _finite(candidate.metrics.get(cfg.primary_metric)) if candidate.status == "ok" else None
    sign = 1.0 if cfg.direction == "max" else -1.0
    reasons: list[str] = []
    if candidate.status == "ok" and not candidate.valid:
        reasons.append("invalid_evaluation")
    elif candidate.status == "ok" and not candidate.complete:
        reasons.append("incomplete_evaluation")
    delta = change = None
    if base_p is not None and cand_p is not None:
        delta = _round(sign * (cand_p - base_p))
        change = _round(sign * _relative(cand_p, base_p))
    primary = partial(
        Comparison, primary_baseline=base_p, primary_candidate=cand_p, primary_delta=delta, primary_change=change
    )
    if candidate.recommendation is not None:
        rec = candidate.recommendation
        return primary(
            score=_finite(rec["score"]),
            grade=rec["grade"],
            should_explore=rec["should_explore"] and candidate.complete,
            reasons=list(rec["reasons"]) + reasons,
            source="recommendation",
        )
    if change is None:
        reasons.insert(0, "primary_metric_missing")
        return primary(score=None, grade="weak", should_explore=False, reasons=reasons)
    band = cfg.tolerance  # relative band; _relative already divides by |baseline|
    moved = "improved" if change > band else "regressed" if change < -band else "flat"
    reasons.insert(0, f"primary_metric_{moved}")
    total, others_regressed = _weighted(candidate, baseline, cfg, change, reasons)
    score = _round(100.0 * total)
    if moved == "regressed":
        grade = "weak"
    elif moved == "improved":
        grade = "strong" if not others_regressed else ("promising" if score > 0 else "mixed")
    else:
        grade = "promising" if total > band else "weak" if total < -band else "mixed"
    should = grade in ("strong", "promising") and candidate.complete
    return primary(score=score, grade=grade, should_explore=should, reasons=reasons)


def _weighted(
    candidate: Evaluation, baseline: Evaluation, cfg: ScoringConfig, change: float, reasons: list[str]
) -> tuple[float, bool]:
    """The primary change plus each weighted metric's (noted in ``reasons``); whether one regressed."""
    total, others_regressed = change, False
    for name in sorted(cfg.weights):
        if name == cfg.primary_metric:
            continue
        b = _finite(baseline.metrics.get(name))
        c = _finite(candidate.metrics.get(name))
        if b is None or c is None:
            reasons.append(f"{name}_missing")
            continue
        contribution = cfg.weights[name] * _relative(c, b)
        total += contribution
        if contribution < -cfg.tolerance:
            reasons.append(f"{name}_regressed")
            others_regressed = True
        elif contribution > cfg.tolerance:
            reasons.append(f"{name}_improved")
    return total, others_regressed


def primary_regressed(cmp: Comparison, cfg: ScoringConfig) -> bool:
    """The primary metric moved the wrong way beyond the noise band (or a recommendation says so)."""
    if "primary_metric_regressed" in cmp.reasons:
        return True
    return cmp.primary_change is not None and cmp.primary_change < -cfg.tolerance


def check_scoring(params: dict[str, Any]) -> None:
    """Raise ``ConfigError`` (one line) for inconsistent scoring ``-S`` parameters (absent ones at their defaults)."""
    from orchestrator.strategy import ConfigError

    direction, weights = params.get("direction", "max"), params.get("weights") or {}
    tolerance = params.get("tolerance", 0.01)
    if params.get("eval_command") and not params.get("primary_metric"):
        raise ConfigError("-S eval_command needs -S primary_metric=<metric name printed by the command>")
    if direction not in ("max", "min"):
        raise ConfigError(f"-S direction must be max or min, got {direction!r}")
    if not isinstance(weights, dict) or not all(_number(v) is not None for v in weights.values()):
        raise ConfigError('-S weights must be a JSON object of numbers, e.g. weights={"latency_ms": -0.5}')
    if _number(tolerance) is None or tolerance < 0:
        raise ConfigError(f"-S tolerance must be a non-negative number (relative, 0.01 = 1%), got {tolerance!r}")


def evaluation_from_json(data: dict[str, Any]) -> Evaluation:
    """Inverse of ``to_json`` for an :class:`Evaluation` (a null metric was NaN)."""
    metrics = {k: float("nan") if v is None else float(v) for k, v in (data.get("metrics") or {}).items()}
    return msgspec.convert(dict(data, metrics=metrics), Evaluation)


def to_json(value: Any) -> Any:
    """Plain JSON data for a struct (or a struct nested in lists/dicts): msgspec writes NaN and infinities as null."""
    return msgspec.json.decode(msgspec.json.encode(value))
