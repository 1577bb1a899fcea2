"""synthesize: hunk provenance (pure), parameter checks, and its decisions over the real engine.

The engine tests use the in-process ScriptedRunner: candidates, reviewers, the
synthesizer, the test commands and the diff task are scripted by task key, so
each decision (synthesis selected, beaten, failing its tests, failing to run)
is checked without Docker. tests/test_synthesize_docker.py runs the real thing.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import git, make_repo
from engine_helpers import run_engine, run_manifest

from orchestrator.engine.testing import ScriptedRunner, failure, success
from orchestrator.errors import ConfigError
from orchestrator.strategy_loader import load_strategy
from strategies._report import synthesize_sections
from strategies.synthesize import synthesize
from strategies.synthesize_provenance import diff_command, parse_hunks, provenance, split_diffs

# ---------------------------------------------------------------- provenance (pure)

CAND_A = """diff --git a/calc.py b/calc.py
index 1111111..2222222 100644
--- a/calc.py
+++ b/calc.py
@@ -2 +2 @@ def add(a, b):
-    return a - b
+    return a + b
"""
CAND_B = """diff --git a/calc.py b/calc.py
index 1111111..3333333 100644
--- a/calc.py
+++ b/calc.py
@@ -14 +14 @@ def mul(a, b):
-    return a * b + 1
+    return a * b
diff --git a/old.txt b/old.txt
deleted file mode 100644
index 4444444..0000000
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-obsolete
"""
SYNTH = """diff --git a/NOTES.md b/NOTES.md
new file mode 100644
index 0000000..5555555
--- /dev/null
+++ b/NOTES.md
@@ -0,0 +1 @@
+combined
diff --git a/calc.py b/calc.py
index 1111111..6666666 100644
--- a/calc.py
+++ b/calc.py
@@ -2 +2 @@ def add(a, b):
-    return a - b
+    return a + b
@@ -14 +14 @@ def mul(a, b):
-    return a * b + 1
+    return a * b   \n
diff --git a/old.txt b/old.txt
deleted file mode 100644
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-obsolete
"""


def test_parse_hunks_reads_files_headers_and_lines_of_new_changed_and_deleted_files():
    hunks = parse_hunks(SYNTH)
    assert [(h["file"], h["header"]) for h in hunks] == [
        ("NOTES.md", "@@ -0,0 +1 @@"),
        ("calc.py", "@@ -2 +2 @@"),
        ("calc.py", "@@ -14 +14 @@"),
        ("old.txt", "@@ -1 +0,0 @@"),
    ]
    assert hunks[0] == {"file": "NOTES.md", "header": "@@ -0,0 +1 @@", "removed": [], "added": ["combined"]}
    assert hunks[2]["added"] == ["    return a * b"]  # trailing whitespace does not count
    assert hunks[3]["removed"] == ["obsolete"] and hunks[3]["added"] == []


def test_provenance_names_the_candidate_of_each_hunk_and_marks_the_synthesizers_own():
    rows = provenance(SYNTH, [("gen/0", CAND_A), ("gen/1", CAND_B)])
    assert [(r["file"], r["source"], r["match"]) for r in rows] == [
        ("NOTES.md", "new", 0.0),
        ("calc.py", "gen/0", 1.0),
        ("calc.py", "gen/1", 1.0),
        ("old.txt", "gen/1", 1.0),  # a deletion-only hunk is matched by what it removes
    ]
    assert rows[1]["added"] == 1 and rows[1]["removed"] == 1


def test_a_hunk_that_drops_a_candidates_line_for_its_own_is_new():
    own = CAND_A.replace("+    return a + b", "+    return a + b + 1")
    (row,) = provenance(own, [("gen/0", CAND_A), ("gen/1", CAND_B)])
    assert row["source"] == "new" and row["match"] == 0.0


def test_provenance_ties_go_to_the_better_ranked_candidate_and_list_the_others():
    (row,) = provenance(CAND_A, [("gen/2", CAND_A), ("gen/0", CAND_A)])
    assert row["source"] == "gen/2" and row["also_in"] == ["gen/0"]


def test_provenance_needs_half_the_added_lines_from_one_candidate():
    two = "--- a/f\n+++ b/f\n@@ -1,0 +1,3 @@\n+x\n+y\n+z\n"
    cand = "--- a/f\n+++ b/f\n@@ -1,0 +1,2 @@\n+x\n+y\n"
    one = "--- a/f\n+++ b/f\n@@ -1,0 +1 @@\n+x\n"
    assert provenance(two, [("a", cand)])[0]["source"] == "a"  # 2 of 3
    assert provenance(two, [("a", one)])[0] == {
        "file": "f",
        "header": "@@ -1,0 +1,3 @@",
        "added": 3,
        "removed": 0,
        "source": "new",
        "match": 0.333,
        "also_in": [],
    }
    # the same line in another file is another line
    assert provenance(two.replace("/f", "/g"), [("a", cand)])[0]["source"] == "new"


def test_split_diffs_reads_back_what_diff_command_prints(tmp_path):
    repo = make_repo(tmp_path / "repo", {"calc.py": "a\nb\n"})
    git(repo, "checkout", "-q", "-b", "fix")
    (repo / "calc.py").write_text("a\nB\n")
    git(repo, "commit", "-qam", "fix")
    git(repo, "checkout", "-q", "-b", "synth")
    (repo / "new.txt").write_text("n\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "synth")
    import subprocess

    out = subprocess.run(
        ["/bin/sh", "-c", diff_command("main", [("synthesis", "HEAD"), ("gen/0", "fix")])],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    diffs = split_diffs(out)
    assert list(diffs) == ["synthesis", "gen/0"]
    rows = provenance(diffs["synthesis"], [("gen/0", diffs["gen/0"])])
    assert [(r["file"], r["source"]) for r in rows] == [("calc.py", "gen/0"), ("new.txt", "new")]


# ---------------------------------------------------------------- parameters


def test_prepare_refuses_bad_parameters_in_one_line(tmp_path):
    from orchestrator.app import run_branches
    from orchestrator.strategy import prepare_runtime

    repo = make_repo(tmp_path / "repo")
    git(repo, "branch", "fix-a")
    prepare = load_strategy("synthesize").options.prepare
    assert prepare is not None
    # What the pre-flight supplies while prepare runs: without it the hook cannot ask about other runs.
    with pytest.raises(RuntimeError, match="absent_branches answers inside a strategy's prepare hook"):
        prepare({"branches": ["fix-a"]}, str(repo))
    with prepare_runtime(run_branches):
        for params, message in (
            ({"n": 0}, "-S n must be a whole number >= 1"),
            ({"k": 0}, "-S k must be a whole number >= 1"),
            ({"branches": "fix-a"}, "-S branches must be a JSON list"),
            ({"branches": ["fix-a"], "from_run": "run_x"}, "not both"),
            ({"branches": ["fix-a", "nope"]}, "-S branches: nope is not a branch of"),
            ({"from_run": "run_19990101_000000"}, "-S from_run=run_19990101_000000: no run"),
            ({"from_run": "../x"}, "is not a run id"),
        ):
            with pytest.raises(ConfigError, match=re.escape(message)) as err:
                prepare(params, str(repo))
            assert "\n" not in str(err.value)
        assert prepare({"branches": ["fix-a", "main", "fix-a"]}, str(repo))["branches"] == ["fix-a", "main"]


# ---------------------------------------------------------------- decisions over the engine


def _diff(path: str, old: str, new: str) -> str:
    return f"--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}\n+{new}\n"


def script(
    scores: dict[int, int],
    *,
    rescore=(8, 8),
    failing=(),
    synth_fails=False,
    tests_fail=(),
):
    """gen/<i> says "candidate i"; reviewers answer ``scores``; the synthesis takes a.py from gen/0, b.py from gen/1."""

    def run(req):
        parts = req.task_key.split("/")[2:]
        head = parts[0]
        if head == "gen":
            i = int(parts[1])
            if i in failing:
                return failure(req, message="boom")
            return success(req, final_message=f"candidate {i} done")
        if head == "score":
            found = re.search(r"candidate (\d+) done", req.prompt) or re.search(r"branch-(\d+)", req.task_key)
            i = int(found.group(1))
            return success(req, final_message=json.dumps({"score": scores[i], "rationale": f"r{i}"}))
        if head == "synth":
            return failure(req, message="synth crashed") if synth_fails else success(req, final_message="combined")
        if head == "tests":
            which = "/".join(parts[1:])
            code = 1 if which in tests_fail else 0
            return success(req, final_message=f"ran\n@@orch-base exit={code}\n", has_changes=False)
        if head == "diffs":
            text = (
                "@@orch-diff synthesis\n"
                + _diff("a.py", "a", "A")
                + _diff("b.py", "b", "B")
                + _diff("c.py", "c", "C")
                + "@@orch-diff gen/0\n"
                + _diff("a.py", "a", "A")
                + "@@orch-diff gen/1\n"
                + _diff("b.py", "b", "B")
            )
            return success(req, final_message=text, has_changes=False)
        if head == "rescore":
            value = rescore[0] if parts[1] == "synthesis" else rescore[1]
            return success(req, final_message=json.dumps({"score": value, "rationale": parts[1]}))
        raise AssertionError(req.task_key)

    return run


def _by(runner, head):
    return [c for c in runner.calls if c.task_key.split("/")[2] == head]


async def test_the_synthesis_of_the_top_k_is_selected_when_it_scores_as_well_and_passes_tests(tmp_path):
    runner = ScriptedRunner(script({0: 6, 1: 8, 2: 9}, failing={3}))
    engine, state = await run_engine(tmp_path, synthesize, runner, params={"n": 4, "k": 2, "test_command": "pytest -q"})
    s1 = state.strategies["s1"]
    assert s1.status == "success", s1.error
    result = s1.result
    (synth,) = _by(runner, "synth")
    gens = {c.task_key.split("/")[3]: c for c in _by(runner, "gen")}
    # the two best (gen/2 score 9, gen/1 score 8) are present in the synthesizer's workspace, best first
    assert synth.include_branches == (gens["2"].branch_name, gens["1"].branch_name)
    assert synth.base_branch == "main" and "Role: synthesizer" in synth.prompt
    assert result["top"] == ["gen/2", "gen/1"]
    assert result["key"] == "run_t/s1/synth" and result["artifact"]["branch_final"] == synth.branch_name
    # tests ran on the synthesis and on each of the top k, never on the others
    assert sorted("/".join(c.task_key.split("/")[3:]) for c in _by(runner, "tests")) == ["gen/1", "gen/2", "synthesis"]
    # side by side: each reviewer has the other branch present
    rescores = {c.task_key.split("/")[3]: c for c in _by(runner, "rescore")}
    assert rescores["synthesis"].base_branch == synth.branch_name
    assert rescores["synthesis"].include_branches == ("main", gens["2"].branch_name)
    assert rescores["candidate"].include_branches == ("main", synth.branch_name)
    (diffs,) = _by(runner, "diffs")
    assert diffs.base_branch == synth.branch_name and diffs.import_policy == "never"
    # a.py is gen/0's change, but gen/0 was not given to the synthesizer: for the synthesis it is new
    assert [h["source"] for h in result["provenance"]] == ["new", "gen/1", "new"]
    assert result["verdict"] == (
        "synthesis of gen/2, gen/1 selected: the synthesis scored 8 >= gen/2's 8 side by side, tests passed; "
        "hunks: 1 gen/1, 2 new"
    )
    assert [c["status"] for c in result["candidates"]] == ["scored", "scored", "scored", "failed"]
    out = engine.paths.results / "strategy_output"
    assert (out / "best_branch.txt").read_text() == synth.branch_name + "\n"
    assert json.loads((out / "synthesis.json").read_text())["selected"]["which"] == "synthesis"


async def test_a_synthesis_that_scores_lower_side_by_side_leaves_the_best_candidate_selected(tmp_path):
    runner = ScriptedRunner(script({0: 8, 1: 6}, rescore=(5, 8)))
    _, state = await run_engine(tmp_path, synthesize, runner, params={"n": 2})
    result = state.strategies["s1"].result
    assert result["key"] == "run_t/s1/gen/0" and result["synthesis"]["selected"] is False
    assert result["verdict"].startswith("gen/0 stays best: the synthesis scored 5 < gen/0's 8 side by side")
    assert not _by(runner, "tests")  # no test_command: nothing tested


async def test_the_verdict_gives_the_kept_candidate_one_score_the_one_the_decision_compared(tmp_path):
    # gen/0 ranked first alone (10), then scored 8 beside the synthesis (7): the verdict
    # named both ("gen/0 stays best (score 10): the synthesis scored 7 < gen/0's 8").
    runner = ScriptedRunner(script({0: 10, 1: 6}, rescore=(7, 8)))
    _, state = await run_engine(tmp_path, synthesize, runner, params={"n": 2})
    result = state.strategies["s1"].result
    assert result["key"] == "run_t/s1/gen/0"
    assert (
        result["verdict"]
        == "gen/0 stays best: the synthesis scored 7 < gen/0's 8 side by side; hunks: 1 gen/0, 1 gen/1, 1 new"
    )
    assert result["selected"] == {"which": "gen/0", "branch": result["artifact"]["branch_final"], "score": 8}


async def test_a_synthesis_failing_its_tests_is_not_best_and_the_best_candidate_is_one_that_passes(tmp_path):
    runner = ScriptedRunner(script({0: 9, 1: 7}, rescore=(10, 1), tests_fail={"synthesis", "gen/0"}))
    _, state = await run_engine(tmp_path, synthesize, runner, params={"n": 2, "test_command": "make test"})
    result = state.strategies["s1"].result
    # gen/0 scored higher but fails its tests: gen/1 is the best single candidate
    assert result["key"] == "run_t/s1/gen/1"
    assert result["synthesis"]["candidate_rescore"]["label"] == "gen/1"
    assert result["verdict"].startswith("gen/1 stays best (score 7): the synthesis failed its tests (exit 1)")
    assert result["synthesis"]["tests"]["passed"] is False


async def test_a_failed_synthesizer_or_a_single_candidate_leaves_the_best_candidate(tmp_path):
    runner = ScriptedRunner(script({0: 8, 1: 6}, synth_fails=True))
    _, state = await run_engine(tmp_path / "a", synthesize, runner, params={"n": 2})
    result = state.strategies["s1"].result
    assert result["key"] == "run_t/s1/gen/0"
    assert result["verdict"].startswith("gen/0 stays best (score 8): the synthesizer failed (api): synth crashed")
    assert not _by(runner, "diffs") and not _by(runner, "rescore")

    runner = ScriptedRunner(script({0: 8, 1: 6}))
    _, state = await run_engine(tmp_path / "b", synthesize, runner, params={"n": 2, "k": 1})
    result = state.strategies["s1"].result
    assert result["verdict"] == "gen/0 stays best (score 8): nothing to combine: k=1 takes only the best candidate"
    assert not _by(runner, "synth")


async def test_existing_branches_are_reviewed_not_generated_and_a_kept_one_is_selected_by_name(tmp_path):
    runner = ScriptedRunner(script({0: 5, 1: 9}, rescore=(3, 9)))
    _, state = await run_engine(tmp_path, synthesize, runner, params={"branches": ["fix-a", "fix-b"]})
    s1 = state.strategies["s1"]
    assert s1.status == "success", s1.error
    assert not _by(runner, "gen")
    assert sorted(c.task_key.split("/", 2)[2] for c in _by(runner, "score")) == [
        "score/branch-0/attempt-1",
        "score/branch-1/attempt-1",
    ]
    assert {c.base_branch for c in _by(runner, "score")} == {"fix-a", "fix-b"}
    (synth,) = _by(runner, "synth")
    assert synth.include_branches == ("fix-b", "fix-a")
    assert s1.result["selected_branch"] == "fix-b" and "artifact" not in s1.result
    assert s1.result["verdict"].startswith("branch/1 stays best: the synthesis scored 3 < branch/1's 9")


async def test_nothing_scorable_fails_with_no_viable_candidates(tmp_path):
    runner = ScriptedRunner(script({}, failing={0, 1}))
    engine, state = await run_engine(tmp_path, synthesize, runner, params={"n": 2})
    s1 = state.strategies["s1"]
    assert s1.status == "failed" and s1.error.startswith("NoViableCandidates")
    assert json.loads((engine.paths.results / "strategy_output" / "synthesis.json").read_text())["selected"] is None


# ---------------------------------------------------------------- report


async def test_report_sections_show_the_synthesis_beside_the_candidates_with_provenance(tmp_path):
    runner = ScriptedRunner(script({0: 8, 1: 6}))
    _, state = await run_engine(tmp_path, synthesize, runner, params={"n": 2})
    result = state.strategies["s1"].result
    sections = synthesize_sections({"execution": {"result": result}, "tasks": []})
    assert [s["type"] for s in sections] == ["text", "compare", "table"]
    assert sections[0]["text"] == result["verdict"]
    items = sections[1]["items"]
    assert [i["label"] for i in items] == ["synthesis", "gen/0", "gen/1"]
    assert [i["highlight"] for i in items] == [True, False, False]
    assert items[0]["commit"] == result["synthesis"]["commit"]
    assert "1 hunk(s) taken" in items[1]["subtitle"] and "in the synthesis" in items[2]["subtitle"]
    rows = sections[2]["rows"]
    assert [r[3] for r in rows] == ["gen/0", "gen/1", "new"] and sections[2]["highlight"] == [2]
    assert synthesize_sections({"execution": {"result": None}, "tasks": []}) == []


# ---------------------------------------------------------------- resume and --runs


async def test_a_resume_after_the_synthesis_pays_for_nothing_twice_and_decides_the_same(tmp_path):
    from engine_helpers import assert_resume_matches_uninterrupted

    runner2 = await assert_resume_matches_uninterrupted(
        tmp_path,
        synthesize,
        script({0: 8, 1: 6}, rescore=(9, 8)),
        params={"n": 2, "test_command": "make test"},
        outputs=("synthesis.json", "best_branch.txt"),
        blocked=lambda req: req.task_key.split("/")[2] == "rescore",
        count=2,
    )
    # generation, scoring, the synthesizer and the tests finished before the interruption
    assert {c.task_key.split("/")[2] for c in runner2.calls} <= {"rescore", "diffs"}


async def test_runs_2_makes_two_independent_syntheses_with_their_own_output_files(tmp_path):
    runner = ScriptedRunner(script({0: 8, 1: 6}))
    engine, state = await run_engine(tmp_path, synthesize, runner, params={"n": 2}, runs=2)
    assert {sid: s.status for sid, s in state.strategies.items()} == {"s1": "success", "s2": "success"}
    assert {s.result["key"] for s in state.strategies.values()} == {"run_t/s1/synth", "run_t/s2/synth"}
    out = engine.paths.results / "strategy_output"
    assert sorted(p.name for p in out.iterdir()) == [
        "best_branch.txt",
        "best_branch_s2.txt",
        "synthesis.json",
        "synthesis_s2.json",
    ]


# ---------------------------------------------------------------- from_run resolution


def _recorded_run(tmp_path, repo, *, run_id, status, tasks):
    """A run's manifest and summary.json as a finished (or unfinished) run leaves them."""
    from orchestrator.log.runs import RunDirs, write_manifest

    dirs = RunDirs(logs=tmp_path / "logs", state=tmp_path / "state", results=tmp_path / "results")
    (dirs.state / run_id).mkdir(parents=True)
    manifest = run_manifest(
        run_id=run_id,
        strategy_spec="best-of-n",
        repo_path=str(repo),
        model="m",
        plugin="claude",
        docker_image="i",
        status=status,
    )
    write_manifest(dirs, manifest)
    (dirs.results / run_id).mkdir(parents=True)
    summary = {"strategies": [{"tasks": [{"key": k, "branch": b, "state": s} for k, b, s in tasks]}]}
    (dirs.results / run_id / "summary.json").write_text(json.dumps(summary))
    return dirs


