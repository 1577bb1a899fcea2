"""tree-beam: global beam search over a tree of code states (docs/tree-beam.md).

::

    orchestrator "make the solver faster without losing accuracy" --strategy tree-beam \\
        -S eval_command="python bench.py --json" -S primary_metric=ops_per_s \\
        -S ideas_per_node=5 -S max_depth=3 -S beam_width=2

A node is a commit on a kept branch plus its evaluation; the root is the base
branch, evaluated first. Expanding a depth: every frontier node gets a context
pack (diff stats root->node and parent->node, the ideas tried on its path) and
an idea-generation task; new ideas (deduplicated by normalized text hash) get
sequential evaluation ids, each runs the shared per-idea pipeline (implement,
optional review rounds, evaluate) on the node's branch, all in parallel. The
gate is parent-relative, the beam rank root-relative; the top ``beam_width``
gated candidates of the whole depth become the next frontier.

Every step is a durable task, so the event log is the manifest: a resumed run
re-derives the same tree and re-runs nothing that finished, and
:func:`strategies.tree_beam_report.render_tree_report` rebuilds tree.json,
TREE_SUMMARY.md and tree.svg from the event log alone.
"""

from __future__ import annotations

from pathlib import Path

import hashlib
import re
from typing import Annotated, Any, Literal

import anyio
import msgspec

from orchestrator.errors import ConfigError
from orchestrator.strategy_loader import strategy_options

from . import schemas
from ._json import ask_json
from .evaluation import (
    Comparison,
    Evaluation,
    ScoringConfig,
    check_scoring_params,
    compare,
    evaluation_from_json,
    primary_regressed,
    to_json,
)
from .pipeline import Idea, PipelineConfig, command_task, evaluate, run_idea
from .review_loop import output_root
from .tree_beam_report import best_path, write_tree_report

IdeasContext = Literal["node_plus_ancestors", "node_only", "global"]


# ---------------------------------------------------------------- pure decision logic

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
    regressed = primary_regressed(_cmp(cmp), scoring)
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


def _cmp(data: dict[str, Any]) -> Comparison:
    return msgspec.convert(data, Comparison)


def rank_score(record: dict[str, Any]) -> float | None:
    """Root-relative score, else the root-relative primary delta, else None (ranks last)."""
    cmp = record.get("root_comparison") or {}
    score = cmp.get("score")
    return score if score is not None else cmp.get("primary_delta")


def rank_key(record: dict[str, Any]) -> tuple:
    score = record["decision"]["rank_score"]
    delta = (record.get("root_comparison") or {}).get("primary_delta")
    return (score is None, -(score or 0.0), delta is None, -(delta or 0.0), record["id"])


def select_beam(records: list[dict[str, Any]], beam_width: int) -> list[dict[str, Any]]:
    """The top ``beam_width`` gated records of the whole depth, best first."""
    gated = [r for r in records if r["decision"]["passed_gate"]]
    return sorted(gated, key=rank_key)[:beam_width]


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


# ---------------------------------------------------------------- prompts and context

def ideation_prompt(goal: str, node: dict[str, Any], k: int, context: str) -> str:
    return (f"Role: ideator\nNode: {node['id']}\n\nOverall goal: {goal}\n\n{context}\n\n"
            f"Propose {k} new improvement ideas for the code in this repository, each a single focused change "
            "that can be implemented and measured on its own, different from the ideas listed above. Do not modify "
            'any files. Reply with ONLY JSON: {"ideas": [{"title": "...", "description": "..."}]}')


def _outcome_line(r: dict[str, Any]) -> str:
    cmp = r.get("parent_comparison") or {}
    result = f"result {cmp.get('score')} ({cmp.get('grade')})" if cmp else r["status"]
    gate_txt = "kept" if r["decision"]["passed_gate"] else f"dropped: {r['decision']['promotion_reason']}"
    return f"- {r['idea']['title']}: {result}, {gate_txt}"


def context_pack(tree: Tree, node: dict[str, Any], diffstat: str | None, mode: str) -> str:
    parts = []
    if diffstat:
        parts.append(f"Changes on this branch so far (git diff --stat):\n{diffstat.strip()}")
    path = tree.path_to(node["id"])
    applied = [tree.evals[n["eval_id"]] for n in path if n.get("eval_id")]
    if mode == "global":
        shown = list(tree.evals.values())
        label = "Ideas evaluated so far in this run"
    else:
        parents = path[:-1] if mode == "node_plus_ancestors" else path[-2:-1]
        shown = applied if mode == "node_plus_ancestors" else applied[-1:]
        shown += [r for p in parents for r in tree.children_evals(p["id"])
                  if not r["decision"]["passed_gate"]]
        label = "Ideas already tried on this path and their outcomes"
    if shown:
        parts.append(label + ":\n" + "\n".join(_outcome_line(r) for r in sorted(shown, key=lambda r: r["id"])))
    return "\n\n".join(parts) or "This is the starting point: no ideas have been tried yet."


