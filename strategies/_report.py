"""Run-report sections of the built-in strategies (``report_sections(run)``).

Each function reads only the execution's recorded result and its tasks'
recorded results, so the report rebuilt from the event log is the same page.
Result fields a strategy may not have written (older runs, failed runs) are
read with defaults: a section shows what is there rather than failing.
"""

from __future__ import annotations

from typing import Any

from ._json import extract_json

LOG_CHARS = 3_000


def _tail(text: Any, limit: int = LOG_CHARS) -> str:
    text = text if isinstance(text, str) else ""
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


def _tasks_by_short_key(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["short_key"]: t for t in run["tasks"]}


def _message(task: dict[str, Any] | None) -> str:
    return (task or {}).get("final_message") or ""


# ---------------------------------------------------------------- best-of-n


def _score_of(task: dict[str, Any] | None) -> dict[str, Any] | None:
    if not task or task.get("state") != "COMPLETED":
        return None
    result = task.get("result") or {}
    answer = result.get("output") if isinstance(result.get("output"), dict) else extract_json(_message(task))
    if isinstance(answer, dict) and isinstance(answer.get("score"), (int, float)):
        return answer
    return None


def best_of_n_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    ex = run["execution"]
    by_key = _tasks_by_short_key(run)
    winner = (ex.get("result") or {}).get("key") if isinstance(ex.get("result"), dict) else None
    candidates = sorted(
        (t for t in run["tasks"] if t["short_key"].startswith("gen/")),
        key=lambda t: int(t["short_key"].split("/")[1]) if t["short_key"].split("/")[1].isdigit() else 0,
    )
    items, rows, highlight = [], [], []
    for i, c in enumerate(candidates):
        attempts = [by_key.get(f"score/{c['instance_id']}/attempt-{n}") for n in (1, 2)] if c.get("instance_id") else []
        score = next((s for s in (_score_of(a) for a in reversed(attempts)) if s is not None), None)
        won = c["key"] == winner
        if won:
            highlight.append(i)
        status = "failed" if c["state"] == "FAILED" else ("scored" if score else "unscored")
        rows.append(
            [
                c["short_key"],
                c["branch"],
                status,
                None if score is None else score["score"],
                None if score is None else score.get("rationale"),
            ]
        )
        items.append(
            {
                "label": f"candidate {c['short_key'].split('/')[-1]}",
                "subtitle": "" if score is None else f"score {score['score']}: {score.get('rationale', '')}",
                "highlight": won,
                "commit": c.get("commit"),
                "details": {
                    "branch": c["branch"],
                    "status": status,
                    "score": None if score is None else score["score"],
                    "rationale": None if score is None else score.get("rationale"),
                    "reviewer attempts": sum(1 for a in attempts if a),
                    "final message": _tail(_message(c)),
                },
            }
        )
    if not items:
        return []
    return [
        {
            "type": "compare",
            "title": "Candidates side by side",
            "items": items,
            "note": "The winner is the highest reviewer score; ties go to the earlier candidate.",
        },
        {
            "type": "table",
            "title": "Scores",
            "columns": ["task", "branch", "status", "score", "rationale"],
            "rows": rows,
            "highlight": highlight,
        },
    ]


# ---------------------------------------------------------------- tree-beam


def _primary_value(metrics: Any, name: str) -> float | None:
    if isinstance(metrics, dict):
        v = metrics.get(name)
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, dict) and isinstance(v.get("median"), (int, float)):
            return float(v["median"])
    return None


