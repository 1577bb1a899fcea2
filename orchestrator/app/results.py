"""Results export: summary.json, branches.txt, metrics.csv and the human summary, all computed from the run's fold
and manifest, so ``--show-run`` on a finished run prints the summary the run printed."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import msgspec

from ..log.runs import RunDirs, RunManifest
from ..log.state import (
    COMPLETED,
    FAILED,
    INTERRUPTED,
    OUTCOME_FAILED,
    UNUSABLE,
    UNUSABLE_WORDS,
    RunState,
    run_outcome,
    task_label,
    task_outcome,
    write_snapshot_bytes,
)
from ..report.selection import (
    UNFINISHED,
    claims,
    fmt_duration,
    missing_branches,
    selection,
    unheld_branches,
    verdict,
)
from ..sanitize import default_sanitizer
from ..strategy import RunView
from .leftovers import count_recorded_leftovers, leftover_lines
from .locate import run_state
from .run_budget import spend_text, summary_of


def _final_branches(strategies: list[dict[str, Any]], base: str, *, reviewed: bool = True) -> list[str]:
    """The branches the executions selected and judged: the merge advice, never a branch nobody chose, nor the base
    branch where the run started. ``reviewed=False``: the picks nobody judged instead, named but not advised."""
    return list(
        dict.fromkeys(
            s["selected_branch"]
            for s in strategies
            if s["selected_branch"] not in (None, base) and s.get("selection_reviewed", True) == reviewed
        )
    )


class RepositoryCheck(NamedTuple):
    """What the repository says about the run's branches when the summary is written."""

    # selected branches that no longer hold the commit the run recorded: why
    unheld: dict[str, str]
    # branches the run created that are gone (a strategy's clean-up deleted them)
    gone: frozenset[str] = frozenset()


def check_repository(manifest: RunManifest, state: RunState) -> RepositoryCheck:
    """Blocking (runs git): call it from a worker thread in async code."""
    made = {t.branch_final for t in state.tasks.values() if t.branch_final}
    # the selected (branch, commit) pairs, checked before a merge is advised
    selected = claims(
        run_outcome(state), [(s.status, s.result) for s in state.strategies.values()], manifest.base_branch
    )
    return RepositoryCheck(
        unheld=unheld_branches(manifest.repo_path, selected),
        gone=missing_branches(manifest.repo_path, made),
    )


async def recorded_summary(dirs: RunDirs, manifest: RunManifest, *, live: bool = False) -> tuple[RunState, dict]:
    """A run's state and summary as its records and the repository tell them now (leftovers counted unless live)."""
    state = run_state(dirs, manifest.run_id)
    checked = await anyio.to_thread.run_sync(check_repository, manifest, state)
    left = None if live else await count_recorded_leftovers(manifest, str(dirs.manifest(manifest.run_id)))
    return state, build_summary(manifest, state, checked, left, live=live)


# The summary's keys that copy the manifest, in their order; two say it in other words.
_FROM_MANIFEST = (
    "run_id dry_run strategy strategy_spec params runs model plugin repo base_branch created_at finished_at"
)
_RENAMED = {"strategy": "strategy_name", "repo": "repo_path"}


def build_summary(
    manifest: RunManifest,
    state: RunState,
    repo: RepositoryCheck | None = None,
    leftovers: dict[str, Any] | None = None,
    *,
    live: bool = False,
) -> dict[str, Any]:
    """The run's summary, with what ``repo`` found in the repository (nothing checked without it), ending with the
    ``leftovers`` :func:`.leftovers.count_leftovers` counted. ``live``: a process is running the run now."""
    status = run_outcome(state, live=live)
    unheld = repo.unheld if repo else None
    gone = repo.gone if repo else frozenset()
    strategies = []
    all_branches: list[str] = []
    for sid, strat in sorted(state.strategies.items(), key=lambda kv: int(kv[0][1:]) if kv[0][1:].isdigit() else 0):
        tasks = [t for t in state.tasks.values() if t.strategy_execution_id == sid]
        tasks.sort(key=lambda t: (t.scheduled_at or "", t.key))
        rows = [_task_row(t, task_outcome(state, t) == UNUSABLE, gone) for t in tasks]
        for t in tasks:
            if t.branch_final and t.branch_final not in all_branches and t.branch_final not in gone:
                all_branches.append(t.branch_final)
        strategies.append(_strategy_entry(sid, strat, rows, status, manifest.base_branch, unheld))
    unusable_count = sum(row["unusable"] for s in strategies for row in s["tasks"])
    summary = {key: getattr(manifest, _RENAMED.get(key, key)) for key in _FROM_MANIFEST.split()} | {
        "status": status,
        "duration_s": state.duration_s(),
        "totals": _totals(state, status, unusable_count),
        "budget": summary_of(state.budget),
        "strategies": strategies,
        "branches": all_branches,
        "final_branches": _final_branches(strategies, manifest.base_branch),
        "unreviewed_branches": _final_branches(strategies, manifest.base_branch, reviewed=False),
    }
    if leftovers is not None:
        summary["leftovers"] = {"branches": len(all_branches), **leftovers}
    return summary


