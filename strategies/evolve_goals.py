"""The evolve goals file (docs/evolve.md, "Goals file"): model, validation and the strategy's ``prepare`` step.

The validated goals (plain dicts) are what the run records, so a resumed run never reads the file again.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal, TypeGuard

import msgspec
import yaml

from orchestrator.strategy import ConfigError

from .evaluation import to_json

DEFAULT_TIMEOUT = 300
MAX_TIMEOUT = 24 * 3600
MAX_PARALLEL_CAP = 5
_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_GOAL_FIELDS = {"id", "description", "check", "weight", "timeout", "writes", "metric"}
_METRIC_FIELDS = {"json_key", "direction", "threshold", "tolerance"}
# (-S name, its default, its least value)
_WHOLE_NUMBERS = (("max_cycles", 10, 1), ("quarantine_after", 3, 1), ("recheck", 1, 0), ("max_failed_waves", 3, 0))


class Metric(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    direction: Literal["higher", "lower"]
    threshold: float
    json_key: str | None = None
    tolerance: float = 0.0

    def meets(self, value: float | None) -> bool:
        if value is None:
            return False
        return value >= self.threshold if self.direction == "higher" else value <= self.threshold

    def worsening(self, before: float, after: float) -> float:
        """How much worse ``after`` is than ``before`` (negative: better)."""
        return before - after if self.direction == "higher" else after - before


class Goal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str
    description: str
    check: str
    weight: float
    timeout: int = DEFAULT_TIMEOUT
    writes: tuple[str, ...] | None = None
    metric: Metric | None = None


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _goal(raw: Any, index: int, where: str) -> Goal:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: goals[{index}] must be a mapping with id, description, check, weight")
    gid = raw.get("id")
    if not isinstance(gid, str) or not _ID.match(gid):
        raise ConfigError(
            f"{where}: goals[{index}]: field 'id' must be a kebab-case string (like 'lint-clean'), got {gid!r}"
        )
    at = f"{where}: goal {gid!r}"
    if unknown := sorted(set(raw) - _GOAL_FIELDS):
        raise ConfigError(f"{at}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(_GOAL_FIELDS))})")
    for name in ("description", "check"):
        value = raw.get(name)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{at}: field {name!r} must be a non-empty string")
    weight = raw.get("weight")
    if not _is_number(weight) or weight <= 0:
        raise ConfigError(f"{at}: field 'weight' must be a number greater than 0")
    timeout = raw.get("timeout", DEFAULT_TIMEOUT)
    if not _is_number(timeout) or timeout != int(timeout) or not 1 <= timeout <= MAX_TIMEOUT:
        raise ConfigError(f"{at}: field 'timeout' must be a whole number of seconds from 1 to {MAX_TIMEOUT}")
    writes = raw.get("writes")
    if writes is not None:
        if isinstance(writes, str):
            writes = [writes]
        if not isinstance(writes, list) or not writes or not all(isinstance(w, str) and w.strip() for w in writes):
            raise ConfigError(f"{at}: field 'writes' must be a non-empty list of glob strings")
        if any(w.strip().startswith("/") or ".." in w.split("/") for w in writes):
            raise ConfigError(f"{at}: field 'writes' holds repository-relative globs (no leading '/', no '..')")
        writes = tuple(w.strip() for w in writes)
    return Goal(
        id=gid,
        description=raw["description"].strip(),
        check=raw["check"].strip(),
        weight=float(weight),
        timeout=int(timeout),
        writes=writes,
        metric=_metric(raw.get("metric"), at),
    )


def _metric(raw: Any, at: str) -> Metric | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{at}: field 'metric' must be a mapping with direction and threshold")
    if unknown := sorted(set(raw) - _METRIC_FIELDS):
        raise ConfigError(
            f"{at}: field 'metric.{unknown[0]}' is unknown (allowed: {', '.join(sorted(_METRIC_FIELDS))})"
        )
    direction = raw.get("direction")
    if direction not in ("higher", "lower"):
        raise ConfigError(f"{at}: field 'metric.direction' must be 'higher' or 'lower', got {direction!r}")
    if not _is_number(raw.get("threshold")):
        raise ConfigError(f"{at}: field 'metric.threshold' must be a number")
    tolerance = raw.get("tolerance", 0.0)
    if not _is_number(tolerance) or tolerance < 0:
        raise ConfigError(f"{at}: field 'metric.tolerance' must be a number >= 0")
    key = raw.get("json_key")
    if key is not None and (not isinstance(key, str) or not key.strip() or "" in key.split(".")):
        raise ConfigError(f"{at}: field 'metric.json_key' must be a dotted key like 'totals.percent'")
    return Metric(direction=direction, threshold=float(raw["threshold"]), json_key=key, tolerance=float(tolerance))


def validate_goals(data: Any, where: str = "goals") -> list[Goal]:
    """Goals from a parsed goals document (mapping with version+goals) or a bare list."""
    if isinstance(data, dict):
        if unknown := sorted(set(data) - {"version", "goals"}):
            raise ConfigError(f"{where}: unknown top-level field {unknown[0]!r} (allowed: version, goals)")
        if data.get("version") != 1:
            raise ConfigError(f"{where}: field 'version' must be 1, got {data.get('version')!r}")
        data = data.get("goals")
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{where}: field 'goals' must be a non-empty list")
    goals = [_goal(raw, i, where) for i, raw in enumerate(data)]
    seen: set[str] = set()
    for g in goals:
        if g.id in seen:
            raise ConfigError(f"{where}: goal {g.id!r}: field 'id' is used by more than one goal")
        seen.add(g.id)
    return goals


def load_goals_file(path: Path, shown: str | None = None) -> list[Goal]:
    shown = shown or str(path)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot read goals file ({exc.__class__.__name__}: {exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{shown}:{line} is not valid YAML: {problem}") from None
    return validate_goals(data, shown)


def goals_from_param(value: Any) -> list[Goal]:
    """The strategy's view of the recorded ``goals`` parameter (validated again: cheap, catches hand edits)."""
    if isinstance(value, str):
        raise ConfigError("evolve: -S goals=FILE must be loaded by the strategy's prepare step before the run")
    return validate_goals(value, "goals")


