"""tree-beam: global beam search over a tree of code states (docs/tree-beam.md: usage, the search, the statistics).

Every step is a durable task: a resumed run re-derives the same tree, and the report is rebuilt from the event log.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import msgspec

from orchestrator.strategy import BaseEvaluationFailed, ConfigError, Context, ReplayError, RunView, strategy_options

from . import schemas
from ._json import ask_twice
from ._report import tree_beam_sections as report_sections  # noqa: F401  (the run report's sections)
from ._report_tasks import report_task  # noqa: F401  (its command tasks in the report)
from .base_check import run_on_base, unusable_evaluation
from .evaluation import (
    Comparison,
    Evaluation,
    ScoringConfig,
    check_scoring,
    compare,
    evaluation_from_json,
    primary_regressed,
    to_json,
)
from .pipeline import Idea, PipelineConfig, command_task, run_idea
from .review_loop import DirectionParam, EvalCommand, PrimaryMetric, Weights, output_root, tests_cannot_run
from .tree_beam_measure import Measurer, Spending, decide, default_protected_paths, merge_measurements, unpaired_change
from .tree_beam_report import (
    best_path,
    branch_claims,
    is_tree_execution,
    listed_branches,
    node_key,
    order_key,
    tree_problems,
    tree_verdict,
    write_tree_report,
)

IdeasContext = Literal["node_plus_ancestors", "node_only", "global"]


def idea_hash(title: str, description: str) -> str:
    """Normalized text hash: case, bullets, punctuation and spacing do not make an idea new."""
    lines = [re.sub(r"^\s*(?:[-*+•]|\d+[.)])\s*", "", ln) for ln in f"{title}\n{description}".lower().splitlines()]
    text = re.sub(r"[^a-z0-9]+", " ", " ".join(lines)).strip()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gate(record: dict[str, Any], scoring: ScoringConfig) -> tuple[bool, str, bool]:
    """Parent-relative promotion gate: ``(passed, reason, primary_regressed)``."""
    if record["status"] != "completed":
        return False, f"not_evaluated:{record['status']}", False
    ev = evaluation_from_json(record["evaluation"])
    cmp = record["parent_comparison"]
    if cmp is None:
        return False, "no_parent_comparison", False
    regressed = primary_regressed(msgspec.convert(cmp, Comparison), scoring)
    if not ev.valid:
        return False, "invalid_evaluation", regressed
    if not ev.complete:
        return False, "incomplete_evaluation", regressed
    if cmp["primary_delta"] is None:
        return False, "primary_metric_missing", regressed
    if regressed:
        return False, "primary_metric_regressed", True
    if cmp["should_explore"]:
        return True, "should_explore", False
    if cmp["grade"] == "mixed":
        return True, "mixed_without_primary_regression", False
    return False, f"not_promising:{cmp['grade']}", False


def rank_score(record: dict[str, Any]) -> float | None:
    """Root-relative score, else the root-relative primary delta, else None (ranks last)."""
    cmp = record.get("root_comparison") or {}
    score = cmp.get("score")
    return score if score is not None else cmp.get("primary_delta")


def rank_key(record: dict[str, Any]) -> tuple:
    return order_key(record["decision"]["rank_score"], record, record["id"])


def parse_ideas(data: Any, limit: int) -> list[dict[str, str]] | None:
    """``{"ideas": [{"title", "description"}]}`` (or a bare list) -> at most ``limit`` ideas, None if invalid."""
    items = data.get("ideas") if isinstance(data, dict) else data
    if not isinstance(items, list):
        return None
    ideas = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("title"), str) and item["title"].strip():
            desc = item.get("description", "")
            ideas.append({"title": item["title"].strip(), "description": desc if isinstance(desc, str) else str(desc)})
    return ideas[:limit] or None


def ideation_prompt(goal: str, node: dict[str, Any], k: int, context: str) -> str:
    return (
        f"Role: ideator\nNode: {node['id']}\n\nOverall goal: {goal}\n\n{context}\n\n"
        f"Propose {k} new improvement ideas for the code in this repository, each a single focused change "
        "that can be implemented and measured on its own, different from the ideas listed above. Do not modify "
        'any files. Reply with ONLY JSON: {"ideas": [{"title": "...", "description": "..."}]}'
    )


def _outcome_line(r: dict[str, Any]) -> str:
    cmp = r.get("parent_comparison") or {}
    result = f"result {cmp.get('score')} ({cmp.get('grade')})" if cmp else r["status"]
    if change := (r.get("confirmation") or {}).get("change"):
        result += (
            f", confirmed change {100 * change['mean']:+.2f}% "
            f"(interval {100 * change['low']:+.2f}%..{100 * change['high']:+.2f}%)"
        )
    gate_txt = "kept" if r.get("promoted_to") else f"dropped: {r['decision']['promotion_reason']}"
    return f"- {r['idea']['title']}: {result}, {gate_txt}"


def context_pack(tree: Tree, node: dict[str, Any], diffstat: str | None, mode: str) -> str:
    changes = f"Changes on this branch so far (git diff --stat):\n{diffstat.strip()}" if diffstat else ""
    parts = [p for p in (changes, tried_ideas(tree, node, mode)) if p]
    return "\n\n".join(parts) or "This is the starting point: no ideas have been tried yet."


class Tree:
    """Nodes, evaluations and depth records; a pure function of task results."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.nodes: dict[str, dict[str, Any]] = {}
        self.evals: dict[str, dict[str, Any]] = {}
        self.depths: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.root_evaluation: dict[str, Any] | None = None
        self.root_measurement: dict[str, Any] = {}
        self.evals_used = 0
        self.archive: list[str] = []  # passed screening, missed the beam: reserves for an empty frontier
        self.revivals: list[dict[str, Any]] = []
        self.spending: Spending | None = None
        self.budget_reason: str | None = None
        self.best: dict[str, Any] | None = None

    def path_to(self, node_id: str) -> list[dict[str, Any]]:
        path = []
        cur: str | None = node_id
        while cur is not None:
            path.append(self.nodes[cur])
            cur = self.nodes[cur]["parent"]
        return path[::-1]

    def seen_hashes(self, node_id: str, scope: str) -> set[str]:
        if scope == "run":
            return {r["idea"]["hash"] for r in self.evals.values()}
        on_path = {n["id"] for n in self.path_to(node_id)}
        return {r["idea"]["hash"] for r in self.evals.values() if r["parent"] in on_path}

    def delete_list(self) -> list[dict[str, str]]:
        """Branches this run created that no node keeps: every round branch except promoted finals."""
        kept = {n["branch"] for n in self.nodes.values()}
        out: dict[str, str] = {}
        for r in self.evals.values():
            for rnd in r.get("rounds", []):
                if rnd["branch"] and rnd["branch"] not in kept:
                    out[rnd["branch"]] = rnd.get("commit") or ""
        return [{"branch": b, "commit": c} for b, c in sorted(out.items())]

    def eval_runs(self) -> int:
        """Benchmark runs spent: screening, confirmations and the final check (the root included)."""
        cfg = self.config
        runs = cfg["eval_repeats"] if self.root_evaluation else 0
        for r in self.evals.values():
            if r.get("evaluation") is not None:
                runs += cfg["eval_repeats"]
            if (r.get("confirmation") or {}).get("pairs"):
                runs += 2 * r["confirmation"]["pairs"]
        best_check = (self.best or {}).get("check") or {}
        if best_check.get("pairs"):
            runs += 2 * best_check["pairs"]
        return runs

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "tree-beam",
            "config": self.config,
            "root_evaluation": self.root_evaluation,
            "root_measurement": self.root_measurement,
            "stop_reason": self.stop_reason,
            "evals_used": self.evals_used,
            "eval_runs": self.eval_runs(),
            "spent": {"cost_usd": round(self.spending.budget.cost_usd, 6) if self.spending else 0.0},
            "best": self.best,
            "flagged_protected": sorted(r["id"] for r in self.evals.values() if r.get("protected_changed")),
            "flaky_runs": sum(r.get("flaky_runs", 0) for r in self.evals.values())
            + self.root_measurement.get("flaky_runs", 0),
            "archive": list(self.archive),
            "revivals": self.revivals,
            "nodes": list(self.nodes.values()),
            "evaluations": list(self.evals.values()),
            "depths": self.depths,
            "delete_branches": [] if self.config["keep_rejected"] else self.delete_list(),
        }


