"""evolve for real: engine + Docker runner + sim agent + real git merges inside containers.

The goals' descriptions carry ``SIM:`` lines, so the sim agent's fix for a goal
writes and commits exactly what the scenario needs; checks are real shell
commands run read-only in containers on the real branches.
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import strategy_args
from conftest import git, make_repo
from docker_harness import new_run_id, run_with_docker
from evolve_helpers import history, project
from scenarios import GOALS_YAML, STUCK_YAML

from orchestrator.log.eventlog import read_events
from orchestrator.log.state import COMPLETED
from strategies.evolve import evolve

pytestmark = pytest.mark.docker


def sim_goal(gid, weight, check, *sim):
    return {
        "id": gid,
        "description": "\n".join([f"make {gid} pass", *(f"SIM: {s}" for s in sim)]),
        "check": check,
        "weight": weight,
    }


GOALS = [
    sim_goal("keep", 1, "test -f keep.txt"),  # passes from the start
    sim_goal("c1", 9, "test -f c1.txt", "write c1.txt ok", "write shared.txt one", "commit fix c1"),
    sim_goal("c2", 8, "test -f c2.txt", "write c2.txt ok", "write shared.txt two", "commit fix c2"),
    sim_goal("d", 5, "test -f done_d.txt", "write done_d.txt ok", "exec rm keep.txt", "commit fix d"),
]


EXPECTED = [
    # c1 and c2 both add shared.txt: the merge stops at c2, an agent (the sim agent, obeying c2's
    # lines) rewrites shared.txt on top of c1, and the continuation merge takes c2 in cleanly
    (1, ["c1", "c2"], "improved", 3, ["c1", "c2"], [], [], ["c2"], [], []),
    # d's fix deletes keep.txt: reverted twice, then quarantined; nothing else is left to do
    (2, ["d"], "reverted", 3, [], ["keep"], [], [], ["d"], []),
    (3, ["d"], "reverted", 3, [], ["keep"], [], [], ["d"], ["d"]),
    (4, [], "idle", 3, [], [], [], [], [], []),
]


def make_project(tmp_path):
    return make_repo(tmp_path / "repo", {"README.md": "# demo\n", "keep.txt": "keep\n"})


async def test_evolve_end_to_end_with_conflict_revert_and_quarantine(tmp_path, workspace_root):
    repo = make_project(tmp_path)
    start = git(repo, "rev-parse", "main")
    rid = new_run_id()
    engine = await run_with_docker(
        tmp_path,
        repo,
        evolve,
        run_id=rid,
        strategy_name="evolve",
        prompt="keep the project healthy",
        params={"goals": GOALS, "max_parallel": 2, "quarantine_after": 2},
    )
    s = engine.state.strategies["s1"]
    assert s.status == "success", s.error
    entries = history(tmp_path, rid)
    assert project(entries) == EXPECTED
    assert entries[0]["base_commit"] == start
    wave = entries[0]["wave_commit"]
    assert [e["base_commit"] for e in entries[1:]] == [wave, wave, wave]  # reverted waves never moved the base

    final = s.result["final_branch"]
    assert git(repo, "rev-parse", final) == wave == s.result["final_commit"]
    assert git(repo, "show", f"{final}:shared.txt") == "two"
    assert git(repo, "show", f"{final}:keep.txt") == "keep"
    tree = git(repo, "ls-tree", "--name-only", final).split()
    assert {"c1.txt", "c2.txt", "keep.txt"} <= set(tree) and "done_d.txt" not in tree
    # the wave really is a merge made in a container, never in the user's work tree
    assert len(git(repo, "log", "--merges", "--format=%H", final).split()) >= 1
    assert git(repo, "rev-parse", "main") == start and git(repo, "status", "--porcelain") == ""
    assert (s.result["goals_passing_before"], s.result["goals_passing_after"]) == (1, 3)
    summary = (tmp_path / "results" / rid / "strategy_output/evolve_summary.md").read_text()
    assert "1/4 before, 3/4 after" in summary
    # the fix, merge and resolve branches are gone from the user's repository; only the result stays
    assert set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split()) == {"main", final}
    assert len(s.result["branches"]["deleted"]) >= 5 and s.result["branches"]["kept"] == {}


@pytest.mark.parametrize(
    "event_type,key_suffix",
    [
        ("task.completed", "/c/1/fix/c1"),  # mid-wave: c2's fix (sleeping) is still running
        ("task.started", "/c/1/merge/2"),  # mid-merge: the continuation merge after the resolution
    ],
    ids=["mid-wave", "mid-merge"],
)
async def test_evolve_interrupted_resumes_without_rerunning_finished_tasks(
    tmp_path, workspace_root, event_type, key_suffix
):
    repo = make_project(tmp_path)
    slow_c2 = dict(GOALS[2], description=GOALS[2]["description"] + "\nSIM: sleep 2")
    kw = dict(
        run_id=new_run_id(),
        prompt="keep the project healthy",
        params={"goals": [GOALS[0], GOALS[1], slow_c2], "max_parallel": 2},
    )
    first = await run_with_docker(
        tmp_path, repo, evolve, strategy_name="evolve", cancel_on=(event_type, key_suffix), **kw
    )
    assert first.state.strategies["s1"].status == "running"  # really interrupted mid-cycle
    n_first = len(list(read_events(first.paths.events)))
    finished_first = {k for k, t in first.state.tasks.items() if t.state == COMPLETED}
    assert any(k.endswith("/c/1/fix/c1") for k in finished_first)

    second = await run_with_docker(tmp_path, repo, evolve, strategy_name="evolve", **kw)
    s = second.state.strategies["s1"]
    assert s.status == "success", s.error
    events = list(read_events(second.paths.events))
    started_again = {e.key for e in events[n_first:] if e.type == "task.started"}
    assert not started_again & finished_first, "a finished task ran again after resume"
    assert any(k.endswith(key_suffix) or k.endswith("/c/1/fix/c2") for k in started_again)
    completed = [e.key for e in events if e.type == "task.completed"]
    assert len(completed) == len(set(completed))
    assert project(history(tmp_path, kw["run_id"])) == [EXPECTED[0]]
    assert s.result["stopped"] == "all-passing"


def test_cli_runs_evolve_from_a_goals_file(tmp_path):
    from cli_helpers import cli_env, only_run_id, run_cli
    from conftest import TEST_IMAGE

    repo = make_repo(tmp_path / "repo", {"README.md": "# demo\n", "keep.txt": "keep\n", "GOALS.yaml": GOALS_YAML})
    result = run_cli(
        [
            "keep the project healthy",
            *strategy_args("evolve", goals="GOALS.yaml", max_parallel=2, max_cycles=4),
            "--no-tui",
            "--docker-image",
            TEST_IMAGE,
        ],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_id = only_run_id(tmp_path)
    out = tmp_path / "results" / run_id
    entries = history(tmp_path, run_id)
    assert project(entries) == [EXPECTED[0]]
    summary = json.loads((out / "summary.json").read_text())
    final = entries[0]["base_branch"]
    (strategy,) = summary["strategies"]
    assert strategy["selected_branch"] == final and summary["final_branches"] == [final]
    assert strategy["result"]["stopped"] == "all-passing"
    # the recorded parameter is the validated goals, not the file name: resume never reads the file
    assert [g["id"] for g in strategy["params"]["goals"]] == ["keep", "c1", "c2"]
    assert git(repo, "show", f"{final}:shared.txt") == "two"
    assert "1/3 before, 3/3 after" in (out / "strategy_output" / "evolve_summary.md").read_text()
    # the fix and resolve branches were deleted through the runner; the user's branch and the result stay
    assert set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split()) == {"main", final}


def test_cli_dry_run_rests_a_goal_that_cannot_move_and_reaches_the_next(tmp_path):
    # issue 30: a goal whose check no fix can pass took all 6 cycles ("reverted | no goal
    # improved" each time) and the second failing goal was never tried.
    from cli_helpers import cli_env, only_run_id, run_cli
    from conftest import TEST_IMAGE

    repo = make_repo(tmp_path / "repo", {"README.md": "# demo\n", "GOALS.yaml": STUCK_YAML})
    result = run_cli(
        [
            "keep the project healthy",
            *strategy_args("evolve", goals="GOALS.yaml", max_parallel=1, max_cycles=6),
            "--dry-run",
            "--no-tui",
            "--docker-image",
            TEST_IMAGE,
        ],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_id = only_run_id(tmp_path)
    entries = history(tmp_path, run_id)
    tried = [(e["goal_ids"], e["result"]) for e in entries]
    # two reverted attempts on `stuck` (the default rest_after), then `other` gets the wave
    assert tried[:3] == [(["stuck"], "reverted"), (["stuck"], "reverted"), (["other"], "improved")], tried
    assert entries[1]["resting"] == ["stuck"] and "resting" in entries[2]["skipped"]["stuck"]
    summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
    (strategy,) = summary["strategies"]
    res = strategy["result"]
    assert res["goals"]["other"]["after"] is True and res["goals"]["stuck"]["after"] is False
    why = res["could_not_move"]["stuck"]
    assert "2 attempts in a row reverted" in why and "its check still failed after the fix" in why, why
    # the verdict (summary.json, console) says which goal could not move and why
    assert "could not move: stuck (" in strategy["verdict"], strategy["verdict"]
    assert "could not move: stuck (" in result.stdout, result.stdout[-2000:]
    md = (tmp_path / "results" / run_id / "strategy_output" / "evolve_summary.md").read_text()
    assert "Could not move:" in md and "- stuck:" in md
