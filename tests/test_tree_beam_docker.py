"""A real depth-2 tree-beam run: engine + DockerRunner + sim agent + git + a benchmark script.

The goal carries one ``SIM[nX]: print-json`` line per node (the ideator's
prompt has ``Node: nX``); each idea's description tells the coder which file
to commit, and bench.py's throughput depends on which files exist.
Worked out by hand: root 100; depth 1: fast +20 (kept, n1), slow -30 (gate
fails); depth 2 from n1: faster +25 (145, kept, n2), notes +0 (mixed, gated
but below the beam). Stop: max_depth; best path n0 -> n1 -> n2.
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import settings_args, strategy_args
from conftest import TEST_IMAGE, git, make_repo
from docker_harness import new_run_id, run_with_docker
from scenarios import BENCH, GOAL, PARAMS, idea
from tree_checks import validate_tree

from orchestrator.log.eventlog import read_events
from orchestrator.runner import delete_run_branches
from strategies.tree_beam import render_tree_report, tree_beam
from strategies.tree_beam_measure import decide
from strategies.tree_beam_report import listed_branches

pytestmark = pytest.mark.docker


def check_tree(engine, repo):
    s = engine.state.strategies["s1"]
    assert s.status == "success", s.error
    res = s.result
    ev = {r["id"]: r for r in res["tree"]["evaluations"]}
    assert {e: (r["idea"]["title"], r["decision"]["passed_gate"], r.get("promoted_to")) for e, r in ev.items()} == {
        "e0001": ("fast path", True, "n1"),
        "e0002": ("slow path", False, None),
        "e0003": ("faster path", True, "n2"),
        "e0004": ("notes", True, None),
    }
    assert ev["e0002"]["decision"]["promotion_reason"] == "primary_metric_regressed"
    assert ev["e0004"]["decision"]["promotion_reason"] == "below_beam"
    assert ev["e0003"]["parent_comparison"]["score"] == pytest.approx(100 * 25 / 120)
    assert ev["e0003"]["root_comparison"]["score"] == 45.0
    assert (res["stop_reason"], res["best_path"]) == ("max_depth", ["n0", "n1", "n2"])
    n2 = res["tree"]["nodes"][2]
    assert (
        git(repo, "show", f"{n2['branch']}:faster.txt") == "1" and git(repo, "show", f"{n2['branch']}:fast.txt") == "1"
    )
    assert git(repo, "rev-parse", n2["branch"]) == n2["commit"]
    return res


async def test_depth_two_tree_end_to_end(tmp_path, workspace_root):
    repo = make_repo(tmp_path / "repo", {"bench.py": BENCH})
    engine = await run_with_docker(tmp_path, repo, tree_beam, params=PARAMS, prompt=GOAL, max_parallel=4)
    res = check_tree(engine, repo)
    out = engine.paths.results / "strategy_output"
    # the n1 ideator was told what changed on its branch (diff stat) and how its siblings fared
    n1_prompt = engine.state.tasks[f"{engine.config.run_id}/s1/n1/ideas/attempt-1"].input["prompt"]
    assert "fast.txt" in n1_prompt and "- slow path:" in n1_prompt
    # validation, rendering from the log, then the post-run branch cleanup
    assert validate_tree(out / "tree.json", repo) == []
    for p in render_tree_report(engine.paths.events, tmp_path / "rendered"):
        assert p.read_bytes() == (out / p.name).read_bytes()
    doomed = {b["branch"] for b in res["delete_branches"]}
    ev = {r["id"]: r for r in res["tree"]["evaluations"]}
    assert doomed == {ev["e0002"]["branch"], ev["e0004"]["branch"]}
    assert await delete_run_branches(repo, listed_branches(out), run_id=engine.config.run_id) == {
        b: "deleted" for b in doomed
    }
    heads = git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split()
    assert not doomed & set(heads) and validate_tree(out / "tree.json", repo) == []
    assert (
        validate_tree(
            {
                **res["tree"],
                "nodes": [dict(n, commit="0" * 40) if n["id"] == "n2" else n for n in res["tree"]["nodes"]],
            },
            repo,
        )
        != []
    )


async def test_interrupted_tree_resumes_without_rerunning_work(tmp_path, workspace_root):
    repo = make_repo(tmp_path / "repo", {"bench.py": BENCH})
    rid = new_run_id()
    # mid depth 2: implemented, not yet evaluated
    cancel_on = ("task.completed", "/e0003/code/round-1")
    await run_with_docker(tmp_path, repo, tree_beam, params=PARAMS, prompt=GOAL, run_id=rid, cancel_on=cancel_on)
    events = list(read_events(tmp_path / "logs" / rid / "events.jsonl"))
    done_first = {e.key for e in events if e.type == "task.completed"}
    assert f"{rid}/s1/e0003/code/round-1" in done_first and f"{rid}/s1/e0003/eval" not in done_first
    engine = await run_with_docker(tmp_path, repo, tree_beam, params=PARAMS, prompt=GOAL, max_parallel=4, run_id=rid)
    check_tree(engine, repo)
    later = list(read_events(engine.paths.events))[len(events) :]
    rerun = {e.key for e in later if e.type == "task.started"} & done_first
    assert not rerun, f"finished tasks ran again: {sorted(rerun)}"
    assert f"{rid}/s1/e0003/eval" in {e.key for e in later if e.type == "task.completed"}


def test_cli_runs_tree_beam_and_writes_the_tree(tmp_path, workspace_root):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = make_repo(tmp_path / "repo", {"bench.py": BENCH})
    env = dict(
        os.environ, ANTHROPIC_API_KEY="sk-test-dummy-key-0000000000", ORCHESTRATOR_WORKSPACE_ROOT=str(workspace_root)
    )
    cli = Path(sys.executable).with_name("orchestrator")
    args = [
        str(cli),
        GOAL,
        *strategy_args("tree-beam"),
        "--repo",
        str(repo),
        "--docker-image",
        TEST_IMAGE,
        "--no-tui",
        *settings_args(
            eval_command="python3 bench.py", primary_metric="throughput", ideas_per_node=2, max_depth=2, beam_width=1
        ),
    ]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (tree_file,) = tmp_path.glob("results/*/strategy_output/tree.json")
    tree = json.loads(tree_file.read_text())
    assert tree["stop_reason"] == "max_depth" and [n["id"] for n in tree["nodes"]] == ["n0", "n1", "n2"]
    assert validate_tree(tree, repo) == []
    assert (tree_file.parent / "TREE_SUMMARY.md").exists() and (tree_file.parent / "tree.svg").exists()
    # the CLI deleted the rejected candidates' branches after the run, and kept the nodes'
    heads = subprocess.run(
        ["git", "branch", "--format=%(refname:short)"], cwd=repo, capture_output=True, text=True
    ).stdout.split()
    listed = [line.split()[0] for line in (tree_file.parent / "delete_branches.txt").read_text().splitlines()]
    assert listed and not set(listed) & set(heads)
    assert all(n["branch"] in heads for n in tree["nodes"] if n["id"] != "n0")
    # the results name what is left, not what the clean-up deleted
    results = tree_file.parent.parent
    in_txt = (results / "branches.txt").read_text().split()
    summary = json.loads((results / "summary.json").read_text())
    assert in_txt == summary["branches"] and in_txt and set(in_txt) <= set(heads)
    assert not set(listed) & set(in_txt)
    rows = [t for s in summary["strategies"] for t in s["tasks"] if t["branch"] in listed]
    assert rows and all(t["branch_deleted"] for t in rows)
    assert "(deleted by the strategy's clean-up)" in done.stdout + done.stderr
    # --show-run regenerates the report from the event log alone and validates it
    before = tree_file.read_text()
    tree_file.unlink()
    run_id = tree_file.parent.parent.name
    shown = subprocess.run(
        [str(cli), "--show-run", run_id], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
    assert (
        f"checked {len(tree['nodes'])} branch(es) in {repo}: every commit the run kept is on its branch" in shown.stdout
    )
    assert json.loads(tree_file.read_text()) == json.loads(before)


NOISY_BENCH = """import json, os, random
t = 100.0 * (1.2 if os.path.exists("fast.txt") else 1.0)
t *= 1 + 0.01 * random.gauss(0, 1)
print("warming up")
print(json.dumps({"metrics": {"throughput": t}, "expected": 10, "ok": 10}))
"""
GAME = {
    "title": "game the bench",
    "description": 'SIM[coder]: write bench.py print(\'{"metrics": {"throughput": 1000}}\')\nSIM[coder]: commit game',
}
NOISY_GOAL = (
    f"make the solver faster\nSIM[n0]: print-json {json.dumps({'ideas': [idea('fast path', 'fast.txt'), GAME]})}\n"
)


async def test_noisy_benchmark_repeats_confirms_and_protects_the_evaluator(tmp_path, workspace_root):
    """Real containers, real git: a 1 %-noise benchmark measured 3 times per commit, a paired
    confirmation, a candidate that rewrote bench.py measured with the root's bench.py, and the
    final check of the best against the base."""
    repo = make_repo(tmp_path / "repo", {"bench.py": NOISY_BENCH})
    params = {**PARAMS, "max_depth": 1, "beam_width": 2, "eval_repeats": 3, "confirm_pairs": 3, "confidence": 0.9}
    engine = await run_with_docker(tmp_path, repo, tree_beam, params=params, prompt=NOISY_GOAL, max_parallel=4)
    s = engine.state.strategies["s1"]
    assert s.status == "success", s.error
    out = engine.paths.results / "strategy_output"
    tree = json.loads((out / "tree.json").read_text())
    root_stats = tree["root_evaluation"]["stats"]["throughput"]
    assert root_stats["n"] == 3 and 90 < root_stats["median"] < 110 and root_stats["low"] <= root_stats["high"]
    ev = {r["idea"]["title"]: r for r in tree["evaluations"]}
    fast, game = ev["fast path"], ev["game the bench"]
    assert fast["evaluation"]["stats"]["throughput"]["n"] >= 3
    conf = fast["confirmation"]
    assert conf["pairs"] == 3 and conf["change"]["n"] == 3 and conf["change"]["low"] > 0.1, conf
    # The bench's noise is random.gauss (not timing, so machine load does not matter): with 3 pairs the
    # interval's half-width is at most the 1 % tolerance in about 11 % of runs, and the gate then reads it
    # as tight. Both reasons promote a 20 % gain correctly; the reason must be the one its own interval gives.
    reason = decide(conf["change"], PARAMS["tolerance"])
    assert reason[0] and reason[1] in ("improvement_above_noise", "improved_tight_interval"), reason
    assert fast["promoted_to"] == "n1" and fast["decision"]["promotion_reason"] == f"promoted ({reason[1]})"
    # the candidate's own bench.py says 1000; it was measured with the root's bench.py instead, and flagged
    assert game["protected_changed"] == ["bench.py"] and tree["flagged_protected"] == [game["id"]]
    assert game["evaluation"]["metrics"]["throughput"] < 150
    assert git(repo, "show", f"{game['branch']}:bench.py").startswith("print(")
    best = tree["best"]
    assert best["node"] == "n1" and best["beat_base"] and best["check"]["change"]["low"] > 0.1
    assert (
        engine.state.tasks[f"{engine.config.run_id}/s1/final/confirm"].input["base_branch"]
        == tree["nodes"][1]["branch"]
    )
    summary = (out / "TREE_SUMMARY.md").read_text()
    assert "**n1 beat the base**" in summary and "over 3 pairs" in summary
    assert "changed protected bench.py" in summary and "## Protected evaluator" in summary
    assert tree["eval_runs"] == 3 + 2 * 3 + 2 * 3 + 2 * 3 + (2 * 3 if game["confirmation"] else 0)
    assert validate_tree(out / "tree.json", repo) == []
