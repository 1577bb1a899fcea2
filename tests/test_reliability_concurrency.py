"""Concurrent processes: one writer per run, and runs that share a repository do not interfere."""

from __future__ import annotations

import json
import signal
import time

import pytest
from conftest import git, make_repo
from reliability_helpers import (
    IMG,
    check_log,
    check_snapshot_is_replay,
    cli_env,
    events_path,
    finish,
    record,
    remove_run_docker,
    run_ids,
    running_containers,
    start_cli,
    terminal_counts,
    wait_for,
)

pytestmark = pytest.mark.docker
SLOW_TASK = "SIM: write w.txt data\nSIM: commit work\nSIM: sleep 3\nSIM: print finished"


def _interrupted_run(tmp_path, repo, env) -> str:
    out = tmp_path / "out" / "first"
    proc = start_cli([SLOW_TASK, "--runs", "2", "--no-tui", *IMG], cwd=repo, env=env, out=out)
    run_id = wait_for(lambda: run_ids(tmp_path) and run_ids(tmp_path)[0])
    wait_for(lambda: sum(e.type == "task.started" for e in check_log(events_path(tmp_path, run_id))) == 2)
    proc.send_signal(signal.SIGINT)
    rc, _, err = finish(proc, out, timeout=30)
    assert rc == 130, err
    return run_id


@pytest.mark.parametrize("stagger", [0.0, 1.0])
def test_two_resumes_of_one_run_at_once_the_second_is_refused(stagger, tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    run_id = _interrupted_run(tmp_path, repo, env)
    try:
        a = start_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env, out=tmp_path / "out" / "a")
        time.sleep(stagger)
        b = start_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env, out=tmp_path / "out" / "b")
        results = [finish(a, tmp_path / "out" / "a"), finish(b, tmp_path / "out" / "b")]
        codes = sorted(rc for rc, _, _ in results)
        assert codes == [0, 2], [(rc, err[-1500:]) for rc, _, err in results]
        _rc, _, err = next(r for r in results if r[0] == 2)
        # one error line, no traceback (a loser that started at the same instant may have
        # printed the informational "Resuming ..." line before the log lock refused it)
        errors = [ln for ln in err.strip().splitlines() if ln.startswith("orchestrator: error: ")]
        assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
        assert run_id in errors[0] and ("live process" in errors[0] or "in use" in errors[0]), errors[0]
        events = check_log(events_path(tmp_path, run_id))
        assert sorted(terminal_counts(events).values()) == [1, 1]
        check_snapshot_is_replay(tmp_path, run_id)
        manifest = json.loads((tmp_path / "state" / run_id / "run.json").read_text())
        assert manifest["status"] == "completed" and manifest["exit_code"] == 0
        assert running_containers(run_id) == []
        record("concurrency", case=f"two resumes at once (stagger {stagger}s)", survived=1)
    finally:
        remove_run_docker(run_id)


def test_two_runs_on_one_repository_at_once_do_not_interfere(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)  # same directory, same second: the run ids must still differ
    procs = []
    for name in ("one", "two"):
        prompt = f"SIM: write {name}.txt {name}\nSIM: commit {name}\nSIM: sleep 1\nSIM: print {name}"
        procs.append(
            (name, start_cli([prompt, "--runs", "2", "--no-tui", *IMG], cwd=repo, env=env, out=tmp_path / "out" / name))
        )
    all_branches = []
    try:
        for name, proc in procs:
            rc, _, err = finish(proc, tmp_path / "out" / name)
            assert rc == 0, err
        ids = run_ids(tmp_path)
        assert len(ids) == 2
        for run_id in ids:
            manifest = json.loads((tmp_path / "state" / run_id / "run.json").read_text())
            name = manifest["prompt"].split(".txt")[0].split()[-1]
            events = check_log(events_path(tmp_path, run_id))
            assert sorted(terminal_counts(events).values()) == [1, 1]
            check_snapshot_is_replay(tmp_path, run_id)
            summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
            assert len(summary["branches"]) == 2
            for b in summary["branches"]:
                assert git(repo, "show", f"{b}:{name}.txt") == name
            all_branches += summary["branches"]
        assert len(set(all_branches)) == 4
        assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main" and git(repo, "status", "--porcelain") == ""
        record("concurrency", case="two runs on one repository", survived=1)
    finally:
        for rid in run_ids(tmp_path):
            remove_run_docker(rid)
