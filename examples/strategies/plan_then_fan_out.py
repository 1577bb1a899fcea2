"""plan-then-fan-out: a planner answers in a JSON Schema, then one agent per planned step.

The planner task carries ``output_schema``: the agent CLI is told to answer in
that shape (Claude Code ``--json-schema``, Codex ``--output-schema``), the
answer is validated on the host, and it arrives parsed as ``result["output"]``.
A wrong answer gets one repair turn in the same session; after that the task
fails with ``error_type`` ``"output_invalid"``, so the strategy never has to
parse prose. The ``command`` plugin cannot enforce a schema:
``ctx.supports_output_schema()`` says so, and the strategy refuses early.

    orchestrator "add input validation to the CLI" --strategy examples/strategies/plan_then_fan_out.py -S max_steps=3
"""

from typing import Annotated, Any

from orchestrator.strategy import Context, TaskInput


def plan_schema(max_steps: int) -> dict[str, Any]:
    step = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "instructions": {"type": "string"}},
        "required": ["title", "instructions"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"steps": {"type": "array", "items": step, "minItems": 1, "maxItems": max_steps}},
        "required": ["steps"],
        "additionalProperties": False,
    }


async def plan_then_fan_out(
    prompt: str, base_branch: str, ctx: Context, *, max_steps: Annotated[int, "most steps the planner may propose"] = 3
) -> dict[str, Any]:
    """Plan independent steps as structured output, then implement them in parallel."""
    if not ctx.supports_output_schema():
        raise ctx.errors.NoViableCandidates("plan-then-fan-out needs an agent plugin (claude-code or codex)")
    planner: TaskInput = {
        "prompt": f"Split this task into at most {max_steps} independent steps that can be done in "
        f"parallel on separate branches. Do not modify any files.\n\nTask: {prompt}",
        "base_branch": base_branch,
        "import_policy": "never",
        "output_schema": plan_schema(max_steps),
    }
    plan = await ctx.wait(ctx.run(planner, key=ctx.key("plan")))
    steps = plan["output"]["steps"]  # already validated against the schema
    handles = [
        ctx.run(
            {"prompt": f"{prompt}\n\nDo only this part: {s['title']}\n{s['instructions']}", "base_branch": base_branch},
            key=ctx.key("step", i),
        )
        for i, s in enumerate(steps)
    ]
    ok, failed = await ctx.wait_all(handles, tolerate_failures=True)
    by_key = {r["key"]: r for r in ok}
    return {
        "steps": [
            {"title": s["title"], "branch": (by_key[h.key]["artifact"]["branch_final"] if h.key in by_key else None)}
            for s, h in zip(steps, handles, strict=True)
        ],
        "failed": [f"{f.key}: {f.error_type}" for f in failed],
    }
