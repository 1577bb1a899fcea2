"""A run of a few hundred tasks, for the crash test. Usage: crash_worker.py DIR CALLS_FILE.

The scripted runner appends ``start <key>`` to CALLS_FILE (flushed) whenever it
is asked to run a task, so the test can see exactly which keys each process ran.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from engine_helpers import make_config

from orchestrator.engine.engine import Engine
from orchestrator.engine.testing import ScriptedRunner, success
from orchestrator.naming import short8


async def pipeline(prompt, base_branch, ctx, *, width: int = 150):
    seed = ctx.rand()  # recorded: the replay must see the same value
    gens = [ctx.run({"prompt": f"gen {i}"}, key=ctx.key("gen", i)) for i in range(width)]
    ok, failed = await ctx.wait_all(gens, tolerate_failures=True)
    scores = [
        ctx.run(
            {"prompt": f"score {r['final_message']}", "import_policy": "never"}, key=ctx.key("score", r["instance_id"])
        )
        for r in ok
    ]
    scored = await ctx.wait_all(scores)
    ranked = sorted(zip(scored, ok, strict=True), key=lambda p: (p[0]["final_message"], p[1]["key"]))
    top = [p[1] for p in ranked[:10]]
    await ctx.sleep(0.01)
    refine = await ctx.wait_all(
        [
            ctx.run({"prompt": f"refine {t['final_message']} {seed:.6f}"}, key=ctx.key("refine", t["instance_id"]))
            for t in top
        ]
    )
    return {
        "failed": sorted(f.key for f in failed),
        "top": [t["key"] for t in top],
        "refined": [r["final_message"] for r in refine],
        "seed": seed,
    }


def script(calls):
    def run(req):
        calls.write(f"start {req.task_key}\n")
        calls.flush()
        if req.prompt == "gen 7":
            from orchestrator.engine.testing import failure

            return failure(req, error_type="api", message="permanently rate limited")
        return success(req, final_message=f"msg-{short8(req.prompt)}")

    return run


async def main(out: Path, calls_path: Path) -> None:
    # The scripted runner appends to it synchronously, as it would to a log; this
    # worker only exists to be killed, nothing else shares its loop.
    with open(calls_path, "a") as calls:  # noqa: ASYNC230
        runner = ScriptedRunner(script(calls), delay=lambda req: (int(short8(req.task_key), 16) % 60 + 20) / 1000)
        engine = Engine(make_config(out, max_parallel=8), runner)
        await engine.run(pipeline, prompt="p", params={}, runs=2)


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]), Path(sys.argv[2]))
    os._exit(0)