def check_max_parallel(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLEL_CAP:
        raise ConfigError(
            f"evolve: -S max_parallel must be a whole number from 1 to {MAX_PARALLEL_CAP} "
            f"(1 = sequential), got {value!r}"
        )
    return value


def prepare(params: dict[str, Any], repo_path: str) -> dict[str, Any]:
    out = dict(params)
    check_max_parallel(out.get("max_parallel", 3))
    for name, default, least in _WHOLE_NUMBERS:
        value = out.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"evolve: -S {name} must be a whole number >= {least}, got {value!r}")
    value = out.get("retry_backoff_s", 60.0)
    if not _is_number(value) or value < 0:
        raise ConfigError(f"evolve: -S retry_backoff_s must be a number >= 0 (seconds), got {value!r}")
    for name in ("max_cost_usd", "max_wall_s"):
        value = out.get(name)
        if value is not None and (not _is_number(value) or value <= 0):
            raise ConfigError(f"evolve: -S {name} must be a number > 0, got {value!r}")
    value = out.get("goals")
    if value is None:
        raise ConfigError("evolve: needs -S goals=GOALS.yaml (the goals file, see docs/evolve.md)")
    if isinstance(value, str):
        given = Path(value).expanduser()
        candidates = [given] if given.is_absolute() else [Path(repo_path) / given, Path.cwd() / given]
        # Run from the repository itself, both are one file: named once in the message.
        candidates = list({p.resolve(): p for p in candidates}.values())
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            tried = " or ".join(str(p) for p in candidates)
            raise ConfigError(f"{value}: goals file not found (looked for {tried})")
        goals = load_goals_file(found, value)
    else:
        goals = validate_goals(value, "goals")
    out["goals"] = to_json(goals)  # through JSON: the value equals what the event log records (lists, not tuples)
    return out
