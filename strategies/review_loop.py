"""review-loop: every idea through plan -> code -> review rounds -> tests -> evaluation (docs/review-loop.md).

``prepare`` reads the ideas before the run starts, so a resume never re-reads changed files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import anyio

from orchestrator.strategy import BaseEvaluationFailed, BudgetExhausted, ConfigError, Context, strategy_options

from ._report import review_loop_sections as report_sections  # noqa: F401  (the run report's sections)
from ._report_tasks import report_task  # noqa: F401  (its command tasks in the report)
from .base_check import (
    TESTS_CANNOT_RUN,
    BaseRun,
    evaluation_of,
    run_on_base,
    summary_of,
    unusable_evaluation,
    why_tests_cannot_run,
)
from .evaluation import Direction, Evaluation, ScoringConfig, check_scoring, fmt_number, to_json
from .pipeline import Idea, PipelineConfig, run_idea, write_json

MAX_IDEA_BYTES = 64 * 1024
# The scoring parameters as review-loop and tree-beam describe them (``--help``).
EvalCommand = Annotated[str | None, "evaluation command (last stdout line: JSON metrics)"]
PrimaryMetric = Annotated[str | None, "metric that decides better/worse"]
DirectionParam = Annotated[Direction, "whether the primary metric should go up or down"]
Weights = Annotated[dict, 'weights of other metrics, e.g. {"latency_ms": -0.5}']
# The run budget's two limits as review-loop and evolve describe them (``--help``).
MaxCostUsd = Annotated[
    float | None, "start no new task once the run's tasks cost this many US dollars (null: no limit)"
]
MaxWallS = Annotated[float | None, "start no new task once the run is this many seconds old (null: no limit)"]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "idea"


def title_of(text: str) -> str:
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return first.lstrip("#").strip()[:100] or "(untitled)"


def load_ideas(spec: str | None, repo_path: str) -> list[dict[str, str]]:
    """Ideas from a file or a directory (sorted), as ``[{id, title, text}]``; [] means "use the prompt"."""
    if not spec:
        return []
    path = Path(spec).expanduser()
    if not path.is_absolute() and not path.exists():
        path = Path(repo_path) / spec
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise ConfigError(f"-S ideas={spec}: the directory has no idea files")
    elif path.is_file():
        files = [path]
    else:
        raise ConfigError(f"-S ideas={spec}: no such file or directory")
    ideas = []
    for i, f in enumerate(files, 1):
        try:
            data = f.read_bytes()
        except OSError as exc:
            raise ConfigError(f"-S ideas: cannot read {f}: {exc.strerror}") from None
        if len(data) > MAX_IDEA_BYTES:
            raise ConfigError(f"-S ideas: {f} is larger than {MAX_IDEA_BYTES // 1024} KiB; one idea per file")
        try:
            text = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError(f"-S ideas: {f} is not UTF-8 text") from None
        if not text:
            raise ConfigError(f"-S ideas: {f} is empty")
        ideas.append({"id": f"{i:02d}-{_slug(f.stem)}", "title": title_of(text), "text": text})
    return ideas


def prepare(params: dict[str, Any], repo_path: str) -> dict[str, Any]:
    """Read the idea files (their content is what gets recorded) and check the parameters."""
    out = dict(params)
    if isinstance(out.get("ideas"), str):
        out["ideas"] = load_ideas(out["ideas"], repo_path)
    if out.get("max_review_rounds", 2) < 0:
        raise ConfigError("-S max_review_rounds must be >= 0")
    check_scoring(out)
    for name in ("max_cost_usd", "max_wall_s"):
        value = out.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"review-loop: -S {name} must be a number > 0, got {value!r}")
    return out


def output_root(ctx: Context) -> Path:
    """``strategy_output/`` for the first execution, ``strategy_output/<sid>/`` for ``--runs`` > 1."""
    root = Path(ctx.output_dir())
    return root if ctx.strategy_execution_id == "s1" else root / ctx.strategy_execution_id


def rank_outcomes(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ideas by score (desc), then primary delta (desc), then idea id; unscored ideas last."""

    def key(o: dict[str, Any]):
        cmp = o.get("comparison") or {}
        score, delta = cmp.get("score"), cmp.get("primary_delta")
        return (
            o["status"] != "completed",
            score is None,
            -(score or 0.0),
            delta is None,
            -(delta or 0.0),
            o["idea_id"],
        )

    rows = []
    for rank, o in enumerate(sorted(outcomes, key=key), 1):
        cmp = o.get("comparison") or {}
        rows.append(
            {
                "rank": rank,
                "idea_id": o["idea_id"],
                "title": o["title"],
                "status": o["status"],
                "score": cmp.get("score"),
                "grade": cmp.get("grade"),
                "primary_delta": cmp.get("primary_delta"),
                "verdicts": [r["verdict"] for r in o["rounds"]],
                "branch": o["branch"],
                "error": o["error"],
            }
        )
    return rows


