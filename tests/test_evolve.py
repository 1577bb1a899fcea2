"""evolve's decision logic through the real engine with an in-process runner.

The runner answers from a small model of a git repository kept in the test
(commits with files and parents, branches, three-way merges with conflicts),
so every check, fix, merge and conflict resolution has a real effect that the
next measurement sees. Expected cycle histories are written out by hand from
the scenario, not computed by the strategy's code.
"""

from __future__ import annotations

import re

import pytest
from engine_helpers import interrupt_when, run_engine
from evolve_helpers import FIXES, GOALS, Repo, World, goal, history, key_parts, project, world

from orchestrator.engine.testing import ScriptedRunner, failure, success
from strategies.evolve import evolve


def assert_commit_chain(entries, first_base):
    """Each cycle starts on the previous cycle's wave when it advanced, else on the same base."""
    base = first_base
    for e in entries:
        assert e["base_commit"] == base, e["cycle"]
        if e["result"] in ("improved", "conflict"):
            assert e["wave_commit"] and e["wave_commit"] != base
            base = e["wave_commit"]
    return base


async def test_parallel_waves_conflict_resolution_revert_learning_and_quarantine(tmp_path):
    w = world()
    _engine, state = await run_engine(tmp_path, evolve, ScriptedRunner(w), params={"goals": GOALS})
    s = state.strategies["s1"]
    assert s.status == "success", s.error
    expected = [
        # c1, c2, a are the three heaviest and independent; c2 conflicts with c1, an agent resolves it
        (1, ["c1", "c2", "a"], "improved", 4, ["c1", "c2", "a"], [], [], ["c2"], [], []),
        # d deletes keep.txt: the wave regresses and is reverted; nobody can be blamed yet
        (2, ["b", "d"], "reverted", 4, [], ["keep"], [], [], [], []),
        # b and d interfered once: never paired again, so b goes alone and d waits
        (3, ["b"], "improved", 5, ["b"], [], [], [], [], []),
        (4, ["d"], "reverted", 5, [], ["keep"], [], [], ["d"], []),
        (5, ["d"], "reverted", 5, [], ["keep"], [], [], ["d"], []),
        (6, ["d"], "reverted", 5, [], ["keep"], [], [], ["d"], ["d"]),
        (7, [], "idle", 5, [], [], [], [], [], []),
    ]
    entries = history(tmp_path)
    assert project(entries) == expected
    assert entries[2]["skipped"] == {"d": "interfered with b in a reverted wave"}
    assert [e["parallel"] for e in entries] == [True, True, False, False, False, False, False]
    assert all(e["goals_total"] == 6 for e in entries)
    final = assert_commit_chain(entries, w.repo.branches["main"])

    result = s.result
    assert result["stopped"] == "idle" and result["quarantined"] == ["d"]
    assert (result["goals_passing_before"], result["goals_passing_after"]) == (1, 5)
    assert w.repo.branches[result["final_branch"]] == final == result["final_commit"]
    files = w.repo.files(result["final_branch"])
    assert files["shared.txt"] == "one+two"  # the agent's resolution kept both sides
    assert {"c1.txt", "c2.txt", "done_a.txt", "done_b.txt", "keep.txt"} <= set(files) and "done_d.txt" not in files
    assert result["history"] == entries
    # one fix per picked goal per cycle, never more
    assert len(w.fix_runs) == len(set(w.fix_runs)) == 3 + 2 + 1 + 1 + 1 + 1
    summary = (tmp_path / "results" / "run_t" / "strategy_output" / "evolve_summary.md").read_text()
    assert "1/6 before, 5/6 after" in summary and "Quarantined (their fixes kept breaking other goals): d" in summary
    assert "| 2 | b, d | reverted | 4/6 | 4/6 | regressed: keep; regression |" in summary


