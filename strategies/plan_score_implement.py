"""plan-score-implement: plans from several angles, each scored, the best one implemented (docs/strategies.md).

The implementation resumes the winning planner's session and gets the plan in its prompt: plugins that cannot resume work too.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from orchestrator.strategy import ConfigError, Context, TaskInput, TaskResult, strategy_options

from ._scoring import (
    MESSAGE_CHARS,
    concurrently,
    failure,
    pick_best,
    review_task,
    score_into,
    tail,
    with_model,
    write_output,
)

PLAN_CRITERIA = "whether following it would solve the task correctly and completely, its risks and its clarity"


def _prepare(params: dict[str, Any], repo_path: str) -> dict[str, Any]:
    angles = params.get("angles")
    if not isinstance(angles, list) or not angles:
        raise ConfigError('plan-score-implement: -S angles must be a non-empty JSON list, e.g. ["performance"]')
    for a in angles:
        if not isinstance(a, str) or not a.strip() or "/" in a:
            raise ConfigError(f"plan-score-implement: angle {a!r} must be a non-empty string without '/'")
    if len(set(angles)) != len(angles):
        raise ConfigError("plan-score-implement: -S angles has duplicates (each angle names a task key)")
    return params


@strategy_options(prepare=_prepare)
async def plan_score_implement(
    prompt,
    base_branch,
    ctx: Context,
    *,
    angles: Annotated[list, "one planner per angle"] = ["performance", "simplicity", "extensibility"],  # noqa: B006
    model: Annotated[str | None, "model for planners and the implementation"] = None,
    scorer_model: Annotated[str | None, "model for the plan reviewers"] = None,
):
    """Plan from several angles, score the plans, implement the best one in the planner's session."""
    rows: list[dict[str, Any]] = [{} for _ in angles]
    scored: list[tuple[float, int, TaskResult]] = []
    reviewer = functools.partial(
        review_task, prompt=prompt, base=base_branch, criteria=PLAN_CRITERIA, model=scorer_model
    )

    async def plan(i: int, angle: str) -> None:
        task: TaskInput = {
            "prompt": (
                f"Write a detailed, step-by-step implementation plan for the task below, with a focus on "
                f"{angle}. Do not modify any files: reply with the plan only.\n\nTask:\n{prompt}"
            ),
            "base_branch": base_branch,
            "import_policy": "never",
            "session_group_key": ctx.key("plan", angle),
        }
        try:
            result = await ctx.wait(ctx.run(with_model(task, model), key=ctx.key("plan", angle)))
        except ctx.errors.TaskFailed as exc:
            rows[i] = {"angle": angle, "status": "failed", "error": failure(exc)}
            return
        rows[i] = {"angle": angle, "instance_id": result["instance_id"], "plan": result["final_message"]}
        review = reviewer(subject="an implementation plan", subject_text=result["final_message"], branch=base_branch)
        if await score_into(ctx, rows[i], review, ("score-plan", result["instance_id"])):
            scored.append((rows[i]["score"], i, result))

    await concurrently([functools.partial(plan, i, a) for i, a in enumerate(angles)])
    report: dict[str, Any] = {
        "strategy_execution_id": ctx.strategy_execution_id,
        "plans": rows,
        "selected": None,
        "tie_break": "highest score, then the earliest angle",
    }
    if not scored:
        name = write_output(ctx, "plans", "json", report)
        raise ctx.errors.NoViableCandidates(f"none of {len(angles)} plans could be scored; see strategy_output/{name}")
    score, index, best = pick_best(scored)
    angle = angles[index]
    report["selected"] = {"angle": angle, "instance_id": best["instance_id"], "score": score}
    write_output(ctx, "plans", "json", report)
    implement: TaskInput = {
        "prompt": (
            f"Implement the plan you wrote (focus: {angle}) with all details, then commit your changes.\n\n"
            f"Task:\n{prompt}\n\nThe plan:\n{tail(best['final_message'], MESSAGE_CHARS)}"
        ),
        "base_branch": base_branch,
        "session_group_key": ctx.key("plan", angle),
        "resume_session_id": best["session_id"],
    }
    return await ctx.wait(ctx.run(with_model(implement, model), key=ctx.key("implement", "plan", best["instance_id"])))
