"""A corrupt line in the middle of a run's event log is reported by --show-run and --resume
(real command, real git, real Docker with the simulated agent)."""

from __future__ import annotations

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import make_repo

pytestmark = pytest.mark.docker


def test_show_run_and_resume_say_a_middle_line_was_skipped(tmp_path):
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    env = cli_env(tmp_path)
    done = run_cli(["SIM: write b.txt b", "--repo", str(repo), "--dry-run", "--no-tui"], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run_id = only_run_id(tmp_path)
    events = tmp_path / "logs" / run_id / "events.jsonl"
    lines = events.read_bytes().splitlines(keepends=True)
    assert len(lines) > 4
    bad_at = sum(len(x) for x in lines[:2])
    lines[2] = b"\x00garbage from a bad disk\n"
    events.write_bytes(b"".join(lines))

    shown = run_cli(["--show-run", run_id], cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr[-2000:]
    warning = [line for line in shown.stderr.splitlines() if "not events and were skipped" in line]
    assert len(warning) == 1 and f"first at byte {bad_at}" in warning[0] and str(events) in warning[0]
    assert "Traceback" not in shown.stderr

    resumed = run_cli(["--resume", run_id, "--no-tui"], cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"1 line(s) are not events and were skipped, first at byte {bad_at}" in resumed.stderr
    assert "already finished" in resumed.stderr
