"""seeded-fan-out: try k approaches drawn at random from a list, all in parallel.

The draw uses ``ctx.rand()``, which is recorded in the run's event log: a
resumed run draws exactly the same approaches, so finished ones are not run
again. Keys name the approach itself, so they do not depend on draw order.

    orchestrator "speed up the importer" --strategy examples/strategies/seeded_fan_out.py -S k=3
"""

from typing import Annotated, Any

from orchestrator.strategy import Context

APPROACHES = [
    "write the tests first",
    "the smallest possible change",
    "refactor before changing behaviour",
    "a pure-function design",
    "defensive input validation",
]


async def seeded_fan_out(
    prompt: str,
    base_branch: str,
    ctx: Context,
    *,
    k: Annotated[int, "how many approaches to try"] = 2,
    approaches: Annotated[list[str], "the pool to draw from"] = APPROACHES,
) -> dict[str, Any]:
    """Draw k approaches with ctx.rand() and run one agent per approach in parallel."""
    pool = list(approaches)
    picked = [pool.pop(int(ctx.rand() * len(pool))) for _ in range(min(k, len(pool)))]
    handles = [
        ctx.run(
            {"prompt": f"{prompt}\n\nApproach: {a}", "base_branch": base_branch},
            key=ctx.key("approach", a.replace("/", "-")),
        )
        for a in picked
    ]
    ok, failed = await ctx.wait_all(handles, tolerate_failures=True)
    by_key = {r["key"]: r for r in ok}
    return {
        "picked": picked,
        "branches": {
            a: (by_key[h.key]["artifact"]["branch_final"] if h.key in by_key else None)
            for a, h in zip(picked, handles, strict=True)
        },
        "failed": [f"{f.key}: {f.error_type}" for f in failed],
    }
