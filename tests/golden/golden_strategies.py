"""Strategies whose recorded histories live in tests/golden/*.jsonl (see make_golden.py)."""

from __future__ import annotations


async def judge(prompt, base_branch, ctx, *, n: int = 4):
    pick = ctx.rand()
    gens = [ctx.run({"prompt": f"{prompt} #{i}"}, key=ctx.key("gen", i)) for i in range(n)]
    ok, failed = await ctx.wait_all(gens, tolerate_failures=True)
    scores = [
        await ctx.wait(
            ctx.run(
                {"prompt": f"score {r['final_message']}", "import_policy": "never"},
                key=ctx.key("score", r["instance_id"]),
            )
        )
        for r in ok
    ]
    best = max(zip(scores, ok, strict=True), key=lambda p: (p[0]["final_message"], -int(p[1]["key"].rsplit("/", 1)[1])))
    return {"best": best[1]["key"], "failed": [f.key for f in failed], "pick": round(pick, 6)}


async def judge_changed_prompt(prompt, base_branch, ctx, *, n: int = 4):
    """The same keys asked with a different input: must be caught, not silently diverge."""
    ctx.rand()
    gens = [ctx.run({"prompt": f"{prompt} (v2) #{i}"}, key=ctx.key("gen", i)) for i in range(n)]
    return await ctx.wait_all(gens, tolerate_failures=True)


async def judge_fewer_candidates(prompt, base_branch, ctx, *, n: int = 4):
    """A strategy that no longer asks for some recorded keys: must be reported."""
    ctx.rand()
    gens = [ctx.run({"prompt": f"{prompt} #{i}"}, key=ctx.key("gen", i)) for i in range(2)]
    ok, _ = await ctx.wait_all(gens, tolerate_failures=True)
    return len(ok)
