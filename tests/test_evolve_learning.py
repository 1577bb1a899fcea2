"""evolve on the failures of real runs: idle goals, failing fix tasks, flaky checks, repeated fixes, budgets.

Same model repository and runner as tests/test_evolve.py; the expected cycle
histories are written out by hand from each scenario.
"""

from __future__ import annotations

from functools import partial

import anyio
from engine_helpers import run_engine
from evolve_helpers import CHECKS, FIXES, GOALS, Repo, World, goal, history, key_parts, project, world

from orchestrator.engine.testing import ScriptedRunner, failure, success
from strategies.evolve import evolve


def _calls(runner, *parts):
    return [c for c in runner.calls if all(p in key_parts(c) for p in parts)]


async def test_an_idle_heaviest_goal_hands_the_wave_to_lighter_goals(tmp_path):
    goals = [
        goal("heavy", 9, "test -f heavy.txt"),
        goal("light", 5, "test -f light.txt"),
        goal("lighter", 3, "test -f lighter.txt"),
    ]
    checks = {g["id"]: (lambda f, gid=g["id"]: f"{gid}.txt" in f) for g in goals}
    fixes = {
        "heavy": lambda f, n: None,  # the agent never finds anything to change
        "light": lambda f, n: {"light.txt": "ok"},
        "lighter": lambda f, n: {"lighter.txt": "ok"},
    }
    w = World(Repo({"README.md": "r"}), checks, fixes)
    _, state = await run_engine(tmp_path, evolve, ScriptedRunner(w), params={"goals": goals, "max_parallel": 1})
    s = state.strategies["s1"]
    assert s.status == "success", s.error
    entries = history(tmp_path)
    assert [(e["cycle"], e["goal_ids"], e["result"], e["fixed"]) for e in entries] == [
        (1, ["heavy"], "idle", []),  # before: the run ended here with two fixable goals untouched
        (2, ["light"], "improved", ["light"]),
        # a new base: heavy may try again, but only after the goals that never came up empty
        (3, ["lighter"], "improved", ["lighter"]),
        (4, ["heavy"], "idle", []),
    ]
    assert entries[1]["skipped"] == {"heavy": "changed nothing on this base", "lighter": "wave full"}
    assert entries[2]["skipped"] == {"heavy": "wave full"}
    assert s.result["stopped"] == "idle" and s.result["goals_passing_after"] == 2
    assert {"light.txt", "lighter.txt"} <= set(w.repo.files(s.result["final_branch"]))


async def test_a_wave_whose_every_fix_task_fails_is_retried_after_a_backoff(tmp_path):
    w = world()
    quota = {1, 2}  # the agent API refuses every task of cycles 1 and 2

    def script(req):
        parts = key_parts(req)
        if "fix" in parts and int(parts[1]) in quota:
            return failure(req, error_type="api", message="quota exceeded, retry later")
        return w(req)

    goals = [g for g in GOALS if g["id"] in ("keep", "a", "b")]
    _, state = await run_engine(
        tmp_path, evolve, ScriptedRunner(script), params={"goals": goals, "retry_backoff_s": 0.01}
    )
    s = state.strategies["s1"]
    assert s.status == "success", s.error
    entries = history(tmp_path)
    assert [(e["cycle"], e["goal_ids"], e["result"], e["fix_failed"]) for e in entries] == [
        (1, ["a", "b"], "failed", ["a", "b"]),
        (2, ["a", "b"], "failed", ["a", "b"]),
        (3, ["a", "b"], "improved", []),
    ]
    assert entries[0]["reason"] == "every fix task failed (fix failed (api): quota exceeded, retry later)"
    assert [e.get("retry_after_s") for e in entries] == [0.01, 0.02, None]  # doubling backoff
    assert s.result["stopped"] == "all-passing"
    assert sum(1 for c in state.strategies["s1"].checkpoints if c[0] == "sleep") == 2


async def test_failing_fix_tasks_stop_the_run_after_max_failed_waves_with_the_reason(tmp_path):
    w = world()

    def script(req):
        if "fix" in key_parts(req):
            return failure(req, error_type="api", message="quota exceeded")
        return w(req)

    goals = [g for g in GOALS if g["id"] in ("keep", "a")]
    _, state = await run_engine(
        tmp_path, evolve, ScriptedRunner(script), params={"goals": goals, "retry_backoff_s": 0, "max_failed_waves": 1}
    )
    result = state.strategies["s1"].result
    assert [(e["result"], e.get("retry_after_s")) for e in history(tmp_path)] == [("failed", 0), ("failed", None)]
    assert result["stopped"] == "fixes-failing" and result["final_branch"] == "main"
    assert result["stop_reason"].startswith("every fix task failed in 2 waves in a row (last: every fix task failed")