async def test_unresolved_conflict_leaves_the_goal_out_and_it_is_fixed_next_cycle(tmp_path):
    w = world(resolve={"c2": "noop"})
    goals = [g for g in GOALS if g["id"] in ("c1", "c2", "a")]
    _, state = await run_engine(tmp_path, evolve, ScriptedRunner(w), params={"goals": goals, "max_parallel": 2})
    assert state.strategies["s1"].status == "success", state.strategies["s1"].error
    entries = history(tmp_path)
    assert project(entries) == [
        # the resolver commits but never merges c2: the next merge step still conflicts, c2 is left out
        (1, ["c1", "c2"], "conflict", 1, ["c1"], [], ["c2"], [], [], []),
        (2, ["c2", "a"], "improved", 3, ["c2", "a"], [], [], [], [], []),
    ]
    assert state.strategies["s1"].result["stopped"] == "all-passing"
    files = w.repo.files(state.strategies["s1"].result["final_branch"])
    assert files["shared.txt"] == "two" and "notes.txt" in files  # the resolver's unrelated commit stayed in


async def test_failed_resolution_and_failed_fix(tmp_path):
    w = world(resolve={"c2": "fail"})
    w.fixes = dict(FIXES, a=lambda f, n: None)  # the agent for a changes nothing, every time
    goals = [g for g in GOALS if g["id"] in ("c1", "c2", "a")]
    _, _state = await run_engine(
        tmp_path, evolve, ScriptedRunner(w), params={"goals": goals, "max_parallel": 3, "max_cycles": 3}
    )
    entries = history(tmp_path)
    assert project(entries) == [
        (1, ["c1", "c2", "a"], "conflict", 1, ["c1"], [], ["c2"], [], [], []),
        (2, ["c2", "a"], "improved", 2, ["c2"], [], [], [], [], []),
        (3, ["a"], "idle", 2, [], [], [], [], [], []),
    ]
    assert [e["not_fixed"] for e in entries] == [["a"], ["a"], ["a"]]
    assert entries[2]["reason"] == "no fix produced a change"


async def test_bisect_keeps_the_innocent_fix_and_blames_the_culprit(tmp_path):
    w = world()
    runner = ScriptedRunner(w)
    _, _state = await run_engine(tmp_path, evolve, runner, params={"goals": GOALS, "bisect_on_regression": True})
    entries = history(tmp_path)
    assert project(entries) == [
        (1, ["c1", "c2", "a"], "improved", 4, ["c1", "c2", "a"], [], [], ["c2"], [], []),
        # b alone is measured clean and kept; b+d is the whole wave, known to regress: d is blamed
        (2, ["b", "d"], "improved", 5, ["b"], ["keep"], [], [], ["d"], []),
        (3, ["d"], "reverted", 5, [], ["keep"], [], [], ["d"], []),
        (4, ["d"], "reverted", 5, [], ["keep"], [], [], ["d"], ["d"]),
        (5, [], "idle", 5, [], [], [], [], [], []),
    ]
    assert entries[1]["kept"] == ["b"]
    assert_commit_chain(entries, w.repo.branches["main"])
    bisect_keys = sorted({"/".join(key_parts(c)[:5]) for c in runner.calls if "bisect" in c.task_key})
    assert bisect_keys == ["c/2/bisect/1/measure"]  # one subset measured, the full wave not again


async def test_bisect_with_the_culprit_first(tmp_path):
    w = world()
    goals = [dict(g, weight=10) if g["id"] == "d" else g for g in GOALS if g["id"] in ("keep", "a", "b", "d")]
    _, _state = await run_engine(
        tmp_path,
        evolve,
        ScriptedRunner(w),
        params={"goals": goals, "bisect_on_regression": True, "quarantine_after": 1},
    )
    entries = history(tmp_path)
    assert project(entries) == [
        # d alone regresses (blamed, quarantined at once); a then a+b are measured clean
        (1, ["d", "a", "b"], "improved", 3, ["a", "b"], ["keep"], [], [], ["d"], ["d"]),
        (2, [], "idle", 3, [], [], [], [], [], []),
    ]
    assert entries[0]["kept"] == ["a", "b"]


