"""Run-report sections of the built-in strategies, from recorded results only (an older run's missing fields default)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ._json import extract_json, tail
from ._report_tasks import report_task

LOG_CHARS = 3_000


def _tail(text: Any, limit: int = LOG_CHARS) -> str:
    return tail(text if isinstance(text, str) else "", limit)


def _message(task: dict[str, Any] | None) -> str:
    return (task or {}).get("final_message") or ""


def _section(kind: str, title: str, **fields: Any) -> dict[str, Any]:
    """A report section of ``kind``; fields given as None are left out."""
    return {"type": kind, "title": title, **{k: v for k, v in fields.items() if v is not None}}


def _chart(title: str, x_label: str, y_label: str, series: list[dict[str, Any]]) -> dict[str, Any]:
    return _section("chart", title, x_label=x_label, y_label=y_label, x_integer=True, series=series)


def _card(label: str, said: list[str], *, highlight: bool, commit: Any, details: dict[str, Any]) -> dict[str, Any]:
    """One item of a ``compare`` section: its subtitle is what ``said`` holds, joined."""
    subtitle = " · ".join(s for s in said if s)
    return {"label": label, "subtitle": subtitle, "highlight": highlight, "commit": commit, "details": details}


def _score_of(task: dict[str, Any] | None) -> dict[str, Any] | None:
    if not task or task.get("state") != "COMPLETED":
        return None
    result = task.get("result") or {}
    answer = result.get("output") if isinstance(result.get("output"), dict) else extract_json(_message(task))
    return answer if isinstance(answer, dict) and isinstance(answer.get("score"), (int, float)) else None


def best_of_n_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    ex = run["execution"]
    by_key = {t["short_key"]: t for t in run["tasks"]}
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
        value, rationale = (None, None) if score is None else (score["score"], score.get("rationale"))
        rows.append([c["short_key"], c["branch"], status, value, rationale])
        said = "" if score is None else f"score {value}: {score.get('rationale', '')}"
        details = {"branch": c["branch"], "status": status, "score": value, "rationale": rationale}
        details.update({"reviewer attempts": sum(1 for a in attempts if a), "final message": _tail(_message(c))})
        label = f"candidate {c['short_key'].split('/')[-1]}"
        items.append(_card(label, [said], highlight=won, commit=c.get("commit"), details=details))
    if not items:
        return []
    note = "The winner is the highest reviewer score; ties go to the earlier candidate."
    columns = ["task", "branch", "status", "score", "rationale"]
    return [
        _section("compare", "Candidates side by side", items=items, note=note),
        _section("table", "Scores", columns=columns, rows=rows, highlight=highlight),
    ]


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
    by_key = {t["short_key"]: t for t in run["tasks"]}
    config = tree.get("config") or {}
    primary = config.get("primary_metric", "")
    best_path = set(result.get("best_path") or [])
    nodes = {n["id"]: n for n in tree.get("nodes") or [] if isinstance(n, dict) and "id" in n}
    node_of_eval = {n.get("eval_id"): n["id"] for n in nodes.values() if n.get("eval_id")}
    root = nodes.get("n0", {})
    root_value = _primary_value(root.get("metrics"), primary)
    out_nodes = [
        {
            "id": "n0",
            "parent": None,
            "label": f"base ({root.get('branch', config.get('base_branch', ''))})",
            "status": _fmt_metric(root_value, primary),
            "highlight": "n0" in best_path,
            "details": {
                "metrics": root.get("metrics"),
                "root evaluation": tree.get("root_evaluation"),
                "evaluation output": _eval_output(by_key.get("root/eval")),
            },
        }
    ]
    points = [[0, root_value]] if root_value is not None else []
    best_points = list(points)
    for ev in tree.get("evaluations") or []:
        eid = ev.get("id")
        nid = node_of_eval.get(eid, eid)
        value = _primary_value((ev.get("evaluation") or {}).get("metrics"), primary)
        out_nodes.append(_eval_node(ev, nid, by_key, value, primary, nid in best_path))
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
    note = "Highlighted: the best path. Nodes that were evaluated but not promoted are leaves named by their evaluation id."
    sections = [_section("text", "Outcome", text=summary), _section("tree", "Search tree", nodes=out_nodes, note=note)]
    if primary and points:
        series: list[dict[str, Any]] = [
            {"name": "every candidate", "points": sorted(points), "line": False},
            {"name": "best path", "points": sorted(best_points)},
        ]
        sections.append(_chart(f"{primary} by depth", "depth", primary, series))
    return sections


# An evaluation's fields the node shows under their own names (or not at all); the rest as they are.
_NODE_FIELDS = {
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


def _eval_node(
    ev: dict[str, Any], nid: Any, by_key: dict[str, Any], value: float | None, primary: str, on_best_path: bool
) -> dict[str, Any]:
    """The tree node of one evaluation (``nid``: its promoted node, or its own id)."""
    eid = ev.get("id")
    idea = ev.get("idea") or {}
    cmp_parent = ev.get("parent_comparison") or {}
    reviews = [
        {"round": k.split("/")[2], "answer": _tail(_message(t), 1500)}
        for k, t in sorted(by_key.items())
        if k.startswith(f"{eid}/review/")
    ]
    gate = cmp_parent.get("grade") or ev.get("status")
    return {
        "id": nid,
        "parent": ev.get("parent"),
        "label": idea.get("title") or eid,
        "status": f"{gate} · {_fmt_metric(value, primary)}" if value is not None else str(gate or ""),
        "highlight": on_best_path,
        "commit": ev.get("commit") or None,
        "details": {
            "idea": idea.get("description"),
            "status": ev.get("status"),
            "gate": gate,
            "promoted to node": nid if nid != eid else "no",
            "plan": _tail(_message(by_key.get(f"{eid}/plan")), 2500),
            "review rounds": reviews or None,
            "metrics": (ev.get("evaluation") or {}).get("metrics"),
            "against parent": cmp_parent or None,
            "against root": ev.get("root_comparison"),
            "evaluation output": _eval_output(by_key.get(f"{eid}/eval")),
            **{k: v for k, v in ev.items() if k not in _NODE_FIELDS},
        },
    }


def _eval_output(task: dict[str, Any] | None) -> Any:
    """A measurement task's output as its runs and its last run's output, not its marker lines."""
    if task is None:
        return None
    card = report_task(task)
    if not card:
        return _tail(_message(task)) or None
    shown = dict(card.get("fields") or {})
    if card.get("output"):
        shown["output of the last run"] = _tail(card["output"])
    if card.get("stderr"):
        shown["stderr of the last run"] = _tail(card["stderr"])
    return shown


def _fmt_metric(value: float | None, name: str) -> str:
    return "" if value is None else f"{name}={value:.4g}"


def evolve_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    result = run["execution"].get("result")
    if not isinstance(result, dict):
        return []
    history = [h for h in result.get("history") or [] if isinstance(h, dict)]
    goals = result.get("goals") or {}
    series, values, rows = _evolve_cycles(history, goals)
    outcome = (
        f"Stopped: {result.get('stopped')} after {result.get('cycles', len(history))} cycle(s). Goals passing: "
        f"{result.get('goals_passing_before')} before, {result.get('goals_passing_after')} after "
        f"(of {result.get('goals_total')}). Final branch: {result.get('final_branch')}."
    )
    sections = [_section("text", "Outcome", text=outcome)]
    tried = Counter(g for h in history for g in h.get("goal_ids") or [])
    reverted = Counter(g for h in history if h.get("result") == "reverted" for g in h.get("goal_ids") or [])
    stuck = result.get("could_not_move")
    if not isinstance(stuck, dict):  # a result recorded before could_not_move existed
        stuck = {g: "quarantined" for g in result.get("quarantined") or []}
    if goals:
        sections.append(_goals_table(goals, tried, reverted))
    if stuck:
        note = "The loop gave these goals a rest (or quarantined them) and moved on to the others."
        columns = ["goal", "reverted attempts", "why"]
        table_rows = [[g, reverted.get(g, 0), why] for g, why in stuck.items()]
        sections.append(_section("table", "Goals that could not move", columns=columns, rows=table_rows, note=note))
    if series:
        passing = [{"name": g, "points": pts} for g, pts in series.items()]
        sections.append(_chart("Goals passing by cycle (1 = passing)", "cycle", "passing", passing))
    if values:
        sections.append(_chart("Goal values", "cycle", "value", [{"name": g, "points": p} for g, p in values.items()]))
    if rows:
        columns = ["cycle", "goals", "result", "why", "fixed", "regressed", "blamed", "quarantined", "passing"]
        highlight = [i for i, r in enumerate(rows) if r[2] == "improved"]
        note = "Highlighted: waves that advanced the branch. The others were reverted."
        sections.append(_section("table", "Waves", columns=columns, rows=rows, highlight=highlight, note=note))
    return sections


def _evolve_cycles(
    history: list[dict[str, Any]], goals: dict[str, Any]
) -> tuple[dict[str, list[list[float]]], dict[str, list[list[float]]], list[list[Any]]]:
    """Per goal: passing (1/0) by cycle and its value by cycle; and one row per wave."""
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
        listed = [", ".join(h.get(f) or []) for f in ("fixed", "regressed", "blamed", "quarantined")]
        passing_now = f"{h.get('goals_passing_before', '?')} → {h.get('goals_passing', '?')}"
        rows.append(
            [cycle, ", ".join(h.get("goal_ids") or []), h.get("result"), h.get("reason") or "", *listed, passing_now]
        )
    for g, v in goals.items():
        if g in values and isinstance((v or {}).get("value_after"), (int, float)):
            values[g].append([max(len(history), 1), float(v["value_after"])])
    return series, values, rows


def _goals_table(goals: dict[str, Any], tried: dict[str, int], reverted: dict[str, int]) -> dict[str, Any]:
    rows = []
    for g, v in goals.items():
        v = v or {}
        moved = v.get("value_before") is not None or v.get("value_after") is not None
        value = f"{_num(v.get('value_before'))} → {_num(v.get('value_after'))}" if moved else "–"
        rows.append(
            [g, _passing(v.get("before")), _passing(v.get("after")), value, tried.get(g, 0), reverted.get(g, 0)]
        )
    return _section(
        "table",
        "Goals",
        columns=["goal", "before", "after", "value before → after", "waves that tried it", "reverted"],
        rows=rows,
        highlight=[i for i, v in enumerate(goals.values()) if (v or {}).get("after")],
        note="Highlighted: goals passing at the end.",
    )


def _passing(x: Any) -> str:
    return "passing" if x else "failing"


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


def _tests_said(tests: Any, status: Any, has_command: bool = True) -> str:
    """``passed``, ``failed (exit 1)``, or why there is no result: never a bare None."""
    if isinstance(tests, dict):
        if tests.get("passed"):
            return "passed"
        why = f"exit {tests['exit_code']}" if tests.get("exit_code") is not None else tests.get("error_type")
        return f"failed ({why})" if why else "failed"
    if not has_command:
        return "no test command"
    return "not run" if status == "completed" or status == "tests_failed" else f"not reached ({status})"


def _score_said(score: Any, grade: Any) -> str:
    if not isinstance(score, (int, float)) or isinstance(score, bool):
        return "not scored"
    return f"score {score:g}" + (f" ({grade})" if grade else "")


def _comparison_fields(comparison: dict[str, Any]) -> dict[str, Any]:
    base, cand = comparison.get("primary_baseline"), comparison.get("primary_candidate")
    change = comparison.get("primary_change")
    moved = f"{_num(base)} → {_num(cand)}" + (f" ({change:+.1%})" if isinstance(change, (int, float)) else "")
    return {
        "score": _num(comparison.get("score")),
        "grade": comparison.get("grade"),
        "primary metric, base → idea": moved,
        "why": ", ".join(str(r).replace("_", " ") for r in comparison.get("reasons") or []) or None,
    }


def _round_said(r: dict[str, Any]) -> str:
    head = f"round {r.get('round')}: " + ("debug fix" if r.get("debug") else (r.get("verdict") or "no verdict"))
    issues = [str(i) for i in r.get("issues") or []]
    return head + (" — " + "; ".join(issues) if issues else "")


def review_loop_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    result = run["execution"].get("result")
    if not isinstance(result, dict):
        return []
    best = (result.get("best") or {}).get("idea_id") if isinstance(result.get("best"), dict) else None
    ranking = [r for r in result.get("ranking") or [] if isinstance(r, dict)]
    ideas = [i for i in result.get("ideas") or [] if isinstance(i, dict)]
    tests_of = {i.get("idea_id"): i.get("tests") for i in ideas}
    has_tests = bool((run["execution"].get("params") or {}).get("test_command"))
    rows = [
        [
            r.get("rank"),
            r.get("idea_id"),
            r.get("title"),
            str(r.get("status") or "").replace("_", " "),
            _tests_said(tests_of.get(r.get("idea_id")), r.get("status"), has_tests),
            _num(r.get("score")) if r.get("score") is not None else "not scored",
            r.get("grade") or "–",
            " → ".join(v or "?" for v in r.get("verdicts") or []) or "–",
            r.get("branch"),
        ]
        for r in ranking
    ]
    items = [_idea_card(idea, best, has_tests) for idea in ideas]
    sections: list[dict[str, Any]] = []
    if rows:
        columns = ["rank", "idea", "title", "status", "tests", "score", "grade", "reviews", "branch"]
        highlight = [i for i, r in enumerate(ranking) if r.get("idea_id") == best]
        note = (
            "Ranked by score against the base when an evaluation ran; an idea is scored only "
            "when its evaluation ran and the base's did too."
        )
        sections.append(_section("table", "Ideas ranked", columns=columns, rows=rows, highlight=highlight, note=note))
    base_tests = result.get("base_tests")
    baseline = result.get("baseline")
    base_said = []
    if isinstance(baseline, dict):
        base_said.append(f"evaluation {baseline.get('status')}" + (f": {m}" if (m := _metrics(baseline)) else ""))
    if isinstance(base_tests, dict):
        passed = base_tests.get("exit_code") == 0 and not base_tests.get("error")
        base_said.append(f"tests {_tests_said(dict(base_tests, passed=passed), 'completed')}")
    if base_said:
        sections.append(_section("text", "The base", text="; ".join(base_said) + "."))
    if items:
        sections.append(_section("compare", "Each idea's rounds, tests and score", items=items))
    return sections


def _metrics(holder: dict[str, Any]) -> str | None:
    """``name=value, ...`` of the ``metrics`` in ``holder``; None when it has none."""
    metrics = holder.get("metrics")
    return ", ".join(f"{k}={_num(v)}" for k, v in metrics.items()) if isinstance(metrics, dict) else None


def _idea_card(idea: dict[str, Any], best: Any, has_tests: bool) -> dict[str, Any]:
    tests = idea.get("tests")
    comparison = idea.get("comparison") or {}
    status = idea.get("status")
    said = [str(status or "").replace("_", " ") or "?"]
    if tests is not None or (has_tests and status == "completed"):
        said.append(f"tests {_tests_said(tests, status)}")
    said.append(_score_said(comparison.get("score"), comparison.get("grade")))
    return _card(
        idea.get("title") or idea.get("idea_id", "idea"),
        said,
        highlight=idea.get("idea_id") == best,
        commit=idea.get("commit"),
        details={
            "status": str(status or "").replace("_", " "),
            "branch": idea.get("branch"),
            "review rounds": [_round_said(r) for r in idea.get("rounds") or [] if isinstance(r, dict)],
            "tests": _tests_said(tests, status, has_tests),
            "test output": _tail((tests or {}).get("log_tail"), 1500) or None,
            "metrics": _metrics(idea.get("evaluation") or {}),
            "against the base": _comparison_fields(comparison) if comparison else "not compared",
            "error": idea.get("error"),
        },
    )


def synthesize_sections(run: dict[str, Any]) -> list[dict[str, Any]]:
    result = run["execution"].get("result")
    if not isinstance(result, dict) or not isinstance(result.get("candidates"), list):
        return []
    synthesis = result.get("synthesis") if isinstance(result.get("synthesis"), dict) else {}
    selected = (result.get("selected") or {}).get("which") if isinstance(result.get("selected"), dict) else None
    top = result.get("top") or []
    hunks = [h for h in result.get("provenance") or [] if isinstance(h, dict)]
    marks = Counter(str(h.get("source")) for h in hunks)
    items = [_synthesis_card(synthesis, selected == "synthesis", top, marks)] if synthesis else []
    items += [_candidate_card(c, selected, top, marks) for c in result["candidates"] if isinstance(c, dict)]
    note = (
        "Highlighted: the selected branch. The synthesis is selected only if its tests pass (when "
        "given) and the side-by-side review scores it at least as high as the best candidate."
    )
    sections = [
        _section("text", "Outcome", text=str(result.get("verdict") or "")),
        _section("compare", "The synthesis beside the candidates", items=items, note=note),
    ]
    if hunks:
        rows = [
            [
                h.get("file"),
                h.get("header"),
                f"+{h.get('added', 0)} -{h.get('removed', 0)}",
                h.get("source"),
                h.get("match"),
                ", ".join(h.get("also_in") or []),
            ]
            for h in hunks
        ]
        note = (
            "A hunk comes from the candidate whose own diff holds most of its changed lines; "
            "highlighted hunks are new: no candidate holds half of their lines."
        )
        columns = ["file", "hunk", "lines", "from", "match", "also in"]
        new = [i for i, h in enumerate(hunks) if h.get("source") == "new"]
        title = "Where each hunk of the synthesis came from"
        sections.append(_section("table", title, columns=columns, rows=rows, highlight=new, note=note))
    return sections


def _tests_text(t: Any) -> str:
    if not isinstance(t, dict):
        return ""
    return "tests passed" if t.get("passed") else f"tests failed (exit {t.get('exit_code')})"


def _synthesis_card(synthesis: dict[str, Any], selected: bool, top: list[str], marks: dict[str, int]) -> dict[str, Any]:
    rescore = synthesis.get("candidate_rescore") or {}
    shown = [f"score {synthesis['score']:g} side by side" if synthesis.get("score") is not None else ""]
    shown += [_tests_text(synthesis.get("tests")), str(synthesis.get("status") or "")]
    return _card(
        "synthesis",
        shown,
        highlight=selected,
        commit=synthesis.get("commit"),
        details={
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
    )


def _candidate_card(c: dict[str, Any], selected: Any, top: list[str], marks: dict[str, int]) -> dict[str, Any]:
    label = str(c.get("label", ""))
    shown = [f"score {c['score']:g}" if c.get("score") is not None else str(c.get("status") or "")]
    shown += [_tests_text(c.get("tests")), "in the synthesis" if label in top else ""]
    if marks.get(label):
        shown.append(f"{marks[label]} hunk(s) taken")
    details = {k: c.get(k) for k in ("branch", "status", "score", "rationale", "tests", "error")}
    return _card(label, shown, highlight=selected == label, commit=c.get("commit"), details=details)
