"""evolve: a fitness loop over a goals file, fixing independent failing goals in parallel waves.

The cycle, its gates, rests, retries and stop conditions are described in docs/evolve.md.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from itertools import combinations
from typing import Annotated, Any

from orchestrator.strategy import BaseEvaluationFailed, BudgetExhausted, BudgetScope, Context, strategy_options

from ._report import evolve_sections as report_sections  # noqa: F401  (the run report's sections)
from ._report_tasks import report_task  # noqa: F401  (its command tasks in the report)
from ._scoring import write_atomic
from .branch_cleanup import delete_branches
from .evolve_commands import Measurement, cannot_run
from .evolve_goals import Goal, check_max_parallel, goals_from_param, prepare
from .evolve_select import select_goals
from .evolve_wave import (
    bisect_wave,
    confirm_regressions,
    fix_wave,
    head_of,
    improvements,
    measure_all,
    merge_wave,
)
from .review_loop import MaxCostUsd, MaxWallS

ATTEMPTS_KEPT = 5  # earlier attempts shown in a goal's next fix prompt
TAIL_IN_NOTE = 300


@strategy_options(prepare=prepare)
async def evolve(
    prompt,
    base_branch,
    ctx: Context,
    *,
    goals: Annotated[str | list | dict, "goals file (YAML, see docs/evolve.md)"],
    max_parallel: Annotated[int, "goals fixed per wave, 1 = sequential (at most 5)"] = 3,
    max_cycles: Annotated[int, "stop after this many cycles"] = 10,
    bisect_on_regression: Annotated[bool, "on a regression keep the fixes that break nothing"] = False,
    quarantine_after: Annotated[int, "rolled-back fixes before a goal is quarantined"] = 3,
    rest_after: Annotated[
        int, "reverted attempts in a row on one goal before it rests and the next failing goal gets the wave"
    ] = 2,
    recheck: Annotated[
        int, "re-runs of a check that newly fails on a wave before it counts as a regression (0: believe one run)"
    ] = 1,
    max_failed_waves: Annotated[
        int, "waves in a row in which every fix task failed (quota, outage) before the run stops"
    ] = 3,
    retry_backoff_s: Annotated[float, "wait before retrying after such a wave; doubles each time"] = 60.0,
    max_cost_usd: MaxCostUsd = None,
    max_wall_s: MaxWallS = None,
    keep_branches: Annotated[bool, "keep the fix, merge and resolve branches instead of deleting them"] = False,
):
    """Keep a set of measurable goals passing: fix failing ones in parallel waves, revert regressions."""
    goal_list = goals_from_param(goals)
    max_parallel = check_max_parallel(max_parallel)
    # Every task from here on is held to it; its branches are the working branches deleted at the end.
    budget = ctx.open_budget(max_cost_usd=max_cost_usd, max_wall_s=max_wall_s)
    loop = _Loop(
        ctx,
        budget,
        prompt,
        goal_list,
        max_parallel=max_parallel,
        bisect=bisect_on_regression,
        quarantine_after=max(1, quarantine_after),
        rest_after=max(1, rest_after),
        recheck=max(0, recheck),
        max_failed_waves=max(0, max_failed_waves),
        retry_backoff_s=max(0.0, float(retry_backoff_s)),
    )
    out = await loop.run(base_branch, max_cycles)
    out["verdict"] = verdict_line(out)
    if not keep_branches:
        # Only the final branch is worth keeping; the working branches are noise in the user's repository.
        doomed = [b for b in budget.branches if b not in (out["final_branch"], base_branch)]
        out["branches"] = await delete_branches(ctx, doomed, ctx.key("cleanup", "branches"))
    else:
        out["branches"] = {
            "deleted": [],
            "kept": {b: "keep_branches" for b in budget.branches if b != out["final_branch"]},
        }
    return out


@dataclass
class _Loop:
    ctx: Context
    budget: BudgetScope
    prompt: str
    goals: list[Goal]
    max_parallel: int
    bisect: bool
    quarantine_after: int
    rest_after: int
    recheck: int
    max_failed_waves: int
    retry_backoff_s: float

    def __post_init__(self) -> None:
        self.by_id = {g.id: g for g in self.goals}
        self.strikes: Counter[str] = Counter()
        # Reverted attempts in a row per goal; at rest_after the goal rests (goal id -> why)
        # until the base moves, so one goal that cannot move does not take every cycle.
        self.reverted_in_a_row: Counter[str] = Counter()
        self.resting: dict[str, str] = {}
        self.quarantined: list[str] = []
        self.learned: set[frozenset[str]] = set()
        # Goals whose agent changed nothing on the current base: retried only once the base moves.
        self.no_change: list[str] = []
        # How often each goal's agent changed nothing: such goals go after the others on a new base.
        self.idle_counts: Counter[str] = Counter()
        # What each goal's earlier fixes did and why they did not stick, for its next fix prompt.
        self.attempts: dict[str, list[str]] = {}
        self.failed_waves = 0
        self.history: list[dict[str, Any]] = []
        sid = self.ctx.strategy_execution_id
        suffix = "" if sid == "s1" else f"-{sid}"
        self.history_name = f"cycle-history{suffix}.jsonl"
        self.summary_name = f"evolve_summary{suffix}.md"

    def _eligible(self, measures: dict[str, Measurement]) -> list[Goal]:
        left_out = {*self.quarantined, *self.no_change, *self.resting}
        return [g for g in self.goals if not measures[g.id].passed and g.id not in left_out]

    async def run(self, base: str, max_cycles: int) -> dict[str, Any]:
        stop_reason = ""
        try:
            measures = await measure_all(self.ctx, self.goals, base, ("initial", "measure"))
        except BudgetExhausted as exc:
            return {
                "final_branch": base,
                "final_commit": None,
                "stopped": "budget",
                "stop_reason": str(exc),
                "cycles": 0,
                "budget": self.budget.summary(),
                "history": [],
            }
        self._stop_if_a_check_cannot_run(measures, max_cycles)
        initial = measures
        stopped = "max-cycles"
        self._publish(0, max_cycles, measures)
        for cycle in range(1, max_cycles + 1):
            if all(m.passed for m in measures.values()):
                stopped = "all-passing"
                break
            entry = self._new_entry(cycle, base, measures)
            self._publish(cycle, max_cycles, measures)
            try:
                base, measures = await self._cycle(entry, cycle, base, measures)
            except BudgetExhausted as exc:
                # The unfinished wave is dropped: the base stays the last one that was measured clean.
                entry.update(result="stopped", reason=str(exc))
                self.history.append(entry)
                stopped, stop_reason = "budget", str(exc)
                break
            self._track_rest(entry)
            self.history.append(entry)
            self._write_outputs(initial, measures)
            self._publish(cycle, max_cycles, measures, f"last cycle: {entry['result']}")
            if entry["result"] == "failed":
                self.failed_waves += 1
                if self.failed_waves > self.max_failed_waves:
                    entry.pop("retry_after_s", None)  # no retry follows
                    stopped = "fixes-failing"
                    stop_reason = (
                        f"every fix task failed in {self.failed_waves} waves in a row (last: {entry['reason']})"
                    )
                    break
                if cycle < max_cycles and entry.get("retry_after_s"):
                    await self.ctx.sleep(entry["retry_after_s"])
                continue
            self.failed_waves = 0
            if entry["result"] == "idle" and not self._eligible(measures):
                stopped = "idle"
                stop_reason = entry["reason"]
                break
        else:
            if all(m.passed for m in measures.values()):
                stopped = "all-passing"
        self._write_outputs(initial, measures)
        self._publish(len(self.history), max_cycles, measures, f"stopped: {stopped}")
        return self._result(base, initial, measures, stopped, stop_reason)

    def _result(
        self, base: str, initial: dict[str, Measurement], measures: dict[str, Measurement], stopped: str, reason: str
    ) -> dict[str, Any]:
        out = {
            "final_branch": base,
            "final_commit": head_of(measures),
            "stopped": stopped,
            "stop_reason": reason,
            "cycles": len(self.history),
            "goals_total": len(self.goals),
            "goals_passing_before": sum(m.passed for m in initial.values()),
            "goals_passing_after": sum(m.passed for m in measures.values()),
            "goals": {
                g.id: {
                    "before": initial[g.id].passed,
                    "after": measures[g.id].passed,
                    "value_before": initial[g.id].value,
                    "value_after": measures[g.id].value,
                }
                for g in self.goals
            },
            "quarantined": list(self.quarantined),
            "resting": dict(self.resting),
            "could_not_move": self._could_not_move(measures),
            "history": self.history,
        }
        if self.budget.active:
            out["budget"] = self.budget.summary()
        return out

    def _stop_if_a_check_cannot_run(self, measures: dict[str, Measurement], max_cycles: int) -> None:
        """Stop before any agent task when a check measured nothing on the base: no fix can make such a goal pass,
        and the gate cannot protect it."""
        broken = [(g, why) for g in self.goals if (why := cannot_run(g, measures[g.id])) is not None]
        if not broken:
            return
        goal, why = broken[0]
        others = [g.id for g, _ in broken[1:]]
        reason = f"goal {goal.id!r}: {why}" + (
            f" (and {len(others)} more goal(s) whose check cannot run: {', '.join(others)})" if others else ""
        )
        self._publish(0, max_cycles, measures, f"stopped: goal {goal.id!r}'s check cannot run on the base")
        # every goal whose check cannot run measured nothing usable: none of them is a success
        keys = tuple(self.ctx.key("initial", "measure", g.id) for g, _ in broken)
        raise BaseEvaluationFailed(reason, command=goal.check, output=measures[goal.id].output, keys=keys)

    def _new_entry(self, cycle: int, base: str, measures: dict[str, Measurement]) -> dict[str, Any]:
        passing = sum(m.passed for m in measures.values())
        return {
            "cycle": cycle,
            "goal_ids": [],
            "result": "idle",
            "reason": "",
            "base_commit": head_of(measures),
            "wave_commit": None,
            "goals_passing": passing,
            "goals_total": len(self.goals),
            "parallel": False,
            "goals_passing_before": passing,
            "fixed": [],
            "regressed": [],
            "conflicts": [],
            "resolved": [],
            "blamed": [],
            "not_fixed": [],
            "quarantined": [],
            "skipped": {},
            "base_branch": base,
            "flaky": [],
            "fix_failed": [],
        }

    async def _cycle(self, entry: dict[str, Any], cycle: int, base: str, measures: dict[str, Measurement]):
        """One cycle, filling ``entry``; returns the base after it and the measurements on that base."""
        ctx, goals = self.ctx, self.goals
        picked = self._pick(entry, measures)
        if not picked:
            return base, measures
        fixes = await fix_wave(ctx, cycle, self.prompt, base, picked, goals, measures, self.attempts)
        summaries = {f.goal_id: f.summary for f in fixes}
        wave = self._take_fixes(entry, cycle, fixes)
        if not wave:
            return base, measures
        merged = await merge_wave(ctx, ("c", cycle), base, wave)
        entry["conflicts"], entry["resolved"] = list(merged.conflicts), list(merged.resolved)
        for gid in merged.conflicts:
            self._note(
                gid,
                f"cycle {cycle}: the fix ({_said(summaries[gid])}) conflicted with other fixes of "
                "the wave and was left out",
            )
        if merged.branch is None:
            entry.update(result="reverted", reason=merged.error or "merge failed")
            return base, measures
        after = await measure_all(ctx, goals, merged.branch, ("c", cycle, "wave", "measure"))
        regressed, after, flaky = await confirm_regressions(
            ctx, goals, measures, after, merged.branch, ("c", cycle, "wave"), self.recheck
        )
        entry["wave_commit"] = head_of(after)
        entry["regressed"], entry["flaky"] = regressed, flaky
        new_branch: str | None = merged.branch
        new_measures: dict[str, Measurement] | None = after
        included = [(g, b) for g, b in wave if g.id in merged.included]
        if regressed:
            new_branch, new_measures = await self._after_regression(
                entry, cycle, base, measures, included, after, not merged.resolved, summaries
            )
        if new_branch is None or new_measures is None:  # (only a regression clears them, both together)
            entry.update(result="reverted", reason="regression")
            return base, measures
        gained = improvements(goals, measures, new_measures)
        if not gained:
            for g, _ in included:
                m = new_measures[g.id]
                self._note(
                    g.id,
                    f"cycle {cycle}: the fix ({_said(summaries[g.id])}) was merged but the check "
                    f"still failed: {_tail(m.output)}",
                )
            entry.update(result="reverted", reason="no goal improved")
            return base, measures
        entry["fixed"] = gained
        entry.update(
            result="conflict" if entry["conflicts"] else "improved",
            base_branch=new_branch,
            goals_passing=sum(m.passed for m in new_measures.values()),
        )
        self.no_change.clear()  # a new base: an agent that found nothing to do may now find something
        return new_branch, new_measures

    def _pick(self, entry: dict[str, Any], measures: dict[str, Measurement]) -> list[Goal]:
        """The goals this cycle's wave fixes; ``entry`` says which were skipped and why."""
        failing = [g for g in self.goals if not measures[g.id].passed and g.id not in self.quarantined]
        learned = frozenset(self.learned)
        picked, skipped = select_goals(self._eligible(measures), self.max_parallel, learned, self.idle_counts)
        failing_ids = {g.id for g in failing}
        skipped.update({gid: "changed nothing on this base" for gid in self.no_change if gid in failing_ids})
        skipped.update(
            {
                gid: f"resting after {self.rest_after} reverted attempts in a row"
                for gid in self.resting
                if gid in failing_ids and gid not in skipped
            }
        )
        entry["skipped"] = skipped
        if not picked:
            entry["reason"] = (
                "every failing goal is quarantined"
                if not any(g.id in self.no_change or g.id in self.resting for g in failing)
                else "no failing goal left to try on this base"
            )
            return []
        entry["goal_ids"] = [g.id for g in picked]
        entry["parallel"] = len(picked) > 1
        return picked

    def _take_fixes(self, entry: dict[str, Any], cycle: int, fixes: list) -> list[tuple[Goal, str]]:
        """The fixes that committed something; ``entry`` says why there are none."""
        entry["not_fixed"] = [f.goal_id for f in fixes if f.branch is None]
        entry["fix_failed"] = [f.goal_id for f in fixes if f.failed]
        for f in fixes:
            if f.branch is None and not f.failed and f.goal_id not in self.no_change:
                self.no_change.append(f.goal_id)
                self.idle_counts[f.goal_id] += 1
                self._note(f.goal_id, f"cycle {cycle}: the agent committed nothing")
        wave = [(self.by_id[f.goal_id], f.branch) for f in fixes if f.branch is not None]
        if not wave:
            if entry["fix_failed"]:
                # Quota exhaustion or a broken container says nothing about the goals: try again later.
                first = next(f for f in fixes if f.failed)
                entry.update(
                    result="failed",
                    reason=f"every fix task failed ({first.note})",
                    retry_after_s=self.retry_backoff_s * (2**self.failed_waves),
                )
            else:
                entry["reason"] = "no fix produced a change"
        return wave

    async def _after_regression(
        self,
        entry: dict[str, Any],
        cycle: int,
        base: str,
        measures: dict[str, Measurement],
        included: list[tuple[Goal, str]],
        after: dict[str, Measurement],
        full_wave_known: bool,
        summaries: dict[str, str],
    ) -> tuple[str | None, dict[str, Measurement] | None]:
        """The wave broke a goal: blame who broke it and keep, bisected, what did not (else nothing)."""
        new_branch: str | None = None
        new_measures: dict[str, Measurement] | None = None
        blamed: list[str] = []
        if self.bisect and len(included) > 1:
            cut = await bisect_wave(
                self.ctx,
                cycle,
                base,
                self.goals,
                included,
                measures,
                full_wave_known=full_wave_known,
                reruns=self.recheck,
            )
            blamed = list(cut.blamed)
            self._blame(entry, cut.blamed)
            entry["conflicts"] += [g for g in cut.conflicts if g not in entry["conflicts"]]
            if cut.branch is not None and cut.measures is not None:  # (set together)
                new_branch, new_measures = cut.branch, cut.measures
                entry["wave_commit"] = head_of(cut.measures)
                entry["kept"] = list(cut.kept)
        elif len(included) == 1:
            blamed = [included[0][0].id]
            self._blame(entry, blamed)
        else:
            # Somebody in this wave broke something and we cannot tell who:
            # never pair these goals again, so the culprit ends up alone.
            self.learned.update(frozenset(p) for p in combinations(sorted(g.id for g, _ in included), 2))
        broke = self._broke(entry["regressed"], after)
        for g, _ in included:
            if g.id in blamed:
                self._note(
                    g.id, f"cycle {cycle}: the fix ({_said(summaries[g.id])}) was reverted because it broke {broke}"
                )
            elif not blamed and new_branch is None:
                others = ", ".join(o.id for o, _ in included if o.id != g.id)
                self._note(
                    g.id,
                    f"cycle {cycle}: the fix ({_said(summaries[g.id])}) was reverted together "
                    f"with the fixes for {others}: the wave broke {broke}",
                )
        return new_branch, new_measures

    def _track_rest(self, entry: dict[str, Any]) -> None:
        """Count reverted attempts in a row per goal; at ``rest_after`` the goal rests until the base moves."""
        if entry["result"] in ("improved", "conflict"):
            # A new base: every goal may move now, and counts start again.
            self.reverted_in_a_row.clear()
            self.resting.clear()
            return
        if entry["result"] != "reverted" or entry["reason"] == "regression":
            # A failed wave (quota, outage) says nothing about its goals, and a fix that broke
            # another goal is the quarantine's business (quarantine_after): the row is broken.
            for gid in entry["goal_ids"]:
                self.reverted_in_a_row.pop(gid, None)
            return
        for gid in entry["goal_ids"]:
            self.reverted_in_a_row[gid] += 1
            if self.reverted_in_a_row[gid] >= self.rest_after and gid not in self.resting:
                why = _REVERT_WHY.get(entry["reason"], entry["reason"])
                self.resting[gid] = f"{self.reverted_in_a_row[gid]} attempts in a row reverted; last: {why}"
                entry.setdefault("resting", []).append(gid)

    def _could_not_move(self, measures: dict[str, Measurement]) -> dict[str, str]:
        """Each goal still failing that the loop gave up on, and why."""
        out: dict[str, str] = {}
        for g in self.goals:
            if measures[g.id].passed:
                continue
            if g.id in self.quarantined:
                out[g.id] = f"quarantined: its fixes broke other goals {self.strikes[g.id]} time(s)"
            elif g.id in self.resting:
                out[g.id] = self.resting[g.id]
            elif g.id in self.no_change:
                out[g.id] = "its agent changed nothing"
        return out

    def _note(self, gid: str, text: str) -> None:
        notes = self.attempts.setdefault(gid, [])
        notes.append(text)
        del notes[:-ATTEMPTS_KEPT]

    def _broke(self, regressed: list[str], after: dict[str, Measurement]) -> str:
        return "; ".join(
            f"goal `{gid}` (check `{self.by_id[gid].check}`, which then printed: {_tail(after[gid].output)})"
            for gid in regressed
        )

    def _blame(self, entry: dict[str, Any], goal_ids) -> None:
        entry["blamed"] = list(goal_ids)
        for gid in goal_ids:
            self.strikes[gid] += 1
            if self.strikes[gid] >= self.quarantine_after and gid not in self.quarantined:
                self.quarantined.append(gid)
                entry["quarantined"].append(gid)

    def _publish(self, cycle: int, max_cycles: int, measures: dict[str, Measurement], doing: str = "") -> None:
        """Tell people watching (the TUI) where the loop is: cycle, and goals passing on the current base."""
        passing, total = sum(m.passed for m in measures.values()), len(self.goals)
        self.ctx.progress(
            phase="cycle",
            step=cycle,
            of_total=max_cycles,
            done=passing,
            total=total,
            text=f"goals {passing}/{total} passing" + (f" · {doing}" if doing else ""),
        )

    def _write_outputs(self, initial: dict[str, Measurement], current: dict[str, Measurement]) -> None:
        """Rewrite both files whole from task-derived data: a replay writes identical bytes."""
        out = self.ctx.output_dir()
        history = "".join(json.dumps(e, sort_keys=False) + "\n" for e in self.history)
        write_atomic(out / self.history_name, history)
        write_atomic(out / self.summary_name, self._summary(initial, current))

    def _summary(self, initial: dict[str, Measurement], current: dict[str, Measurement]) -> str:
        total = len(self.goals)
        lines = [
            "# evolve summary",
            "",
            f"Goals passing: {sum(m.passed for m in initial.values())}/{total} before, "
            f"{sum(m.passed for m in current.values())}/{total} after.",
            "",
        ]
        if self.quarantined:
            lines += ["Quarantined (their fixes kept breaking other goals): " + ", ".join(self.quarantined), ""]
        if stuck := self._could_not_move(current):
            lines += ["Could not move:", *(f"- {gid}: {why}" for gid, why in stuck.items()), ""]
        lines += ["| cycle | goals | result | passing before | passing after | notes |", "|---|---|---|---|---|---|"]
        for e in self.history:
            notes = [f"{field.replace('_', ' ')}: {', '.join(e[field])}" for field in _NOTED if e.get(field)]
            if e.get("reason"):
                notes.append(e["reason"])
            lines.append(
                f"| {e['cycle']} | {', '.join(e['goal_ids']) or '-'} | {e['result']} | "
                f"{e['goals_passing_before']}/{total} | {e['goals_passing']}/{total} | {'; '.join(notes)} |"
            )
        lines += ["", "| goal | before | after |", "|---|---|---|"]
        for g in self.goals:
            lines.append(f"| {g.id} | {_status(initial[g.id])} | {_status(current[g.id])} |")
        return "\n".join(lines) + "\n"


