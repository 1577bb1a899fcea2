"""One evolve wave as durable tasks (measure, fix, merge, bisect), keyed by cycle, goal and step.

Everything is read from task results, so a resumed run replays finished steps and runs only what is missing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .evolve_commands import (
    Measurement,
    failed_measurement,
    measure_task,
    merge_task,
    parse_measurement,
    parse_merge,
)
from .evolve_goals import Goal

OUTPUT_IN_PROMPT = 4000
SUMMARY_IN_PROMPT = 600


class Fix(msgspec.Struct, frozen=True, kw_only=True):
    goal_id: str
    branch: str | None  # None: the fix failed or changed nothing
    note: str = ""
    failed: bool = False  # the agent task itself failed (quota, container, timeout)
    summary: str = ""  # the tail of the agent's own last message: what it says it did


class WaveMerge(msgspec.Struct, frozen=True, kw_only=True):
    branch: str | None  # None: the merge task itself failed
    included: tuple[str, ...]  # goal ids whose fix is in ``branch``, in merge order
    conflicts: tuple[str, ...]  # goal ids left out after an unresolved conflict
    resolved: tuple[str, ...] = ()  # goal ids whose conflict an agent resolved
    error: str | None = None


async def measure_all(ctx, goals: list[Goal], branch: str, key_parts: tuple) -> dict[str, Measurement]:
    """Every goal's check on ``branch``, in parallel; a task that broke counts as a failing check."""
    handles = [(g, ctx.run(measure_task(g, branch), key=ctx.key(*key_parts, g.id))) for g in goals]
    out: dict[str, Measurement] = {}
    for goal, handle in handles:
        try:
            out[goal.id] = parse_measurement(goal, (await ctx.wait(handle))["final_message"])
        except ctx.errors.TaskFailed as exc:
            out[goal.id] = failed_measurement(goal, f"measuring failed ({exc.error_type}): {exc.message}")
    return out


def head_of(measures: dict[str, Measurement]) -> str | None:
    return next((m.head for m in measures.values() if m.head), None)


def regressions(goals: list[Goal], before: dict[str, Measurement], after: dict[str, Measurement]) -> list[str]:
    """Goals that passed before and fail after, or whose metric got worse beyond its tolerance."""
    return [g.id for g in goals if _worse(g, before[g.id], after[g.id])]


def improvements(goals: list[Goal], before: dict[str, Measurement], after: dict[str, Measurement]) -> list[str]:
    """Goals that failed before and pass after, or whose metric got better beyond its tolerance."""
    return [g.id for g in goals if _worse(g, after[g.id], before[g.id])]


def _worse(goal: Goal, first: Measurement, then: Measurement) -> bool:
    """``then`` fails where ``first`` passed, or its metric is worse than ``first``'s beyond the tolerance."""
    m = goal.metric
    if first.passed and not then.passed:
        return True
    return (
        m is not None
        and first.value is not None
        and (then.value is None or m.worsening(first.value, then.value) > m.tolerance)
    )


async def confirm_regressions(
    ctx,
    goals: list[Goal],
    before: dict[str, Measurement],
    after: dict[str, Measurement],
    branch: str,
    key_parts: tuple,
    reruns: int,
) -> tuple[list[str], dict[str, Measurement], list[str]]:
    """Re-run each regressed goal's check up to ``reruns`` times before believing it (docs/evolve.md): the confirmed
    regressions, the measurements (a flaky goal's passing one) and the goals found flaky."""
    suspects = regressions(goals, before, after)
    flaky: list[str] = []
    current = dict(after)
    for attempt in range(1, reruns + 1):
        if not suspects:
            break
        subset = [g for g in goals if g.id in suspects]
        again = await measure_all(ctx, subset, branch, (*key_parts, "recheck", attempt))
        still = set(regressions(subset, before, {**current, **again}))
        for gid in suspects:
            if gid not in still:
                flaky.append(gid)
                current[gid] = again[gid]
        suspects = [gid for gid in suspects if gid in still]
    return suspects, current, flaky