def tree_beam_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    result = run["execution"].get("result")
    tree = result.get("tree") if isinstance(result, dict) else None
    if not isinstance(tree, dict):
        return []
    by_key = _tasks_by_short_key(run)
    config = tree.get("config") or {}
    primary = config.get("primary_metric", "")
    best_path = set(result.get("best_path") or [])
    nodes = {n["id"]: n for n in tree.get("nodes") or [] if isinstance(n, dict) and "id" in n}
    node_of_eval = {n.get("eval_id"): n["id"] for n in nodes.values() if n.get("eval_id")}
    root = nodes.get("n0", {})
    out_nodes = [
        {
            "id": "n0",
            "parent": None,
            "label": f"base ({root.get('branch', config.get('base_branch', ''))})",
            "status": _fmt_metric(_primary_value(root.get("metrics"), primary), primary),
            "highlight": "n0" in best_path,
            "details": {
                "metrics": root.get("metrics"),
                "root evaluation": tree.get("root_evaluation"),
                "evaluation output": _tail(_message(by_key.get("root/eval"))),
            },
        }
    ]
    points, best_points = [], []
    if _primary_value(root.get("metrics"), primary) is not None:
        points.append([0, _primary_value(root.get("metrics"), primary)])
        best_points.append([0, _primary_value(root.get("metrics"), primary)])
    for ev in tree.get("evaluations") or []:
        eid = ev.get("id")
        nid = node_of_eval.get(eid, eid)
        idea = ev.get("idea") or {}
        evaluation = ev.get("evaluation") or {}
        cmp_parent = ev.get("parent_comparison") or {}
        value = _primary_value(evaluation.get("metrics"), primary)
        reviews = [
            {"round": k.split("/")[2], "answer": _tail(_message(t), 1500)}
            for k, t in sorted(by_key.items())
            if k.startswith(f"{eid}/review/")
        ]
        gate = cmp_parent.get("grade") or ev.get("status")
        out_nodes.append(
            {
                "id": nid,
                "parent": ev.get("parent"),
                "label": idea.get("title") or eid,
                "status": f"{gate} · {_fmt_metric(value, primary)}" if value is not None else str(gate or ""),
                "highlight": nid in best_path,
                "commit": ev.get("commit") or None,
                "details": {
                    "idea": idea.get("description"),
                    "status": ev.get("status"),
                    "gate": gate,
                    "promoted to node": nid if nid != eid else "no",
                    "plan": _tail(_message(by_key.get(f"{eid}/plan")), 2500),
                    "review rounds": reviews or None,
                    "metrics": evaluation.get("metrics"),
                    "against parent": cmp_parent or None,
                    "against root": ev.get("root_comparison"),
                    "evaluation output": _tail(_message(by_key.get(f"{eid}/eval"))),
                    **{
                        k: v
                        for k, v in ev.items()
                        if k
                        not in {
                            "id",
                            "parent",
                            "idea",
                            "evaluation",
                            "status",
                            "parent_comparison",
                            "root_comparison",
                            "commit",
                            "branch",
                            "depth",
                        }
                    },
                },
            }
        )
        if value is not None and isinstance(ev.get("depth"), int):
            points.append([ev["depth"], value])
            if nid in best_path:
                best_points.append([ev["depth"], value])
    best = result.get("best_branch")
    summary = (
        f"Stopped: {result.get('stop_reason')}. {result.get('evals_used', tree.get('evals_used'))} evaluations. "
        + (
            f"Best branch: {best} (path {' → '.join(result.get('best_path') or [])})."
            if best and best != config.get("base_branch")
            else "Nothing beat the base."
        )
    )
    sections: list[dict[str, Any]] = [
        {"type": "text", "title": "Outcome", "text": summary},
        {
            "type": "tree",
            "title": "Search tree",
            "nodes": out_nodes,
            "note": "Highlighted: the best path. Nodes that were evaluated but not promoted are leaves named by their "
            "evaluation id.",
        },
    ]
    if primary and points:
        sections.append(
            {
                "type": "chart",
                "title": f"{primary} by depth",
                "x_label": "depth",
                "y_label": primary,
                "x_integer": True,
                "series": [
                    {"name": "every candidate", "points": sorted(points), "line": False},
                    {"name": "best path", "points": sorted(best_points)},
                ],
            }
        )
    return sections


def _fmt_metric(value: float | None, name: str) -> str:
    return "" if value is None else f"{name}={value:.4g}"


# ---------------------------------------------------------------- evolve


