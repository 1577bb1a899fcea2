"""A third plugin needs its own module and one registration line: here a test
module registered by configuration, run through the real command, real git and
real Docker."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import TEST_IMAGE, git, make_repo

TESTS = Path(__file__).resolve().parent


@pytest.mark.docker
def test_a_toy_plugin_from_a_test_module_runs_a_task_and_its_commit_comes_back(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    config = tmp_path / "orchestrator.yaml"
    config.write_text(
        "runner:\n  plugin: toy\n  plugin_modules:\n    toy: toy_plugin\norchestration:\n  default_model: toy-1\n"
    )
    env = cli_env(tmp_path, PYTHONPATH=str(TESTS))
    env.pop("ANTHROPIC_API_KEY")  # the toy needs no credentials, and none reach it
    args = ["hello from the toy", "--repo", str(repo), "--config", str(config), "--docker-image", TEST_IMAGE]
    done = run_cli([*args, "--no-tui"], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = only_run_id(tmp_path)
    (branch,) = (tmp_path / "results" / run_id / "branches.txt").read_text().split()
    assert git(repo, "show", f"{branch}:toy.txt") == "hello from the toy"
    assert git(repo, "log", "-1", "--format=%s", branch) == "toy: wrote the prompt"
    summary = (tmp_path / "results" / run_id / "summary.json").read_text()
    assert '"plugin": "toy"' in summary

    # a module that is not there, or not a plugin, is one line before anything runs
    config.write_text("runner:\n  plugin: toy\n  plugin_modules:\n    toy: no_such_toy_module\n")
    bad = run_cli([*args, "--no-tui"], cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "plugin 'toy': cannot import its module no_such_toy_module" in bad.stderr
    config.write_text("runner:\n  plugin: toy\n  plugin_modules:\n    toy: cli_helpers\n")
    not_one = run_cli([*args, "--no-tui"], cwd=tmp_path, env=env)
    assert not_one.returncode == 2 and "module cli_helpers must define PLUGIN, a runner plugin named 'toy'" in (
        not_one.stderr
    )
    config.write_text("runner:\n  plugin_modules:\n    codex: toy_plugin\n")
    taken = run_cli([*args, "--no-tui"], cwd=tmp_path, env=env)
    assert taken.returncode == 2 and "'codex' is a built-in plugin; give yours another name" in taken.stderr