async def test_the_next_fix_prompt_says_what_was_tried_and_why_it_was_reverted(tmp_path):
    w = world()
    runner = ScriptedRunner(w)
    await run_engine(tmp_path, evolve, runner, params={"goals": GOALS})
    prompts = {"/".join(key_parts(c)[:2]): c.prompt for c in _calls(runner, "fix", "d")}
    assert sorted(prompts) == ["c/2", "c/4", "c/5", "c/6"]
    assert "Earlier attempts" not in prompts["c/2"]
    # cycle 2 reverted b and d together; cycle 4 blamed d alone
    assert (
        "cycle 2: the fix (the agent said: 'fixed d') was reverted together with the fixes for b: "
        "the wave broke goal `keep` (check `test -f keep.txt`, which then printed: 'checked keep')"
    ) in prompts["c/4"]
    assert "cycle 4: the fix (the agent said: 'fixed d') was reverted because it broke goal `keep`" in prompts["c/5"]
    assert len({prompts["c/4"], prompts["c/5"], prompts["c/6"]}) == 3  # never byte-identical again
    assert prompts["c/6"].count("\n- cycle ") == 3


async def test_a_flaky_check_is_rerun_and_the_innocent_fix_is_not_blamed(tmp_path):
    w = world()

    def flaky(req):
        parts = key_parts(req)
        # "keep" fails the first time it is measured on cycle 1's wave, then passes again
        if parts[-1] == "keep" and parts[:4] == ["c", "1", "wave", "measure"]:
            head = w.repo.branches[req.base_branch]
            return success(
                req,
                has_changes=False,
                final_message=(f"Connection reset by peer\n@@evolve stderr\n\n@@evolve end exit=1 head={head}\n"),
            )
        return w(req)

    goals = [g for g in GOALS if g["id"] in ("keep", "a")]
    runner = ScriptedRunner(flaky)
    _, state = await run_engine(tmp_path, evolve, runner, params={"goals": goals, "quarantine_after": 1})
    entries = history(tmp_path)
    assert project(entries) == [(1, ["a"], "improved", 2, ["a"], [], [], [], [], [])]
    assert entries[0]["flaky"] == ["keep"]
    assert state.strategies["s1"].result["quarantined"] == []
    rechecks = ["/".join(key_parts(c)) for c in _calls(runner, "recheck")]
    assert rechecks == ["c/1/wave/recheck/1/keep"]  # one extra run, for the suspect only


async def test_a_real_regression_survives_the_recheck(tmp_path):
    w = world()
    runner = ScriptedRunner(w)
    goals = [g for g in GOALS if g["id"] in ("keep", "d")]
    _, _state = await run_engine(tmp_path, evolve, runner, params={"goals": goals, "quarantine_after": 1, "recheck": 2})
    entries = history(tmp_path)
    assert project(entries) == [
        (1, ["d"], "reverted", 1, [], ["keep"], [], [], ["d"], ["d"]),
        (2, [], "idle", 1, [], [], [], [], [], []),
    ]
    assert sorted("/".join(key_parts(c)) for c in _calls(runner, "recheck")) == [
        "c/1/wave/recheck/1/keep",
        "c/1/wave/recheck/2/keep",
    ]


async def test_cost_budget_starts_no_new_task_and_keeps_the_last_clean_base(tmp_path):
    w = world()
    runner = ScriptedRunner(w)  # every scripted task reports $0.01
    _, state = await run_engine(tmp_path, evolve, runner, params={"goals": GOALS, "max_cost_usd": 0.08})
    s = state.strategies["s1"]
    assert s.status == "success", s.error
    result = s.result
    # 6 initial checks ($0.06) leave room to start the three fixes; then $0.09 is spent: no merge
    assert [k.split("/s1/")[1] for k in runner.per_key if "/c/" in k] == ["c/1/fix/c1", "c/1/fix/c2", "c/1/fix/a"]
    assert result["stopped"] == "budget" and result["final_branch"] == "main"
    assert result["stop_reason"] == "max_cost_usd reached: spent $0.0900 of $0.0800"
    assert result["budget"]["cost_usd"] == 0.09
    assert [(e["cycle"], e["result"]) for e in result["history"]] == [(1, "stopped")]
    assert "max_cost_usd reached" in history(tmp_path)[0]["reason"]