BEATS_BASE = ("strong", "promising")


def beats_base(row: dict[str, Any]) -> bool:
    """A completed idea whose evaluation is better than the base's and whose primary metric is not worse."""
    delta = row.get("primary_delta")
    return row["status"] == "completed" and row.get("grade") in BEATS_BASE and delta is not None and delta >= 0


def pick_best(rows: list[dict[str, Any]], evaluated: bool) -> tuple[dict[str, Any] | None, str]:
    """The best idea and a one-line verdict. With an evaluation the base is a candidate: a regression never wins."""
    if not evaluated:
        best = next((r for r in rows if r["status"] == "completed"), None)
        return best, (
            f"best: {best['idea_id']} (not evaluated: the top completed idea)" if best else "no idea completed"
        )
    best = next((r for r in rows if beats_base(r)), None)
    if best is not None:
        return best, f"best: {best['idea_id']} beat the base (score {fmt_number(best['score'])}, grade {best['grade']})"
    top = next((r for r in rows if r["status"] == "completed"), None)
    if top is None:
        return None, "nothing beat the base: no idea completed"
    return None, (
        f"nothing beat the base: the top completed idea, {top['idea_id']}, scored {fmt_number(top['score'])} "
        f"(grade {top['grade'] or '-'}, primary delta {fmt_number(top['primary_delta'])})"
    )


def ranking_line(rows: list[dict[str, Any]], tests: dict[str, Any]) -> str:
    """``1. 02-x score 25, tests passed; 2. 01-y tests_failed`` (the summary's ranking, in one line)."""
    parts = []
    for r in rows:
        shown = [f"score {fmt_number(r['score'])}"] if r["score"] is not None else []
        if r["status"] != "completed":
            shown.append(r["status"])
        t = tests.get(r["idea_id"])
        if t is not None and r["status"] == "completed":
            shown.append("tests passed" if t.get("passed") else "tests failed")
        parts.append(f"{r['rank']}. {r['idea_id']} " + ", ".join(shown))
    return "; ".join(parts)


