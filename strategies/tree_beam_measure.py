"""Measuring a commit like a careful engineer: repeats, intervals, paired confirmation, a protected evaluator.

One measurement is ONE command task: every run in one container is what makes a paired A B A B comparison
fair. Its first line, ``# orch-measure <json>``, names the runs, so a scripted benchmark (tests,
bench/search_quality.py) can answer without a shell. The rules: docs/tree-beam.md.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import statistics
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from orchestrator.strategy import BudgetScope

from .base_check import could_not_run, named_command
from .evaluation import Evaluation, ScoringConfig, evaluation_of_output, to_json
from .pipeline import command_task

RUN_MARK = "@@orch-run "
PROTECTED_MARK = "@@orch-protected-changed "
DONE_MARK = "@@orch-done"
LOG_MARK = "| "
ERR_MARK = "!| "


def default_protected_paths(eval_command: str) -> list[str]:
    """Files the evaluation command names (``bench.py``, ``./scripts/run.sh``), and ``bench/``."""
    try:
        tokens = shlex.split(eval_command)
    except ValueError:
        tokens = eval_command.split()
    paths = []
    skip_next = False
    for tok in tokens:
        if skip_next or tok in ("-c", "-e", "--eval", "--command"):
            skip_next = not skip_next  # the next token is code, not a file
            continue
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_./-]*", tok.removeprefix("./")) or ".." in tok:
            continue
        if "/" in tok or ("." in tok and tok.rsplit(".", 1)[1].isalnum() and not tok.replace(".", "").isdigit()):
            path = tok.removeprefix("./")
            if path and path not in paths:
                paths.append(path)
    return paths + (["bench/"] if "bench/" not in paths else [])


def measure_command(
    eval_command: str, runs: list[tuple[str, str]], *, root: str = "HEAD", protected: list[str] | tuple[str, ...] = ()
) -> str:
    """A POSIX sh script running ``eval_command`` per ``(label, ref)`` (a commit or ``HEAD``), protected paths from ``root``."""
    header = json.dumps(
        {"runs": [list(r) for r in runs], "root": root, "protected": list(protected)}, separators=(",", ":")
    )
    refs: dict[str, str] = {}
    for label, ref in runs:
        if refs.setdefault(label, ref) != ref:
            raise ValueError(f"label {label!r} names two commits")
    q = shlex.quote
    lines = [
        f"# orch-measure {header}",
        "set -u -f",  # -f: no globbing, a protected path is a path
        "G='git -c safe.directory=* -c advice.detachedHead=false'",
        "W=$(mktemp -d /tmp/orch-eval.XXXXXX) || exit 3",
        'resolve() { if [ "$1" = HEAD ]; then $G -C /workspace rev-parse HEAD; else echo "$1"; fi; }',
        f"ROOT=$(resolve {q(root)}) || exit 3",
        f"PROT={q(' '.join(protected))}",
        f"CMD={q(eval_command)}",
        "prep() {",
        '  d="$W/$1"',
        '  c=$(resolve "$2") || exit 3',
        '  $G clone -q --shared --no-checkout /workspace "$d" >/dev/null 2>&1'
        ' || { echo "cannot clone /workspace" >&2; exit 3; }',
        '  $G -C "$d" checkout -q --detach "$c" || { echo "cannot check out $c" >&2; exit 3; }',
        # What git ignores but the project needs to run (a .venv/ or node_modules/ the
        # environment's setup made) is not in a clone: it comes from the workspace.
        "  $G -C /workspace ls-files -z --others --ignored --exclude-standard --directory"
        ' | (cd /workspace && tar --null -T - -cf - 2>/dev/null) | tar -C "$d" -xf - 2>/dev/null',
        '  if [ -n "$PROT" ]; then',
        '    changed=$($G -C "$d" diff --name-only "$ROOT" "$c" -- $PROT | tr \'\\n\' \' \')',
        f'    [ -n "$changed" ] && echo "{PROTECTED_MARK}$1 $changed"',
        '    for p in $PROT; do rm -rf "$d/$p"; $G -C "$d" checkout -q "$ROOT" -- "$p" 2>/dev/null; done',
        "  fi",
        "  return 0",
        "}",
        'once() { ( cd "$W/$1" && sh -c "$CMD" ) >"$W/out" 2>"$W/err"; }',
        # What is shown of a run names the repository's paths, not this script's clones
        # (python3: can't open file 'bench.py', not '/tmp/orch-eval.X/c/bench.py').
        'shown() { sed -e "s|$W/[A-Za-z0-9_.-]*/||g" -e "s|$W/[A-Za-z0-9_.-]*|.|g"; }',
        "run() {",
        '  a=1; once "$2"; rc=$?',
        '  if [ $rc -ne 0 ]; then a=2; once "$2"; rc=$?; fi',
        "  if [ $rc -eq 0 ]; then last=$(grep -v '^[[:space:]]*$' \"$W/out\" | tail -n 1)",
        "  else last=$(shown < \"$W/err\" | tail -c 300 | tr '\\n' ' '); fi",
        f'  echo "{RUN_MARK}$1 $2 $rc $a $last"',
        "}",
    ]
    for label, ref in refs.items():
        lines.append(f"prep {q(label)} {q(ref)}")
    for i, (label, _ref) in enumerate(runs):
        lines.append(f"run {i} {q(label)}")
    # the last run's own output, trimmed, for the agents' prompts and eval.log; its stderr for
    # a base evaluation that cannot be used (the run stops showing both)
    lines += [
        f"tail -n 20 \"$W/out\" | shown | sed 's/^/{LOG_MARK}/'",
        f"tail -n 20 \"$W/err\" | shown | sed 's/^/{ERR_MARK}/'",
        f"echo {DONE_MARK} {len(runs)}",
        'rm -rf "$W"',
        named_command(eval_command),
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Runs:
    """Parsed runs of one measurement task: evaluations per label, in run order."""

    by_label: dict[str, list[Evaluation]] = field(default_factory=dict)
    flaky: int = 0  # runs that failed once and passed on the retry
    failed: list[str] = field(default_factory=list)  # runs that failed twice: the reasons
    protected_changed: dict[str, list[str]] = field(default_factory=dict)
    log: str = ""
    err_log: str = ""  # the last run's stderr, trimmed
    complete: bool = False
    # each run's marker line split: index, label, exit status, attempts[, last line]
    rows: list[list[str]] = field(default_factory=list)


def parse_runs(text: str, commit: str | None = None) -> Runs:
    out = Runs()
    log, err_log = [], []
    for line in (text or "").splitlines():
        if line.startswith(RUN_MARK):
            parts = line[len(RUN_MARK) :].split(" ", 4)
            if len(parts) < 4:
                continue
            out.rows.append(parts)
            _i, label, rc, attempts = parts[:4]
            last = parts[4] if len(parts) > 4 else ""
            if rc != "0":
                error = could_not_run(int(rc), last) if rc in ("126", "127") else None
                error = error or f"command: exit code {rc}: {last.strip()[:300]}"
                ev = Evaluation(status="failed", commit=commit, error=error)
            else:
                ev = evaluation_of_output(last, commit)
            if ev.status != "ok":
                out.failed.append(ev.error or "")
            if attempts != "1" and rc == "0":
                out.flaky += 1
            out.by_label.setdefault(label, []).append(ev)
        elif line.startswith(PROTECTED_MARK):
            label, _, paths = line[len(PROTECTED_MARK) :].partition(" ")
            out.protected_changed[label] = sorted(p for p in paths.split() if p)
        elif line.startswith(DONE_MARK):
            out.complete = True
        elif line.startswith(LOG_MARK):
            log.append(line[len(LOG_MARK) :])
        elif line.startswith(ERR_MARK):
            err_log.append(line[len(ERR_MARK) :])
    out.log = "\n".join(log)
    out.err_log = "\n".join(err_log)
    return out


def _betacf(a: float, b: float, x: float) -> float:
    # Continued fraction of the regularized incomplete beta function (Lentz's method).
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        # the even and the odd step of the fraction
        for aa in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)), -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
            delta = d * c
            h *= delta
        if abs(delta - 1.0) < 1e-12:
            break
    return h


def _t_cdf(t: float, df: int) -> float:
    x = df / (df + t * t)
    lbeta = math.lgamma(df / 2) + math.lgamma(0.5) - math.lgamma(df / 2 + 0.5)
    front = math.exp(math.log(x) * df / 2 + math.log(1 - x) * 0.5 - lbeta) if 0 < x < 1 else 0.0
    if x <= 0:
        ib = 0.0
    elif x < (df / 2 + 1) / (df / 2 + 0.5 + 2):
        ib = front * _betacf(df / 2, 0.5, x) / (df / 2)
    else:
        ib = 1.0 - front * _betacf(0.5, df / 2, 1 - x) / 0.5
    tail = 0.5 * ib
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile (bisection on the CDF; exact enough for intervals)."""
    lo, hi = 0.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def interval(values: list[float], confidence: float) -> dict[str, Any]:
    """Median, mean and the two-sided Student-t interval of the mean (zero width below two values)."""
    n = len(values)
    mean = statistics.fmean(values)
    hw = t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(values) / math.sqrt(n) if n >= 2 else 0.0
    return _stats(n, statistics.median(values), mean, hw)


