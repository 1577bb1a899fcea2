"""tree-beam outputs (tree.json, TREE_SUMMARY.md, tree.svg) and the checks of a tree (docs/tree-beam.md).

Nothing here runs git: the orchestrator checks the claims and deletes the listed branches through its git layer.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, cast

from .evaluation import fmt_number

COLOURS = {
    "root": "#9e9e9e",
    "promoted": "#2e7d32",
    "below_beam": "#f9a825",
    "gate_failed": "#c62828",
    "failed": "#424242",
    "pending": "#e0e0e0",
}


def order_key(score: float | None, item: dict[str, Any], tiebreak: Any) -> tuple:
    """Best first: the rank score, then the root-relative primary delta (missing ones last), then ``tiebreak``."""
    delta = (item.get("root_comparison") or {}).get("primary_delta")
    return (score is None, -(score or 0.0), delta is None, -(delta or 0.0), tiebreak)


def node_key(node: dict[str, Any]) -> tuple:
    return order_key(node.get("rank_score"), node, int(node["id"][1:]))


def best_path(tree: dict[str, Any]) -> list[dict[str, Any]]:
    """Root -> best node; best = max rank score, then root-relative delta, then lowest node id."""
    nodes = {n["id"]: n for n in tree["nodes"]}
    if tree.get("best") is not None:
        # the run decided (and confirmed against the base); the base itself may be the best
        best = nodes.get(tree["best"]["node"], nodes.get("n0"))
    else:
        candidates = [n for n in tree["nodes"] if n["parent"] is not None]
        best = min(candidates, key=node_key) if candidates else nodes.get("n0")
    path = []
    while best is not None:
        path.append(best)
        best = nodes.get(best["parent"]) if best["parent"] is not None else None
    return path[::-1]


def outcome_of(record: dict[str, Any]) -> str:
    if record.get("promoted_to"):
        return "promoted"
    if record["status"] == "pending":
        return "pending"
    if record["status"] != "completed":
        return "failed"
    return "below_beam" if record["decision"]["passed_gate"] else "gate_failed"


def summary_markdown(tree: dict[str, Any]) -> str:
    cfg = tree["config"]
    root = tree.get("root_evaluation") or {}
    lines = ["# tree-beam summary", "", "## Run configuration", ""]
    lines += [f"- {k}: `{json.dumps(v)}`" for k, v in cfg.items()]
    lines += [
        "",
        f"Root baseline ({cfg['base_branch']}): status {root.get('status', '-')}, "
        f"metrics `{json.dumps(root.get('metrics'))}`" + (f", error: {root['error']}" if root.get("error") else ""),
        "",
        f"Stop reason: **{tree.get('stop_reason') or 'interrupted (run not finished)'}**; "
        f"evaluations used: {tree.get('evals_used', 0)}"
        + (f"; benchmark runs: {tree['eval_runs']}" if "eval_runs" in tree else "")
        + (f"; flaky runs (failed once, passed on the retry): {tree['flaky_runs']}" if tree.get("flaky_runs") else "")
        + (f"; cost: ${tree['spent']['cost_usd']:.4f}" if tree.get("spent") else ""),
        "",
    ]
    lines += _result_lines(tree)
    evals = {r["id"]: r for r in tree["evaluations"]}
    for d in tree["depths"]:
        lines += [
            f"## Depth {d['depth']}",
            "",
            f"Frontier: {', '.join(d['frontier'])}; ideas per node: "
            + ", ".join(f"{k}={fmt_number(v)}" for k, v in d["ideas"].items())
            + (f"; duplicates skipped: {len(d['duplicates'])}" if d["duplicates"] else "")
            + ("; budget reached at this depth" if d.get("budget_hit") else ""),
            "",
            "| eval | parent | idea | status | parent score (grade) | confirmed change vs parent | root score "
            "| gate | decision | node | flags |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for eid in d["evaluations"]:
            r = evals[eid]
            pc, rc = r.get("parent_comparison") or {}, r.get("root_comparison") or {}
            flags = []
            if r.get("protected_changed"):
                flags.append("changed protected " + " ".join(r["protected_changed"]))
            if r.get("flaky_runs"):
                flags.append(f"{r['flaky_runs']} flaky run(s)")
            lines.append(
                f"| {eid} | {r['parent']} | {r['idea']['title']} | {r['status']} | "
                f"{fmt_number(pc.get('score'))} ({pc.get('grade') or '-'}) | {_change(r.get('confirmation'))} | "
                f"{fmt_number(rc.get('score'))} | "
                f"{'pass' if r['decision']['passed_gate'] else 'fail'} | {r['decision']['promotion_reason']} | "
                f"{r.get('promoted_to') or '-'} | {'; '.join(flags) or '-'} |"
            )
        lines.append("")
    path = best_path(tree)
    lines += ["## Best path", ""]
    for n in path:
        idea = n["idea_chain"][-1]["title"] if n["idea_chain"] else "(root)"
        lines.append(
            f"1. {n['id']} `{n['branch']}` @ {str(n.get('commit'))[:12]}: {idea}; "
            f"rank score {fmt_number(n.get('rank_score'))}; metrics `{json.dumps(n.get('metrics'))}`"
        )
    lines += [
        "",
        "## Artifacts",
        "",
        "- tree.json: every node and evaluation with both comparisons and decisions",
        "- tree.svg: the tree, coloured by gate outcome",
        "- evals/<eval id>/: idea.md, plan.md, "
        "diff_round_<n>.diff, review_round_<n>.md, tests.log, eval.log, summary.json",
    ]
    if tree.get("stop_reason"):
        lines.append(
            f"- delete_branches.txt: {len(tree.get('delete_branches', []))} branch(es) to delete after the run"
        )
    return "\n".join(lines) + "\n"


def _change(check: dict[str, Any] | None) -> str:
    change = (check or {}).get("change")
    if not change or check is None:  # (a change comes only from a check)
        return "-" if not check else f"({check.get('reason')})"
    return f"{100 * change['mean']:+.2f}% [{100 * change['low']:+.2f}%, {100 * change['high']:+.2f}%]" + (
        f" over {check['pairs']} pairs" if check.get("pairs") else " (separate runs)"
    )


def _metric(node: dict[str, Any] | None, name: str) -> str:
    value = ((node or {}).get("metrics") or {}).get(name)
    return "?" if value is None else f"{value:g}"


def tree_verdict(tree: dict[str, Any]) -> str:
    """The run summary's one line: the best node and its confirmed change, or why nothing beat the base."""
    nodes = {n["id"]: n for n in tree["nodes"]}
    metric = tree["config"]["primary_metric"]
    stop = f"; stopped: {tree['stop_reason']}" if tree.get("stop_reason") else ""
    if tree.get("stop_reason") == "root_evaluation_failed":
        error = (tree.get("root_evaluation") or {}).get("error") or "no error recorded"
        first = error.strip().splitlines()[0][:160].rstrip(": ") if error.strip() else "no error recorded"
        return f"nothing beat the base: the evaluation of the base itself failed ({first})"
    best = tree.get("best")
    evaluated = len([r for r in tree.get("evaluations", []) if r.get("status") != "pending"])
    if best is None:
        return f"nothing selected: the search stopped before its final check{stop}"
    check = best.get("check")
    if best.get("beat_base"):
        return (
            f"{best['node']} beat the base: {metric} {_metric(nodes.get('n0'), metric)} → "
            f"{_metric(nodes.get(best['node']), metric)}, change {_change(check)}{stop}"
        )
    if best.get("candidate"):
        why = (check or {}).get("reason") or "not clearly better"
        error = (check or {}).get("error")
        return (
            f"nothing beat the base: the best candidate, {best['candidate']}, measured {_change(check)} "
            f"against it ({why}{': ' + str(error)[:120] if error else ''}){stop}"
        )
    return f"nothing beat the base: no candidate was confirmed better than its parent ({evaluated} evaluated){stop}"


