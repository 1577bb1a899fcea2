"""synthesize end to end: the real command, real Docker, the sim agent, real git.

The repository has two bugs in two functions. The strategy's prompts carry a
``Role:`` line, so the task prompt steers each of its agents with scoped
``SIM[...]`` lines: candidate 0 (``-S approaches``: ``Role: fixadd``) fixes
``add``, candidate 1 (``Role: fixmul``) fixes ``mul``, every reviewer
(``Role: reviewer``) answers score 7, and the synthesizer (``Role: synthesizer``)
applies each candidate branch present in its workspace (``git diff
main...BRANCH | git apply``), then adds a note of its own. Neither candidate
passes the tests (each fixes one function); the synthesis does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import cli_env, only_run_id, run_cli, run_summary
from conftest import TEST_IMAGE, git, make_repo
from scenarios import APPROACHES, BROKEN_SYNTH, CALC, CANDIDATES, GOOD_SYNTH, TESTS

pytestmark = pytest.mark.docker

IMG = ["--no-tui", "--docker-image", TEST_IMAGE]


def _show(repo: Path, branch: str, path: str) -> str:
    return git(repo, "show", f"{branch}:{path}")


def test_synthesis_holds_both_fixes_names_both_candidates_and_passes_its_tests(tmp_path):
    repo = make_repo(tmp_path / "repo", {"calc.py": CALC})
    env = cli_env(tmp_path)
    args = [CANDIDATES + GOOD_SYNTH, "--strategy", "synthesize", "-S", "n=2", *APPROACHES, "-S", "keep_branches=false"]
    done = run_cli([*args, "-S", f"test_command={TESTS}", *IMG], cwd=repo, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = only_run_id(tmp_path)
    (ex,) = run_summary(tmp_path, run_id)["strategies"]
    result = ex["result"]
    synthesis = result["synthesis"]
    assert synthesis["status"] == "made" and synthesis["selected"] is True
    assert synthesis["tests"]["passed"] is True
    # each candidate alone fails the tests: the synthesis is more than either
    assert [result["candidates"][i]["tests"]["passed"] for i in (0, 1)] == [False, False]
    calc = _show(repo, synthesis["branch"], "calc.py")
    assert "return a + b\n" in calc and calc.endswith("return a * b") and "a - b" not in calc
    by_source = {h["source"]: h for h in result["provenance"]}
    assert by_source["gen/0"]["file"] == "calc.py" and by_source["gen/1"]["file"] == "calc.py"
    assert by_source["new"]["file"] == "NOTES.md"
    assert len(result["provenance"]) == 3
    # the selected branch is the synthesis, and it is the only merge advice
    assert ex["selected_branch"] == synthesis["branch"]
    assert run_summary(tmp_path, run_id)["final_branches"] == [synthesis["branch"]]
    assert ex["verdict"].startswith("synthesis of gen/0, gen/1 selected: the synthesis scored 7 >= gen/0's 7")
    assert "hunks: 1 gen/0, 1 gen/1, 1 new" in ex["verdict"]
    assert "synthesis of gen/0, gen/1 selected" in done.stdout
    # the synthesizer worked with both candidate branches present
    keys = {t["key"].split("/", 2)[2] for t in ex["tasks"]}
    assert {"synth", "diffs", "tests/synthesis", "tests/gen/0", "tests/gen/1"} <= keys
    assert {"rescore/synthesis/attempt-1", "rescore/candidate/attempt-1"} <= keys
    out = tmp_path / "results" / run_id / "strategy_output"
    assert (out / "best_branch.txt").read_text().strip() == synthesis["branch"]
    assert json.loads((out / "synthesis.json").read_text())["provenance"] == result["provenance"]
    # keep_branches=false: the candidates it combined are deleted, the synthesis it selected stays
    gens = [c["branch"] for c in result["candidates"]]
    assert sorted(json.loads((out / "synthesis.json").read_text())["delete_branches"]) == sorted(gens)
    assert git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split() == sorted(
        ["main", synthesis["branch"]]
    )


def test_from_run_takes_a_finished_best_of_n_runs_branches_and_a_broken_synthesis_is_not_best(tmp_path):
    repo = make_repo(tmp_path / "repo", {"calc.py": CALC})
    first_env = cli_env(tmp_path / "first")
    done = run_cli(
        [CANDIDATES, "--strategy", "best-of-n", "-S", "n=2", *APPROACHES, *IMG],
        cwd=repo,
        env=first_env,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first = only_run_id(tmp_path / "first")
    made = [
        t["branch"]
        for t in run_summary(tmp_path / "first", first)["strategies"][0]["tasks"]
        if t["key"].split("/")[2] == "gen"
    ]
    assert len(made) == 2

    # a second set of run folders: from_run finds the first run through its host-wide record
    env = cli_env(tmp_path / "second")
    args = [CANDIDATES + BROKEN_SYNTH, "--strategy", "synthesize", "-S", f"from_run={first}"]
    args += ["-S", "keep_branches=false"]
    done = run_cli([*args, "-S", f"test_command={TESTS}", *IMG], cwd=repo, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    second = only_run_id(tmp_path / "second")
    summary = run_summary(tmp_path / "second", second)
    assert summary["params"]["branches"] == sorted(made, key=lambda b: made.index(b))
    (ex,) = summary["strategies"]
    result = ex["result"]
    assert result["source"] == "from_run" and result["from_run"] == first
    assert [c["branch"] for c in result["candidates"]] == made
    assert not any(t["key"].split("/")[2] == "gen" for t in ex["tasks"])  # nothing generated again
    synthesis = result["synthesis"]
    assert synthesis["status"] == "made" and synthesis["tests"]["passed"] is False
    assert synthesis["selected"] is False
    assert ex["selected_branch"] == made[0] and summary["final_branches"] == [made[0]]
    assert ex["verdict"].startswith("branch/0 stays best (score 7): the synthesis failed its tests (exit 1)")
    assert "branch/0 stays best" in done.stdout
    # the broken line is no candidate's: provenance says the synthesizer wrote it
    sources = [h["source"] for h in result["provenance"]]
    assert "new" in sources and "branch/1" in sources
    # keep_branches=false: the synthesis it did not select is deleted; the branches it was given
    # (the first run's) were never its own to delete
    assert git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split() == sorted(["main", *made])
    assert "synthesize: deleted 1 branch(es) it no longer needs" in done.stderr, done.stderr


def test_from_run_refuses_an_unknown_run_in_one_line(tmp_path):
    repo = make_repo(tmp_path / "repo", {"calc.py": CALC})
    env = cli_env(tmp_path)
    done = run_cli(["x", "--strategy", "synthesize", "-S", "from_run=run_19990101_000000", *IMG], cwd=repo, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "-S from_run=run_19990101_000000: no run" in done.stderr
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())


def test_a_dry_run_rehearses_every_step(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    done = run_cli(
        ["add a greeting", "--strategy", "synthesize", "-S", "n=2", "-S", "test_command=true", "--dry-run", *IMG],
        cwd=repo,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = only_run_id(tmp_path)
    (ex,) = run_summary(tmp_path, run_id)["strategies"]
    keys = {t["key"].split("/", 2)[2] for t in ex["tasks"]}
    assert {"gen/0", "gen/1", "synth", "diffs", "tests/synthesis", "tests/gen/0", "tests/gen/1"} <= keys
    assert {"rescore/synthesis/attempt-1", "rescore/candidate/attempt-1"} <= keys
    assert all(t["state"] == "COMPLETED" for t in ex["tasks"])
    # the simulated synthesizer writes a file of its own: provenance says it is new
    assert ex["result"]["provenance"] and {h["source"] for h in ex["result"]["provenance"]} == {"new"}
    assert f"Verdict: {ex['verdict']}" in done.stdout