def _task_row(t: Any, unusable: bool, gone: frozenset[str]) -> dict[str, Any]:
    return {
        "key": t.key,
        "instance_id": t.instance_id,
        "state": t.state,
        # completed, but the strategy could not use its result (why it failed)
        "unusable": unusable,
        "branch": t.branch_final,
        "branch_planned": t.branch_name,
        "duration_s": round(t.duration_s, 3),
        "cost_usd": t.cost_usd,
        "tokens_in": t.tokens_in,
        "tokens_out": t.tokens_out,
        "error_type": t.error_type,
        "error": t.message,
        "attempts": t.attempts,
        "uncommitted_files": t.uncommitted_files,
        "auto_committed": t.auto_committed,
        "branch_deleted": bool(t.branch_final and t.branch_final in gone),
    }


def _strategy_entry(
    sid: str, strat: Any, rows: list[dict[str, Any]], status: str, base_branch: str, unheld: Any
) -> dict[str, Any]:
    decided = {"run_status": status, "status": strat.status, "error": strat.error, "result": strat.result}
    chosen = selection(**decided, base_branch=base_branch, unheld=unheld)
    return {
        "strategy_execution_id": sid,
        "name": strat.name,
        "params": strat.params,
        "status": strat.status,
        "error": strat.error,
        "verdict": verdict(**decided, base_branch=base_branch),
        "selected_branch": chosen["branch"],
        "selection_reviewed": chosen["reviewed"],
        "selection_note": chosen["note"],
        "result": strat.result,
        "tasks": rows,
    }


def _totals(state: RunState, status: str, unusable_count: int) -> dict[str, Any]:
    c = state.counters
    finished = c.completed + c.failed
    succeeded = c.completed - unusable_count
    total_cost = sum((t.cost_usd or 0.0) for t in state.tasks.values())
    cost_known = any(t.cost_usd is not None for t in state.tasks.values())
    return {
        "tasks": len(state.tasks),
        "completed": c.completed,
        "failed": c.failed,
        "unusable": unusable_count,
        "interrupted": sum(1 for t in state.tasks.values() if t.state == INTERRUPTED),
        "cost_usd": round(total_cost, 6) if cost_known else None,
        "tokens_in": c.tokens_in,
        "tokens_out": c.tokens_out,
        # A run that failed has no success to rate, however many of its tasks completed.
        "success_rate": round(succeeded / finished, 4) if finished and status != OUTCOME_FAILED else None,
    }


