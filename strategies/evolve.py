"""evolve: a fitness loop over a goals file, fixing independent failing goals in parallel waves.

Each cycle measures every goal (a read-only ``command`` task per goal), picks
up to ``max_parallel`` independent failing goals by weight, fixes each on its
own branch from the cycle's base, merges the fixes into one wave branch inside
a container, and re-measures everything there. A wave that breaks a goal that
passed at the start of the cycle is reverted as a whole (or, with
``bisect_on_regression``, cut down to the fixes that break nothing); otherwise
the base advances to the wave branch. The loop ends when every goal passes,
after ``max_cycles``, or after an idle cycle. See docs/evolve.md.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from itertools import combinations
from typing import Annotated, Any

from orchestrator.strategy_loader import strategy_options

from .evolve_commands import Measurement
from .evolve_goals import Goal, check_max_parallel, goals_from_param, prepare
from .evolve_select import select_goals
from .evolve_wave import bisect_wave, fix_wave, head_of, improvements, measure_all, merge_wave, regressions
from ._report import evolve_sections as report_sections  # noqa: F401  (the run report's sections)


@strategy_options(prepare=prepare)
async def evolve(prompt, base_branch, ctx, *,
                 goals: Annotated[str | list | dict, "goals file (YAML, see docs/evolve.md)"],
                 max_parallel: Annotated[int, "goals fixed per wave, 1 = sequential (at most 5)"] = 3,
                 max_cycles: Annotated[int, "stop after this many cycles"] = 10,
                 bisect_on_regression: Annotated[bool, "on a regression keep the fixes that break nothing"] = False,
                 quarantine_after: Annotated[int, "rolled-back fixes before a goal is quarantined"] = 3):
    """Keep a set of measurable goals passing: fix failing ones in parallel waves, revert regressions."""
    goal_list = goals_from_param(goals)
    max_parallel = check_max_parallel(max_parallel)
    loop = _Loop(ctx, prompt, goal_list, max_parallel=max_parallel, bisect=bisect_on_regression,
                 quarantine_after=max(1, quarantine_after))
    return await loop.run(base_branch, max_cycles)


class _Loop:
    def __init__(self, ctx, prompt: str, goals: list[Goal], *, max_parallel: int, bisect: bool,
                 quarantine_after: int) -> None:
        self.ctx, self.prompt, self.goals = ctx, prompt, goals
        self.by_id = {g.id: g for g in goals}
        self.max_parallel, self.bisect, self.quarantine_after = max_parallel, bisect, quarantine_after
        self.strikes: Counter[str] = Counter()
        self.quarantined: list[str] = []
        self.learned: set[frozenset[str]] = set()
        self.history: list[dict[str, Any]] = []
        suffix = "" if ctx.strategy_execution_id == "s1" else f"-{ctx.strategy_execution_id}"
        self.history_name = f"cycle-history{suffix}.jsonl"
        self.summary_name = f"evolve_summary{suffix}.md"

    async def run(self, base: str, max_cycles: int) -> dict[str, Any]:
        measures = await measure_all(self.ctx, self.goals, base, ("initial", "measure"))
        initial = measures
        stopped = "max-cycles"
        for cycle in range(1, max_cycles + 1):
            if all(m.passed for m in measures.values()):
                stopped = "all-passing"
                break
            entry, base, measures = await self._cycle(cycle, base, measures)
            self.history.append(entry)
            self._write_outputs(initial, measures)
            if entry["result"] == "idle":
                stopped = "idle"
                break
        else:
            if all(m.passed for m in measures.values()):
                stopped = "all-passing"
        self._write_outputs(initial, measures)
        return {
            "final_branch": base,
            "final_commit": head_of(measures),
            "stopped": stopped,
            "cycles": len(self.history),
            "goals_total": len(self.goals),
            "goals_passing_before": sum(m.passed for m in initial.values()),
            "goals_passing_after": sum(m.passed for m in measures.values()),
            "goals": {g.id: {"before": initial[g.id].passed, "after": measures[g.id].passed,
                             "value_before": initial[g.id].value, "value_after": measures[g.id].value}
                      for g in self.goals},
            "quarantined": list(self.quarantined),
            "history": self.history,
        }

    async def _cycle(self, cycle: int, base: str, measures: dict[str, Measurement]):
        """One cycle; returns its history entry, the base after it and the measurements on that base."""
        ctx, goals = self.ctx, self.goals
        entry: dict[str, Any] = {
            "cycle": cycle, "goal_ids": [], "result": "idle", "reason": "", "base_commit": head_of(measures),
            "wave_commit": None, "goals_passing": sum(m.passed for m in measures.values()),
            "goals_total": len(goals), "parallel": False,
            "goals_passing_before": sum(m.passed for m in measures.values()),
            "fixed": [], "regressed": [], "conflicts": [], "resolved": [], "blamed": [], "not_fixed": [],
            "quarantined": [], "skipped": {}, "base_branch": base,
        }
        failing = [g for g in goals if not measures[g.id].passed and g.id not in self.quarantined]
        picked, skipped = select_goals(failing, self.max_parallel, frozenset(self.learned))
        entry["skipped"] = skipped
        if not picked:
            entry["reason"] = "every failing goal is quarantined"
            return entry, base, measures
        entry["goal_ids"] = [g.id for g in picked]
        entry["parallel"] = len(picked) > 1

        fixes = await fix_wave(ctx, cycle, self.prompt, base, picked, goals, measures)
        entry["not_fixed"] = [f.goal_id for f in fixes if f.branch is None]
        wave = [(self.by_id[f.goal_id], f.branch) for f in fixes if f.branch is not None]
        if not wave:
            entry["reason"] = "no fix produced a change"
            return entry, base, measures

        merged = await merge_wave(ctx, ("c", cycle), base, wave)
        entry["conflicts"], entry["resolved"] = list(merged.conflicts), list(merged.resolved)
        if merged.branch is None:
            entry.update(result="reverted", reason=merged.error or "merge failed")
            return entry, base, measures
        after = await measure_all(ctx, goals, merged.branch, ("c", cycle, "wave", "measure"))
        entry["wave_commit"] = head_of(after)
        regressed = regressions(goals, measures, after)
        entry["regressed"] = regressed
        new_branch, new_measures = merged.branch, after
        if regressed:
            included = [(g, b) for g, b in wave if g.id in merged.included]
            new_branch, new_measures = None, None
            if self.bisect and len(included) > 1:
                cut = await bisect_wave(ctx, cycle, base, goals, included, measures,
                                        full_wave_known=not merged.resolved)
                self._blame(entry, cut.blamed)
                entry["conflicts"] += [g for g in cut.conflicts if g not in entry["conflicts"]]
                if cut.branch is not None:
                    new_branch, new_measures = cut.branch, cut.measures
                    entry["wave_commit"] = head_of(cut.measures)
                    entry["kept"] = list(cut.kept)
            elif len(included) == 1:
                self._blame(entry, [included[0][0].id])
            else:
                # Somebody in this wave broke something and we cannot tell who:
                # never pair these goals again, so the culprit ends up alone.
                self.learned.update(frozenset(p) for p in combinations(sorted(g.id for g, _ in included), 2))
            if new_branch is None:
                entry.update(result="reverted", reason="regression")
                return entry, base, measures
        gained = improvements(goals, measures, new_measures)
        if not gained:
            entry.update(result="reverted", reason="no goal improved")
            return entry, base, measures
        entry["fixed"] = gained
        entry.update(result="conflict" if entry["conflicts"] else "improved", base_branch=new_branch,
                     goals_passing=sum(m.passed for m in new_measures.values()))
        return entry, new_branch, new_measures

    def _blame(self, entry: dict[str, Any], goal_ids) -> None:
        entry["blamed"] = list(goal_ids)
        for gid in goal_ids:
            self.strikes[gid] += 1
            if self.strikes[gid] >= self.quarantine_after and gid not in self.quarantined:
                self.quarantined.append(gid)
                entry["quarantined"].append(gid)

    # -------------------------------------------------------------- outputs
    def _write_outputs(self, initial: dict[str, Measurement], current: dict[str, Measurement]) -> None:
        """Rewrite both files whole from task-derived data: a replay writes identical bytes."""
        out = self.ctx.output_dir()
        history = "".join(json.dumps(e, sort_keys=False) + "\n" for e in self.history)
        _write(out / self.history_name, history)
        _write(out / self.summary_name, self._summary(initial, current))

    def _summary(self, initial: dict[str, Measurement], current: dict[str, Measurement]) -> str:
        total = len(self.goals)
        lines = ["# evolve summary", "",
                 f"Goals passing: {sum(m.passed for m in initial.values())}/{total} before, "
                 f"{sum(m.passed for m in current.values())}/{total} after.", ""]
        if self.quarantined:
            lines += ["Quarantined (their fixes kept breaking other goals): " + ", ".join(self.quarantined), ""]
        lines += ["| cycle | goals | result | passing before | passing after | notes |",
                  "|---|---|---|---|---|---|"]
        for e in self.history:
            notes = []
            for field in ("fixed", "regressed", "conflicts", "resolved", "blamed", "quarantined", "not_fixed"):
                if e.get(field):
                    notes.append(f"{field.replace('_', ' ')}: {', '.join(e[field])}")
            if e.get("reason"):
                notes.append(e["reason"])
            lines.append(f"| {e['cycle']} | {', '.join(e['goal_ids']) or '-'} | {e['result']} | "
                         f"{e['goals_passing_before']}/{total} | {e['goals_passing']}/{total} | {'; '.join(notes)} |")
        lines += ["", "| goal | before | after |", "|---|---|---|"]
        for g in self.goals:
            lines.append(f"| {g.id} | {_status(initial[g.id])} | {_status(current[g.id])} |")
        return "\n".join(lines) + "\n"


def _status(m: Measurement) -> str:
    word = "pass" if m.passed else "FAIL"
    return f"{word} ({m.value:g})" if m.value is not None else word


def _write(path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, "utf-8")
    os.replace(tmp, path)