def _stats(n: int, median: float, mean: float, half_width: float) -> dict[str, Any]:
    """An interval's figures, rounded: float noise makes JSON unstable."""
    hw = half_width
    figures = {"median": median, "mean": mean, "low": mean - hw, "high": mean + hw, "half_width": hw}
    return {"n": n, **{k: round(v, 9) for k, v in figures.items()}}


def summarize(samples: list[Evaluation], confidence: float) -> Evaluation:
    """The median of every metric over repeated runs (intervals in ``stats``); a failed run fails it: a number from
    the runs that happened to work would hide a broken candidate."""
    if not samples:
        return Evaluation(status="failed", error="the measurement produced no runs (output cut short?)")
    if failed := [s for s in samples if s.status != "ok"]:
        return Evaluation(status="failed", commit=failed[0].commit, error=failed[0].error, samples=len(samples))
    names = sorted(set.intersection(*(set(s.metrics) for s in samples)))
    stats = {}
    for name in names:
        values = [s.metrics[name] for s in samples]
        finite = [v for v in values if math.isfinite(v)]
        stats[name] = interval(finite, confidence) if len(finite) == len(values) else None
    metrics = {k: (v["median"] if v else float("nan")) for k, v in stats.items()}
    first = samples[0]
    return Evaluation(
        status="ok",
        metrics=metrics,
        valid=all(s.valid for s in samples),
        expected=first.expected,
        ok=min((s.ok for s in samples if s.ok is not None), default=None),
        recommendation=first.recommendation if len(samples) == 1 else None,
        commit=first.commit,
        samples=len(samples),
        stats={k: v for k, v in stats.items() if v},
    )