def _result_lines(tree: dict[str, Any]) -> list[str]:
    best = tree.get("best")
    lines = []
    if best is not None:
        check = best.get("check")
        conf = tree["config"].get("confidence", 0.9)
        lines += ["## Result", ""]
        if best.get("beat_base"):
            lines.append(
                f"**{best['node']} beat the base**: its change against the base, measured paired "
                f"(base and candidate alternating in one container), is {_change(check)} "
                f"({conf:.0%} interval of the mean relative change of `{tree['config']['primary_metric']}`)."
            )
        elif best.get("candidate"):
            lines.append(
                f"**Nothing beat the base.** The best candidate, {best['candidate']}, measured "
                f"{_change(check)} against the base ({conf:.0%} interval): not clearly better, so the "
                "base branch stays the best."
            )
        else:
            lines.append(
                "**Nothing beat the base.** No candidate was confirmed better than its parent; "
                "the base branch stays the best."
            )
        lines.append("")
    if flagged := [r for r in tree.get("evaluations", []) if r.get("protected_changed")]:
        lines += [
            "## Protected evaluator",
            "",
            "These candidates changed a protected path; they were measured with the base branch's version of it:",
            "",
        ]
        lines += [f"- {r['id']} ({r['idea']['title']}): {', '.join(r['protected_changed'])}" for r in flagged]
        lines.append("")
    return lines


