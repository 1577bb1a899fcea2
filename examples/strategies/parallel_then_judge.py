"""parallel-then-judge: a few drafts in parallel, then one judge picks the winner.

Run it (from the repository you want to change):

    orchestrator "add a --version flag" --strategy examples/strategies/parallel_then_judge.py -S drafts=3
"""

import json
from typing import Annotated, Any

from orchestrator.strategy import Context, TaskResult


def parse_verdict(text: str, count: int) -> dict[str, Any] | None:
    """The judge's {"winner": i, "reason": ...}, or None when it is not usable."""
    try:
        data = json.loads(text.strip())
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    winner = data.get("winner")
    if isinstance(winner, bool) or not isinstance(winner, int) or not 0 <= winner < count:
        return None
    return data


async def parallel_then_judge(
    prompt: str, base_branch: str, ctx: Context, *, drafts: Annotated[int, "how many drafts run in parallel"] = 2
) -> TaskResult:
    """Write several drafts in parallel, let a read-only judge pick one, return it."""
    # 1. Schedule every draft before awaiting any: they run in parallel.
    #    Keys come from data (the draft number), never from time or randomness.
    handles = [ctx.run({"prompt": prompt, "base_branch": base_branch}, key=ctx.key("draft", i)) for i in range(drafts)]
    ok, failed = await ctx.wait_all(handles, tolerate_failures=True)
    if not ok:
        raise ctx.errors.NoViableCandidates(f"all {drafts} drafts failed: {failed[0].message}")

    # 2. One judge reads the drafts' summaries. import_policy "never": it only reads.
    listing = "\n\n".join(
        f"Draft {i} ({r['artifact']['branch_final']}) says:\n{r['final_message'][-2000:]}" for i, r in enumerate(ok)
    )
    judge = await ctx.wait(
        ctx.run(
            {
                "prompt": (
                    f"Several drafts were written for this task:\n{prompt}\n\n{listing}\n\n"
                    'Pick the best draft. Reply with ONLY JSON: {"winner": <draft number>, "reason": "<why>"}'
                ),
                "base_branch": base_branch,
                "import_policy": "never",
            },
            key=ctx.key("judge"),
        )
    )

    # 3. Decide deterministically: an unusable verdict keeps the first draft.
    verdict = parse_verdict(judge["final_message"], len(ok))
    winner = verdict["winner"] if verdict else 0
    return ok[winner]