# The lists of a history entry that the summary's notes name.
_NOTED = ("fixed", "regressed", "conflicts", "resolved", "blamed", "quarantined", "not_fixed", "resting")
# A reverted cycle's reason, as said of one goal that could not move.
_REVERT_WHY = {"no goal improved": "its check still failed after the fix"}


def _said(summary: str) -> str:
    return f"the agent said: {summary[-200:]!r}" if summary else "the agent gave no summary"


def _tail(output: str) -> str:
    text = " ".join((output or "").split())
    return repr(text[-TAIL_IN_NOTE:]) if text else "(no output)"


def _status(m: Measurement) -> str:
    word = "pass" if m.passed else "FAIL"
    return f"{word} ({m.value:g})" if m.value is not None else word


def verdict_line(out: dict[str, Any]) -> str:
    """Goals passing before -> after, the cycles spent, why it stopped, and the goals that could not move."""
    why = f" ({out['stop_reason']})" if out.get("stop_reason") else ""
    if out.get("goals_total") is None:
        return f"stopped before the goals were measured: {out['stopped']}{why}"
    total = out["goals_total"]
    line = (
        f"goals passing {out['goals_passing_before']}/{total} → {out['goals_passing_after']}/{total} "
        f"after {out['cycles']} cycle(s); stopped: {out['stopped']}{why}"
    )
    if stuck := out["could_not_move"]:
        line += "; could not move: " + "; ".join(f"{gid} ({why})" for gid, why in stuck.items())
    return line