def _values(ev: dict[str, Any] | None, confidence: float) -> str:
    if not ev or ev.get("status") != "ok":
        return "(not measured)"
    stats = ev.get("stats") or {}
    parts = []
    for name, value in sorted((ev.get("metrics") or {}).items()):
        st = stats.get(name)
        spread = (
            f" (median of {st['n']} runs, {confidence:.0%} interval of the mean {st['low']:g}..{st['high']:g})"
            if st and st["n"] > 1
            else ""
        )
        parts.append(f"{name}={'n/a' if value is None else f'{value:g}'}{spread}")
    return "; ".join(parts) or "(no metrics)"


def objective_text(tree: Tree, node: dict[str, Any], *, tried: bool) -> str:
    """What is measured, how, and where this node stands: the agents optimise what they can see."""
    cfg = tree.config
    better = "higher" if cfg["direction"] == "max" else "lower"
    unit = f" (unit: {cfg['metric_unit']})" if cfg.get("metric_unit") else ""
    lines = [
        f"Objective: {'maximise' if cfg['direction'] == 'max' else 'minimise'} the metric "
        f"`{cfg['primary_metric']}`{unit}; {better} is better."
    ]
    if cfg["weights"]:
        lines.append(
            "Other metrics in the score (weight per relative change; positive = higher is better): "
            + ", ".join(f"{k}={v:g}" for k, v in sorted(cfg["weights"].items()))
        )
    lines += [
        f"Evaluation command (run from the repository root; its last stdout line is JSON with a "
        f'"metrics" object): {cfg["eval_command"]}',
        f"Each candidate is measured {cfg['eval_repeats']} time(s); a change is kept only when it beats "
        "its parent by more than the measurement noise.",
    ]
    if cfg["protected_paths"]:
        lines.append(
            "Protected evaluator: " + ", ".join(cfg["protected_paths"]) + " are always taken from the base "
            "branch when measuring, so changing them has no effect (and is flagged)."
        )
    lines.append(f"Values at this node ({node['id']}): {_values(node.get('evaluation'), cfg['confidence'])}")
    lines.append(f"Values at the root (base branch): {_values(tree.root_evaluation, cfg['confidence'])}")
    if log := (node.get("eval_log") or "").strip():
        lines.append(f"Last evaluation output at this node (trimmed):\n```\n{log[-1500:]}\n```")
    if tried and (shown := tried_ideas(tree, node, cfg["ideas_context"])):
        lines.append(shown)
    return "\n".join(lines)