def evolve_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    result = run["execution"].get("result")
    if not isinstance(result, dict):
        return []
    history = [h for h in result.get("history") or [] if isinstance(h, dict)]
    goals = result.get("goals") or {}
    passing = {g: bool((v or {}).get("before")) for g, v in goals.items()}
    series: dict[str, list[list[float]]] = {g: [[0, 1.0 if p else 0.0]] for g, p in passing.items()}
    values: dict[str, list[list[float]]] = {}
    for g, v in goals.items():
        if isinstance((v or {}).get("value_before"), (int, float)):
            values[g] = [[0, float(v["value_before"])]]
    rows: list[list[Any]] = []
    for h in history:
        cycle = h.get("cycle", len(rows) + 1)
        if h.get("result") == "improved":
            for g in h.get("fixed") or []:
                passing[g] = True
            for g in h.get("regressed") or []:
                passing[g] = False
        for g in series:
            series[g].append([cycle, 1.0 if passing.get(g) else 0.0])
        rows.append(
            [
                cycle,
                ", ".join(h.get("goal_ids") or []),
                h.get("result"),
                h.get("reason") or "",
                ", ".join(h.get("fixed") or []),
                ", ".join(h.get("regressed") or []),
                ", ".join(h.get("blamed") or []),
                ", ".join(h.get("quarantined") or []),
                f"{h.get('goals_passing_before', '?')} → {h.get('goals_passing', '?')}",
            ]
        )
    for g, v in goals.items():
        if g in values and isinstance((v or {}).get("value_after"), (int, float)):
            values[g].append([max(len(history), 1), float(v["value_after"])])
    sections: list[dict[str, Any]] = [
        {
            "type": "text",
            "title": "Outcome",
            "text": f"Stopped: {result.get('stopped')} after {result.get('cycles', len(history))} cycle(s). Goals passing: "
            f"{result.get('goals_passing_before')} before, {result.get('goals_passing_after')} after "
            f"(of {result.get('goals_total')}). Final branch: {result.get('final_branch')}.",
        }
    ]
    if series:
        sections.append(
            {
                "type": "chart",
                "title": "Goals passing by cycle (1 = passing)",
                "x_label": "cycle",
                "y_label": "passing",
                "x_integer": True,
                "series": [{"name": g, "points": pts} for g, pts in series.items()],
            }
        )
    if values:
        sections.append(
            {
                "type": "chart",
                "title": "Goal values",
                "x_label": "cycle",
                "y_label": "value",
                "x_integer": True,
                "series": [{"name": g, "points": pts} for g, pts in values.items()],
            }
        )
    if rows:
        sections.append(
            {
                "type": "table",
                "title": "Waves",
                "columns": [
                    "cycle",
                    "goals",
                    "result",
                    "why",
                    "fixed",
                    "regressed",
                    "blamed",
                    "quarantined",
                    "passing",
                ],
                "rows": rows,
                "highlight": [i for i, r in enumerate(rows) if r[2] == "improved"],
                "note": "Highlighted: waves that advanced the branch. The others were reverted.",
            }
        )
    return sections


# ---------------------------------------------------------------- review-loop


def review_loop_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    result = run["execution"].get("result")
    if not isinstance(result, dict):
        return []
    best = (result.get("best") or {}).get("idea_id") if isinstance(result.get("best"), dict) else None
    ranking = [r for r in result.get("ranking") or [] if isinstance(r, dict)]
    rows = [
        [
            r.get("rank"),
            r.get("idea_id"),
            r.get("title"),
            r.get("status"),
            r.get("score"),
            r.get("grade"),
            ", ".join(r.get("verdicts") or []),
            r.get("branch"),
        ]
        for r in ranking
    ]
    items = []
    for idea in result.get("ideas") or []:
        if not isinstance(idea, dict):
            continue
        tests = idea.get("tests") or {}
        comparison = idea.get("comparison") or {}
        items.append(
            {
                "label": idea.get("title") or idea.get("idea_id", "idea"),
                "subtitle": f"{idea.get('status')} · score {comparison.get('score')}",
                "highlight": idea.get("idea_id") == best,
                "commit": idea.get("commit"),
                "details": {
                    "status": idea.get("status"),
                    "branch": idea.get("branch"),
                    "rounds": [
                        {"round": r.get("round"), "verdict": r.get("verdict"), "issues": r.get("issues")}
                        for r in idea.get("rounds") or []
                    ],
                    "tests": tests or None,
                    "metrics": (idea.get("evaluation") or {}).get("metrics"),
                    "comparison": comparison or None,
                    "error": idea.get("error"),
                },
            }
        )
    sections: list[dict[str, Any]] = []
    if rows:
        sections.append(
            {
                "type": "table",
                "title": "Ideas ranked",
                "columns": ["rank", "idea", "title", "status", "score", "grade", "verdicts", "branch"],
                "rows": rows,
                "highlight": [i for i, r in enumerate(ranking) if r.get("idea_id") == best],
            }
        )
    if items:
        sections.append({"type": "compare", "title": "Each idea's rounds, tests and score", "items": items})
    return sections