def test_from_run_resolves_a_finished_runs_branches_in_key_order_and_refuses_what_cannot_be_taken(
    tmp_path, monkeypatch
):
    from orchestrator.app.run_branches import finished_run_branches  # what the pre-flight supplies to prepare

    repo = make_repo(tmp_path / "repo")
    for b in ("gen-2", "gen-10", "gen-0"):
        git(repo, "branch", b)
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("ORCHESTRATOR_LOGS_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("ORCHESTRATOR_RESULTS_DIR", str(tmp_path / "results"))
    tasks = [
        ("run_a/s1/gen/10", "gen-10", "COMPLETED"),
        ("run_a/s1/gen/2", "gen-2", "COMPLETED"),
        ("run_a/s1/score/x/attempt-1", None, "COMPLETED"),  # reviewers make no branch
        ("run_a/s1/gen/0", "gen-0", "COMPLETED"),
        ("run_a/s1/gen/3", "main", "COMPLETED"),  # a candidate that changed nothing: the base
        ("run_a/s1/gen/4", "gen-4", "FAILED"),
    ]
    _recorded_run(tmp_path, repo, run_id="run_a", status="completed", tasks=tasks)
    assert finished_run_branches("run_a", str(repo)) == ["gen-0", "gen-2", "gen-10"]

    _recorded_run(tmp_path, repo, run_id="run_b", status="interrupted", tasks=tasks)
    with pytest.raises(ConfigError, match=re.escape("the run is interrupted, not finished; resume it first")):
        finished_run_branches("run_b", str(repo))
    other = make_repo(tmp_path / "other")
    with pytest.raises(ConfigError, match=r"the run worked on .*repo, not .*other; run from that repository"):
        finished_run_branches("run_a", str(other))
    _recorded_run(tmp_path, repo, run_id="run_c", status="completed", tasks=[("run_c/s1/gen/0", "gone", "COMPLETED")])
    with pytest.raises(ConfigError, match="branch gone of that run no longer exists in"):
        finished_run_branches("run_c", str(repo))
    _recorded_run(tmp_path, repo, run_id="run_d", status="completed", tasks=[("run_d/s1/task", "main", "COMPLETED")])
    with pytest.raises(ConfigError, match="the run created no branches to take"):
        finished_run_branches("run_d", str(repo))
