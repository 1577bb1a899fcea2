"""simple: one task, one branch."""

from __future__ import annotations

from typing import Annotated

from orchestrator.strategy import Context, ImportPolicy


async def simple(
    prompt,
    base_branch,
    ctx: Context,
    *,
    import_policy: Annotated[ImportPolicy, "when to create the branch"] = "auto",
):
    """Run the prompt once and return its result."""
    return await ctx.wait(
        ctx.run({"prompt": prompt, "base_branch": base_branch, "import_policy": import_policy}, key=ctx.key("task"))
    )
