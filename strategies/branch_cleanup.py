"""Deleting a strategy's working branches at the end of its run, as one durable housekeeping task."""

from __future__ import annotations

from typing import Any

from orchestrator.strategy import Context


async def delete_branches(ctx: Context, names: list[str], key: str) -> dict[str, Any]:
    """Delete these branches of this run from the user's repository: ``{"deleted": [...], "kept": {name: why}}``.

    The git layer deletes only branches whose tip this run created and that
    nobody has checked out; the rest are reported as kept, with the reason.
    Runs even when the strategy's budget is spent: it costs nothing and starts no agent.
    """
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
