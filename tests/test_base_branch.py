"""The base branch without --base-branch, and what the command says when the branch is not there.

Through the real command, real git and (for the run) real Docker with the simulated agent.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE, git, make_repo

from orchestrator.naming import branch_name

pytestmark = pytest.mark.docker
IMG = ["--docker-image", TEST_IMAGE]


def master_repo(path):
    repo = make_repo(path)
    git(repo, "branch", "-m", "main", "master")
    return repo


def test_a_repository_with_only_master_runs_without_base_branch(tmp_path):
    repo = master_repo(tmp_path / "repo")
    r = run_cli(
        ["SIM: write f.txt hello\nSIM: commit add f", "--dry-run", "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path)
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    said = [line for line in r.stdout.splitlines() if line.startswith("Base branch:")]
    assert said == [
        "Base branch: master (the current branch; there is no main; choose another with --base-branch NAME)"
    ]
    manifest = json.loads((tmp_path / "state" / only_run_id(tmp_path) / "run.json").read_text())
    assert manifest["base_branch"] == "master"
    made = [b for b in git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split() if b != "master"]
    assert len(made) == 1 and git(repo, "merge-base", "--is-ancestor", "master", made[0]) == ""


def test_main_is_still_the_default_when_it_exists(tmp_path):
    repo = make_repo(tmp_path / "repo")
    git(repo, "checkout", "-q", "-b", "feature")
    r = run_cli(["SIM: print hi", "--dry-run", "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "Base branch: main (the default; choose another with --base-branch NAME)" in r.stdout.splitlines()
    manifest = json.loads((tmp_path / "state" / only_run_id(tmp_path) / "run.json").read_text())
    assert manifest["base_branch"] == "main"


def test_a_named_base_branch_is_used_without_a_note(tmp_path):
    repo = master_repo(tmp_path / "repo")
    r = run_cli(
        ["SIM: print hi", "--dry-run", "--no-tui", "--base-branch", "master", *IMG], cwd=repo, env=cli_env(tmp_path)
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "Base branch:" not in r.stdout


def _one_error_line(r) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestrator: error: "), r.stderr
    return lines[0]


def test_unknown_branch_lists_the_users_branches_likely_names_first(tmp_path):
    repo = master_repo(tmp_path / "repo")
    # Names that sort before master, as a run's own branches do (best-of-n_run_...).
    for name in ("aaa-old", "dev"):
        git(repo, "branch", name)
    # The branches runs leave (a best-of-n leaves one per candidate): the list named every one.
    runs = [branch_name("best-of-n", "run_20250101_000000", f"run_20250101_000000/s1/gen/{i}") for i in range(5)] + [
        branch_name("simple", "run_20250101_000000_2", "run_20250101_000000_2/s1/task") + "_2",  # suffix policy
        branch_name("my-strategy", "run_20250102_101010", "run_20250102_101010/s2/x"),
    ]
    for name in runs:
        git(repo, "branch", name)
    git(repo, "checkout", "-q", "dev")
    line = _one_error_line(run_cli(["do it", "--base-branch", "nope", *IMG], cwd=repo, env=cli_env(tmp_path)))
    assert "base branch 'nope' not found" in line
    listed, _, rest = line.split("with one of: ")[1].partition(" (")
    assert listed.split(", ") == ["master", "dev", "aaa-old"], line
    assert rest.startswith("and 7 branches of orchestrator runs"), line
    assert not any(name in line for name in runs), line
    assert not (tmp_path / "state").exists()


def test_a_remote_only_branch_gets_the_commands_that_make_it_local(tmp_path):
    upstream = make_repo(tmp_path / "upstream")
    git(upstream, "branch", "release")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True)
    env = cli_env(tmp_path)
    line = _one_error_line(run_cli(["do it", "--base-branch", "release", *IMG], cwd=clone, env=env))
    assert "exists only on remote origin" in line and "git fetch origin && git branch release origin/release" in line
    line = _one_error_line(run_cli(["do it", "--base-branch", "origin/release", *IMG], cwd=clone, env=env))
    assert "remote-tracking branch" in line and "git branch release origin/release" in line
    assert "--base-branch release" in line


def _doctor_lines(r) -> dict[str, str]:
    return {line[6:].split(":")[0]: line for line in r.stdout.splitlines() if line[:4] in ("ok  ", "warn", "fail")}


def test_doctor_names_the_base_branch_problem_not_the_repository(tmp_path):
    repo = master_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    ok = _doctor_lines(run_cli(["--doctor", *IMG], cwd=repo, env=env, timeout=300))
    assert ok["repository"].startswith("ok "), ok
    assert ok["base branch"] == "ok    base branch: master (the current branch; there is no main)", ok
    bad = _doctor_lines(run_cli(["--doctor", "--base-branch", "nope", *IMG], cwd=repo, env=env, timeout=300))
    assert bad["repository"].startswith("ok "), bad
    assert bad["base branch"].startswith("fail  base branch: base branch 'nope' not found"), bad
    assert "-- fix: pass --base-branch with one of: master" in bad["base branch"]
    assert "run from a git repository" not in "\n".join(bad.values())
