"""More of the real command: review-loop, dirty trees, start-up cleanup of orphans and old logs."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from cli_helpers import cli_env, only_run_id, run_cli, wait_for
from conftest import TEST_IMAGE, git, make_repo

pytestmark = pytest.mark.docker
IMG = ["--docker-image", TEST_IMAGE]


def test_review_loop_from_an_ideas_folder(tmp_path):
    repo = make_repo(tmp_path / "repo")
    ideas = tmp_path / "ideas"
    ideas.mkdir()
    (ideas / "01-cache.md").write_text("Cache parsed headers\n")
    (ideas / "02-stream.md").write_text("Stream the input instead of reading it whole\n")
    result = run_cli(["improve the parser", "--strategy", "review-loop", "-S", f"ideas={ideas}",
                      "-S", "test_command=true", "--dry-run", "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    out = tmp_path / "results" / only_run_id(tmp_path) / "strategy_output"
    idea_dirs = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(idea_dirs) == 2
    for d in idea_dirs:
        summary = json.loads((d / "summary.json").read_text())
        assert summary["status"] == "completed", summary
        assert summary["rounds"][0]["verdict"] == "APPROVE" and summary["tests"]["exit_code"] == 0
        for name in ("idea.md", "plan.md", "diff_round_1.diff", "review_round_1.md", "tests.log"):
            assert (d / name).exists(), (d, name)
        branch = summary["branch"]
        assert branch and git(repo, "rev-parse", "--verify", branch)


def test_dirty_tree_warns_and_require_clean_refuses(tmp_path):
    repo = make_repo(tmp_path / "repo")
    (repo / "README.md").write_text("changed but not committed\n")
    refused = run_cli(["SIM: print x", "--require-clean-wt", *IMG], cwd=repo, env=cli_env(tmp_path))
    assert refused.returncode == 2 and "uncommitted changes" in refused.stderr
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
    ok = run_cli(["SIM: print x", "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path))
    assert ok.returncode == 0 and "uncommitted changes" in ok.stderr
    assert (repo / "README.md").read_text() == "changed but not committed\n"  # never touched


def test_start_removes_orphans_and_old_logs_but_not_resumable_runs(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    old_ts = "2020-01-01T00:00:00.000Z"
    names = {"orphan": f"orch-test-orphan-{os.getpid()}", "resumable": f"orch-test-resumable-{os.getpid()}"}
    # a resumable (interrupted) run whose container must survive
    (tmp_path / "state" / "run_20200101_000001").mkdir(parents=True)
    (tmp_path / "state" / "run_20200101_000001" / "run.json").write_text(json.dumps({
        "run_id": "run_20200101_000001", "created_at": old_ts, "prompt": "p", "strategy_spec": "simple",
        "strategy_name": "simple", "params": {}, "runs": 1, "repo_path": str(repo), "base_branch": "main",
        "model": "sonnet", "plugin": "claude-code", "docker_image": TEST_IMAGE, "max_parallel": 2,
        "status": "interrupted"}))
    for what, run_id in (("orphan", "run_unknown_orphan"), ("resumable", "run_20200101_000001")):
        subprocess.run(["docker", "create", "--name", names[what], "--label", "orchestrator=true",
                        "--label", f"run_id={run_id}", "--label", f"orchestrator.last_active_ts={old_ts}",
                        TEST_IMAGE, "true"], check=True, capture_output=True)
    old_logs = tmp_path / "logs" / "run_20200101_000002"
    old_logs.mkdir(parents=True)
    (old_logs / "events.jsonl").write_text("")
    past = time.time() - 30 * 86400
    os.utime(old_logs / "events.jsonl", (past, past))
    try:
        result = run_cli(["SIM: print x", "--no-tui", *IMG], cwd=repo, env=env)
        assert result.returncode == 0, result.stderr
        present = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True,
                                 text=True).stdout.split()
        assert names["orphan"] not in present
        assert names["resumable"] in present
        assert not old_logs.exists()
        # the scan is rate-limited per state directory, with no marker among the runs
        assert all((p / "run.json").exists() for p in (tmp_path / "state").iterdir())
        names["late"] = f"orch-test-late-{os.getpid()}"
        subprocess.run(["docker", "create", "--name", names["late"], "--label", "orchestrator=true",
                        "--label", "run_id=run_unknown_late", "--label", f"orchestrator.last_active_ts={old_ts}",
                        TEST_IMAGE, "true"], check=True, capture_output=True)
        again = run_cli(["SIM: print x", "--no-tui", *IMG], cwd=repo, env=env)
        assert again.returncode == 0, again.stderr
        present = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True,
                                 text=True).stdout.split()
        assert names["late"] in present  # scanned a moment ago: not again within 5 minutes
        second = max(p.name for p in (tmp_path / "state").iterdir())
        log = (tmp_path / "logs" / second / "orchestration.jsonl").read_text()
        assert "scanned recently" in log
        assert all((p / "run.json").exists() for p in (tmp_path / "state").iterdir())
    finally:
        subprocess.run(["docker", "rm", "-f", *names.values()], capture_output=True)


def test_clean_containers_removes_stopped_past_retention_and_never_running_ones(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    old_ts = "2020-01-01T00:00:00.000Z"
    pid = os.getpid()
    names = {"stopped_old": f"orch-cc-old-{pid}", "stopped_new": f"orch-cc-new-{pid}",
             "running_old": f"orch-cc-run-{pid}"}
    now_ts = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    try:
        for what, ts in (("stopped_old", old_ts), ("stopped_new", now_ts), ("running_old", old_ts)):
            cmd = ["docker", "run", "-d", "--name", names[what], "--label", "orchestrator=true",
                   "--label", f"run_id=run_cc_{pid}", "--label", f"orchestrator.last_active_ts={ts}",
                   TEST_IMAGE, "sleep", "infinity" if what == "running_old" else "0"]
            subprocess.run(cmd, check=True, capture_output=True)
        def short_ones_exited() -> bool:
            r = subprocess.run(["docker", "inspect", "-f", "{{.State.Status}}", names["stopped_old"],
                                names["stopped_new"]], capture_output=True, text=True)
            return r.stdout.split() == ["exited", "exited"]

        wait_for(short_ones_exited, timeout=120, interval=0.1)
        listed = run_cli(["--clean-containers", "--dry-run"], cwd=repo, env=env)
        assert listed.returncode == 0 and f"would remove {names['stopped_old']}" in listed.stdout
        assert names["stopped_new"] not in listed.stdout and names["running_old"] not in listed.stdout
        removed = run_cli(["--clean-containers", "--force"], cwd=repo, env=env)
        assert removed.returncode == 0, removed.stderr
        present = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True,
                                 text=True).stdout.split()
        assert names["stopped_old"] not in present
        assert names["stopped_new"] in present and names["running_old"] in present
    finally:
        subprocess.run(["docker", "rm", "-f", *names.values()], capture_output=True)


def test_clean_containers_takes_its_retention_from_the_config_file(tmp_path):
    # An hour old: inside the default 2 h retention (so no other run's orphan scan
    # removes it meanwhile), past the half hour that the config file sets.
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    name = f"orch-cc-cfg-{os.getpid()}"
    ts = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 3600))
    (tmp_path / "short.yaml").write_text("runner:\n  success_retention_hours: 0.5\n  failure_retention_hours: 0.5\n")
    try:
        subprocess.run(["docker", "create", "--name", name, "--label", "orchestrator=true", "--label",
                        f"run_id=run_cfg_{os.getpid()}", "--label", f"orchestrator.last_active_ts={ts}", TEST_IMAGE],
                       check=True, capture_output=True)
        default = run_cli(["--clean-containers", "--dry-run"], cwd=repo, env=env)
        assert default.returncode == 0, default.stderr
        assert name not in default.stdout
        short = run_cli(["--clean-containers", "--dry-run", "--config", str(tmp_path / "short.yaml")], cwd=repo,
                        env=env)
        assert short.returncode == 0 and f"would remove {name}" in short.stdout, short.stdout + short.stderr
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
