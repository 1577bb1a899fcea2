"""iterative: generate, then review and improve the same work N times in one session (docs/strategies.md)."""

from __future__ import annotations

from typing import Annotated, Any

from orchestrator.strategy import ConfigError, Context, TaskInput, TaskResult, strategy_options

from . import schemas
from ._json import ask_twice, score_of
from ._scoring import DEFAULT_CRITERIA, branch_of, kept_unreviewed, review_task, with_model, write_output

REVIEW_SCHEMA = '{"score": <number from 0 to 10>, "feedback": "<the most important concrete improvements>"}'


def _prepare(params: dict[str, Any], repo_path: str) -> dict[str, Any]:
    if params.get("iterations", 0) < 0:
        raise ConfigError(f"iterative: -S iterations must be 0 or more, got {params['iterations']}")
    return params


def feedback_of(data: Any) -> dict[str, Any] | None:
    """``{score, feedback}``; a reviewer that says ``rationale`` instead of ``feedback`` is accepted."""
    scored = score_of(data)
    if scored is None:
        return None
    text = data.get("feedback", data.get("rationale"))
    if not isinstance(text, str) or not text.strip():
        return None
    return {"score": scored["score"], "feedback": text.strip()}


def _review_task(
    prompt: str, base_branch: str, current: TaskResult, criteria: str, reviewer_model: str | None
) -> dict[str, Any]:
    """A read-only review of ``current``'s branch that asks for feedback the author can act on."""
    return review_task(
        prompt=prompt,
        subject="work done",
        subject_text=current["final_message"],
        base=base_branch,
        branch=branch_of(current),
        criteria=criteria,
        model=reviewer_model,
        heading="The author's summary",
        advice=" Give feedback the author can act on.",
        schema=REVIEW_SCHEMA,
    )


@strategy_options(prepare=_prepare, requires_resume=True)
async def iterative(
    prompt,
    base_branch,
    ctx: Context,
    *,
    iterations: Annotated[int, "review+improve rounds after the first generation"] = 3,
    model: Annotated[str | None, "model for generation and improvements"] = None,
    reviewer_model: Annotated[str | None, "model for the reviews"] = None,
    criteria: Annotated[str, "what the reviewer judges"] = DEFAULT_CRITERIA,
    target_score: Annotated[float | None, "stop early once a review scores at least this"] = None,
):
    """Generate once, then review and improve it in the same agent session N times."""
    session = ctx.key("chain")  # one session volume per strategy execution
    gen: TaskInput = {"prompt": prompt, "base_branch": base_branch, "session_group_key": session}
    current = await ctx.wait(ctx.run(with_model(gen, model), key=ctx.key("gen")))
    history: list[dict[str, Any]] = [
        {"step": "gen", "instance_id": current["instance_id"], "branch": branch_of(current)}
    ]
    stopped = "completed all iterations"
    unreviewed = False
    for n in range(1, iterations + 1):
        branch = branch_of(current)
        review = _review_task(prompt, base_branch, current, criteria, reviewer_model)
        try:
            verdict, _, _ = await ask_twice(
                ctx, review, ("review", f"iter-{n}"), feedback_of, schemas.FEEDBACK, at_cap_raise=True
            )
        except ctx.errors.BudgetReached:
            stopped = f"the spending cap was reached before review {n}"
            history.append({"step": f"review/iter-{n}", "score": None, "error": "budget_reached"})
            unreviewed = True
            break
        if verdict is None:
            stopped = f"review {n} was unusable (failed or not valid JSON twice)"
            history.append({"step": f"review/iter-{n}", "score": None})
            break
        history.append({"step": f"review/iter-{n}", "score": verdict["score"], "feedback": verdict["feedback"]})
        if target_score is not None and verdict["score"] >= target_score:
            stopped = f"review {n} reached the target score {target_score}"
            break
        improve: TaskInput = {
            "prompt": (
                f"A reviewer scored your work {verdict['score']:g}/10 and said:\n{verdict['feedback']}\n\n"
                f"Improve your implementation of the original task accordingly and commit the changes.\n\n"
                f"Original task:\n{prompt}"
            ),
            "base_branch": branch,
            "session_group_key": session,
            "resume_session_id": current["session_id"],
        }
        try:
            current = await ctx.wait(ctx.run(with_model(improve, model), key=ctx.key("improve", f"iter-{n}")))
        except ctx.errors.TaskFailed as exc:
            stopped = f"improvement {n} failed ({exc.error_type}): {exc.message}"
            history.append({"step": f"improve/iter-{n}", "error": f"{exc.error_type}: {exc.message}"})
            break
        history.append(
            {"step": f"improve/iter-{n}", "instance_id": current["instance_id"], "branch": branch_of(current)}
        )
    write_output(
        ctx,
        "iterations",
        "json",
        {
            "strategy_execution_id": ctx.strategy_execution_id,
            "iterations": iterations,
            "stopped": stopped,
            "steps": history,
            "final_branch": branch_of(current),
        },
    )
    if unreviewed:
        # what the last step made, which nobody judged: gen, or the latest improvement
        return kept_unreviewed(current, history[-2]["step"], "its review")
    return current