# ---------------------------------------------------------------- synthesize


def synthesize_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    result = run["execution"].get("result")
    if not isinstance(result, dict) or not isinstance(result.get("candidates"), list):
        return []
    synthesis = result.get("synthesis") if isinstance(result.get("synthesis"), dict) else {}
    selected = (result.get("selected") or {}).get("which") if isinstance(result.get("selected"), dict) else None
    top = result.get("top") or []
    hunks = [h for h in result.get("provenance") or [] if isinstance(h, dict)]
    marks: dict[str, int] = {}
    for h in hunks:
        marks[str(h.get("source"))] = marks.get(str(h.get("source")), 0) + 1

    def tests_text(t: Any) -> str:
        if not isinstance(t, dict):
            return ""
        return "tests passed" if t.get("passed") else f"tests failed (exit {t.get('exit_code')})"

    items: list[dict[str, Any]] = []
    if synthesis:
        rescore = synthesis.get("candidate_rescore") or {}
        shown = [f"score {synthesis['score']:g} side by side" if synthesis.get("score") is not None else ""]
        shown += [tests_text(synthesis.get("tests")), str(synthesis.get("status") or "")]
        items.append(
            {
                "label": "synthesis",
                "subtitle": " · ".join(s for s in shown if s),
                "highlight": selected == "synthesis",
                "commit": synthesis.get("commit"),
                "details": {
                    "combines": ", ".join(top),
                    "branch": synthesis.get("branch"),
                    "status": synthesis.get("status"),
                    "why": synthesis.get("why"),
                    "score side by side": synthesis.get("score"),
                    "rationale": synthesis.get("rationale"),
                    "compared with": rescore.get("label"),
                    "its score side by side": rescore.get("score"),
                    "tests": synthesis.get("tests"),
                    "hunks by source": ", ".join(f"{src}: {n}" for src, n in marks.items()) or None,
                },
            }
        )
    for c in result["candidates"]:
        if not isinstance(c, dict):
            continue
        label = str(c.get("label", ""))
        shown = [f"score {c['score']:g}" if c.get("score") is not None else str(c.get("status") or "")]
        shown += [tests_text(c.get("tests")), "in the synthesis" if label in top else ""]
        if marks.get(label):
            shown.append(f"{marks[label]} hunk(s) taken")
        items.append(
            {
                "label": label,
                "subtitle": " · ".join(s for s in shown if s),
                "highlight": selected == label,
                "commit": c.get("commit"),
                "details": {
                    "branch": c.get("branch"),
                    "status": c.get("status"),
                    "score": c.get("score"),
                    "rationale": c.get("rationale"),
                    "tests": c.get("tests"),
                    "error": c.get("error"),
                },
            }
        )
    sections: list[dict[str, Any]] = [
        {"type": "text", "title": "Outcome", "text": str(result.get("verdict") or "")},
        {
            "type": "compare",
            "title": "The synthesis beside the candidates",
            "items": items,
            "note": "Highlighted: the selected branch. The synthesis is selected only if its tests pass (when "
            "given) and the side-by-side review scores it at least as high as the best candidate.",
        },
    ]
    if hunks:
        sections.append(
            {
                "type": "table",
                "title": "Where each hunk of the synthesis came from",
                "columns": ["file", "hunk", "lines", "from", "match", "also in"],
                "rows": [
                    [
                        h.get("file"),
                        h.get("header"),
                        f"+{h.get('added', 0)} -{h.get('removed', 0)}",
                        h.get("source"),
                        h.get("match"),
                        ", ".join(h.get("also_in") or []),
                    ]
                    for h in hunks
                ],
                "highlight": [i for i, h in enumerate(hunks) if h.get("source") == "new"],
                "note": "A hunk comes from the candidate whose own diff holds most of its changed lines; "
                "highlighted hunks are new: no candidate holds half of their lines.",
            }
        )
    return sections
