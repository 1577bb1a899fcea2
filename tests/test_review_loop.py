"""review-loop and the shared per-idea pipeline, driven by an in-process scripted runner."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from engine_helpers import interrupt_when, run_engine

from orchestrator.engine.testing import ScriptedRunner, failure, success
from orchestrator.errors import ConfigError
from orchestrator.log.eventlog import read_events
from orchestrator.naming import short8
from orchestrator.report.selection import selected_of
from strategies.review_loop import load_ideas, prepare, review_loop

APPROVE = '{"verdict": "APPROVE", "issues": []}'
REJECT = '{"verdict": "REJECT", "issues": ["handle empty input"]}'

# What each idea's tasks answer. Reviews are listed per round; "garbage" is an unparsable answer.
IDEAS = {
    "01-good": {"reviews": [APPROVE], "throughput": 120},
    "02-fixme": {"reviews": [REJECT, APPROVE], "throughput": 90},
    "03-stubborn": {"reviews": [REJECT, REJECT], "throughput": 500},
    "04-flaky": {"reviews": [APPROVE], "tests_fail": True, "throughput": 500},
    "05-garbage": {"reviews": ["garbage"], "throughput": 500},
    "06-repaired": {"reviews": ["repair-then-approve"], "throughput": 100.5},
}


def idea_of(key: str) -> str:
    return key.split("/idea/")[1].split("/")[0]


def script(req):
    key = req.task_key
    if key.endswith("/baseline/eval"):
        return success(req, final_message='bench v1\n{"metrics": {"throughput": 100}}', exit_code=0)
    if key.endswith("/baseline/tests"):
        return success(req, final_message="3 passed\n@@orch-base stderr\n\n@@orch-base exit=0\n", exit_code=0)
    idea = IDEAS[idea_of(key)]
    part = key.split("/idea/")[1].split("/", 1)[1]
    if part == "plan":
        return success(req, final_message=f"PLAN for {idea_of(key)}\nRISKS: none", has_changes=False)
    if part.startswith("code/"):
        return success(req, final_message="implemented")
    if part.startswith("diff/"):
        return success(req, final_message=f"diff of {req.base_branch} ({part})", exit_code=0)
    if part.startswith("review/"):
        n = int(part.split("/")[1].split("-")[1])
        attempt = int(part.split("/")[2].split("-")[1])
        answer = idea["reviews"][n - 1]
        if answer == "garbage" or (answer == "repair-then-approve" and attempt == 1):
            return success(req, final_message="Looks fine to me!", has_changes=False)
        if answer == "repair-then-approve":
            answer = APPROVE
        return success(req, final_message=f"Review:\n```json\n{answer}\n```", has_changes=False)
    if part == "tests":
        if idea.get("tests_fail"):
            return failure(req, error_type="command", message="exit code 1\nFAILED test_parser.py::test_empty")
        return success(req, final_message="3 passed", exit_code=0)
    if part == "eval":
        return success(req, final_message=json.dumps({"metrics": {"throughput": idea["throughput"]}}), exit_code=0)
    raise AssertionError(f"unexpected task {key}")


def ideas_list():
    return [{"id": i, "title": f"Idea {i}", "text": f"Do {i}"} for i in IDEAS]


PARAMS = {
    "max_review_rounds": 1,
    "test_command": "pytest -q",
    "eval_command": "python bench.py --json",
    "primary_metric": "throughput",
    "direction": "max",
    "weights": {},
    "tolerance": 0.01,
}


async def run(tmp_path, runner=None, **kw):
    runner = runner or ScriptedRunner(script)
    engine, state = await run_engine(tmp_path, review_loop, runner, params={**PARAMS, "ideas": ideas_list()}, **kw)
    return engine, state, runner


def by_id(result):
    return {o["idea_id"]: o for o in result["ideas"]}


async def test_every_idea_ends_as_its_reviews_tests_and_evaluation_say(tmp_path):
    _engine, state, runner = await run(tmp_path)
    s = state.strategies["s1"]
    assert s.status == "success", s.error
    out = by_id(s.result)
    assert {k: v["status"] for k, v in out.items()} == {
        "01-good": "completed",
        "02-fixme": "completed",
        "03-stubborn": "rejected",
        "04-flaky": "tests_failed",
        "05-garbage": "review_invalid",
        "06-repaired": "completed",
    }
    assert [r["verdict"] for r in out["01-good"]["rounds"]] == ["APPROVE"]
    assert [r["verdict"] for r in out["02-fixme"]["rounds"]] == ["REJECT", "APPROVE"]
    assert [r["verdict"] for r in out["03-stubborn"]["rounds"]] == ["REJECT", "REJECT"]
    # scoring against the baseline (throughput 100, 1 % band)
    assert out["01-good"]["comparison"]["score"] == 20.0 and out["01-good"]["comparison"]["grade"] == "strong"
    assert out["02-fixme"]["comparison"]["score"] == -10.0 and out["02-fixme"]["comparison"]["grade"] == "weak"
    assert out["02-fixme"]["comparison"]["reasons"] == ["primary_metric_regressed"]
    assert out["06-repaired"]["comparison"]["grade"] == "mixed"  # +0.5 % is noise
    assert s.result["baseline"]["metrics"] == {"throughput": 100.0}
    assert [r["idea_id"] for r in s.result["ranking"]][:3] == ["01-good", "06-repaired", "02-fixme"]
    assert s.result["best"]["idea_id"] == "01-good"

    keys = set(runner.per_key)
    prefix = "run_t/s1/idea/"
    # rejected until the rounds ran out: no tests, no evaluation
    assert not any(k.startswith(prefix + "03-stubborn/") and k.endswith(("/tests", "/eval")) for k in keys)
    assert prefix + "03-stubborn/code/round-2" in keys  # the one fix round happened
    # failing tests stop the idea before the evaluation; the log tail is recorded
    assert prefix + "04-flaky/tests" in keys and prefix + "04-flaky/eval" not in keys
    assert "FAILED test_parser.py::test_empty" in out["04-flaky"]["tests"]["log_tail"]
    # an invalid review is repaired exactly once, then the idea is excluded
    assert {k for k in keys if k.startswith(prefix + "05-garbage/review/")} == {
        prefix + "05-garbage/review/round-1/attempt-1",
        prefix + "05-garbage/review/round-1/attempt-2",
    }
    assert prefix + "05-garbage/tests" not in keys
    assert (
        prefix + "06-repaired/review/round-1/attempt-2" in keys
        and out["06-repaired"]["rounds"][0]["verdict"] == "APPROVE"
    )
    assert all(n == 1 for n in runner.per_key.values())


async def test_fix_round_resumes_the_coders_own_session_on_its_branch(tmp_path):
    _, state, runner = await run(tmp_path)
    calls = {c.task_key: c for c in runner.calls}
    first = calls["run_t/s1/idea/02-fixme/code/round-1"]
    fix = calls["run_t/s1/idea/02-fixme/code/round-2"]
    assert fix.session_id == f"sess-{short8(first.task_key)}"  # resume_session_id = coder's session
    assert fix.session_group_key == first.session_group_key is not None
    assert fix.base_branch == first.branch_name  # fixes its own branch
    assert "handle empty input" in fix.prompt
    # tests and evaluation ran on the fixed branch, the review of round 2 saw it too
    final = by_id(state.strategies["s1"].result)["02-fixme"]["branch"]
    assert final == fix.branch_name
    assert calls["run_t/s1/idea/02-fixme/eval"].base_branch == final
    assert calls["run_t/s1/idea/02-fixme/review/round-2/attempt-1"].base_branch == final
    assert calls["run_t/s1/idea/02-fixme/review/round-2/attempt-1"].import_policy == "never"


async def test_artifacts_per_idea_and_ranking(tmp_path):
    engine, _, _ = await run(tmp_path)
    out = engine.paths.results / "strategy_output"
    d = out / "02-fixme"
    assert sorted(p.name for p in d.iterdir()) == [
        "diff_round_1.diff",
        "diff_round_2.diff",
        "eval.log",
        "idea.md",
        "plan.md",
        "review_round_1.md",
        "review_round_2.md",
        "summary.json",
        "tests.log",
    ]
    assert (d / "review_round_1.md").read_text().startswith("# Review round 1: REJECT")
    fix_branch = f"simple_run_t_k{short8('run_t/s1/idea/02-fixme/code/round-2')}"
    assert (d / "diff_round_2.diff").read_text() == f"diff of {fix_branch} (diff/round-2)"
    summary = json.loads((d / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["tests"]["exit_code"] == 0
    assert summary["evaluation"]["metrics"] == {"throughput": 90.0}
    assert not (out / "03-stubborn" / "tests.log").exists() and not (out / "03-stubborn" / "eval.log").exists()
    ranking = json.loads((out / "ranking.json").read_text())
    assert [r["idea_id"] for r in ranking] == [
        "01-good",
        "06-repaired",
        "02-fixme",
        "03-stubborn",
        "04-flaky",
        "05-garbage",
    ]
    assert "| 1 | 01-good: Idea 01-good | completed | 20 | strong |" in (out / "ideas.md").read_text()


def snapshot_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "hang_on", [("02-fixme/review/round-2/attempt-1",), ("01-good/eval", "06-repaired/review/round-1/attempt-2")]
)
async def test_interrupt_mid_review_or_mid_evaluation_then_resume(tmp_path, hang_on):
    ref_engine, ref_state, _ = await run(tmp_path / "ref")

    returned: set[str] = set()

    async def hanging(req):
        if req.task_key.endswith(hang_on):
            await anyio.sleep_forever()
        out = script(req)
        returned.add(req.task_key)
        return out

    def hanging_where_wanted() -> bool:
        # every hang point reached, and every other task given its result: the run is
        # stopped there (a fixed one second did not reach it on a loaded machine)
        called = {c.task_key for c in first.calls}
        reached = all(any(k.endswith(h) for k in called) for h in hang_on)
        return reached and {k for k in called if not k.endswith(hang_on)} <= returned

    first = ScriptedRunner(hanging)
    await interrupt_when(lambda: run(tmp_path / "run", first), hanging_where_wanted, settle=0.2)
    # the tasks the interrupted run recorded as done
    done_before = {
        e.key for e in read_events(tmp_path / "run" / "logs" / "run_t" / "events.jsonl") if e.type == "task.completed"
    }
    assert done_before, "the first run recorded no finished task: nothing was tested"
    second = ScriptedRunner(script)
    engine, state, _ = await run(tmp_path / "run", second)
    assert state.strategies["s1"].status == "success"
    assert not done_before & set(second.per_key), "a finished task ran again"
    assert all(any(k.endswith(h) for k in second.per_key) for h in hang_on)
    assert state.strategies["s1"].result == ref_state.strategies["s1"].result
    assert snapshot_tree(engine.paths.results / "strategy_output") == snapshot_tree(
        ref_engine.paths.results / "strategy_output"
    )


def test_prepare_reads_a_directory_in_sorted_order(tmp_path):
    d = tmp_path / "ideas"
    d.mkdir()
    (d / "b_second.md").write_text("# Faster tokenizer\nuse a table\n")
    (d / "a_first.md").write_text("Cache parsed headers\n")
    out = prepare({"ideas": str(d), "max_review_rounds": 2, "eval_command": None}, str(tmp_path))
    assert out["ideas"] == [
        {"id": "01-a-first", "title": "Cache parsed headers", "text": "Cache parsed headers"},
        {"id": "02-b-second", "title": "Faster tokenizer", "text": "# Faster tokenizer\nuse a table"},
    ]
    assert load_ideas(str(d / "a_first.md"), str(tmp_path))[0]["id"] == "01-a-first"
    assert load_ideas("ideas", str(tmp_path))[1]["title"] == "Faster tokenizer"  # relative to the repo


def test_prepare_rejects_bad_input_with_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        prepare({"ideas": str(tmp_path / "missing")}, str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no idea files"):
        prepare({"ideas": str(tmp_path / "empty")}, str(tmp_path))
    with pytest.raises(ConfigError, match="primary_metric"):
        prepare({"eval_command": "python bench.py"}, str(tmp_path))


async def test_prompt_is_the_idea_when_no_ideas_given(tmp_path):
    runner = ScriptedRunner(lambda req: success(req, final_message=APPROVE if "/review/" in req.task_key else "ok"))
    _, state = await run_engine(tmp_path, review_loop, runner, params={"max_review_rounds": 0})
    result = state.strategies["s1"].result
    assert [o["idea_id"] for o in result["ideas"]] == ["01-prompt"] and result["ideas"][0]["idea"] == "do it"
    assert result["ideas"][0]["status"] == "completed" and result["baseline"] is None
    assert sorted(k.split("/s1/")[1] for k in runner.per_key) == [
        "idea/01-prompt/code/round-1",
        "idea/01-prompt/diff/round-1",
        "idea/01-prompt/plan",
        "idea/01-prompt/review/round-1/attempt-1",
    ]


# ---------------------------------------------------------------- "best" and budgets


def regressing_script(req):
    """Every idea completes, and every one is slower than the base (100): 50, 99.5 (noise) and 70."""
    values = {"01-good": 50, "02-fixme": 99.5, "06-repaired": 70}
    key = req.task_key
    if key.endswith("/eval") and "/idea/" in key:
        return success(req, final_message=json.dumps({"metrics": {"throughput": values[idea_of(key)]}}), exit_code=0)
    return script(req)


async def test_a_regression_is_never_best_and_the_base_wins_when_nothing_beat_it(tmp_path):
    ideas = [i for i in ideas_list() if i["id"] in ("01-good", "02-fixme", "06-repaired")]
    engine, state = await run_engine(
        tmp_path, review_loop, ScriptedRunner(regressing_script), params={**PARAMS, "ideas": ideas}
    )
    result = state.strategies["s1"].result
    assert [r["idea_id"] for r in result["ranking"]] == ["02-fixme", "06-repaired", "01-good"]
    assert result["ranking"][0]["grade"] == "mixed"  # -0.5 %: within the noise band, still not better
    assert result["best"] is None and result["best_branch"] == "main"
    assert result["verdict"] == (
        "nothing beat the base: the top completed idea, 02-fixme, scored -0.5 (grade mixed, primary delta -0.5); "
        "ranking: 1. 02-fixme score -0.5, tests passed; 2. 06-repaired score -30, tests passed; "
        "3. 01-good score -50, tests passed"
    )
    ideas_md = (engine.paths.results / "strategy_output" / "ideas.md").read_text()
    assert "Nothing beat the base: the top completed idea, 02-fixme" in ideas_md
    assert selected_of(result)[0] == "main"  # what the run summary reports as selected


async def test_best_is_the_top_idea_that_beat_the_base(tmp_path):
    _, state, _ = await run(tmp_path)
    result = state.strategies["s1"].result
    assert result["best"]["idea_id"] == "01-good" and result["best_branch"] == result["best"]["branch"]
    # the summary's verdict line: the winner, then the whole ranking with scores and test outcomes
    assert result["verdict"] == (
        "best: 01-good beat the base (score 20, grade strong); ranking: 1. 01-good score 20, tests passed; "
        "2. 06-repaired score 0.5, tests passed; 3. 02-fixme score -10, tests passed; 4. 03-stubborn rejected; "
        "5. 04-flaky tests_failed; 6. 05-garbage review_invalid"
    )


async def test_cost_budget_stops_new_tasks_and_reports_the_best_so_far(tmp_path):
    # every scripted task costs $0.01: six plans and six coders spend $0.12, past the limit before any review
    runner = ScriptedRunner(script)
    engine, state = await run_engine(
        tmp_path, review_loop, runner, params={**PARAMS, "ideas": ideas_list(), "max_cost_usd": 0.1}
    )
    s = state.strategies["s1"]
    assert s.status == "success", s.error
    result = s.result
    started = [k.split("/s1/")[1] for k in runner.per_key]
    assert not [k for k in started if k.endswith(("/tests", "/eval")) and k.startswith("idea/")]
    assert len(started) <= 2 + 6 + 6 + 6  # the base's eval and tests, plans, coders and the diffs in flight
    assert result["budget"]["cost_usd"] >= 0.1
    assert {o["status"] for o in result["ideas"]} == {"budget_stopped"}
    assert result["stopped"] == "budget" and result["stop_reason"].startswith("max_cost_usd reached")
    assert result["best"] is None and result["best_branch"] == "main"
    assert "Stopped early: max_cost_usd reached" in (engine.paths.results / "strategy_output" / "ideas.md").read_text()


def test_prepare_rejects_a_non_positive_budget(tmp_path):
    with pytest.raises(ConfigError, match="max_wall_s must be a number > 0"):
        prepare({"max_wall_s": 0}, str(tmp_path))
