"""review-loop for real: engine + DockerRunner + sim agent + real git and a real benchmark script.

Ideas steer the sim agent with role-scoped lines (``SIM[coder]:`` acts only in
the coder's prompt, ``SIM[review-1]:`` only in the first review); the
benchmark's throughput depends on which files the coder committed.
"""

from __future__ import annotations

import json

import pytest
from conftest import git, make_repo
from docker_harness import run_with_docker
from scenarios import GAINS_BENCH

from strategies.review_loop import prepare, review_loop

pytestmark = pytest.mark.docker

BENCH = (
    GAINS_BENCH
    + """print("bench ran")
print(json.dumps({"metrics": {"throughput": t}}))
"""
)

FIX = (
    '{"verdict":"REJECT","issues":["slow.txt makes it slow\\nSIM[coder]: exec git rm -q slow.txt\\n'
    'SIM[coder]: write faster.txt 1\\nSIM[coder]: commit replace slow with faster"]}'
)
IDEAS = {
    "a_fast.md": "Add a fast path\nSIM[coder]: write fast.txt 1\nSIM[coder]: commit fast path",
    "b_fixme.md": f"Try an experiment\nSIM[coder]: write slow.txt 1\nSIM[coder]: commit slow\nSIM[review-1]: print-json {FIX}",
    "c_slow.md": "Add a slow path\nSIM[coder]: write slow.txt 1\nSIM[coder]: commit slow path",
    "d_broken.md": "Break the build\nSIM[coder]: write broken.txt 1\nSIM[coder]: commit broken",
    "e_stubborn.md": (
        "Unsafe change\nSIM[coder]: write fast.txt 1\nSIM[coder]: commit unsafe\n"
        'SIM[reviewer]: print-json {"verdict":"REJECT","issues":["unsafe"]}'
    ),
    # answers in prose, also in the runner's repair turn: the review task fails with output_invalid
    "f_garbage.md": "Confusing change\nSIM[coder]: write fast.txt 1\nSIM[coder]: commit x\nSIM[reviewer]: bad-output",
}


async def test_review_loop_end_to_end(tmp_path, workspace_root):
    repo = make_repo(tmp_path / "repo", {"bench.py": BENCH, "README.md": "# parser\n"})
    ideas_dir = tmp_path / "ideas"
    ideas_dir.mkdir()
    for name, text in IDEAS.items():
        (ideas_dir / name).write_text(text + "\n")
    params = prepare(
        {
            "ideas": str(ideas_dir),
            "max_review_rounds": 1,
            "test_command": "test ! -f broken.txt",
            "eval_command": "python3 bench.py",
            "primary_metric": "throughput",
            "direction": "max",
            "weights": {},
            "tolerance": 0.01,
            "eval_timeout_s": None,
        },
        str(repo),
    )
    engine = await run_with_docker(
        tmp_path, repo, review_loop, params=params, prompt="improve the parser", max_parallel=4
    )
    s = engine.state.strategies["s1"]
    assert s.status == "success", s.error
    out = {o["idea_id"]: o for o in s.result["ideas"]}
    assert {k: v["status"] for k, v in out.items()} == {
        "01-a-fast": "completed",
        "02-b-fixme": "completed",
        "03-c-slow": "completed",
        "04-d-broken": "tests_failed",
        "05-e-stubborn": "rejected",
        "06-f-garbage": "review_invalid",
    }
    assert s.result["baseline"]["metrics"] == {"throughput": 100.0}
    cmp = {k: (v["comparison"] or {}).get("score") for k, v in out.items()}
    assert (cmp["01-a-fast"], cmp["02-b-fixme"], cmp["03-c-slow"]) == (20.0, 25.0, -30.0)
    assert out["03-c-slow"]["comparison"]["grade"] == "weak"
    assert [r["idea_id"] for r in s.result["ranking"][:3]] == ["02-b-fixme", "01-a-fast", "03-c-slow"]

    # the fix resumed the coder's own session on the coder's branch
    tasks = engine.state.tasks
    rid = engine.config.run_id
    first, fix = tasks[f"{rid}/s1/idea/02-b-fixme/code/round-1"], tasks[f"{rid}/s1/idea/02-b-fixme/code/round-2"]
    assert fix.input["resume_session_id"] == first.session_id is not None
    assert fix.input["session_group_key"] == first.input["session_group_key"]
    assert fix.input["base_branch"] == first.branch_final
    final = out["02-b-fixme"]["branch"]
    assert final == fix.branch_final
    assert git(repo, "show", f"{final}:faster.txt") == "1"
    assert "slow.txt" not in git(repo, "ls-tree", "--name-only", final)
    assert [r["verdict"] for r in out["02-b-fixme"]["rounds"]] == ["REJECT", "APPROVE"]

    # artifacts: cumulative diffs include new files; rejected/invalid ideas ran no tests or evaluation
    d = engine.paths.results / "strategy_output" / "02-b-fixme"
    assert "+++ b/slow.txt" in (d / "diff_round_1.diff").read_text()
    round2 = (d / "diff_round_2.diff").read_text()
    assert "+++ b/faster.txt" in round2 and "slow.txt" not in round2
    assert json.loads((d / "summary.json").read_text())["evaluation"]["metrics"] == {"throughput": 125.0}
    assert (
        "exit" in out["04-d-broken"]["tests"]["log_tail"].lower()
        or out["04-d-broken"]["tests"]["error_type"] == "command"
    )
    for idea in ("05-e-stubborn", "06-f-garbage"):
        assert not any(k.startswith(f"{rid}/s1/idea/{idea}/") and k.endswith(("/tests", "/eval")) for k in tasks)
    garbage_review = tasks[f"{rid}/s1/idea/06-f-garbage/review/round-1/attempt-1"]
    assert garbage_review.error_type == "output_invalid"
    assert f"{rid}/s1/idea/06-f-garbage/review/round-1/attempt-2" not in tasks  # a failed review is not re-asked
    assert (engine.paths.results / "strategy_output" / "ideas.md").read_text().startswith("# review-loop")