def decide(change: dict[str, Any], tolerance: float, *, strict_better: bool = False) -> tuple[bool, str]:
    """Gate on the interval of the primary metric's relative change (positive = better)."""
    if change["high"] < 0 and change["half_width"] > tolerance:
        return False, "confirmed_regression"
    if change["half_width"] <= tolerance:
        if change["mean"] > 0:
            return True, "improved_tight_interval"
        if change["mean"] == 0 and not strict_better:
            return True, "no_regression_tight_interval"
        return False, "regressed_tight_interval" if change["mean"] < 0 else "no_change_tight_interval"
    return (True, "improvement_above_noise") if change["low"] > 0 else (False, "inconclusive_within_noise")


def paired_change(runs: Runs, scoring: ScoringConfig, confidence: float) -> dict[str, Any] | None:
    """The interval of the primary change over A B pairs (parent ``p``, candidate ``c``), or None."""
    name = scoring.primary_metric
    p = [e.metrics.get(name) for e in runs.by_label.get("p", [])]
    c = [e.metrics.get(name) for e in runs.by_label.get("c", [])]
    pairs = [
        (a, b)
        for a, b in zip(p, c, strict=False)
        if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
    ]
    if not pairs or len(pairs) != len(p) or len(p) != len(c):
        return None
    sign = 1.0 if scoring.direction == "max" else -1.0
    return interval([sign * (b - a) / (abs(a) if a != 0 else 1.0) for a, b in pairs], confidence)