def tree_svg(tree: dict[str, Any]) -> str:
    """Self-contained SVG: one row per depth, candidates coloured by outcome, labelled with root score."""
    rows: dict[int, list[tuple[str, str, str, str]]] = {0: [("n0", "root", "n0", "")]}
    parent_of: dict[str, str] = {}
    node_of_eval = {r["id"]: r.get("promoted_to") for r in tree["evaluations"]}
    for r in sorted(tree["evaluations"], key=lambda r: r["id"]):
        score = (r.get("root_comparison") or {}).get("score")
        label = f"{r['id']}" + (f"/{r['promoted_to']}" if r.get("promoted_to") else "")
        tip = f"{r['idea']['title']} | {r['status']} | {r['decision']['promotion_reason']}"
        rows.setdefault(r["depth"], []).append((r["id"], outcome_of(r), label, f"{tip} | score {fmt_number(score)}"))
        parent_of[r["id"]] = r["parent"]
    w_step, h_step, radius = 130, 110, 26
    width = max(len(v) for v in rows.values()) * w_step + 40
    height = (max(rows) + 1) * h_step + 40
    pos: dict[str, tuple[int, int]] = {}
    for depth, items in rows.items():
        offset = (width - len(items) * w_step) // 2
        for i, (ident, *_rest) in enumerate(items):
            pos[ident] = (offset + i * w_step + w_step // 2, 40 + depth * h_step)
    # an eval's parent is a node id; draw from the eval that created that node (or the root)
    eval_of_node = {v: k for k, v in node_of_eval.items() if v}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for eid, parent in parent_of.items():
        src = pos["n0"] if parent == "n0" else pos.get(eval_of_node.get(parent, ""), pos["n0"])
        dst = pos[eid]
        out.append(f'<line x1="{src[0]}" y1="{src[1]}" x2="{dst[0]}" y2="{dst[1]}" stroke="#999"/>')
    for items in rows.values():
        for ident, outcome, label, tip in items:
            x, y = pos[ident]
            score = "" if ident == "n0" else tip.rsplit("score ", 1)[-1]
            out.append(
                f"<g><title>{html.escape(tip or 'root (base branch)')}</title>"
                f'<circle cx="{x}" cy="{y}" r="{radius}" fill="{COLOURS[outcome]}" stroke="#333"/>'
                f'<text x="{x}" y="{y - 2}" text-anchor="middle" fill="white">{html.escape(label)}</text>'
                f'<text x="{x}" y="{y + 12}" text-anchor="middle" fill="white">{html.escape(score)}</text></g>'
            )
    legend_y = height - 12
    for i, (name, colour) in enumerate(COLOURS.items()):
        out.append(
            f'<rect x="{10 + i * 105}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{24 + i * 105}" y="{legend_y}">{name}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_tree_report(tree: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write tree.json, TREE_SUMMARY.md, tree.svg (and delete_branches.txt once finished)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "tree.json": json.dumps(tree, indent=2, allow_nan=False) + "\n",
        "TREE_SUMMARY.md": summary_markdown(tree),
        "tree.svg": tree_svg(tree),
    }
    if tree.get("stop_reason"):
        files["delete_branches.txt"] = "".join(f"{b['branch']} {b['commit']}\n" for b in tree["delete_branches"])
    for name, text in files.items():
        (out_dir / name).write_text(text, "utf-8")
    return [out_dir / name for name in files]


def tree_problems(tree: dict[str, Any] | str | Path) -> list[str]:
    """Parents, depths, frontiers and promotions of a tree (dict or tree.json path) that disagree; [] = consistent.
    Whether each node's commit is on its branch is the repository's question (:func:`branch_claims`)."""
    if not isinstance(tree, dict):
        tree = cast(dict[str, Any], json.loads(Path(tree).read_text("utf-8")))
    problems: list[str] = []
    nodes = {n["id"]: n for n in tree["nodes"]}
    evals = {r["id"]: r for r in tree["evaluations"]}
    for n in tree["nodes"]:
        if n["parent"] is not None:
            parent = nodes.get(n["parent"])
            if parent is None:
                problems.append(f"{n['id']}: parent {n['parent']} is not a node")
            elif n["depth"] != parent["depth"] + 1:
                problems.append(f"{n['id']}: depth {n['depth']} but parent {parent['id']} has depth {parent['depth']}")
            r = evals.get(n.get("eval_id") or "")
            if r is None or r.get("promoted_to") != n["id"] or not r["decision"]["passed_gate"]:
                problems.append(f"{n['id']}: no gated evaluation promoted it")
        if not n.get("commit") or not n.get("branch"):
            problems.append(f"{n['id']}: missing branch or commit")
    expanded: set[str] = set()
    prev_promoted = ["n0"]
    for d in tree["depths"]:
        if d["frontier"] != prev_promoted:
            problems.append(f"depth {d['depth']}: frontier {d['frontier']} != nodes promoted before {prev_promoted}")
        for node_id in d["frontier"]:
            if node_id in expanded:
                problems.append(f"depth {d['depth']}: {node_id} expanded twice")
            expanded.add(node_id)
            if node_id in nodes and nodes[node_id]["depth"] != d["depth"] - 1:
                problems.append(f"depth {d['depth']}: frontier node {node_id} has depth {nodes[node_id]['depth']}")
        for eid in d["evaluations"]:
            if evals.get(eid, {}).get("parent") not in d["frontier"]:
                problems.append(f"depth {d['depth']}: {eid} does not expand a frontier node")
        if len(d["promoted"]) > tree["config"]["beam_width"]:
            problems.append(f"depth {d['depth']}: {len(d['promoted'])} promoted > beam_width")
        prev_promoted = d["promoted"]
    return problems


def branch_claims(tree: dict[str, Any] | str | Path) -> list[tuple[str, str, str]]:
    """``(node id, branch, commit)`` for every node: the commit must be reachable from the branch."""
    data: dict[str, Any] = tree if isinstance(tree, dict) else json.loads(Path(tree).read_text("utf-8"))
    return [(n["id"], n["branch"], n["commit"]) for n in data["nodes"] if n.get("commit") and n.get("branch")]


def listed_branches(out_dir: str | Path) -> list[str]:
    """The branches ``out_dir/delete_branches.txt`` lists (the run's rejected candidates)."""
    listing = Path(out_dir) / "delete_branches.txt"
    lines = listing.read_text("utf-8").splitlines() if listing.exists() else []
    return [b for b in (line.strip().partition(" ")[0] for line in lines) if b]


def is_tree_execution(state, sid: str) -> bool:
    """Whether execution ``sid`` ran tree-beam: it evaluated a root under ``root/eval``."""
    return f"{state.run_id}/{sid}/root/eval" in state.tasks
