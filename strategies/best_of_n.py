"""best-of-n: N candidates in parallel, each scored by a read-only reviewer, the best one wins (docs/strategies.md).

Keys come from data and ties go to the lowest generation index: the outcome never depends on completion order.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from orchestrator.strategy import ConfigError, Context, ImportPolicy, RunView, TaskInput, TaskResult, strategy_options

from ._report import best_of_n_sections as report_sections  # noqa: F401  (the run report's sections)
from ._report_tasks import report_task  # noqa: F401  (its command tasks in the report)
from ._scoring import (
    DEFAULT_CRITERIA,
    branch_of,
    concurrently,
    failure,
    kept_unreviewed,
    none_scored,
    pick_best,
    review_task,
    score_into,
    with_model,
    write_output,
)
from .branch_cleanup import listed_for_deletion


def _prepare(params: dict[str, Any], repo_path: str) -> dict[str, Any]:
    if params.get("n", 1) < 1:
        raise ConfigError(f"best-of-n: -S n must be at least 1, got {params['n']}")
    approaches = params.get("approaches") or []
    if not all(isinstance(a, str) and a.strip() for a in approaches):
        raise ConfigError("best-of-n: -S approaches must be a JSON list of non-empty strings")
    return params


def generation_task(
    prompt: str, approaches: list[str], i: int, base_branch: str, import_policy: ImportPolicy, model: str | None
) -> TaskInput:
    """Candidate ``i``'s task: the prompt, plus approach ``i`` (cycled) when approaches are given."""
    if approaches:
        prompt = f"{prompt}\n\nApproach to take for this attempt:\n{approaches[i % len(approaches)]}"
    return with_model({"prompt": prompt, "base_branch": base_branch, "import_policy": import_policy}, model)


@strategy_options(prepare=_prepare)
async def best_of_n(
    prompt,
    base_branch,
    ctx: Context,
    *,
    n: Annotated[int, "number of candidates generated in parallel"] = 5,
    model: Annotated[str | None, "model for the candidates; unset: the run's --model"] = None,
    scorer_model: Annotated[str | None, "model for the reviewers; unset: the run's --model"] = None,
    criteria: Annotated[str, "what the reviewer judges"] = DEFAULT_CRITERIA,
    approaches: Annotated[list, "optional hints; candidate i gets approaches[i % len]"] = [],  # noqa: B006
    import_policy: Annotated[ImportPolicy, "branch creation for candidates"] = "auto",
    keep_branches: Annotated[bool, "keep the candidates' branches; false: delete those not selected at the end"] = True,
):
    """N candidates in parallel, each scored 0-10 by a reviewer; returns the best one."""
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    scored: list[tuple[float, int, TaskResult]] = []
    finished: list[tuple[int, TaskResult]] = []  # candidates that produced a result, scored or not
    reviewer = functools.partial(review_task, prompt=prompt, base=base_branch, criteria=criteria, model=scorer_model)

    async def candidate(i: int) -> None:
        key = ctx.key("gen", i)
        try:
            task = generation_task(prompt, approaches, i, base_branch, import_policy, model)
            result = await ctx.wait(ctx.run(task, key=key))
        except ctx.errors.TaskFailed as exc:
            rows[i] = {"index": i, "key": key, "status": "failed", "error": failure(exc)}
            return
        branch = branch_of(result)
        rows[i] = {
            "index": i,
            "key": key,
            "instance_id": result["instance_id"],
            "branch": branch,
            "has_changes": result["artifact"]["has_changes"],
        }
        review = reviewer(subject="one candidate solution", subject_text=result["final_message"], branch=branch)
        if await score_into(ctx, rows[i], review, ("score", result["instance_id"])):
            scored.append((rows[i]["score"], i, result))
        finished.append((i, result))

    await concurrently([functools.partial(candidate, i) for i in range(n)])
    return _select(ctx, rows, scored, finished, base_branch=base_branch, keep_branches=keep_branches)


def _select(
    ctx: Context,
    rows: list[dict[str, Any]],
    scored: list[tuple[float, int, TaskResult]],
    finished: list[tuple[int, TaskResult]],
    *,
    base_branch: str,
    keep_branches: bool,
) -> dict[str, Any]:
    """Write ``scores.json`` and ``best_branch.txt``; the winner's TaskResult with the summary's verdict line."""
    report: dict[str, Any] = {
        "strategy_execution_id": ctx.strategy_execution_id,
        "n": len(rows),
        "tie_break": "highest score, then lowest generation index",
        "candidates": rows,
        "selected": None,
    }
    if not scored and finished and any("budget_reached" in str(r.get("error", "")) for r in rows):
        # The spending cap stopped the reviews: the best so far is the first finished candidate, unscored.
        index, best = min(finished, key=lambda t: t[0])
        report["selected"] = {"index": index, "instance_id": best["instance_id"], "branch": branch_of(best)}
        write_output(ctx, "scores", "json", report)
        write_output(ctx, "best_branch", "txt", branch_of(best) + "\n")
        return kept_unreviewed(best, f"gen/{index}", "any review")
    if not scored:
        write_output(ctx, "scores", "json", report)
        raise none_scored(ctx, rows, "scores")
    score, index, best = pick_best(scored)
    report["selected"] = {"index": index, "instance_id": best["instance_id"], "branch": branch_of(best), "score": score}
    if not keep_branches:  # a candidate that changed nothing has no branch of its own
        report["delete_branches"] = [
            b for r in rows if (b := r.get("branch")) and b not in (branch_of(best), base_branch)
        ]
    write_output(ctx, "scores", "json", report)
    write_output(ctx, "best_branch", "txt", branch_of(best) + "\n")
    # The winner's TaskResult (so the run selects its branch), plus the one line the summary shows.
    return {**best, "verdict": verdict_line(rows, index, score)}


def verdict_line(rows: list[dict[str, Any]], index: int, score: float) -> str:
    """``gen/1 won with score 8 (others: gen/0 6, gen/2 8, tie: lowest index wins; gen/3 failed)``."""
    others = []
    for r in rows:
        if r["index"] == index:
            continue
        shown = f"{r['score']:g}" if r.get("score") is not None else r["status"]
        others.append(f"gen/{r['index']} {shown}")
    tie = any(r["index"] != index and r.get("score") == score for r in rows)
    tail = ", tie: lowest index wins" if tie else ""
    return f"gen/{index} won with score {score:g}" + (f" (others: {', '.join(others)}{tail})" if others else "")


def branches_to_delete(run: RunView) -> list[str]:
    """After a finished run: the unselected candidates of each execution run with ``keep_branches=false``."""
    return listed_for_deletion(run, "scores")
