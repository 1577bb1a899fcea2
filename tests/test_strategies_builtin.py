"""Built-in strategies over the real engine with an in-process runner: decisions, outputs, resume."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from engine_helpers import assert_resume_matches_uninterrupted, output, run_engine

from orchestrator.engine.testing import ScriptedRunner, failure, success
from orchestrator.errors import ConfigError
from orchestrator.strategy_loader import load_strategy, parse_params
from strategies._json import STRICT_PREFIX
from strategies.best_of_n import best_of_n
from strategies.iterative import iterative
from strategies.plan_score_implement import plan_score_implement
from strategies.simple import simple


def part(req, n=-1):
    """The ``n``-th part of the task key after ``run/sid/``."""
    return req.task_key.split("/")[2:][n]


def reviewed_candidate(req) -> int:
    return int(re.search(r"candidate (\d+) says", req.prompt).group(1))


def bon_script(answers, failing=()):
    """gen/<i> says "candidate i says ..."; its reviewer answers ``answers[i][attempt-1]``."""

    def script(req):
        parts = req.task_key.split("/")[2:]
        if parts[0] == "gen":
            i = int(parts[1])
            if i in failing:
                return failure(req, error_type="api", message="boom")
            return success(req, final_message=f"candidate {i} says done")
        assert parts[0] == "score" and req.import_policy == "never"
        attempt = int(parts[2].removeprefix("attempt-"))
        answer = answers[reviewed_candidate(req)][attempt - 1]
        if answer == "FAIL":
            return failure(req, error_type="api", message="reviewer crashed")
        return success(req, final_message=answer, has_changes=False)

    return script


async def test_best_of_n_selects_highest_score_with_lowest_index_tie_break(tmp_path):
    answers = {
        0: ['{"score": 6, "rationale": "ok"}'],
        1: ['Here you go: ```json\n{"score": 8, "rationale": "good"}\n```'],
        2: ['{"score": 8, "rationale": "also good"}'],
        3: ['{"score": 2, "rationale": "weak"}'],
    }
    runner = ScriptedRunner(
        bon_script(answers), delay=lambda req: 0.02 * (3 - int(part(req, 1))) if part(req, 0) == "gen" else 0
    )  # later candidates finish first
    engine, state = await run_engine(tmp_path, best_of_n, runner, params={"n": 4})
    s1 = state.strategies["s1"]
    assert s1.status == "success", s1.error
    assert s1.result["key"] == "run_t/s1/gen/1" and s1.result["final_message"] == "candidate 1 says done"
    scores = json.loads(output(engine, "scores.json"))
    assert scores["selected"]["index"] == 1 and scores["selected"]["score"] == 8
    assert [c["score"] for c in scores["candidates"]] == [6, 8, 8, 2]
    assert scores["candidates"][2]["rationale"] == "also good"
    assert output(engine, "best_branch.txt") == s1.result["artifact"]["branch_final"] + "\n"
    # reviewers are read-only on the candidate's branch, with the base present for diffs
    reviews = [c for c in runner.calls if part(c, 0) == "score"]
    assert len(reviews) == 4
    for r in reviews:
        gen_key = f"run_t/s1/gen/{reviewed_candidate(r)}"
        gen = state.tasks[gen_key]
        assert r.task_key == f"run_t/s1/score/{gen.instance_id}/attempt-1"
        assert r.include_branches == ("main",) and r.import_policy == "never"
    branches = {c.base_branch for c in reviews}
    assert branches == {c.branch_name for c in runner.calls if part(c, 0) == "gen"}


async def test_best_of_n_repairs_once_and_excludes_unscorable_and_failed(tmp_path):
    answers = {
        0: ["I think it is fine", '{"score": 3, "rationale": "fixed"}'],
        1: ['{"score": "9", "rationale": "string score"}', '{"score": 11, "rationale": "out of range"}'],
        2: ["FAIL"],
        4: ['{"score": 1, "rationale": "x"}'],
    }
    runner = ScriptedRunner(bon_script(answers, failing={3}))
    engine, state = await run_engine(tmp_path, best_of_n, runner, params={"n": 5})
    assert state.strategies["s1"].result["key"] == "run_t/s1/gen/0"  # 3 beats 1; 9/11 never coerced
    rows = json.loads(output(engine, "scores.json"))["candidates"]
    assert [r["status"] for r in rows] == ["scored", "unscorable", "unscorable", "failed", "scored"]
    assert [r.get("attempts") for r in rows] == [2, 2, 1, None, 1]
    repair = next(c for c in runner.calls if c.task_key.endswith("attempt-2") and reviewed_candidate(c) == 0)
    assert repair.prompt.startswith(STRICT_PREFIX) and "I think it is fine" in repair.prompt
    # a failed reviewer is not repaired: no attempt-2 for candidate 2
    assert not any(c.task_key.endswith("attempt-2") and reviewed_candidate(c) == 2 for c in runner.calls)


async def test_best_of_n_with_nothing_scorable_fails_with_no_viable_candidates(tmp_path):
    answers = {0: ["nope", "still nope"], 1: ["FAIL"]}
    engine, state = await run_engine(
        tmp_path, best_of_n, ScriptedRunner(bon_script(answers, failing={2})), params={"n": 3}
    )
    s1 = state.strategies["s1"]
    assert s1.status == "failed" and s1.error.startswith("NoViableCandidates")
    report = json.loads(output(engine, "scores.json"))
    assert report["selected"] is None and [r["status"] for r in report["candidates"]] == [
        "unscorable",
        "unscorable",
        "failed",
    ]
    assert not (engine.paths.results / "strategy_output" / "best_branch.txt").exists()


async def test_best_of_n_runs_n_writes_one_score_file_per_execution(tmp_path):
    answers = {i: [f'{{"score": {i + 1}, "rationale": "r"}}'] for i in range(2)}
    runner = ScriptedRunner(bon_script(answers))
    engine, state = await run_engine(tmp_path, best_of_n, runner, params={"n": 2}, runs=3)
    assert {sid: s.status for sid, s in state.strategies.items()} == {"s1": "success", "s2": "success", "s3": "success"}
    assert {s.result["key"] for s in state.strategies.values()} == {f"run_t/s{k}/gen/1" for k in (1, 2, 3)}
    out = engine.paths.results / "strategy_output"
    assert sorted(p.name for p in out.iterdir()) == [
        "best_branch.txt",
        "best_branch_s2.txt",
        "best_branch_s3.txt",
        "scores.json",
        "scores_s2.json",
        "scores_s3.json",
    ]
    for k, name in ((2, "best_branch_s2.txt"), (3, "best_branch_s3.txt")):
        assert (out / name).read_text().strip() == state.strategies[f"s{k}"].result["artifact"]["branch_final"]
    assert len(runner.calls) == 3 * 4


async def test_best_of_n_prepare_rejects_bad_parameters():
    loaded = load_strategy("best-of-n")
    with pytest.raises(ConfigError, match="n must be at least 1"):
        loaded.options.prepare(parse_params(loaded, ["n=0"]), ".")
    with pytest.raises(ConfigError, match="approaches"):
        loaded.options.prepare(parse_params(loaded, ['approaches=["ok", ""]']), ".")
    assert parse_params(loaded, [])["n"] == 5


# ------------------------------------------------------------------ interruption + resume


BON_ANSWERS = {
    0: ["bad", '{"score": 5, "rationale": "a"}'],
    1: ['{"score": 7, "rationale": "b"}'],
    2: ['{"score": 7, "rationale": "c"}'],
}


async def _best_of_n_resumed(tmp_path, blocked, count: int):
    return await assert_resume_matches_uninterrupted(
        tmp_path,
        best_of_n,
        bon_script(BON_ANSWERS),
        params={"n": 3},
        outputs=("scores.json", "best_branch.txt"),
        blocked=blocked,
        count=count,
    )


async def test_best_of_n_resumes_after_generation_without_duplicates(tmp_path):
    runner2 = await _best_of_n_resumed(tmp_path, lambda req: part(req, 0) == "score", 3)
    assert all(part(c, 0) == "score" for c in runner2.calls)


async def test_best_of_n_resumes_mid_scoring_without_duplicates(tmp_path):
    # candidate 0's repair attempt is running when the run is interrupted; 1 and 2 are scored
    runner2 = await _best_of_n_resumed(tmp_path, lambda req: req.task_key.endswith("attempt-2"), 1)
    assert [c.task_key.split("/")[-1] for c in runner2.calls] == ["attempt-2"]


# ------------------------------------------------------------------ iterative


def iterative_script(scores, *, bad_review_at=None):
    def script(req):
        step = part(req, 0)
        if step == "review":
            n = int(part(req, 1).removeprefix("iter-"))
            if n == bad_review_at:
                return success(req, final_message="no json here", has_changes=False)
            return success(
                req, final_message=json.dumps({"score": scores[n - 1], "feedback": f"fix thing {n}"}), has_changes=False
            )
        return success(req, final_message=f"{step} done", session_id="sess-chain")

    return script


async def test_iterative_chains_reviews_and_improvements_in_one_session(tmp_path):
    runner = ScriptedRunner(iterative_script([4, 6, 8]))
    engine, state = await run_engine(tmp_path, iterative, runner, params={"iterations": 3})
    keys = [c.task_key.removeprefix("run_t/s1/") for c in runner.calls]
    assert keys == [
        "gen",
        "review/iter-1/attempt-1",
        "improve/iter-1",
        "review/iter-2/attempt-1",
        "improve/iter-2",
        "review/iter-3/attempt-1",
        "improve/iter-3",
    ]
    by_key = {c.task_key.removeprefix("run_t/s1/"): c for c in runner.calls}
    chain = {by_key[k].session_group_key for k in ("gen", "improve/iter-1", "improve/iter-2", "improve/iter-3")}
    assert chain == {"run_t/s1/chain"}
    for n in (1, 2, 3):
        prev = by_key["gen" if n == 1 else f"improve/iter-{n - 1}"]
        improve, review = by_key[f"improve/iter-{n}"], by_key[f"review/iter-{n}/attempt-1"]
        assert improve.session_id == "sess-chain"  # resumes the previous task's session
        assert improve.base_branch == review.base_branch == prev.branch_name
        assert f"fix thing {n}" in improve.prompt and review.import_policy == "never"
    assert state.strategies["s1"].result["key"] == "run_t/s1/improve/iter-3"
    report = json.loads(output(engine, "iterations.json"))
    assert report["final_branch"] == by_key["improve/iter-3"].branch_name
    assert [s.get("score") for s in report["steps"] if s["step"].startswith("review")] == [4, 6, 8]
    assert load_strategy("iterative").options.requires_resume


async def test_iterative_stops_at_target_score_or_unusable_review(tmp_path):
    runner = ScriptedRunner(iterative_script([5, 9, 10]))
    _, state = await run_engine(tmp_path / "a", iterative, runner, params={"iterations": 3, "target_score": 9.0})
    assert state.strategies["s1"].result["key"] == "run_t/s1/improve/iter-1"
    assert runner.calls[-1].task_key == "run_t/s1/review/iter-2/attempt-1"

    runner = ScriptedRunner(iterative_script([5, 9, 10], bad_review_at=2))
    engine, state = await run_engine(tmp_path / "b", iterative, runner, params={"iterations": 3})
    assert [c.task_key.split("/", 2)[2] for c in runner.calls][-2:] == [
        "review/iter-2/attempt-1",
        "review/iter-2/attempt-2",
    ]
    assert state.strategies["s1"].result["key"] == "run_t/s1/improve/iter-1"
    assert "review 2 was unusable" in json.loads(output(engine, "iterations.json"))["stopped"]


async def test_iterative_resumes_mid_chain_without_duplicates(tmp_path):
    runner2 = await assert_resume_matches_uninterrupted(
        tmp_path,
        iterative,
        iterative_script([3, 5]),
        params={"iterations": 2},
        outputs=("iterations.json",),
        blocked=lambda req: req.task_key.endswith("improve/iter-2"),
        count=1,
    )
    assert [c.task_key for c in runner2.calls] == ["run_t/s1/improve/iter-2"]


# ------------------------------------------------------------------ plan-score-implement


def psi_script(plan_scores):
    def script(req):
        step = part(req, 0)
        if step == "plan":
            assert req.import_policy == "never"
            return success(req, final_message=f"PLAN[{part(req, 1)}]: steps", has_changes=False)
        if step == "score-plan":
            angle = re.search(r"PLAN\[(\w+)\]", req.prompt).group(1)
            answer = plan_scores[angle]
            return success(req, final_message=answer[min(len(answer), int(part(req)[-1])) - 1], has_changes=False)
        return success(req, final_message="implemented")

    return script


async def test_plan_score_implement_implements_the_best_plan_in_its_session(tmp_path):
    scores = {
        "performance": ['{"score": 6, "rationale": "p"}'],
        "simplicity": ["hmm", '{"score": 8, "rationale": "s"}'],
        "extensibility": ['{"score": 8, "rationale": "e"}'],
    }
    runner = ScriptedRunner(psi_script(scores))
    engine, state = await run_engine(tmp_path, plan_score_implement, runner)
    plans = {part(c, 1): c for c in runner.calls if part(c, 0) == "plan"}
    assert sorted(plans) == ["extensibility", "performance", "simplicity"]
    impl = runner.calls[-1]
    winner = state.tasks["run_t/s1/plan/simplicity"]  # 8 after repair; ties go to the earlier angle
    assert impl.task_key == f"run_t/s1/implement/plan/{winner.instance_id}"
    assert impl.session_id == winner.session_id and impl.session_group_key == plans["simplicity"].session_group_key
    assert "PLAN[simplicity]" in impl.prompt and impl.base_branch == "main"
    assert state.strategies["s1"].result["final_message"] == "implemented"
    report = json.loads(output(engine, "plans.json"))
    assert report["selected"]["angle"] == "simplicity"
    assert [p["attempts"] for p in report["plans"]] == [1, 2, 1]


async def test_plan_score_implement_resumes_mid_scoring_and_validates_angles(tmp_path):
    scores = {"a": ['{"score": 3, "rationale": "p"}'], "b": ["x", '{"score": 4, "rationale": "s"}']}
    await assert_resume_matches_uninterrupted(
        tmp_path,
        plan_score_implement,
        psi_script(scores),
        params={"angles": ["a", "b"]},
        outputs=("plans.json",),
        blocked=lambda req: req.task_key.endswith("attempt-2"),
        count=1,
    )
    loaded = load_strategy("plan-score-implement")
    with pytest.raises(ConfigError, match="duplicates"):
        loaded.options.prepare(parse_params(loaded, ['angles=["a","a"]']), ".")
    with pytest.raises(ConfigError, match="without '/'"):
        loaded.options.prepare(parse_params(loaded, ['angles=["a/b"]']), ".")


async def test_every_builtin_runs_n_independent_executions(tmp_path):
    def script(req):
        if "JSON object" in req.prompt:
            return success(req, final_message='{"score": 5, "rationale": "r", "feedback": "f"}', has_changes=False)
        return success(req, final_message="PLAN[x] done")

    for fn, params in (
        (simple, {}),
        (best_of_n, {"n": 2}),
        (iterative, {"iterations": 1}),
        (plan_score_implement, {"angles": ["x", "y"]}),
    ):
        runner = ScriptedRunner(script)
        _, state = await run_engine(tmp_path / fn.__name__, fn, runner, params=params, runs=2)
        assert {sid: s.status for sid, s in state.strategies.items()} == {"s1": "success", "s2": "success"}
        per_sid = Counter(c.strategy_execution_id for c in runner.calls)
        assert per_sid["s1"] == per_sid["s2"] > 0
        assert state.strategies["s2"].result["key"].startswith("run_t/s2/")