def fix_prompt(
    user_prompt: str, goal: Goal, measured: Measurement, goals: list[Goal], attempts: list[str] | tuple[str, ...] = ()
) -> str:
    tail = measured.output[-OUTPUT_IN_PROMPT:] if measured.output else "(no output)"
    others = "\n".join(f"- {g.id}: `{g.check}`" for g in goals if g.id != goal.id) or "- (none)"
    state = f"exit status {measured.exit_code}" if measured.exit_code is not None else (measured.error or "unknown")
    lines = [
        f"Overall objective: {user_prompt}",
        "",
        f"Make the goal `{goal.id}` pass in this repository.",
        f"Goal: {goal.description}",
        f"Check command (run from the repository root; exit status 0 means the goal passes): `{goal.check}`",
    ]
    if goal.metric is not None:
        m = goal.metric
        where = f"JSON key `{m.json_key}` of its output" if m.json_key else "the last line of its output"
        best = "higher" if m.direction == "higher" else "lower"
        lines.append(
            f"This goal is a number read from {where}; {best} is better and it passes at "
            f"{'>=' if best == 'higher' else '<='} {m.threshold:g}. Currently: "
            f"{'unreadable' if measured.value is None else f'{measured.value:g}'}."
        )
    if goal.writes:
        lines.append("The fix is expected to touch only: " + ", ".join(goal.writes))
    lines += [
        "",
        f"The check currently fails ({state}). The last part of its output:",
        "```",
        tail,
        "```",
        "",
        "These other checks must keep passing; do not break them:",
        others,
    ]
    if attempts:
        # Without this the agent gets a byte-identical prompt and repeats the fix that was just reverted.
        lines += ["", "Earlier attempts at this goal did not stick. Do not repeat them; find another way:"]
        lines += [f"- {a}" for a in attempts]
    lines += ["", "Make the smallest change that fixes the goal and commit it with git."]
    return "\n".join(lines)


async def fix_wave(
    ctx,
    cycle: int,
    user_prompt: str,
    base: str,
    picked: list[Goal],
    goals: list[Goal],
    measures: dict[str, Measurement],
    attempts: dict[str, list[str]],
) -> list[Fix]:
    """One agent task per picked goal, each on its own branch from the cycle's base, in parallel."""
    handles = []
    for g in picked:
        prompt = fix_prompt(user_prompt, g, measures[g.id], goals, attempts.get(g.id, ()))
        task = {"prompt": prompt, "base_branch": base, "import_policy": "auto"}
        handles.append((g, ctx.run(task, key=ctx.key("c", cycle, "fix", g.id))))
    fixes = []
    for goal, handle in handles:
        try:
            result = await ctx.wait(handle)
        except ctx.errors.TaskFailed as exc:
            note = f"fix failed ({exc.error_type}): {(exc.message or '').strip()[:200]}"
            fixes.append(Fix(goal_id=goal.id, branch=None, failed=True, note=note))
            continue
        branch = (result.get("artifact") or {}).get("branch_final")
        summary = " ".join((result.get("final_message") or "").split())[-SUMMARY_IN_PROMPT:]
        fixes.append(Fix(goal_id=goal.id, branch=branch, note="" if branch else "fix changed nothing", summary=summary))
    return fixes


def resolve_prompt(goal: Goal, branch: str, merged: list[Goal]) -> str:
    # First lines only: the full descriptions belong to the fixes that are already done.
    done = "\n".join(f"- {g.id}: {g.description.splitlines()[0]} (check `{g.check}`)" for g in merged) or "- (none)"
    return "\n".join(
        [
            f"Merge the git branch `{branch}` into the current branch and resolve the conflicts.",
            f"Run `git merge --no-edit {branch}`: it stops with conflicts. Edit the conflicting files so that",
            "the fixes already on the current branch and the fix on the merged branch both keep working,",
            "then `git add -A` and `git commit --no-edit` to conclude the merge. Do not rebase or reset.",
            "",
            "Fixes already on the current branch:",
            done,
            "",
            f"The branch being merged fixes goal `{goal.id}`: {goal.description}",
            f"Its check must pass after the merge: `{goal.check}`",
        ]
    )