async def test_metric_goal_regression_beyond_tolerance_reverts(tmp_path):
    # "speed" is a number (lower is better). Fixing "a" makes it slower by 3 > tolerance 2: reverted.
    repo = Repo({"speed": "10"})
    goals = [
        goal("speed", 1, "cat speed", metric={"direction": "lower", "threshold": 20, "tolerance": 2}),
        goal("a", 5, "test -f done_a.txt"),
    ]
    w = World(repo, {}, {"a": lambda f, n: {"done_a.txt": "ok", "speed": str(10 + 3 * n)}})

    def measure(req, gid):
        files = repo.files(req.base_branch)
        stdout = files["speed"] if gid == "speed" else ""
        ok = gid == "speed" or "done_a.txt" in files
        return success(
            req,
            has_changes=False,
            final_message=(
                f"{stdout}\n@@evolve stderr\n\n@@evolve end exit={0 if ok else 1} head={repo.branches[req.base_branch]}\n"
            ),
        )

    w.measure = measure
    _, state = await run_engine(tmp_path, evolve, ScriptedRunner(w), params={"goals": goals, "max_cycles": 2})
    entries = history(tmp_path)
    assert project(entries) == [
        (1, ["a"], "reverted", 1, [], ["speed"], [], [], ["a"], []),
        (2, ["a"], "reverted", 1, [], ["speed"], [], [], ["a"], []),
    ]
    result = state.strategies["s1"].result
    assert result["stopped"] == "max-cycles" and result["final_branch"] == "main"
    assert result["goals"]["speed"] == {"before": True, "after": True, "value_before": 10.0, "value_after": 10.0}


# ---------------------------------------------------------------- durability


@pytest.mark.parametrize(
    "slow,done_before",
    [
        (r"/c/2/fix/d$", "run_t/s1/c/2/fix/b"),  # mid-wave: b's fix finished, d's is running
        (r"/c/1/merge/2$", "run_t/s1/c/1/resolve/c2"),  # mid-merge: conflict resolved, continuation merge running
    ],
    ids=["mid-wave", "mid-merge"],
)
async def test_interrupt_and_resume_gives_the_same_history_without_rerunning_fixes(tmp_path, slow, done_before):
    params = {"goals": GOALS}
    straight = world()
    await run_engine(tmp_path / "straight", evolve, ScriptedRunner(straight), params=params)
    expected = (tmp_path / "straight/results/run_t/strategy_output/cycle-history.jsonl").read_bytes()

    w = world()
    pattern = re.compile(slow)
    first = ScriptedRunner(w, delay=lambda req: 30 if pattern.search(req.task_key) else 0)
    # interrupted once the slow task is running; the quick ones (delay 0) have finished 0.3 s later
    await interrupt_when(
        lambda: run_engine(tmp_path / "resumed", evolve, first, params=params),
        lambda: any(pattern.search(c.task_key) for c in first.calls),
        settle=0.3,
    )
    finished_first = [c.task_key for c in first.calls if not pattern.search(c.task_key)]
    assert done_before in finished_first
    assert any(pattern.search(c.task_key) for c in first.calls), "the interruption point was never reached"
    second = ScriptedRunner(w)
    _, state = await run_engine(tmp_path / "resumed", evolve, second, params=params)
    assert state.strategies["s1"].status == "success", state.strategies["s1"].error

    again = [c.task_key for c in second.calls]
    assert not set(again) & set(finished_first), "a finished task ran again after resume"
    assert any(pattern.search(k) for k in again)  # the interrupted task is the one that reruns
    assert (tmp_path / "resumed/results/run_t/strategy_output/cycle-history.jsonl").read_bytes() == expected
    assert len(w.fix_runs) == len(set(w.fix_runs)), "a fix task ran twice"


