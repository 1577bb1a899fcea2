"""Deleting a strategy's working branches: a durable task inside the strategy (evolve), or a list its
``branches_to_delete`` hook reads once the run has finished, so a run stopped at its cap keeps what a resume needs.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.strategy import Context, RunView

from ._scoring import output_name


async def delete_branches(ctx: Context, names: list[str], key: str) -> dict[str, Any]:
    """Delete these branches of this run (only those whose tip it created and nobody has checked out), even past the
    budget: it costs nothing. ``{"deleted": [...], "kept": {name: why}}``."""
    if not names:
        return {"deleted": [], "kept": {}}
    try:
        result = await ctx.wait(
            ctx.run({"prompt": f"delete {len(names)} working branch(es)", "delete_branches": list(names)}, key=key)
        )
    except ctx.errors.TaskFailed as exc:
        return {"deleted": [], "kept": {n: f"cleanup failed: {exc.message}" for n in names}}
    deleted: list[str] = []
    kept: dict[str, str] = {}
    for line in (result.get("final_message") or "").splitlines():
        state, sep, name = line.removeprefix("@@branch ").partition(": ")
        if not sep or not line.startswith("@@branch "):
            continue
        if state == "deleted":
            deleted.append(name)
        else:
            kept[name] = state
    return {"deleted": deleted, "kept": kept}


def listed_for_deletion(run: RunView, stem: str) -> list[str]:
    """For a ``branches_to_delete`` hook: what each successful execution listed under ``delete_branches``
    in its ``<stem>`` JSON output, written once it had selected its result."""
    names: list[str] = []
    for sid, status in sorted(run.executions.items()):
        if status != "success":
            continue
        path = run.output_dir / output_name(sid, stem, "json")
        try:
            listed = json.loads(path.read_text("utf-8")).get("delete_branches") or []
        except (OSError, ValueError, AttributeError):
            continue  # no record, no deletion: a branch is never deleted on a guess
        names += [b for b in listed if isinstance(b, str) and b]
    return names