async def merge_wave(
    ctx, key_parts: tuple, base: str, fixes: list[tuple[Goal, str]], *, resolve: bool = True
) -> WaveMerge:
    """Merge the fix branches in order in a container; an agent resolves the first conflict, the next step verifies it."""
    if len(fixes) == 1:
        return WaveMerge(branch=fixes[0][1], included=(fixes[0][0].id,), conflicts=())
    goal_of = {branch: goal for goal, branch in fixes}
    head, remaining = base, list(fixes)
    included: list[str] = []
    conflicts: list[str] = []
    resolved: list[str] = []
    attempted: set[str] = set()
    step = 0
    while remaining:
        step += 1
        try:
            result = await ctx.wait(
                ctx.run(merge_task(head, [b for _, b in remaining]), key=ctx.key(*key_parts, "merge", step))
            )
        except ctx.errors.TaskFailed as exc:
            error = f"merge task failed ({exc.error_type}): {exc.message}"
            return WaveMerge(
                branch=None, included=(*included,), conflicts=(*conflicts,), resolved=(*resolved,), error=error
            )
        head = (result.get("artifact") or {}).get("branch_final") or head
        report = parse_merge(result["final_message"])
        for branch in report.merged:
            gid = goal_of[branch].id if branch in goal_of else None
            if gid and gid not in included:
                included.append(gid)
        if report.conflict is None or report.conflict not in goal_of:
            # Clean (or a report we cannot read): what is not reported merged is left out.
            conflicts += [g.id for g, b in remaining if g.id not in included]
            break
        at = next(i for i, (_, b) in enumerate(remaining) if b == report.conflict)
        goal, branch = remaining[at]
        rest = remaining[at + 1 :]
        if not resolve or goal.id in attempted:
            conflicts.append(goal.id)
            remaining = rest
            continue
        attempted.add(goal.id)
        merged_goals = [goal_of[b] for b in goal_of if goal_of[b].id in included]
        if new_head := await _resolve(ctx, (*key_parts, "resolve", goal.id), goal, branch, head, merged_goals):
            head = new_head
            resolved.append(goal.id)
            remaining = [(goal, branch), *rest]  # the next step verifies the branch really is merged
        else:
            conflicts.append(goal.id)
            remaining = rest
    if not included:
        return WaveMerge(
            branch=None, included=(), conflicts=tuple(conflicts), resolved=tuple(resolved), error="no fix branch merged"
        )
    resolved_in = tuple(g for g in resolved if g in included)
    return WaveMerge(branch=head, included=tuple(included), conflicts=tuple(conflicts), resolved=resolved_in)


async def _resolve(ctx, key_parts: tuple, goal: Goal, branch: str, head: str, merged: list[Goal]) -> str | None:
    """An agent merges ``branch`` on top of ``head``; its branch, or None when it failed or committed nothing."""
    task = {
        "prompt": resolve_prompt(goal, branch, merged),
        "base_branch": head,
        "include_branches": [branch],
        "import_policy": "auto",
    }
    try:
        fixed = await ctx.wait(ctx.run(task, key=ctx.key(*key_parts)))
    except ctx.errors.TaskFailed:
        return None
    return (fixed.get("artifact") or {}).get("branch_final")


class Bisect(msgspec.Struct, frozen=True, kw_only=True):
    kept: tuple[str, ...]
    branch: str | None
    measures: dict[str, Any] | None  # goal id -> Measurement on ``branch``
    blamed: tuple[str, ...]
    conflicts: tuple[str, ...]


async def bisect_wave(
    ctx,
    cycle: int,
    base: str,
    goals: list[Goal],
    wave: list[tuple[Goal, str]],
    before: dict[str, Measurement],
    *,
    full_wave_known: bool,
    reruns: int = 0,
) -> Bisect:
    """Keep the largest prefix-greedy subset of the wave that regresses nothing (docs/evolve.md, "bisect_on_regression")."""
    kept: list[tuple[Goal, str]] = []
    branch: str | None = None
    measures: dict[str, Measurement] | None = None
    blamed: list[str] = []
    conflicts: list[str] = []
    for i, (goal, fix_branch) in enumerate(wave, start=1):
        candidate = [*kept, (goal, fix_branch)]
        if full_wave_known and len(candidate) == len(wave):
            blamed.append(goal.id)
            break
        merged = await merge_wave(ctx, ("c", cycle, "bisect", i), base, candidate, resolve=False)
        if merged.branch is None or goal.id not in merged.included:
            conflicts.append(goal.id)
            continue
        m = await measure_all(ctx, goals, merged.branch, ("c", cycle, "bisect", i, "measure"))
        bad, m, _ = await confirm_regressions(ctx, goals, before, m, merged.branch, ("c", cycle, "bisect", i), reruns)
        if bad:
            blamed.append(goal.id)
            continue
        kept, branch, measures = candidate, merged.branch, m
    return Bisect(
        kept=tuple(g.id for g, _ in kept),
        branch=branch,
        measures=measures,
        blamed=tuple(blamed),
        conflicts=tuple(conflicts),
    )