def tried_ideas(tree: Tree, node: dict[str, Any], mode: str) -> str:
    path = tree.path_to(node["id"])
    applied = [tree.evals[n["eval_id"]] for n in path if n.get("eval_id")]
    if mode == "global":
        shown = list(tree.evals.values())
        label = "Ideas evaluated so far in this run"
    else:
        parents = path[:-1] if mode == "node_plus_ancestors" else path[-2:-1]
        shown = applied if mode == "node_plus_ancestors" else applied[-1:]
        on_path = {p["id"] for p in parents}
        shown += [r for r in tree.evals.values() if r["parent"] in on_path and not r["decision"]["passed_gate"]]
        label = "Ideas already tried on this path and their outcomes"
    shown = [r for r in shown if r["status"] != "pending"]
    if not shown:
        return ""
    return label + ":\n" + "\n".join(_outcome_line(r) for r in sorted(shown, key=lambda r: r["id"]))


def prepare(params: dict[str, Any], repo_path: str) -> dict[str, Any]:
    """Check the parameters before the run starts (one clear line per problem)."""
    if not params.get("eval_command"):
        raise ConfigError('tree-beam needs -S eval_command="..." (prints JSON metrics as its last line)')
    check_scoring(params)
    for name in ("ideas_per_node", "max_depth", "beam_width", "eval_repeats", "eval_parallel"):
        if params.get(name, 1) < 1:
            raise ConfigError(f"-S {name} must be >= 1")
    if params.get("confirm_pairs", 2) != 0 and params.get("confirm_pairs", 2) < 2:
        raise ConfigError("-S confirm_pairs must be 0 (no confirmation) or >= 2 (an interval needs two pairs)")
    if not 0 < params.get("confidence", 0.9) < 1:
        raise ConfigError("-S confidence must be between 0 and 1, e.g. 0.9")
    if params.get("max_total_evals") is not None and params["max_total_evals"] < 1:
        raise ConfigError("-S max_total_evals must be >= 1 (or omitted for no budget)")
    for name in ("max_cost_usd", "max_wall_s"):
        if params.get(name) is not None and params[name] <= 0:
            raise ConfigError(f"-S {name} must be a positive number (or omitted for no limit)")
    for name in ("max_review_rounds", "debug_rounds"):
        if params.get(name, 0) < 0:
            raise ConfigError(f"-S {name} must be >= 0")
    paths = params.get("protected_paths")
    if paths is not None and not (isinstance(paths, list) and all(map(_relative_path, paths))):
        raise ConfigError(
            '-S protected_paths must be a JSON list of repository-relative paths, e.g. ["bench.py", "bench/"]'
        )
    return dict(params)


def _relative_path(p: Any) -> bool:
    plain = isinstance(p, str) and not any(c.isspace() or c in "*?[" for c in p)
    return plain and p != "" and not p.startswith("/") and ".." not in p


