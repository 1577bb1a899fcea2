"""Management commands as a user meets them: --doctor for a dry run, and runs found where they were written.

Real command, real git, real Docker with the simulated agent.
"""

from __future__ import annotations

import pytest
from cli_helpers import cli_env, run_cli
from conftest import TEST_IMAGE, make_repo

pytestmark = pytest.mark.docker
IMG = ["--docker-image", TEST_IMAGE]


def _out(r) -> str:
    return r.stdout[-3000:] + r.stderr[-3000:]


def test_doctor_for_a_dry_run_warns_about_missing_credentials_instead_of_failing(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, ANTHROPIC_API_KEY="", ORCHESTRATOR_CACHE_DIR=str(tmp_path / "cache"))
    dry = run_cli(["--doctor", "--dry-run", *IMG], cwd=repo, env=env, timeout=300)
    assert dry.returncode == 0, _out(dry)
    lines = dry.stdout.splitlines()
    assert not [line for line in lines if line.startswith("fail")], dry.stdout
    creds = [line for line in lines if "credentials for claude-code" in line]
    assert len(creds) == 1 and creds[0].startswith("warn") and "a dry run needs none" in creds[0], creds
    assert f"ok    orchestrator-sim-agent in {TEST_IMAGE}: present" in lines
    assert "checked what a dry run needs" in dry.stderr
    # A real run does need them: the same machine fails the plain doctor.
    real = run_cli(["--doctor", *IMG], cwd=repo, env=env, timeout=300)
    assert real.returncode == 1, _out(real)
    assert any(line.startswith("fail  credentials for claude-code") for line in real.stdout.splitlines())


def _env_with_default_folders(tmp_path):
    # The run folders follow the directory the command runs in, as for a user without ORCHESTRATOR_*_DIR.
    env = cli_env(tmp_path)
    for name in ("ORCHESTRATOR_LOGS_DIR", "ORCHESTRATOR_STATE_DIR", "ORCHESTRATOR_RESULTS_DIR"):
        env.pop(name)
    return env


def test_runs_are_found_where_they_were_written_and_cleanup_keeps_them_readable(tmp_path):
    repo = make_repo(tmp_path / "repo")
    started_in, elsewhere = tmp_path / "a", tmp_path / "b"
    started_in.mkdir()
    elsewhere.mkdir()
    env = _env_with_default_folders(tmp_path)
    r = run_cli(
        ["SIM: write f.txt x\nSIM: commit f", "--repo", str(repo), "--dry-run", "--quiet", *IMG],
        cwd=started_in,
        env=env,
    )
    assert r.returncode == 0, _out(r)
    (run_id,) = [p.name for p in (started_in / "orchestrator_state").iterdir()]

    # Without --repo the current folder is listed, and the command says so.
    here = run_cli(["--list-runs"], cwd=elsewhere, env=env)
    assert here.returncode == 0 and run_id not in here.stdout, _out(here)
    assert str(elsewhere / "orchestrator_state") in here.stdout + here.stderr
    # With --repo, the repository's runs wherever they were started.
    listed = run_cli(["--list-runs", "--repo", str(repo)], cwd=elsewhere, env=env)
    assert listed.returncode == 0, _out(listed)
    row = [line for line in listed.stdout.splitlines() if line.startswith(run_id)]
    assert len(row) == 1 and row[0].split()[1] == "completed", listed.stdout
    assert row[0].endswith(str(started_in / "orchestrator_state"))

    shown = run_cli(["--show-run", run_id], cwd=elsewhere, env=env)
    assert shown.returncode == 0, _out(shown)
    assert f"is under {started_in / 'orchestrator_state'}" in shown.stderr
    # The summary ends with what the run leaves and the command that removes what is safe to remove.
    assert "\nLeft behind: 1 branch, 1 stopped container and 1 volume\n" in shown.stdout, shown.stdout
    assert f"(the branches stay): orchestrator --cleanup-run {run_id}\n" in shown.stdout

    cleaned = run_cli(["--cleanup-run", run_id, "--repo", str(repo)], cwd=elsewhere, env=env)
    assert cleaned.returncode == 0, _out(cleaned)
    said = cleaned.stdout.strip().splitlines()[-1]
    assert (
        said.startswith("removed 1 container, ") and f"the state ({started_in / 'orchestrator_state' / run_id})" in said
    )
    assert f"kept the logs ({started_in / 'logs' / run_id}), the results ({started_in / 'results' / run_id})" in said
    assert "can no longer be resumed" in said
    assert not (started_in / "orchestrator_state" / run_id).exists()
    assert (started_in / "logs" / run_id / "events.jsonl").exists()

    html = run_cli(["--show-run", run_id, "--html"], cwd=elsewhere, env=env)
    assert html.returncode == 0, _out(html)
    report = started_in / "results" / run_id / "report.html"
    assert html.stdout.strip() == str(report) and report.stat().st_size > 0
    again = run_cli(["--show-run", run_id], cwd=started_in, env=env)
    assert again.returncode == 0, _out(again)
    assert "Cleaned up" in again.stdout and "Resume with" not in again.stdout
    assert "\nLeft behind: 1 branch, 0 stopped containers and 0 volumes\n" in again.stdout, again.stdout
    assert "(the branches stay): orchestrator --cleanup-run" not in again.stdout  # nothing left for it
    assert "1/1" in run_cli(["--list-runs"], cwd=started_in, env=env).stdout
    status = [line.split()[1] for line in run_cli(["--list-runs"], cwd=started_in, env=env).stdout.splitlines()[1:]]
    assert status == ["cleaned"]
    refused = run_cli(["--resume", run_id], cwd=started_in, env=env)
    assert refused.returncode == 2 and "cleaned up" in refused.stderr, _out(refused)
    assert len(refused.stderr.strip().splitlines()) == 1


def test_resume_from_another_folder_says_where_the_run_is(tmp_path):
    repo = make_repo(tmp_path / "repo")
    started_in, elsewhere = tmp_path / "a", tmp_path / "b"
    started_in.mkdir()
    elsewhere.mkdir()
    env = _env_with_default_folders(tmp_path)
    r = run_cli(["SIM: print hi", "--repo", str(repo), "--dry-run", "--quiet", *IMG], cwd=started_in, env=env)
    assert r.returncode == 0, _out(r)
    (run_id,) = [p.name for p in (started_in / "orchestrator_state").iterdir()]
    refused = run_cli(["--resume", run_id], cwd=elsewhere, env=env)
    assert refused.returncode == 2, _out(refused)
    assert f"cd {started_in} && orchestrator --resume {run_id}" in refused.stderr


def test_a_summary_says_which_engine_it_could_not_count_on(monkeypatch):
    import anyio

    from orchestrator.app.leftovers import count_leftovers, leftover_lines

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    counted = anyio.run(count_leftovers, "run_19990101_000000")
    assert counted["containers"] is None and counted["not_counted"].startswith("local: "), counted
    summary = {"run_id": "run_19990101_000000", "status": "completed", "leftovers": {"branches": 2, **counted}}
    assert leftover_lines(summary) == [
        "",
        f"Left behind: 2 branches; containers and volumes not counted ({counted['not_counted']})",
    ]