async def test_task_shapes_fix_prompts_and_merge_order(tmp_path):
    w = world()
    runner = ScriptedRunner(w)
    goals = [dict(g, description=f"make {g['id']} pass\nsecond line") for g in GOALS if g["id"] in ("keep", "a", "b")]
    await run_engine(tmp_path, evolve, runner, params={"goals": goals}, max_parallel=1)
    by_key = {"/".join(key_parts(c)): c for c in runner.calls}
    measure = by_key["initial/measure/a"]
    assert (measure.plugin_name, measure.import_policy, measure.base_branch) == ("command", "never", "main")
    fix = by_key["c/1/fix/a"]
    assert fix.plugin_name == "claude-code" and fix.base_branch == "main" and fix.import_policy == "auto"
    for text in (
        "Overall objective: do it",
        "make a pass\nsecond line",
        "`test -f done_a.txt`",
        "checked a",  # the failing output's tail
        "- keep: `test -f keep.txt`",
        "- b: `test -f done_b.txt`",
    ):
        assert text in fix.prompt
    merge = by_key["c/1/merge/1"]
    assert merge.base_branch == "main" and merge.import_policy == "auto"
    assert list(merge.include_branches) == [by_key["c/1/fix/a"].branch_name, by_key["c/1/fix/b"].branch_name]
    assert merge.command.index(merge.include_branches[0]) < merge.command.index(merge.include_branches[1])
    wave = by_key["c/1/wave/measure/keep"]
    assert wave.base_branch == merge.branch_name  # the gate measures the merged wave


# ---------------------------------------------------------------- fail fast on the base


def base_world(exit_codes: dict[str, int], stdout: dict[str, str], broken: tuple[str, ...] = ()):
    """Every check answers on the base with the given status and stdout; ``broken`` measuring tasks fail."""
    repo = Repo({"keep.txt": "k"})
    w = World(repo, {}, {gid: (lambda f, n: {"x": "1"}) for gid in exit_codes})

    def measure(req, gid):
        if gid in broken:
            return failure(req, error_type="container", message="the container died")
        return success(
            req,
            has_changes=False,
            final_message=(
                f"{stdout.get(gid, '')}\n@@evolve stderr\nsh: 1: tool: not found\n"
                f"@@evolve end exit={exit_codes[gid]} head={repo.branches[req.base_branch]}\n"
            ),
        )

    w.measure = measure
    return w


@pytest.mark.parametrize(
    ("exit_codes", "stdout", "broken", "reason"),
    [
        ({"a": 127, "b": 1}, {}, (), "goal 'a': command not found: tool (exit status 127); install it in"),
        ({"a": 0, "b": 126}, {}, (), "goal 'b': cannot execute the command (exit status 126: found, but not"),
        ({"a": 1, "b": 1}, {}, ("b",), "goal 'b': its measuring task ended without a result: measuring failed"),
        ({"a": 1, "b": 0}, {"b": "no number here"}, (), "goal 'b': its metric has no number (its last stdout line)"),
    ],
)
async def test_a_check_that_cannot_run_on_the_base_stops_before_any_fix(tmp_path, exit_codes, stdout, broken, reason):
    goals = [goal("a", 2, "a-check"), goal("b", 1, "b-check", metric={"direction": "higher", "threshold": 5})]
    runner = ScriptedRunner(base_world(exit_codes, stdout, broken))
    _, state = await run_engine(tmp_path, evolve, runner, params={"goals": goals, "max_cycles": 2})
    s = state.strategies["s1"]
    assert s.status == "failed"
    first = s.error.splitlines()[0]
    assert first.startswith("BaseEvaluationFailed: the evaluation of the base cannot be used: " + reason), first
    check = "a-check" if reason.startswith("goal 'a'") else "b-check"
    assert s.error.splitlines()[1] == f"  command: {check}"
    assert sorted(k.split("/s1/")[1] for k in runner.per_key) == ["initial/measure/a", "initial/measure/b"]


async def test_a_check_that_merely_fails_on_the_base_goes_to_an_agent(tmp_path):
    # exit 1 with an interpreter's error (a missing module) is how failing tests look too
    goals = [goal("a", 2, "python3 -m pytest")]
    runner = ScriptedRunner(base_world({"a": 1}, {"a": "/usr/bin/python3: No module named pytest"}))
    _, state = await run_engine(tmp_path, evolve, runner, params={"goals": goals, "max_cycles": 1})
    assert state.strategies["s1"].status == "success", state.strategies["s1"].error
    assert "c/1/fix/a" in {k.split("/s1/")[1] for k in runner.per_key}
