"""tree-beam decisions, exact and end to end through the engine with a scripted world.

The world: a candidate branch carries the features of its path; the benchmark
reports throughput = 100 + the sum of its features' effects. Ideas say
``FEATURE: X``; the coder adds X to its base branch's features. Expected beams,
gate decisions, stop reasons and best paths are worked out by hand below.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from engine_helpers import run_until_hung
from tree_beam_helpers import ROOT_COMMIT, World, evals, measure_spec, run, with_commit

from orchestrator.engine.testing import ScriptedRunner, failure, success
from orchestrator.errors import ConfigError
from orchestrator.log.eventlog import read_events
from strategies.tree_beam import (
    gate,
    idea_hash,
    parse_ideas,
    prepare,
    rank_key,
    render_tree_report,
)
from strategies.tree_beam_report import best_path


async def test_two_depths_exact_gates_beam_ties_nan_and_failures(tmp_path):
    engine, state, runner = await run(tmp_path)
    s = state.strategies["s1"]
    assert s.status == "success", s.error
    res = s.result
    ev = evals(res)
    # which idea got which eval id: frontier order, then idea order; the duplicate "A" under n1 is skipped
    assert {e: r["idea"]["title"] for e, r in ev.items()} == {
        "e0001": "idea A",
        "e0002": "idea T",
        "e0003": "idea C",
        "e0004": "idea INC",
        "e0005": "idea B",
        "e0006": "idea FAILIMPL",
        "e0007": "idea NANREC",
        "e0008": "idea D",
        "e0009": "idea FAILEVAL",
        "e0010": "idea B",
    }
    assert res["tree"]["depths"][1]["duplicates"] == [
        {"node": "n1", "title": "idea A", "hash": idea_hash("idea A", "FEATURE: A")}
    ]
    decisions = {
        e: (r["decision"]["passed_gate"], r["decision"]["promotion_reason"], r["decision"]["rank_score"])
        for e, r in ev.items()
    }
    assert decisions == {
        "e0001": (True, "promoted (improved_tight_interval)", 20.0),
        "e0002": (
            True,
            "promoted (improved_tight_interval)",
            20.0,
        ),  # tie with e0001, lower id first: both fit the beam
        "e0003": (False, "primary_metric_regressed", None),
        "e0004": (False, "incomplete_evaluation", None),
        "e0005": (True, "promoted (improved_tight_interval)", 30.0),
        "e0006": (False, "not_evaluated:code_failed", None),
        "e0007": (True, "below_beam", 22.0),  # recommendation score null: ranked by the root delta
        "e0008": (True, "below_beam", 20.5),  # +0.42 % vs parent is noise: mixed, no regression -> gated
        "e0009": (False, "not_evaluated:eval_failed", None),
        "e0010": (True, "promoted (improved_tight_interval)", 30.0),  # ties e0005 on score and delta: loses on id
    }
    assert ev["e0005"]["parent_comparison"]["score"] == pytest.approx(100 * 10 / 120)
    assert ev["e0008"]["parent_comparison"]["grade"] == "mixed" and ev["e0008"]["root_comparison"]["score"] == 20.5
    assert ev["e0007"]["root_comparison"]["score"] is None and ev["e0007"]["root_comparison"]["primary_delta"] == 22.0
    assert "exit code 2" in ev["e0009"]["error"] and ev["e0006"]["error"].startswith("agent: model refused")
    nodes = {n["id"]: n for n in res["tree"]["nodes"]}
    assert {n: (v["parent"], v["depth"], v["eval_id"]) for n, v in nodes.items()} == {
        "n0": (None, 0, None),
        "n1": ("n0", 1, "e0001"),
        "n2": ("n0", 1, "e0002"),
        "n3": ("n1", 2, "e0005"),
        "n4": ("n2", 2, "e0010"),
    }
    assert nodes["n3"]["metrics"] == {"throughput": 130.0}
    assert [c["title"] for c in nodes["n3"]["idea_chain"]] == ["idea A", "idea B"]
    assert [d["promoted"] for d in res["tree"]["depths"]] == [["n1", "n2"], ["n3", "n4"]]
    assert (res["stop_reason"], res["best_node"], res["best_path"]) == ("max_depth", "n3", ["n0", "n1", "n3"])
    assert res["best_branch"] == nodes["n3"]["branch"]
    # rejected candidates' branches go to the delete list; node branches stay
    assert sorted(b["branch"] for b in res["delete_branches"]) == sorted(
        ev[e]["branch"] for e in ("e0003", "e0004", "e0007", "e0008", "e0009")
    )
    # the idea JSON for n2 was repaired once; every task ran exactly once
    assert "run_t/s1/n2/ideas/attempt-2" in runner.per_key and "run_t/s1/n1/ideas/attempt-2" not in runner.per_key
    assert all(n == 1 for n in runner.per_key.values())
    # each implementation started from its parent node's branch
    calls = {c.task_key: c for c in runner.calls}
    assert calls["run_t/s1/e0005/code/round-1"].base_branch == nodes["n1"]["branch"]
    assert calls["run_t/s1/e0010/code/round-1"].base_branch == nodes["n2"]["branch"]
    assert calls["run_t/s1/root/eval"].base_branch == "main"
    # the context pack told n1's ideator about the path and the failed siblings
    n1_prompt = calls["run_t/s1/n1/ideas/attempt-1"].prompt
    assert "- idea A: result 20.0 (strong), confirmed change +20.00% (interval +20.00%..+20.00%), kept" in n1_prompt
    assert "- idea C: result -5.0 (weak), dropped: primary_metric_regressed" in n1_prompt
    assert f"output of echo 'root -> node:' on {nodes['n1']['branch']}" in n1_prompt
    # files
    out = engine.paths.results / "strategy_output"
    assert json.loads((out / "tree.json").read_text()) == res["tree"]
    summary = (out / "TREE_SUMMARY.md").read_text()
    assert "Stop reason: **max_depth**" in summary and "1. n3 `" in summary
    assert (out / "tree.svg").read_text().startswith("<svg") and "#2e7d32" in (out / "tree.svg").read_text()
    assert (out / "delete_branches.txt").read_text().count("\n") == 5
    assert (out / "evals" / "e0005" / "eval.log").read_text().startswith("bench\n")


async def test_budget_hit_mid_depth_stops_scheduling(tmp_path):
    _, state, runner = await run(tmp_path, max_total_evals=5)
    res = state.strategies["s1"].result
    assert res["stop_reason"] == "max_total_evals" and res["evals_used"] == 5
    assert sorted(evals(res)) == ["e0001", "e0002", "e0003", "e0004", "e0005"]
    assert res["tree"]["depths"][1]["budget_hit"] is True
    assert not any("/e0006/" in k for k in runner.per_key)
    assert [d["promoted"] for d in res["tree"]["depths"]] == [["n1", "n2"], ["n3"]]
    assert res["best_path"] == ["n0", "n1", "n3"]


async def test_empty_frontier_stops_with_the_root_as_best(tmp_path):
    world = World(ideas={"n0": ["C", "INC", "FAILEVAL"]})
    _, state, runner = await run(tmp_path, world, max_depth=3)
    res = state.strategies["s1"].result
    assert (res["stop_reason"], res["best_path"], res["delete_branches"] != []) == ("frontier_empty", ["n0"], True)
    assert [n["id"] for n in res["tree"]["nodes"]] == ["n0"]
    assert not any(k.startswith("run_t/s1/n1/") for k in runner.per_key)


async def test_run_scope_dedupe_and_keep_rejected(tmp_path):
    _, state, _ = await run(tmp_path, dedupe_scope="run", keep_rejected=True)
    res = state.strategies["s1"].result
    ev = evals(res)
    # B was planned under n1 first, so n2's B is a duplicate across the run
    assert [r["idea"]["title"] for r in ev.values() if r["parent"] == "n2"] == ["idea D", "idea FAILEVAL"]
    assert res["delete_branches"] == []


async def test_failed_root_evaluation_stops_before_any_idea(tmp_path):
    def script(req):
        return failure(req, error_type="command", message="exit code 1\nno bench.py")

    engine, state, runner = await run(tmp_path, runner=ScriptedRunner(script))
    s1 = state.strategies["s1"]
    assert (s1.status, list(runner.per_key)) == ("failed", ["run_t/s1/root/eval"])
    assert s1.error.startswith("BaseEvaluationFailed: the evaluation of the base cannot be used: it did not run")
    assert "no bench.py" in s1.error and "command: python bench.py --json" in s1.error
    tree = json.loads((engine.paths.results / "strategy_output" / "tree.json").read_text())
    assert tree["stop_reason"] == "root_evaluation_failed"


@pytest.mark.parametrize(
    ("root_answer", "params", "expected"),
    [
        (
            {"root/eval": "invalid"},
            {},
            ["it reports valid: false", "command: python bench.py --json", "| No module named pytest"],
        ),
        (
            {"root/tests": "\n@@orch-base stderr\nsh: 1: pytest: not found\n@@orch-base exit=127\n"},
            {"test_command": "pytest -q"},
            [
                "BaseEvaluationFailed: the test command cannot run on the base: command not found: pytest "
                "(exit status 127); install it in the project's environment",
                "command: pytest -q",
                "| sh: 1: pytest: not found",
            ],
        ),
    ],
)
async def test_an_unusable_base_stops_before_any_idea(tmp_path, root_answer, params, expected):
    world = World()

    def script(req):
        key = req.task_key.split("/s1/")[1]
        if root_answer.get(key) == "invalid":
            runs = measure_spec(req)["runs"]
            line = json.dumps({"metrics": {"throughput": 100}, "valid": False})
            lines = [f"@@orch-run {i} c 0 1 {line}" for i in range(len(runs))]
            text = "\n".join([*lines, f"| {line}", "!| No module named pytest", f"@@orch-done {len(runs)}"])
            return with_commit(success(req, final_message=text, exit_code=0), ROOT_COMMIT)
        if key in root_answer:
            return success(req, final_message=root_answer[key], exit_code=0)
        return world(req)

    _, state, runner = await run(tmp_path, runner=ScriptedRunner(script), **params)
    s1 = state.strategies["s1"]
    assert s1.status == "failed" and all(k.split("/s1/")[1].startswith("root/") for k in runner.per_key)
    for text in expected:
        assert text in s1.error, (text, s1.error)


async def test_review_rounds_in_tree_beam_use_the_pipeline(tmp_path):
    _, state, runner = await run(tmp_path, max_review_rounds=1, max_depth=1)
    assert "run_t/s1/e0001/review/round-1/attempt-1" in runner.per_key
    assert state.strategies["s1"].result["tree"]["evaluations"][0]["rounds"][0]["verdict"] == "APPROVE"


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("hang_on", ["n1/ideas/attempt-1", "e0008/eval", "n1/context", "e0002/code/round-1"])
async def test_interrupt_and_resume_rebuilds_the_identical_tree(tmp_path, hang_on):
    ref_engine, ref_state, _ = await run(tmp_path / "ref")
    world = World()

    async def hanging(req):
        if req.task_key.endswith(hang_on):
            await anyio.sleep_forever()
        return world(req)

    first = ScriptedRunner(hanging)
    await run_until_hung(run(tmp_path / "run", runner=first), first, hang_on)
    assert any(k.endswith(hang_on) for k in first.per_key)
    # the partial tree can be rendered from the log alone
    partial = render_tree_report(tmp_path / "run" / "logs" / "run_t" / "events.jsonl", tmp_path / "partial")
    assert json.loads(partial[0].read_text())["stop_reason"] is None
    # what the first process durably finished: a task merely started when the
    # interrupt came (a loaded machine) runs again, and must
    events = tmp_path / "run" / "logs" / "run_t" / "events.jsonl"
    finished_first = {e.key for e in read_events(events) if e.type == "task.completed"}
    assert finished_first, "the first process finished nothing before the interrupt"
    second = ScriptedRunner(world)
    engine, state, _ = await run(tmp_path / "run", runner=second)
    assert state.strategies["s1"].result == ref_state.strategies["s1"].result
    assert not finished_first & set(second.per_key), "a finished task ran again"
    assert snapshot(engine.paths.results / "strategy_output") == snapshot(ref_engine.paths.results / "strategy_output")


async def test_render_from_events_alone_matches_the_strategys_files(tmp_path):
    engine, _, _ = await run(tmp_path)
    written = render_tree_report(engine.paths.events, tmp_path / "rendered")
    assert sorted(p.name for p in written) == ["TREE_SUMMARY.md", "delete_branches.txt", "tree.json", "tree.svg"]
    out = engine.paths.results / "strategy_output"
    for p in written:
        assert p.read_bytes() == (out / p.name).read_bytes(), p.name


async def test_partial_render_shows_what_finished(tmp_path):
    world = World()

    async def hang_depth2(req):
        if "/s1/e0005/" in req.task_key:
            await anyio.sleep_forever()
        return world(req)

    runner = ScriptedRunner(hang_depth2)
    await run_until_hung(run(tmp_path, runner=runner), runner, "/s1/e0005/")
    (tree_file, *_rest) = render_tree_report(tmp_path / "logs" / "run_t" / "events.jsonl", tmp_path / "r")
    tree = json.loads(tree_file.read_text())
    status = {r["id"]: r["status"] for r in tree["evaluations"]}
    assert status["e0001"] == "completed" and status["e0005"] == "pending"
    assert [n["id"] for n in tree["nodes"]] == ["n0", "n1", "n2"] and tree["stop_reason"] is None
    assert "interrupted (run not finished)" in (tmp_path / "r" / "TREE_SUMMARY.md").read_text()


# ------------------------------------------------------------------ pure pieces


def rec(eid, *, passed=True, score=None, delta=None):
    return {
        "id": eid,
        "decision": {"passed_gate": passed, "rank_score": score},
        "root_comparison": {"score": score, "primary_delta": delta},
    }


def test_rank_order_score_then_delta_then_id_missing_last():
    records = [
        rec("e0004", score=None, delta=None),
        rec("e0003", score=5.0, delta=1.0),
        rec("e0002", score=5.0, delta=2.0),
        rec("e0001", score=5.0, delta=2.0),
        rec("e0005", score=9.0, passed=False),
    ]
    assert [r["id"] for r in sorted(records, key=rank_key)] == ["e0005", "e0001", "e0002", "e0003", "e0004"]


def test_gate_mixed_needs_no_primary_regression():
    from strategies.evaluation import ScoringConfig

    cfg = ScoringConfig(primary_metric="t", tolerance=0.01)
    base = {"status": "completed", "evaluation": {"status": "ok", "metrics": {"t": 1.0}}}
    mixed_rec = {
        "score": 0.0,
        "grade": "mixed",
        "should_explore": False,
        "reasons": ["primary_metric_regressed"],
        "primary_delta": -0.5,
        "primary_change": -0.05,
        "primary_baseline": 10.0,
        "primary_candidate": 9.5,
    }
    assert gate({**base, "parent_comparison": mixed_rec}, cfg) == (False, "primary_metric_regressed", True)
    flat = dict(mixed_rec, reasons=["primary_metric_flat"], primary_delta=-0.05, primary_change=-0.005)
    assert gate({**base, "parent_comparison": flat}, cfg) == (True, "mixed_without_primary_regression", False)


def test_idea_hash_normalizes_and_parse_ideas_validates():
    assert idea_hash("Cache  Results!", "- use an LRU\n") == idea_hash("cache results", "1. Use an LRU")
    assert idea_hash("Cache results", "x") != idea_hash("Cache results", "y")
    assert parse_ideas({"ideas": [{"title": "a", "description": "b"}, {"title": ""}, "x"]}, 5) == [
        {"title": "a", "description": "b"}
    ]
    assert parse_ideas({"ideas": []}, 5) is None and parse_ideas("nope", 5) is None
    assert len(parse_ideas([{"title": str(i)} for i in range(9)], 3)) == 3


def test_best_path_prefers_lower_node_id_on_full_tie():
    tree = {
        "nodes": [
            {"id": "n0", "parent": None},
            {"id": "n1", "parent": "n0", "rank_score": 3.0, "root_comparison": {"primary_delta": 1.0}},
            {"id": "n2", "parent": "n0", "rank_score": 3.0, "root_comparison": {"primary_delta": 1.0}},
            {"id": "n10", "parent": "n1", "rank_score": 3.0, "root_comparison": {"primary_delta": 1.0}},
        ]
    }
    assert [n["id"] for n in best_path(tree)] == ["n0", "n1"]


def test_prepare_requires_eval_command_and_metric():
    with pytest.raises(ConfigError, match="eval_command"):
        prepare({}, ".")
    with pytest.raises(ConfigError, match="primary_metric"):
        prepare({"eval_command": "python bench.py"}, ".")
    with pytest.raises(ConfigError, match="beam_width"):
        prepare({"eval_command": "x", "primary_metric": "t", "beam_width": 0}, ".")