@strategy_options(prepare=prepare)
async def tree_beam(
    prompt,
    base_branch,
    ctx: Context,
    *,
    eval_command: EvalCommand = None,
    primary_metric: PrimaryMetric = None,
    direction: DirectionParam = "max",
    metric_unit: Annotated[str, "unit of the primary metric, shown to the agents (e.g. ops/s)"] = "",
    weights: Weights = {},  # noqa: B006
    tolerance: Annotated[float, "relative band: an interval narrower than this is 'tight' (0.01 = 1%)"] = 0.01,
    eval_repeats: Annotated[int, "runs of the evaluation per candidate (median and interval)"] = 3,
    confirm_pairs: Annotated[int, "paired parent/candidate runs confirming a promotion (0 = none)"] = 10,
    confidence: Annotated[float, "confidence of the intervals (two-sided)"] = 0.9,
    eval_parallel: Annotated[int, "evaluations running at once (apart from agent tasks)"] = 1,
    protected_paths: Annotated[
        list | None, "paths always measured as on the base branch (default: files the eval command names, and bench/)"
    ] = None,
    ideas_per_node: Annotated[int, "ideas generated per expanded node"] = 5,
    max_depth: Annotated[int, "maximum tree depth"] = 3,
    beam_width: Annotated[int, "nodes kept per depth across the whole frontier"] = 2,
    max_total_evals: Annotated[int | None, "budget of candidate evaluations for the run"] = None,
    max_cost_usd: Annotated[float | None, "no new task starts once the run's tasks cost this much"] = None,
    max_wall_s: Annotated[float | None, "no new task starts once the run has lasted this long"] = None,
    keep_rejected: Annotated[bool, "keep branches of candidates that were not promoted"] = False,
    ideas_context: Annotated[IdeasContext, "what the idea generator is told"] = "node_plus_ancestors",
    dedupe_scope: Annotated[Literal["path", "run"], "dedupe ideas on the node's path or the whole run"] = "path",
    max_review_rounds: Annotated[int, "review rounds per idea (0 = implement only)"] = 0,
    test_command: Annotated[str | None, "shell command gating each candidate before evaluation"] = None,
    debug_rounds: Annotated[int, "fix rounds for a coder whose candidate failed the tests"] = 1,
    eval_timeout_s: Annotated[float | None, "timeout of one evaluation run"] = None,
):
    """Global beam search over a tree of evaluated code states."""
    # The parameters as the run was asked for them, base branch first: tree.json shows them as its config.
    config = {name: value for name, value in locals().items() if name not in ("prompt", "ctx")}
    if not eval_command or not primary_metric:
        raise ConfigError("tree-beam needs -S eval_command and -S primary_metric")
    config.update(
        weights=weights or {},
        protected_paths=list(default_protected_paths(eval_command) if protected_paths is None else protected_paths),
    )
    search = _Search(ctx, Tree(config), prompt)
    await search.measure_root()
    frontier = ["n0"]
    while True:
        if not frontier:
            frontier, stop = await search.revive()
        elif not (expandable := [n for n in frontier if search.tree.nodes[n]["depth"] < max_depth]):
            stop = "max_depth"
        elif (reason := search.ctx.over_budget()) is not None:
            stop = f"budget: {reason}"
        else:
            frontier, stop = await search.expand(expandable)
        if stop is not None:
            return await search.end(stop)