def unpaired_change(
    parent: Evaluation, candidate: Evaluation, scoring: ScoringConfig, confidence: float
) -> dict[str, Any] | None:
    """Welch-style interval of the relative change of means between two separate measurements."""
    sp, sc = (parent.stats or {}).get(scoring.primary_metric), (candidate.stats or {}).get(scoring.primary_metric)
    if not sp or not sc:
        return None
    base = abs(sp["mean"]) if sp["mean"] != 0 else 1.0
    sign = 1.0 if scoring.direction == "max" else -1.0
    mean = sign * (sc["mean"] - sp["mean"]) / base

    def se(s):  # the interval's half-width back to a standard error
        return 0.0 if s["n"] < 2 else s["half_width"] / t_quantile(0.5 + confidence / 2, s["n"] - 1)

    err = math.sqrt(se(sp) ** 2 + se(sc) ** 2) / base
    df = max(1, min(sp["n"], sc["n"]) - 1)
    hw = t_quantile(0.5 + confidence / 2, df) * err if err else 0.0
    return _stats(min(sp["n"], sc["n"]), mean, mean, hw)


class Spending:
    """``ctx`` that charges every finished task's cost to the run's budget, asked at the points the search chooses."""

    def __init__(self, ctx, *, max_cost_usd: float | None, max_wall_s: float | None) -> None:
        self._ctx, self._timed = ctx, max_wall_s is not None
        self._clock = ctx.now() if self._timed else 0.0
        # The budget reads the time over_budget last asked ctx for, never ctx itself.
        self.budget = BudgetScope(lambda: self._clock, max_cost_usd=max_cost_usd, max_wall_s=max_wall_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def over_budget(self) -> str | None:
        # ctx.now() only at sequential points: a resumed run must ask for the same checkpoints in the same order
        self._clock = self._ctx.now() if self._timed else 0.0
        return self.budget.exhausted()

    async def wait(self, handle):
        result = await self._ctx.wait(handle)
        self.budget.charge(result)
        return result


class Measurer:
    """Every measurement of one run: same script, same repeats, one concurrency limit."""

    def __init__(self, ctx, cfg: dict[str, Any], scoring: ScoringConfig) -> None:
        self.ctx, self.cfg, self.scoring = ctx, cfg, scoring
        self.limiter = anyio.CapacityLimiter(cfg["eval_parallel"])
        self.root_commit = "HEAD"
        self.root_expected: int | None = None

    async def runs(
        self, branch: str, key_parts: tuple, runs: list[tuple[str, str]]
    ) -> tuple[Runs | None, str | None, str]:
        """``(parsed runs, evaluated commit, error)``; parsed runs is None when the task itself failed."""
        cmd = measure_command(
            self.cfg["eval_command"], runs, root=self.root_commit, protected=self.cfg["protected_paths"]
        )
        timeout = self.cfg["eval_timeout_s"]
        async with self.limiter:
            handle = self.ctx.run(
                command_task(cmd, branch, timeout=timeout * 2 * len(runs) if timeout else None),
                key=self.ctx.key(*key_parts),
            )
            try:
                result = await self.ctx.wait(handle)
            except self.ctx.errors.TaskFailed as exc:
                return None, None, f"{exc.error_type}: {exc.message.strip()[-400:]}"
        commit = (result.get("artifact") or {}).get("commit")
        parsed = parse_runs(result.get("final_message") or "", commit)
        return parsed, commit, "" if parsed.complete else "the measurement's output was cut short (no end marker)"

    def pin(self, ev: Evaluation) -> Evaluation:
        """The row count a candidate must reach is the root's, whatever its own benchmark claims."""
        if self.root_expected is None or ev.status != "ok":
            return ev
        return msgspec.structs.replace(ev, expected=self.root_expected)

    async def screen(self, branch: str, key_parts: tuple, info: dict[str, Any]) -> tuple[Evaluation, str]:
        parsed, commit, error = await self.runs(branch, key_parts, [("c", "HEAD")] * self.cfg["eval_repeats"])
        info.update(
            flaky_runs=parsed.flaky if parsed else 0,
            protected_changed=parsed.protected_changed.get("c", []) if parsed and not error else [],
            log=parsed.log if parsed else "",
            err_log=parsed.err_log if parsed else error,  # the task failed: its message is the output
        )
        if parsed is None or error:
            return Evaluation(status="failed", commit=commit, error=error), error
        ev = summarize(parsed.by_label.get("c", []), self.cfg["confidence"])
        return self.pin(msgspec.structs.replace(ev, commit=commit)), parsed.log

    async def confirm(
        self, branch: str, key_parts: tuple, parent_commit: str | None, *, strict_better: bool = False
    ) -> dict[str, Any]:
        """Parent and candidate re-measured paired, interleaved (p c p c ...), in one container."""
        pairs = self.cfg["confirm_pairs"]
        parsed, _commit, error = await self.runs(
            branch, key_parts, [("p", parent_commit or "HEAD"), ("c", "HEAD")] * pairs
        )
        out: dict[str, Any] = {
            "pairs": pairs,
            "change": None,
            "passed": False,
            "reason": "",
            "error": None,
            "flaky_runs": parsed.flaky if parsed else 0,
            "parent": None,
            "candidate": None,
        }
        if parsed is None or error or parsed.failed:
            out.update(reason="confirmation_failed", error=error or (parsed.failed[0] if parsed else "no runs"))
            return out
        parent = summarize(parsed.by_label.get("p", []), self.cfg["confidence"])
        cand = self.pin(summarize(parsed.by_label.get("c", []), self.cfg["confidence"]))
        out.update(parent=to_json(parent), candidate=to_json(cand))
        change = paired_change(parsed, self.scoring, self.cfg["confidence"])
        if change is None:
            out.update(reason="primary_metric_missing")
            return out
        if not cand.complete:
            out.update(change=change, reason="incomplete_evaluation")
            return out
        passed, reason = decide(change, self.scoring.tolerance, strict_better=strict_better)
        out.update(change=change, passed=passed, reason=reason)
        return out


def merge_measurements(a: Evaluation, b: Evaluation) -> Evaluation:
    """Two measurements of the same commit as one (screening runs plus confirmation runs)."""
    # Only medians and intervals survive summarising; rebuild from them weighted by run counts.
    if not a.stats or not b.stats:
        return a
    stats = {}
    for name in sorted(set(a.stats) & set(b.stats)):
        sa, sb = a.stats[name], b.stats[name]
        n = sa["n"] + sb["n"]
        mean = (sa["mean"] * sa["n"] + sb["mean"] * sb["n"]) / n
        median = (sa["median"] * sa["n"] + sb["median"] * sb["n"]) / n
        hw = min(sa["half_width"], sb["half_width"]) if sa["n"] and sb["n"] else max(sa["half_width"], sb["half_width"])
        stats[name] = _stats(n, median, mean, hw)
    metrics = {k: v["median"] for k, v in stats.items()}
    return msgspec.structs.replace(a, metrics=metrics, stats=stats, samples=a.samples + b.samples)