def export(
    dirs: RunDirs,
    manifest: RunManifest,
    state: RunState,
    repo: RepositoryCheck | None = None,
    leftovers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write results/<run_id>/{summary.json, branches.txt, metrics.csv}; return the summary."""
    summary = default_sanitizer().scrub(build_summary(manifest, state, repo, leftovers))
    out = dirs.results / manifest.run_id
    (out / "strategy_output").mkdir(parents=True, exist_ok=True)
    write_snapshot_bytes(msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n", [out / "summary.json"])
    (out / "branches.txt").write_text("".join(f"{b}\n" for b in summary["branches"]), "utf-8")
    (out / "metrics.csv").write_text(metrics_csv(state), "utf-8")
    return summary


_METRICS_COLUMNS = """timestamp key instance_id strategy_execution_id state duration_s cost_usd tokens_in tokens_out
branch tasks_finished cumulative_cost_usd cumulative_tokens"""


def metrics_csv(state: RunState) -> str:
    """One row per finished task in completion order, with running totals (a time series)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(_METRICS_COLUMNS.split())
    done = sorted(
        (t for t in state.tasks.values() if t.state in (COMPLETED, FAILED)), key=lambda t: (t.completed_at or "", t.key)
    )
    cost = 0.0
    tokens = 0
    for i, t in enumerate(done, 1):
        cost += t.cost_usd or 0.0
        tokens += t.tokens_in + t.tokens_out
        w.writerow(
            [
                t.completed_at,
                t.key,
                t.instance_id,
                t.strategy_execution_id,
                t.state,
                round(t.duration_s, 3),
                "" if t.cost_usd is None else t.cost_usd,
                t.tokens_in,
                t.tokens_out,
                t.branch_final or "",
                i,
                round(cost, 6),
                tokens,
            ]
        )
    return buf.getvalue()


def fmt_tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def fmt_cost(cost: float | None) -> str:
    return "N/A" if cost is None else f"${cost:.2f}"


def _raised(budget: dict[str, Any] | None) -> str:
    """The flag that raises the cap that was reached (doubled, as an example)."""
    b = budget or {}
    if b.get("max_cost_usd") is not None:
        return f"--max-cost {b['max_cost_usd'] * 2:.2f}"
    return f"--max-tokens {(b.get('max_tokens') or b.get('spent_tokens') or 1) * 2}"


def render_summary(summary: dict[str, Any], *, results_path: Path) -> str:
    lines = [
        f"═══ Run {'Complete' if summary['status'] == 'completed' else summary['status'].replace('_', ' ').title()}: "
        f"{summary['run_id']} ═══",
        "",
    ]
    if summary.get("dry_run"):
        lines += ["DRY RUN: agent tasks were answered by the simulated agent; nothing was spent.", ""]
    lines.append(f"Strategy: {summary['strategy']}")
    for k, v in (summary.get("params") or {}).items():
        if v is None:
            continue  # left unset: the strategy's default applies, and "model: …" said nothing
        text = v if isinstance(v, (str, int, float, bool)) else json.dumps(v, separators=(", ", ": "))
        lines.append(f"  {k}: {text if len(str(text)) <= 120 else str(text)[:119] + '…'}")
    lines += ["", f"Runs: {summary['runs']}", "", "Results by strategy:", ""]
    for s in summary["strategies"]:
        lines += _strategy_lines(s, summary)
    lines += _totals_lines(summary)
    where = ["", f"Full results: {results_path}/", f"Report: {results_path}/report.html", *leftover_lines(summary)]
    return "\n".join(lines + _advice_lines(summary, results_path) + where)


def _task_lines(t: dict[str, Any]) -> list[str]:
    # tasks without a branch (reviews, scorings, checks) are named by their key
    label = t["branch"] or task_label(t["key"])
    if t["state"] == "COMPLETED" and t.get("unusable"):
        # it ran, but what it measured is why the strategy failed: not a success
        return [f"  ✗ {label}  {fmt_duration(t['duration_s'])}: {UNUSABLE_WORDS}"]
    if t["state"] == "COMPLETED":
        tokens = fmt_tokens((t["tokens_in"] or 0) + (t["tokens_out"] or 0))
        extra = (
            " (deleted by the strategy's clean-up)"
            if t.get("branch_deleted")
            else ""
            if t["branch"]
            else " (no branch)"
        )
        lines = [f"  ✓ {label}  {fmt_duration(t['duration_s'])} • {fmt_cost(t['cost_usd'])} • {tokens} tokens{extra}"]
        left = t.get("uncommitted_files") or 0
        if left and t.get("auto_committed"):
            lines.append(f"      {left} file(s) the agent left uncommitted were committed for it")
        elif left:
            lines.append(f"      ⚠ {left} file(s) the agent left uncommitted were discarded (uncommitted: discard)")
        return lines
    if t["state"] == "FAILED":
        first_line = (t["error"] or "").splitlines()[0][:120] if t["error"] else ""
        return [f"  ✗ {label}  Failed ({t['error_type']}): {first_line}"]
    return [f"  … {label}  {t['state'].lower()}"]


def _strategy_lines(s: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    lines = [f"Strategy #{s['strategy_execution_id'].lstrip('s')} ({s['name']}):"]
    for t in s["tasks"]:
        lines += _task_lines(t)
    if s["status"] == "failed":
        # a multi-line reason (a base evaluation's output) stays indented under its strategy
        first, *rest = (s["error"] or "").splitlines() or [""]
        lines.append(f"  ✗ strategy failed: {first}")
        lines += [f"    {ln}" for ln in rest]
    elif s.get("verdict") and summary["status"] not in UNFINISHED:
        lines.append(f"  Verdict: {s['verdict']}")
    if s["selected_branch"] == summary["base_branch"]:
        lines.append(f"  → Kept {s['selected_branch']}: nothing to merge")
    elif s["selected_branch"] and not s.get("selection_reviewed", True):
        lines.append(f"  → Picked without review: {s['selected_branch']}")
    elif s["selected_branch"]:
        lines.append(f"  → Selected: {s['selected_branch']}")
    elif summary["status"] not in UNFINISHED and s.get("selection_note"):
        lines.append(f"  → Nothing selected: {s['selection_note']}")
    return [*lines, ""]


def _totals_lines(summary: dict[str, Any]) -> list[str]:
    t = summary["totals"]
    succeeded = t["completed"] - (t.get("unusable") or 0)
    finished = t["completed"] + t["failed"]
    lines = ["Summary:"]
    if summary.get("duration_s") is not None:
        lines.append(f"  Total Duration: {fmt_duration(summary['duration_s'])}")
    if summary["status"] == OUTCOME_FAILED:
        # No rate for a run that failed: "1/1 (100%)" beside a failure reads as a success.
        rate_line = f"  Tasks: {succeeded}/{finished} succeeded; the run failed"
    else:
        rate_line = f"  Success Rate: {succeeded}/{finished} tasks" + (
            f" ({t['success_rate'] * 100:.0f}%)" if t["success_rate"] is not None else ""
        )
    simulated = " (simulated: nothing was spent)" if summary.get("dry_run") else ""
    lines += [
        f"  Total Cost: {fmt_cost(t['cost_usd'])}{simulated}",
        f"  Tokens: {fmt_tokens(t['tokens_in'])} in / {fmt_tokens(t['tokens_out'])} out",
        rate_line,
    ]
    if summary.get("budget"):
        lines.append(f"  Spend: {spend_text(summary['budget'])}")
    lines.append("")
    if summary["status"] == "budget_reached":
        lines.append(
            "Stopped at the spending cap: raise it to go on, e.g. "
            f"orchestrator --resume {summary['run_id']} {_raised(summary['budget'])}"
        )
        lines.append("")
    return lines


def _advice_lines(summary: dict[str, Any], results_path: Path) -> list[str]:
    """What to do with the run's branches: nothing yet, nothing at all, or which to compare and merge."""
    if summary["status"] in UNFINISHED:
        # Nothing is decided until the strategy finishes: no branch of an unfinished run is advice.
        if summary["status"] == "live":
            return ["Still running: nothing is selected yet."]
        return [
            "Not finished: nothing was selected, so there is no branch to merge yet.",
            f"Resume with: orchestrator --resume {summary['run_id']}",
        ]
    lines: list[str] = []
    finals = summary["final_branches"]
    base = summary["base_branch"]
    unreviewed = summary.get("unreviewed_branches") or []
    if unreviewed:
        # A pick nobody judged (the cap stopped every review) is named, with the way to look at it: no merge.
        lines.append(f"Picked without review ({len(unreviewed)}), so not advised for merging:")
        lines += [f"  {b}" for b in unreviewed]
        lines += [f"To compare {'it' if len(unreviewed) == 1 else 'them'} with {base} before deciding:"]
        lines += [f"  git diff {base}...{b}" for b in unreviewed]
        lines.append("")
    if not finals:
        kept = [s for s in summary["strategies"] if s["selected_branch"] == summary["base_branch"]]
        why = (
            f"the run left {summary['base_branch']} as the best result"
            if kept
            else "nothing it selected was reviewed"
            if unreviewed
            else "no strategy execution selected a branch"
        )
        lines.append(f"No branch to merge: {why}.")
        created = summary.get("branches") or []
        if created:
            lines.append(f"The run created {len(created)} branch(es), listed in {results_path}/branches.txt.")
        return lines
    lines.append(f"Final branches ({len(finals)}):")
    lines += [f"  {b}" for b in finals]
    lines += ["", "To compare implementations:", f"  git diff {base}..{finals[0]}"]
    if len(finals) > 1:
        lines.append(f"  git diff {finals[0]}..{finals[1]}")
    lines += ["", "To merge selected solution:", f"  git merge {finals[0]}"]
    return lines


def run_view(dirs: RunDirs, manifest: RunManifest, state: RunState) -> RunView:
    """The public view of a run that a strategy's after-run hooks receive."""
    run_id = manifest.run_id
    return RunView(
        run_id=run_id,
        prompt=manifest.prompt,
        repo_path=manifest.repo_path,
        base_branch=manifest.base_branch,
        events_path=dirs.events(run_id),
        logs_dir=dirs.logs / run_id,
        output_dir=dirs.results / run_id / "strategy_output",
        executions={sid: s.status for sid, s in state.strategies.items()},
        task_keys=frozenset(state.tasks),
    )