class _Search:
    """One execution's search; its steps ask ``ctx`` in a fixed order, so a resumed run's log replays the same keys."""

    root_ev: Evaluation

    def __init__(self, ctx: Context, tree: Tree, prompt: str) -> None:
        cfg = self.cfg = tree.config
        self.tree, self.prompt = tree, prompt
        self.scoring = ScoringConfig(**{k: cfg[k] for k in ("primary_metric", "direction", "weights", "tolerance")})
        pipe_fields = ("max_review_rounds", "test_command", "eval_command", "eval_timeout_s", "debug_rounds")
        self.pipe = PipelineConfig(
            review=cfg["max_review_rounds"] > 0, scoring=self.scoring, **{k: cfg[k] for k in pipe_fields}
        )
        self.out = output_root(ctx)
        self.ctx: Any = Spending(ctx, max_cost_usd=cfg["max_cost_usd"], max_wall_s=cfg["max_wall_s"])
        tree.spending = self.ctx
        self.meter = Measurer(self.ctx, cfg, self.scoring)
        self.evaluations: dict[str, Evaluation] = {}
        self.round_no = 0

    def publish(self) -> dict[str, Any]:
        """Write the tree and the progress wherever it changed: an interrupted run's files hold what it got to."""
        data = self.tree.to_json()
        write_tree_report(data, self.out)
        self.ctx.progress(**tree_progress(data))
        return data

    def finish(self, reason: str) -> dict[str, Any]:
        tree = self.tree
        tree.stop_reason = reason
        data = self.publish()
        path = best_path(data)
        best = path[-1]
        return {
            "verdict": tree_verdict(data),
            "stop_reason": reason,
            "best_node": best["id"],
            "best_branch": best["branch"],
            "best_path": [n["id"] for n in path],
            "beat_base": bool((tree.best or {}).get("beat_base")),
            "evals_used": tree.evals_used,
            "spent": data["spent"],
            "delete_branches": data["delete_branches"],
            "tree": data,
        }

    async def end(self, reason: str) -> dict[str, Any]:
        """Pick the best node, confirm it against the base, and finish."""
        tree, meter = self.tree, self.meter
        candidates = [n for n in tree.nodes.values() if n["parent"] is not None and (n.get("rank_score") or 0) > 0]
        best = min(candidates, key=node_key) if candidates else None
        verdict: dict[str, Any] = {"node": "n0", "beat_base": False, "check": None, "candidate": None}
        if best is not None:
            verdict["candidate"] = best["id"]
            budget_reason = self.ctx.over_budget()
            if meter.cfg["confirm_pairs"] == 0 or budget_reason is not None:
                # no paired check (not asked for, or no budget left): the chain of confirmed promotions is the evidence
                basis = "separate_measurements" + ("; budget spent" if budget_reason else "")
                cand = evaluation_from_json(best["evaluation"])
                verdict["check"] = _unpaired_check(self.root_ev, cand, meter, basis, strict_better=True)
            else:
                verdict["check"] = await meter.confirm(
                    best["branch"], ("final", "confirm"), tree.nodes["n0"]["commit"], strict_better=True
                )
            if verdict["check"]["passed"]:
                verdict.update(node=best["id"], beat_base=True)
        tree.best = verdict
        return self.finish(reason)

    async def measure_root(self) -> None:
        """Measure the base; stop the run when candidates could not be measured against it."""
        ctx, tree, cfg = self.ctx, self.tree, self.cfg
        self.publish()
        # The test gate runs on the base alongside the root's measurement: one that cannot run at all
        # would fail every candidate after it was paid for.
        test_command = cfg["test_command"]
        tests_get = run_on_base(ctx, test_command, cfg["base_branch"], ("root", "tests")) if test_command else None
        info: dict[str, Any] = {}
        root_ev, root_log = await self.meter.screen(cfg["base_branch"], ("root", "eval"), info)
        tests_run = await tests_get() if tests_get is not None else None
        tree.root_evaluation = to_json(root_ev)
        tree.root_measurement = {"flaky_runs": info.get("flaky_runs", 0)}
        self.meter.root_commit = root_ev.commit or "HEAD"
        self.meter.root_expected = root_ev.expected
        self.root_ev = self.evaluations["n0"] = root_ev
        tree.nodes["n0"] = {
            "id": "n0",
            "parent": None,
            "depth": 0,
            "branch": cfg["base_branch"],
            "commit": root_ev.commit,
            "eval_id": None,
            "idea_chain": [],
            "metrics": tree.root_evaluation["metrics"],
            "evaluation": tree.root_evaluation,
            "eval_log": root_log[-2000:] if root_ev.status == "ok" else "",
            "rank_score": None,
            "root_comparison": None,
        }
        if (stop := unusable_evaluation(root_ev, [cfg["primary_metric"], *sorted(cfg["weights"])])) is not None:
            # Every candidate would be measured against this: stop before any agent task spends money.
            self.finish(stop[0])
            output = "\n".join(t for t in (info.get("log", ""), info.get("err_log", "")) if t.strip())
            raise BaseEvaluationFailed(
                stop[1], command=cfg["eval_command"], output=output, keys=(ctx.key("root", "eval"),)
            )
        if tests_run is not None and (stop_run := tests_cannot_run(ctx, tests_run, test_command, "root")):
            self.finish("root_tests_cannot_run")
            raise stop_run
        self.publish()

    async def expand(self, expandable: list[str]) -> tuple[list[str], str | None]:
        """One depth (ideas for the frontier, implemented, screened, the best confirmed): the next frontier, a stop reason."""
        tree, cfg = self.tree, self.cfg
        self.round_no += 1
        record: dict[str, Any] = {
            "depth": self.round_no,
            "frontier": list(expandable),
            "ideas": {},
            "duplicates": [],
            "evaluations": [],
            "promoted": [],
            "budget_hit": False,
        }
        tree.depths.append(record)
        generated: dict[str, list[dict[str, str]] | None] = {}
        async with anyio.create_task_group() as tg:
            for node_id in expandable:
                tg.start_soon(self.ideate, node_id, generated)
        planned = self.plan(expandable, generated, record)
        for rec in planned:
            tree.evals[rec["id"]] = rec
            record["evaluations"].append(rec["id"])
        self.publish()
        if (reason := self.ctx.over_budget()) is not None:
            for rec in planned:
                rec.update(status="skipped")
                rec["decision"]["promotion_reason"] = "not_started:budget"
            return [], f"budget: {reason}"
        async with anyio.create_task_group() as tg:
            for rec in planned:
                tg.start_soon(self.implement, rec)
        # The best screened candidates are confirmed in rank order until the beam is full; the rest is archived.
        queue = sorted((rec for rec in planned if rec["decision"]["passed_gate"]), key=rank_key)
        chosen = await self.confirm_in_rank_order(queue, cfg["beam_width"])
        for r in queue:
            r["decision"]["promotion_reason"] = "below_beam"
            tree.archive.append(r["id"])
        frontier = self.promote(chosen)
        record["promoted"] = list(frontier)
        self.publish()
        if tree.budget_reason:
            return frontier, f"budget: {tree.budget_reason}"
        if cfg["max_total_evals"] is not None and tree.evals_used >= cfg["max_total_evals"]:
            return frontier, "max_total_evals"
        return frontier, None

    async def ideate(self, node_id: str, generated: dict[str, list[dict[str, str]] | None]) -> None:
        ctx, tree, cfg = self.ctx, self.tree, self.cfg
        node = tree.nodes[node_id]
        diffstat = None
        if node["parent"] is not None:
            parent = tree.nodes[node["parent"]]
            cmd = (
                f"echo 'root -> node:'; git diff --stat {tree.nodes['n0']['commit']} HEAD; "
                f"echo 'parent -> node:'; git diff --stat {parent['commit']} HEAD"
            )
            try:
                diffstat = (
                    await ctx.wait(ctx.run(command_task(cmd, node["branch"]), key=ctx.key(node_id, "context")))
                )["final_message"]
            except ctx.errors.TaskFailed as exc:
                diffstat = f"(diff stat unavailable: {exc.error_type})"
        context = (
            objective_text(tree, node, tried=False) + "\n\n" + context_pack(tree, node, diffstat, cfg["ideas_context"])
        )
        k = cfg["ideas_per_node"]
        task = {
            "prompt": ideation_prompt(self.prompt, node, k, context),
            "base_branch": node["branch"],
            "import_policy": "never",
        }
        generated[node_id] = (
            await ask_twice(ctx, task, (node_id, "ideas"), lambda d: parse_ideas(d, k), schemas.ideas(k))
        )[0]

    def plan(
        self, expandable: list[str], generated: dict[str, list[dict[str, str]] | None], record: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """New ideas within the budget, as pending evaluations: frontier then idea order, so ids never depend on timing."""
        tree, scope, limit = self.tree, self.cfg["dedupe_scope"], self.cfg["max_total_evals"]
        planned: list[dict[str, Any]] = []
        for node_id in expandable:
            ideas = generated[node_id]
            record["ideas"][node_id] = None if ideas is None else len(ideas)
            seen = tree.seen_hashes(node_id, scope) | {
                r["idea"]["hash"] for r in planned if scope == "run" or r["parent"] == node_id
            }
            for idea in ideas or []:
                h = idea_hash(idea["title"], idea["description"])
                if h in seen:
                    record["duplicates"].append({"node": node_id, "title": idea["title"], "hash": h})
                    continue
                if limit is not None and tree.evals_used >= limit:
                    record["budget_hit"] = True
                    break
                seen.add(h)
                tree.evals_used += 1
                idea = {"title": idea["title"], "description": idea["description"], "hash": h}
                planned.append(_pending(f"e{tree.evals_used:04d}", node_id, tree.nodes[node_id]["depth"] + 1, idea))
        return planned

    async def implement(self, rec: dict[str, Any]) -> None:
        """The shared per-idea pipeline on the parent's branch, then the parent-relative screen."""
        eid, tree = rec["id"], self.tree
        parent = tree.nodes[rec["parent"]]
        parent_ev = self.evaluations[rec["parent"]]
        idea = Idea(id=eid, title=rec["idea"]["title"], text=f"{rec['idea']['title']}\n\n{rec['idea']['description']}")
        info: dict[str, Any] = {}
        outcome = await run_idea(
            self.ctx,
            idea,
            goal=self.prompt,
            base_branch=parent["branch"],
            key_prefix=(eid,),
            cfg=self.pipe,
            baseline=parent_ev,
            root=self.root_ev,
            out_dir=self.out / "evals" / eid,
            objective=objective_text(tree, parent, tried=True),
            evaluator=functools.partial(self.meter.screen, info=info),
        )
        # (every key but eval_log is already in the record: the update keeps tree.json's key order)
        rec.update(
            {k: outcome[k] for k in ("status", "branch", "commit", "evaluation", "root_comparison", "rounds", "error")},
            parent_comparison=outcome["comparison"],
            protected_changed=info.get("protected_changed", []),
            flaky_runs=info.get("flaky_runs", 0),
            eval_log=(info.get("log") or "")[-2000:],
        )
        if outcome.get("tests"):
            rec["tests"] = {k: outcome["tests"][k] for k in ("passed", "debug_rounds") if k in outcome["tests"]}
        passed, reason, regressed = gate(rec, self.scoring)
        if passed and rec["evaluation"]:
            candidate = evaluation_from_json(rec["evaluation"])
            rec["screen_change"] = unpaired_change(parent_ev, candidate, self.scoring, self.cfg["confidence"])
        rec["decision"].update(
            passed_gate=passed,
            promotion_reason=reason,
            primary_regressed=regressed,
            rank_score=rank_score(rec) if passed else None,
        )
        self.publish()

    async def confirm_in_rank_order(self, queue: list[dict[str, Any]], slots: int) -> list[dict[str, Any]]:
        """Confirm the best-ranked screened candidates until ``slots`` pass (or none is left); ``queue`` keeps the rest."""
        chosen: list[dict[str, Any]] = []
        while queue and len(chosen) < slots:
            if (reason := self.ctx.over_budget()) is not None:
                self.tree.budget_reason = reason
                break
            batch, queue[:] = queue[: slots - len(chosen)], queue[slots - len(chosen) :]
            async with anyio.create_task_group() as tg:
                for r in batch:
                    tg.start_soon(self.confirm, r, chosen)
            for r in batch:
                if r in chosen:
                    _absorb_confirmation(r, self.root_ev, self.scoring, self.cfg["confidence"])
        return sorted(chosen, key=rank_key)

    async def confirm(self, r: dict[str, Any], chosen: list[dict[str, Any]]) -> None:
        if self.cfg["confirm_pairs"] == 0:
            candidate = evaluation_from_json(r["evaluation"])
            r["confirmation"] = _unpaired_check(self.evaluations[r["parent"]], candidate, self.meter, "screening_runs")
        else:
            parent = self.tree.nodes[r["parent"]]
            r["confirmation"] = await self.meter.confirm(r["branch"], (r["id"], "confirm"), parent["commit"])
        if r["confirmation"]["passed"]:
            chosen.append(r)
        else:
            r["decision"].update(passed_gate=False, promotion_reason=f"not_confirmed:{r['confirmation']['reason']}")

    def promote(self, chosen: list[dict[str, Any]]) -> list[str]:
        tree, new = self.tree, []
        for r in chosen:
            node_id = f"n{len(tree.nodes)}"
            parent = tree.nodes[r["parent"]]
            r["promoted_to"] = node_id
            r["decision"]["promotion_reason"] = f"promoted ({r['confirmation']['reason']})"
            self.evaluations[node_id] = evaluation_from_json(r["evaluation"])
            tree.nodes[node_id] = {
                "id": node_id,
                "parent": r["parent"],
                "depth": parent["depth"] + 1,
                "branch": r["branch"],
                "commit": r["commit"],
                "eval_id": r["id"],
                "idea_chain": parent["idea_chain"] + [{"eval_id": r["id"], "title": r["idea"]["title"]}],
                "metrics": r["evaluation"]["metrics"],
                "evaluation": r["evaluation"],
                "eval_log": r.get("eval_log", ""),
                "rank_score": r["decision"]["rank_score"],
                "root_comparison": r["root_comparison"],
                "confirmation": r["confirmation"],
                "protected_changed": r.get("protected_changed", []),
            }
            new.append(node_id)
        return new

    async def revive(self) -> tuple[list[str], str | None]:
        """Beyond a pure beam: an empty frontier continues from the best archived candidates."""
        tree = self.tree
        revived_from = sorted((tree.evals[e] for e in tree.archive), key=rank_key)
        if not revived_from:
            return [], "frontier_empty"
        if (reason := self.ctx.over_budget()) is not None:
            return [], f"budget: {reason}"
        tree.archive = []
        chosen = await self.confirm_in_rank_order(revived_from, self.cfg["beam_width"])
        tree.archive = [r["id"] for r in revived_from if r["decision"]["promotion_reason"] == "below_beam"]
        frontier = self.promote(chosen)
        tree.revivals.append(
            {
                "after_round": self.round_no,
                "promoted": list(frontier),
                "confirmed_from_archive": [r["id"] for r in chosen],
            }
        )
        self.publish()
        return frontier, f"budget: {tree.budget_reason}" if tree.budget_reason else None


def _pending(eid: str, parent: str, depth: int, idea: dict[str, str]) -> dict[str, Any]:
    return {
        "id": eid,
        "parent": parent,
        "depth": depth,
        "idea": idea,
        "status": "pending",
        "branch": None,
        "commit": None,
        "evaluation": None,
        "parent_comparison": None,
        "root_comparison": None,
        "screen_change": None,
        "confirmation": None,
        "protected_changed": [],
        "flaky_runs": 0,
        "rounds": [],
        "error": None,
        "decision": {
            "gate_basis": "parent_relative",
            "rank_basis": "root_relative",
            "passed_gate": False,
            "rank_score": None,
            "promotion_reason": "pending",
            "primary_regressed": False,
        },
        "promoted_to": None,
        "artifacts": f"evals/{eid}",
    }


def _unpaired_check(
    before: Evaluation, after: Evaluation, meter: Measurer, basis: str, *, strict_better: bool = False
) -> dict[str, Any]:
    """A check from the separate measurements already taken, without paired runs."""
    change = unpaired_change(before, after, meter.scoring, meter.cfg["confidence"])
    passed, why = (
        decide(change, meter.scoring.tolerance, strict_better=strict_better) if change else (True, "no_interval")
    )
    return {"pairs": 0, "change": change, "passed": passed, "reason": why, "basis": basis}


def _absorb_confirmation(r: dict[str, Any], root_ev: Evaluation, scoring: ScoringConfig, confidence: float) -> None:
    """A confirmed candidate's figures become screening plus confirmation runs of the same commit."""
    conf = r["confirmation"]
    if conf.get("candidate") and r["evaluation"]:
        merged = merge_measurements(evaluation_from_json(r["evaluation"]), evaluation_from_json(conf["candidate"]))
        r["evaluation"] = to_json(merged)
        r["root_comparison"] = to_json(compare(merged, root_ev, scoring))
        r["decision"]["rank_score"] = rank_score(r)


def tree_progress(data: dict[str, Any]) -> dict[str, Any]:
    """The ``ctx.progress`` fields for a tree (as ``Tree.to_json`` gives it)."""
    current = data["depths"][-1] if data["depths"] else None
    evals = {r["id"]: r for r in data["evaluations"]}
    scores = [n["rank_score"] for n in data["nodes"] if n.get("rank_score") is not None]
    done = sum(1 for e in current["evaluations"] if evals[e]["status"] != "pending") if current else 0
    total = len(current["evaluations"]) if current else 0
    if data["stop_reason"]:
        text = f"stopped: {data['stop_reason']}"
    elif current is None:
        text = "measuring the base" if data["root_evaluation"] is None else "generating ideas"
    else:
        text = f"{done}/{total} candidates of this depth evaluated"
    return {
        "phase": "depth",
        "step": current["depth"] if current else 0,
        "of_total": data["config"]["max_depth"],
        "frontier": len(current["frontier"]) if current else len(data["nodes"]),
        "best": max(scores) if scores else None,
        "done": done,
        "total": total,
        "text": text,
    }


# ---- hooks the orchestrator command calls (see orchestrator/app/launch.py, app/manage.py) ----------
# They only read files and the folded state: the orchestrator does the git work through its git layer.


def _execution_dirs(run: RunView) -> list[tuple[str, Path]]:
    """``(sid, output folder)`` of each tree-beam execution of the run (a tree evaluates its root first)."""
    return [
        (sid, run.output_dir if sid == "s1" else run.output_dir / sid)
        for sid in sorted(run.executions)
        if f"{run.run_id}/{sid}/root/eval" in run.task_keys
    ]


def branches_to_delete(run: RunView) -> list[str]:
    """After a finished run: the branches delete_branches.txt lists (docs/tree-beam.md, "Branch cleanup contract")."""
    return [b for sid, d in _execution_dirs(run) if run.executions[sid] == "success" for b in listed_branches(d)]


def show_run_report(run: RunView) -> list[str]:
    """``--show-run``: regenerate tree.json / TREE_SUMMARY.md / tree.svg from the log and check them."""
    problems = []
    try:
        render_tree_report(run.events_path, run.output_dir, prompt=run.prompt)
    except ReplayError as exc:
        problems.append(f"{exc}; traceback in {run.logs_dir / 'orchestration.jsonl'}")
    for sid, directory in _execution_dirs(run):
        tree_file = directory / "tree.json"
        if tree_file.exists():
            print(f"tree-beam {sid}: {directory / 'TREE_SUMMARY.md'} (regenerated from the event log)")
            problems += [f"{sid}: {p}" for p in tree_problems(tree_file)]
    return problems


def claimed_branches(run: RunView) -> list[tuple[str, str, str]]:
    """``(what, branch, commit)``: every tree node's commit must be reachable from its branch."""
    return [
        (f"{sid}: {node}", branch, commit)
        for sid, directory in _execution_dirs(run)
        if (directory / "tree.json").exists()
        for node, branch, commit in branch_claims(directory / "tree.json")
    ]


def render_tree_report(
    events_path: str | Path, out_dir: str | Path, *, sid: str | None = None, prompt: str = ""
) -> list[Path]:
    """Regenerate tree.json / TREE_SUMMARY.md / tree.svg: the strategy replayed over the log into a scratch folder."""
    from orchestrator.strategy import replay_strategy  # loads the engine: only when asked

    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="tree-replay-") as tmp:
        outcomes = replay_strategy(
            events_path,
            tree_beam,
            output_dir=tmp,
            prompt=prompt,
            executions=None if sid is None else [sid],
            select=is_tree_execution,
        )
        for outcome in outcomes:
            execution = outcome.strategy_execution_id
            sub = "" if execution == "s1" else execution
            tree_file = Path(tmp) / sub / "tree.json"
            if tree_file.exists():
                written += write_tree_report(json.loads(tree_file.read_text("utf-8")), Path(out_dir) / sub)
        failed = [o for o in outcomes if o.ended == "error"]
    if failed:
        raise ReplayError(
            "; ".join(f"{o.strategy_execution_id}: replaying the strategy raised {o.error}" for o in failed)
            + " (the report shows the tree up to there)"
        )
    return written