async def test_wall_clock_budget_stops_before_the_merge(tmp_path):
    w = world()
    runner = ScriptedRunner(w, delay=lambda req: 1.0 if "/fix/" in req.task_key else 0)
    goals = [g for g in GOALS if g["id"] in ("keep", "a", "b")]
    _, state = await run_engine(tmp_path, evolve, runner, params={"goals": goals, "max_wall_s": 0.5})
    result = state.strategies["s1"].result
    assert result["stopped"] == "budget" and result["stop_reason"].startswith("max_wall_s reached")
    assert not any("merge" in key_parts(c) or "wave" in key_parts(c) for c in runner.calls)
    assert result["final_branch"] == "main"


async def test_working_branches_are_deleted_at_the_end_except_the_final_one(tmp_path):
    w = world()
    runner = ScriptedRunner(w)
    _, state = await run_engine(tmp_path, evolve, runner, params={"goals": GOALS, "bisect_on_regression": True})
    result = state.strategies["s1"].result
    created = {c.branch_name for c in runner.calls if not c.delete_branches} & set(w.deleted)
    # every fix, merge, resolve and bisect branch the run made, and nothing else
    kinds = {
        "/".join(p for p in key_parts(c) if not p.isdigit() and p not in GOALS_IDS)
        for c in runner.calls
        if c.branch_name in w.deleted
    }
    assert kinds == {"c/fix", "c/merge", "c/resolve"}
    assert set(w.deleted) == created and result["final_branch"] not in w.deleted
    assert set(w.repo.branches) == {"main", result["final_branch"]}
    assert result["branches"] == {"deleted": w.deleted, "kept": {}}
    cleanup = [c for c in runner.calls if c.delete_branches]
    assert [key_parts(c) for c in cleanup] == [["cleanup", "branches"]]


async def test_keep_branches_keeps_them(tmp_path):
    w = world()
    runner = ScriptedRunner(w)
    goals = [g for g in GOALS if g["id"] in ("keep", "a", "b")]
    _, state = await run_engine(tmp_path, evolve, runner, params={"goals": goals, "keep_branches": True})
    assert not [c for c in runner.calls if c.delete_branches]
    result = state.strategies["s1"].result
    assert sorted(result["branches"]["kept"]) == sorted(
        b for b in w.repo.branches if b not in ("main", result["final_branch"])
    )


async def test_a_budgeted_run_resumed_mid_wave_decides_the_same(tmp_path):
    # $0.01 per task: the budget runs out in cycle 2; the first process is stopped during cycle 2's fixes
    params = {"goals": GOALS, "max_cost_usd": 0.2}
    straight = world()
    _, ref = await run_engine(tmp_path / "straight", evolve, ScriptedRunner(straight), params=params)
    expected = (tmp_path / "straight/results/run_t/strategy_output/cycle-history.jsonl").read_bytes()
    assert ref.strategies["s1"].result["stopped"] == "budget"

    w = world()
    reached = anyio.Event()

    async def hang_in_cycle_2(req):
        if req.task_key.endswith("/c/2/fix/d"):
            reached.set()
            await anyio.sleep_forever()
        return w(req)

    first = ScriptedRunner(hang_in_cycle_2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(run_engine, tmp_path / "resumed", evolve, first, params=params))
        await reached.wait()
        tg.cancel_scope.cancel()
    second = ScriptedRunner(w)
    _, state = await run_engine(tmp_path / "resumed", evolve, second, params=params)
    result = state.strategies["s1"].result
    assert (tmp_path / "resumed/results/run_t/strategy_output/cycle-history.jsonl").read_bytes() == expected
    assert result["stop_reason"] == ref.strategies["s1"].result["stop_reason"]
    assert result["budget"]["cost_usd"] == ref.strategies["s1"].result["budget"]["cost_usd"]
    finished_first = {c.task_key for c in first.calls if not c.task_key.endswith("/c/2/fix/d")}
    assert not finished_first & {c.task_key for c in second.calls}


GOALS_IDS = {g["id"] for g in GOALS}


def test_the_scenario_tables_are_unchanged():
    # the learning tests reuse the base scenario; keep them honest if it changes
    assert set(CHECKS) == {g["id"] for g in GOALS} and "keep" not in FIXES