def ranking_markdown(
    rows: list[dict[str, Any]], baseline: dict[str, Any] | None, verdict: str = "", stop_reason: str | None = None
) -> str:
    lines = ["# review-loop: ideas ranked by score", ""]
    if verdict:
        lines += [verdict[:1].upper() + verdict[1:] + ".", ""]
    if stop_reason:
        lines += [f"Stopped early: {stop_reason}.", ""]
    if baseline is not None:
        lines += [
            f"Baseline ({baseline.get('status')}): metrics {baseline.get('metrics')}"
            + (f", error {baseline['error']}" if baseline.get("error") else ""),
            "",
        ]
    lines += [
        "| rank | idea | status | score | grade | primary delta | verdicts | branch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        verdicts = " -> ".join(v or "?" for v in r["verdicts"]) or "-"
        lines.append(
            f"| {r['rank']} | {r['idea_id']}: {r['title']} | {r['status']} | {fmt_number(r['score'])} | "
            f"{r['grade'] or '-'} | {fmt_number(r['primary_delta'])} | {verdicts} | {r['branch'] or '-'} |"
        )
    return "\n".join(lines) + "\n"


@strategy_options(prepare=prepare)
async def review_loop(
    prompt,
    base_branch,
    ctx: Context,
    *,
    ideas: Annotated[str | None, "idea file or directory (one idea per file); default: the prompt"] = None,
    max_review_rounds: Annotated[int, "coder fix rounds after a rejection"] = 2,
    test_command: Annotated[str | None, "shell command run on the final branch; non-zero stops the idea"] = None,
    eval_command: EvalCommand = None,
    primary_metric: PrimaryMetric = None,
    direction: DirectionParam = "max",
    weights: Weights = {},  # noqa: B006
    tolerance: Annotated[float, "relative noise band (0.01 = 1%)"] = 0.01,
    eval_timeout_s: Annotated[float | None, "timeout of one evaluation"] = None,
    max_cost_usd: MaxCostUsd = None,
    max_wall_s: MaxWallS = None,
):
    """Plan, implement, review (with fix rounds), test and evaluate each idea; rank by score."""
    if isinstance(ideas, str):  # called without prepare (a direct call): read now
        raise ConfigError("review-loop: ideas must be loaded by prepare; pass -S ideas=PATH on the command line")
    loaded: list[dict[str, str]] = ideas or []  # prepare replaced the path with the ideas it read
    items = [Idea(id=i["id"], title=i["title"], text=i["text"]) for i in loaded] or [
        Idea(id="01-prompt", title=title_of(prompt), text=prompt)
    ]
    scoring = (
        ScoringConfig(primary_metric=primary_metric, direction=direction, weights=weights or {}, tolerance=tolerance)
        if eval_command and primary_metric
        else None
    )
    cfg = PipelineConfig(
        review=True,
        max_review_rounds=max_review_rounds,
        test_command=test_command,
        eval_command=eval_command,
        eval_timeout_s=eval_timeout_s,
        scoring=scoring,
    )
    root = output_root(ctx)
    budget = ctx.open_budget(max_cost_usd=max_cost_usd, max_wall_s=max_wall_s)

    baseline, baseline_json, tests_run = await _check_base(ctx, root, base_branch, cfg)
    outcomes = await _run_ideas(ctx, items, prompt, base_branch, cfg, baseline, root)
    evaluated = scoring is not None and baseline_json is not None
    return _result(root, outcomes, baseline_json, tests_run, budget, base_branch=base_branch, evaluated=evaluated)


async def _check_base(
    ctx: Context, root: Path, base_branch: str, cfg: PipelineConfig
) -> tuple[Evaluation | None, dict[str, Any] | None, BaseRun | None]:
    """Evaluate the base and run the tests on it; stop the run when either cannot be used."""
    eval_command, test_command = cfg.eval_command, cfg.test_command
    # The base is checked before any agent task (both commands in parallel): an evaluation that
    # cannot be used, or a test command that cannot run, would fail every idea after it was paid for.
    eval_get = (
        run_on_base(ctx, eval_command, base_branch, ("baseline", "eval"), timeout=cfg.eval_timeout_s)
        if eval_command
        else None
    )
    tests_get = run_on_base(ctx, test_command, base_branch, ("baseline", "tests")) if test_command else None
    eval_run = await eval_get() if eval_get is not None else None
    tests_run = await tests_get() if tests_get is not None else None
    baseline: Evaluation | None = None
    baseline_json: dict[str, Any] | None = None
    if eval_command and eval_run is not None:
        baseline = evaluation_of(eval_run)
        baseline_json = to_json(baseline)
        write_json(root / "baseline.json", baseline_json)
        needed = [cfg.scoring.primary_metric, *sorted(cfg.scoring.weights)] if cfg.scoring else []
        if (stop := unusable_evaluation(baseline, needed)) is not None:
            raise BaseEvaluationFailed(
                stop[1], command=eval_command, output=eval_run.output, keys=(ctx.key("baseline", "eval"),)
            )
    if (
        test_command
        and tests_run is not None
        and (stop_run := tests_cannot_run(ctx, tests_run, test_command, "baseline"))
    ):
        raise stop_run
    return baseline, baseline_json, tests_run


def tests_cannot_run(ctx: Context, tests_run: BaseRun, command: str, step: str) -> BaseEvaluationFailed | None:
    """What stops the run when the test command cannot run at all on the base (``<step>/tests``), else None."""
    why = why_tests_cannot_run(tests_run)
    if why is None:
        return None
    keys = (ctx.key(step, "tests"),)
    return BaseEvaluationFailed(why, command=command, output=tests_run.output, headline=TESTS_CANNOT_RUN, keys=keys)


async def _run_ideas(
    ctx: Context,
    items: list[Idea],
    prompt: str,
    base_branch: str,
    cfg: PipelineConfig,
    baseline: Evaluation | None,
    root: Path,
) -> list[dict[str, Any] | None]:
    """Every idea through the pipeline, in parallel; an idea the budget stopped is recorded as such."""
    outcomes: list[dict[str, Any] | None] = [None] * len(items)

    async def one(i: int, idea: Idea) -> None:
        try:
            outcomes[i] = await run_idea(
                ctx,
                idea,
                goal=prompt,
                base_branch=base_branch,
                key_prefix=("idea", idea.id),
                cfg=cfg,
                baseline=baseline,
                out_dir=root / idea.id,
            )
        except BudgetExhausted as exc:
            # The budget ran out between two of this idea's steps: what it finished stays in the event log.
            outcomes[i] = {
                "idea_id": idea.id,
                "title": idea.title,
                "idea": idea.text,
                "status": "budget_stopped",
                "rounds": [],
                "comparison": None,
                "branch": None,
                "error": str(exc),
            }

    async with anyio.create_task_group() as tg:
        for i, idea in enumerate(items):
            tg.start_soon(one, i, idea)
    return outcomes


def _result(
    root: Path,
    outcomes: list[dict[str, Any] | None],
    baseline_json: dict[str, Any] | None,
    tests_run: BaseRun | None,
    budget: Any,
    *,
    base_branch: str,
    evaluated: bool,
) -> dict[str, Any]:
    """Rank the ideas, write ``ranking.json`` and ``ideas.md``; the strategy's result."""
    rows = rank_outcomes([o for o in outcomes if o is not None])
    write_json(root / "ranking.json", rows)
    best, verdict = pick_best(rows, evaluated)
    if evaluated and best is None and (baseline_json or {}).get("status") != "ok":
        # Without a measured base nothing can be compared: say so rather than blame the ideas.
        error = str((baseline_json or {}).get("error") or "no error recorded").strip().splitlines() or ["?"]
        verdict = f"nothing beat the base: the evaluation of the base itself failed ({error[0][:160].rstrip(': ')})"
    stop_reason = budget.stop_reason
    (root / "ideas.md").write_text(ranking_markdown(rows, baseline_json, verdict, stop_reason), "utf-8")
    tests = {o["idea_id"]: o.get("tests") for o in outcomes if o is not None}
    out = {
        "best": best,
        "verdict": f"{verdict}; ranking: {ranking_line(rows, tests)}" if rows else verdict,
        "ranking": rows,
        "baseline": baseline_json,
        "ideas": outcomes,
    }
    if tests_run is not None:
        out["base_tests"] = summary_of(tests_run)  # failing tests on the base are allowed, and worth knowing
    # What the run recommends merging: the best idea (it passed its review and its tests), the base
    # when an evaluation found nothing better, else nothing (no idea passed its gates).
    out["selected_branch"] = best["branch"] if best is not None else (base_branch if evaluated else None)
    if evaluated:
        # The base is a candidate: when no idea beat it, the base is what the run selects.
        out["best_branch"] = best["branch"] if best is not None else base_branch
    if budget.active:
        out["stopped"] = "budget" if stop_reason else "done"
        out["stop_reason"] = stop_reason
        out["budget"] = budget.summary()
    return out