# ---------------------------------------------------------------- the tree being built

class Tree:
    """Nodes, evaluations and depth records; a pure function of task results."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.nodes: dict[str, dict[str, Any]] = {}
        self.evals: dict[str, dict[str, Any]] = {}
        self.depths: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.root_evaluation: dict[str, Any] | None = None
        self.evals_used = 0

    def path_to(self, node_id: str) -> list[dict[str, Any]]:
        path = []
        cur: str | None = node_id
        while cur is not None:
            path.append(self.nodes[cur])
            cur = self.nodes[cur]["parent"]
        return path[::-1]

    def children_evals(self, node_id: str) -> list[dict[str, Any]]:
        return [r for r in self.evals.values() if r["parent"] == node_id]

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

    def to_json(self) -> dict[str, Any]:
        return {"kind": "tree-beam", "config": self.config, "root_evaluation": self.root_evaluation,
                "stop_reason": self.stop_reason, "evals_used": self.evals_used,
                "nodes": list(self.nodes.values()), "evaluations": list(self.evals.values()),
                "depths": self.depths,
                "delete_branches": [] if self.config["keep_rejected"] else self.delete_list()}


# ---------------------------------------------------------------- the strategy

def prepare(params: dict[str, Any], repo_path: str) -> dict[str, Any]:
    """Check the parameters before the run starts (one clear line per problem)."""
    if not params.get("eval_command"):
        raise ConfigError("tree-beam needs -S eval_command=\"...\" (prints JSON metrics as its last line)")
    check_scoring_params(params.get("primary_metric"), params.get("direction", "max"), params.get("weights") or {},
                         params.get("tolerance", 0.01), eval_command=params["eval_command"])
    for name in ("ideas_per_node", "max_depth", "beam_width"):
        if params.get(name, 1) < 1:
            raise ConfigError(f"-S {name} must be >= 1")
    if params.get("max_total_evals") is not None and params["max_total_evals"] < 1:
        raise ConfigError("-S max_total_evals must be >= 1 (or omitted for no budget)")
    if params.get("max_review_rounds", 0) < 0:
        raise ConfigError("-S max_review_rounds must be >= 0")
    return dict(params)


@strategy_options(prepare=prepare)
async def tree_beam(prompt, base_branch, ctx, *,
                    eval_command: Annotated[str | None, "evaluation command (last stdout line: JSON metrics)"] = None,
                    primary_metric: Annotated[str | None, "metric that decides better/worse"] = None,
                    direction: Annotated[Literal["max", "min"], "whether the primary metric should go up or down"] = "max",
                    weights: Annotated[dict, "weights of other metrics, e.g. {\"latency_ms\": -0.5}"] = {},  # noqa: B006
                    tolerance: Annotated[float, "relative noise band (0.01 = 1%)"] = 0.01,
                    ideas_per_node: Annotated[int, "ideas generated per expanded node"] = 5,
                    max_depth: Annotated[int, "maximum tree depth"] = 3,
                    beam_width: Annotated[int, "nodes kept per depth across the whole frontier"] = 2,
                    max_total_evals: Annotated[int | None, "budget of candidate evaluations for the run"] = None,
                    keep_rejected: Annotated[bool, "keep branches of candidates that were not promoted"] = False,
                    ideas_context: Annotated[IdeasContext, "what the idea generator is told"] = "node_plus_ancestors",
                    dedupe_scope: Annotated[Literal["path", "run"], "dedupe ideas on the node's path or the whole run"] = "path",
                    max_review_rounds: Annotated[int, "review rounds per idea (0 = implement only)"] = 0,
                    test_command: Annotated[str | None, "shell command gating each candidate before evaluation"] = None,
                    eval_timeout_s: Annotated[float | None, "timeout of one evaluation"] = None):
    """Global beam search over a tree of evaluated code states."""
    if not eval_command or not primary_metric:
        raise ConfigError("tree-beam needs -S eval_command and -S primary_metric")
    scoring = ScoringConfig(primary_metric=primary_metric, direction=direction, weights=weights or {},
                            tolerance=tolerance)
    pipe = PipelineConfig(review=max_review_rounds > 0, max_review_rounds=max_review_rounds,
                          test_command=test_command, eval_command=eval_command, eval_timeout_s=eval_timeout_s,
                          scoring=scoring)
    tree = Tree({"base_branch": base_branch, "eval_command": eval_command, "primary_metric": primary_metric,
                 "direction": direction, "weights": weights or {}, "tolerance": tolerance,
                 "ideas_per_node": ideas_per_node, "max_depth": max_depth, "beam_width": beam_width,
                 "max_total_evals": max_total_evals, "keep_rejected": keep_rejected, "ideas_context": ideas_context,
                 "dedupe_scope": dedupe_scope, "max_review_rounds": max_review_rounds, "test_command": test_command})
    observe = getattr(ctx, "observe_tree", None)
    if observe is not None:
        observe(tree)  # report-only replay renders whatever this tree reached
    out = output_root(ctx)

    root_ev, _ = await evaluate(ctx, eval_command, base_branch, ("root", "eval"), timeout=eval_timeout_s)
    tree.root_evaluation = to_json(root_ev)
    evaluations: dict[str, Evaluation] = {"n0": root_ev}
    tree.nodes["n0"] = {"id": "n0", "parent": None, "depth": 0, "branch": base_branch, "commit": root_ev.commit,
                        "eval_id": None, "idea_chain": [], "metrics": tree.root_evaluation["metrics"],
                        "rank_score": None, "root_comparison": None}
    if root_ev.status != "ok":
        return _finish(tree, out, "root_evaluation_failed")
    frontier = ["n0"]
    for depth in range(1, max_depth + 1):
        record: dict[str, Any] = {"depth": depth, "frontier": list(frontier), "ideas": {}, "duplicates": [],
                                  "evaluations": [], "promoted": [], "budget_hit": False}
        tree.depths.append(record)
        # 1. context pack and ideas for every frontier node, in parallel
        generated: dict[str, list[dict[str, str]] | None] = {}

        async def ideate(node_id: str) -> None:
            node = tree.nodes[node_id]
            diffstat = None
            if node["parent"] is not None:
                parent = tree.nodes[node["parent"]]
                cmd = (f"echo 'root -> node:'; git diff --stat {tree.nodes['n0']['commit']} HEAD; "
                       f"echo 'parent -> node:'; git diff --stat {parent['commit']} HEAD")
                try:
                    diffstat = (await ctx.wait(ctx.run(command_task(cmd, node["branch"]),
                                                       key=ctx.key(node_id, "context"))))["final_message"]
                except ctx.errors.TaskFailed as exc:
                    diffstat = f"(diff stat unavailable: {exc.error_type})"
            task = {"prompt": ideation_prompt(prompt, node, ideas_per_node,
                                              context_pack(tree, node, diffstat, ideas_context)),
                    "base_branch": node["branch"], "import_policy": "never"}
            generated[node_id] = await ask_json(ctx, task, (node_id, "ideas"),
                                                lambda d: parse_ideas(d, ideas_per_node), schemas.ideas(ideas_per_node))

        async with anyio.create_task_group() as tg:
            for node_id in frontier:
                tg.start_soon(ideate, node_id)
        # 2. dedupe and budget, in frontier then idea order: eval ids never depend on timing
        planned: list[tuple[str, dict[str, Any]]] = []
        for node_id in frontier:
            ideas = generated[node_id]
            record["ideas"][node_id] = None if ideas is None else len(ideas)
            seen = tree.seen_hashes(node_id, dedupe_scope) | {r["idea"]["hash"] for _, r in planned
                                                              if dedupe_scope == "run" or r["parent"] == node_id}
            for idea in ideas or []:
                h = idea_hash(idea["title"], idea["description"])
                if h in seen:
                    record["duplicates"].append({"node": node_id, "title": idea["title"], "hash": h})
                    continue
                if max_total_evals is not None and tree.evals_used >= max_total_evals:
                    record["budget_hit"] = True
                    break
                seen.add(h)
                tree.evals_used += 1
                eid = f"e{tree.evals_used:04d}"
                planned.append((eid, {"id": eid, "parent": node_id, "depth": depth,
                                      "idea": {"title": idea["title"], "description": idea["description"], "hash": h}}))
        # 3. implement and evaluate every planned idea, in parallel
        for eid, rec in planned:
            tree.evals[eid] = {**rec, "status": "pending", "branch": None, "commit": None, "evaluation": None,
                               "parent_comparison": None, "root_comparison": None, "rounds": [], "error": None,
                               "decision": {"gate_basis": "parent_relative", "rank_basis": "root_relative",
                                            "passed_gate": False, "rank_score": None, "promotion_reason": "pending",
                                            "primary_regressed": False}, "promoted_to": None,
                               "artifacts": f"evals/{eid}"}
            record["evaluations"].append(eid)

        async def implement(eid: str) -> None:
            rec = tree.evals[eid]
            parent = tree.nodes[rec["parent"]]
            idea = Idea(id=eid, title=rec["idea"]["title"], text=f"{rec['idea']['title']}\n\n{rec['idea']['description']}")
            outcome = await run_idea(ctx, idea, goal=prompt, base_branch=parent["branch"], key_prefix=(eid,),
                                     cfg=pipe, baseline=evaluations[rec["parent"]], root=root_ev,
                                     out_dir=out / "evals" / eid)
            rec.update(status=outcome["status"], branch=outcome["branch"], commit=outcome["commit"],
                       evaluation=outcome["evaluation"], parent_comparison=outcome["comparison"],
                       root_comparison=outcome["root_comparison"], rounds=outcome["rounds"], error=outcome["error"])
            passed, reason, regressed = gate(rec, scoring)
            rec["decision"].update(passed_gate=passed, promotion_reason=reason, primary_regressed=regressed,
                                   rank_score=rank_score(rec) if passed else None)

        async with anyio.create_task_group() as tg:
            for eid, _ in planned:
                tg.start_soon(implement, eid)
        # 4. global beam: the best gated candidates of the whole depth become nodes
        chosen = select_beam([tree.evals[e] for e, _ in planned], beam_width)
        chosen_ids = {r["id"] for r in chosen}
        for r in (tree.evals[e] for e, _ in planned):
            if r["decision"]["passed_gate"] and r["id"] not in chosen_ids:
                r["decision"]["promotion_reason"] = "below_beam"
        frontier = []
        for r in chosen:
            node_id = f"n{len(tree.nodes)}"
            parent = tree.nodes[r["parent"]]
            r["promoted_to"] = node_id
            r["decision"]["promotion_reason"] = f"promoted ({r['decision']['promotion_reason']})"
            evaluations[node_id] = evaluation_from_json(r["evaluation"])
            tree.nodes[node_id] = {"id": node_id, "parent": r["parent"], "depth": depth, "branch": r["branch"],
                                   "commit": r["commit"], "eval_id": r["id"],
                                   "idea_chain": parent["idea_chain"] + [{"eval_id": r["id"], "title": r["idea"]["title"]}],
                                   "metrics": r["evaluation"]["metrics"], "rank_score": r["decision"]["rank_score"],
                                   "root_comparison": r["root_comparison"]}
            frontier.append(node_id)
        record["promoted"] = list(frontier)
        write_tree_report(tree.to_json(), out)  # progress: the tree so far
        if not frontier:
            return _finish(tree, out, "frontier_empty")
        if max_total_evals is not None and tree.evals_used >= max_total_evals:
            return _finish(tree, out, "max_total_evals")
    return _finish(tree, out, "max_depth")


def _finish(tree: Tree, out, reason: str) -> dict[str, Any]:
    tree.stop_reason = reason
    data = tree.to_json()
    write_tree_report(data, out)
    path = best_path(data)
    best = path[-1]
    return {"stop_reason": reason, "best_node": best["id"], "best_branch": best["branch"],
            "best_path": [n["id"] for n in path], "evals_used": tree.evals_used,
            "delete_branches": data["delete_branches"], "tree": data}


# ---- hooks the orchestrator command calls (see orchestrator/launch.py, manage.py) ----------


def _execution_dirs(output_dir: Path, state) -> list[tuple[str, Path]]:
    from .tree_beam_replay import tree_executions

    return [(sid, output_dir if sid == "s1" else output_dir / sid) for sid in tree_executions(state)]


def after_run(*, repo_path: str, output_dir: Path, state) -> list[str]:
    """After a finished run: delete the rejected candidates' branches listed in delete_branches.txt."""
    from .tree_beam_report import delete_listed_branches

    lines = []
    for sid, directory in _execution_dirs(Path(output_dir), state):
        if state.strategies[sid].status != "success":
            continue
        outcomes = delete_listed_branches(repo_path, directory)
        deleted = sum(1 for _, how in outcomes if how == "deleted")
        moved = [b for b, how in outcomes if how == "moved"]
        if outcomes:
            lines.append(f"tree-beam {sid}: deleted {deleted} rejected candidate branch(es)"
                         + (f"; kept {len(moved)} that moved since: {', '.join(moved)}" if moved else ""))
    return lines


def show_run_report(*, run_id: str, dirs, manifest, state) -> list[str]:
    """``--show-run``: regenerate tree.json / TREE_SUMMARY.md / tree.svg from the log and validate them."""
    from .tree_beam_report import render_tree_report, validate_tree

    output_dir = dirs.results / run_id / "strategy_output"
    written = render_tree_report(dirs.events(run_id), output_dir)
    problems = []
    for sid, directory in _execution_dirs(output_dir, state):
        tree_file = directory / "tree.json"
        if tree_file.exists():
            print(f"tree-beam {sid}: {directory / 'TREE_SUMMARY.md'} (regenerated from the event log)")
            problems += [f"{sid}: {p}" for p in validate_tree(tree_file, manifest.repo_path)]
    if written and not problems:
        print("tree validated: every promoted commit is on its branch; frontier and depth records agree")
    return problems
