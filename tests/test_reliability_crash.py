"""Crash torture: SIGKILL the real command at random moments, resume until done.

Every kill is followed by the same checks; at the end the run must equal an
uninterrupted reference run of the same command (branches compared by task
key without the run id, and by tree: commits carry timestamps), every key
completed exactly once in the log, no key that had durably completed before a
kill made the agent run again afterwards (the sim agent's own record), the
snapshot equals a replay and no container of the run is left running.

"Orphan" here means: a container of the run still RUNNING after the
orchestrator process has exited. Stopped containers are retained on purpose
(2 h for successes, longer for failures) so sessions can be inspected or
resumed; they are not orphans.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import strategy_args
from conftest import git, make_repo
from reliability_helpers import (
    IMG,
    agent_executions,
    check_log,
    check_snapshot_is_replay,
    cli_env,
    events_path,
    finish,
    manifest,
    normalized_branches,
    record,
    remove_run_docker,
    run_ids,
    run_volumes,
    running_containers,
    sigkill,
    start_cli,
    terminal_counts,
    wait_for,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

KILLS = int(os.environ.get("RELIABILITY_KILLS", "30"))
EVAL = (
    "python3 -c \"import glob,hashlib,json;f=sorted(glob.glob('sim/*.txt'));"
    "h=hashlib.sha256(''.join(f).encode()).hexdigest();"
    "print(json.dumps({'metrics':{'score':10+len(f)+int(h[:2],16)/1000}}))\""
)

CASES = {
    "best-of-n": (["implement the greeting", *strategy_args("best-of-n", n=4)], "best-of-n"),
    "tree-beam": (
        [
            "make it better",
            *strategy_args(
                "tree-beam", eval_command=EVAL, primary_metric="score", ideas_per_node=2, max_depth=2, beam_width=1
            ),
        ],
        "tree-beam",
    ),
}


def _kill_phase(tmp_path: Path, run_id: str | None) -> str:
    """Where the kill landed, from the last runner log line (informational, for the report)."""
    if run_id is None:
        return "startup"
    runner_log = tmp_path / "logs" / run_id / "runner.jsonl"
    lines = runner_log.read_bytes().splitlines() if runner_log.exists() else []
    for raw in reversed(lines):
        try:
            kind = json.loads(raw).get("message")
        except ValueError:
            continue
        if kind:
            if "exec.started" in kind or "agent" in kind or "container.ready" in kind:
                return "mid-container"
            if "exec.finished" in kind:
                return "mid-import"
            if "workspace" in kind:
                return "workspace/container start"
            return "after a task (snapshot/scheduling)"
    return "scheduling"


def _reference(tmp_path: Path, args: list[str], strategy: str) -> dict[str, str]:
    ref = tmp_path / "reference"
    repo = make_repo(ref / "repo")
    proc = start_cli([*args, "--dry-run", "--no-tui", *IMG], cwd=repo, env=cli_env(ref), out=ref / "out" / "ref")
    rc, _, err = finish(proc, ref / "out" / "ref")
    assert rc == 0, err
    (run_id,) = run_ids(ref)
    events = check_log(events_path(ref, run_id))
    trees = normalized_branches(repo, events, run_id, strategy)
    remove_run_docker(run_id)
    return trees


@pytest.mark.parametrize("case", sorted(CASES))
def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(case, tmp_path):
    args, strategy = CASES[case]
    expected = _reference(tmp_path, args, strategy)
    assert expected, "the reference run made no branches: nothing to compare"

    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    rng = random.Random(f"crash-{case}")
    run_id: str | None = None
    kills, phases, attempt = 0, {}, 0
    runs_finished, executions_total, keys_total = 0, 0, 0
    try:
        while True:
            attempt += 1
            before_done = set(terminal_counts(check_log(events_path(tmp_path, run_id)))) if run_id else set()
            before_exec = agent_executions(run_id) if run_id else {}
            cmd = ["--resume", run_id, "--no-tui"] if run_id else [*args, "--dry-run", "--no-tui", *IMG]
            out = tmp_path / "out" / f"p{attempt}"
            proc = start_cli(cmd, cwd=repo, env=env, out=out)
            if kills < KILLS:
                deadline = time.monotonic() + rng.uniform(0.5, 3.0)
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.02)
            if proc.poll() is None and kills < KILLS:
                sigkill(proc)
                kills += 1
                run_id = run_id or (run_ids(tmp_path) or [None])[0]
                phase = _kill_phase(tmp_path, run_id)
                phases[phase] = phases.get(phase, 0) + 1
            else:
                rc, _, err = finish(proc, out)
                assert rc == 0, f"process {attempt} exited {rc}: {err[-2000:]}"
                run_id = run_id or run_ids(tmp_path)[0]
                if kills >= KILLS:
                    break
            if run_id is None:
                continue  # killed before the run directory existed: nothing to resume, start again
            # after every process: the log is whole, and nothing durably finished ran again
            events = check_log(events_path(tmp_path, run_id))
            after_exec = agent_executions(run_id)
            rerun = {
                k: (before_exec.get(k, 0), after_exec.get(k, 0))
                for k in before_done
                if after_exec.get(k, 0) != before_exec.get(k, 0)
            }
            assert not rerun, f"process {attempt} ran the agent again for finished keys: {rerun}"
            assert set(terminal_counts(events).values()) <= {1}, terminal_counts(events)
            if manifest(tmp_path, run_id)["status"] == "completed":
                if kills >= KILLS:
                    break
                # finished before the kill budget ran out: keep killing a fresh run of the same command
                check_final(tmp_path, repo, run_id, strategy, expected)
                executions = agent_executions(run_id)
                runs_finished += 1
                executions_total += sum(executions.values())
                keys_total += len(executions)
                remove_run_docker(run_id)
                run_id = None
                repo = make_repo(tmp_path / f"repo{attempt}")
                for d in ("logs", "state", "results"):
                    (tmp_path / d).rename(tmp_path / f"{d}.done{attempt}")
        check_final(tmp_path, repo, run_id, strategy, expected)
        executions = agent_executions(run_id)
        record(
            "crash",
            case=case,
            kills_tried=kills,
            kills_survived=kills,
            processes=attempt,
            phases=phases,
            runs=runs_finished + 1,
            agent_executions=executions_total + sum(executions.values()),
            keys=keys_total + len(executions),
        )
    finally:
        for rid in {run_id, *run_ids(tmp_path)} - {None}:
            remove_run_docker(rid)


def check_final(tmp_path: Path, repo: Path, run_id: str, strategy: str, expected: dict[str, str]) -> None:
    events = check_log(events_path(tmp_path, run_id))
    counts = terminal_counts(events)
    assert set(counts.values()) == {1}, f"keys completed more than once: {[k for k, n in counts.items() if n > 1]}"
    assert normalized_branches(repo, events, run_id, strategy) == expected
    all_branches = git(repo, "branch", "--format=%(refname:short)").split()
    assert not [b for b in all_branches if b.rsplit("_", 1)[-1].isdigit() and b.count("_k")], all_branches
    check_snapshot_is_replay(tmp_path, run_id)
    assert running_containers(run_id) == [], "containers of the finished run are still running"
    summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
    assert summary["totals"]["completed"] == len(counts), (summary["totals"], len(counts))
    assert summary["status"] == "completed"


def test_a_runs_ending_is_written_after_its_summary_and_report(tmp_path):
    """run.json's ending is the run's last word. Written first, a SIGKILL before the summary left a
    run recorded as completed without its summary.json, half its unneeded branches deleted, and
    --resume saying it had finished (the torture above, 1 run in 3 alone on an emptied engine)."""
    repo = make_repo(tmp_path / "repo")
    out = tmp_path / "out"
    rc, _, err = finish(
        start_cli(["SIM: done", "--dry-run", "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path), out=out), out
    )
    assert rc == 0, err
    (run_id,) = run_ids(tmp_path)
    assert manifest(tmp_path, run_id)["status"] == "completed"
    ending = (tmp_path / "state" / run_id / "run.json").stat().st_mtime_ns
    for name in ("summary.json", "report.html"):
        assert (tmp_path / "results" / run_id / name).stat().st_mtime_ns <= ending, name


@pytest.mark.exclusive  # it bounds the product's own stopping time: 10.6 s against 10 on six loaded workers
def test_sigterm_and_sigint_interrupt_gracefully_and_a_second_sigint_exits_at_once(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    prompt = "SIM: write w.txt data\nSIM: commit work\nSIM: sleep 8\nSIM: print finished"
    for n, sig in enumerate((signal.SIGTERM, signal.SIGINT)):
        out = tmp_path / "out" / f"graceful{n}"
        cmd = ["--resume", run_ids(tmp_path)[0], "--no-tui"] if n else [prompt, "--runs", "2", "--no-tui", *IMG]
        proc = start_cli(cmd, cwd=repo, env=env, out=out)
        run_id = wait_for(lambda: run_ids(tmp_path) and run_ids(tmp_path)[0])
        wait_for(
            lambda run_id=run_id, n=n: (
                sum(e.type == "task.started" for e in check_log(events_path(tmp_path, run_id))) >= 2 * (n + 1)
            ),
            timeout=60,
        )
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(sig)
        rc, _, err = finish(proc, out, timeout=30)
        assert rc == 130, err
        assert time.monotonic() - t0 < 10
        assert f"Run interrupted. Resume with: orchestrator --resume {run_id}" in err
        check_log(events_path(tmp_path, run_id))
        check_snapshot_is_replay(tmp_path, run_id)
        assert running_containers(run_id) == []
    # a second Ctrl+C leaves at once; the log stays parseable and the run resumable
    out = tmp_path / "out" / "double"
    proc = start_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env, out=out)
    wait_for(lambda: sum(e.type == "task.started" for e in check_log(events_path(tmp_path, run_id))) >= 6, timeout=60)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc, _, err = finish(proc, out, timeout=30)
    assert rc == 130 and time.monotonic() - t0 < 3, err
    check_log(events_path(tmp_path, run_id))
    try:
        result = start_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env, out=tmp_path / "out" / "final")
        rc, _, err = finish(result, tmp_path / "out" / "final")
        assert rc == 0, err
        events = check_log(events_path(tmp_path, run_id))
        assert sorted(terminal_counts(events).values()) == [1, 1]
        check_snapshot_is_replay(tmp_path, run_id)
        assert running_containers(run_id) == []
        record("signals", signals_tried=3, signals_survived=3)
    finally:
        remove_run_docker(run_id)


AGENT_KILLS = int(os.environ.get("RELIABILITY_AGENT_KILLS", "8"))
# Three seconds of work, of which the kill lands 0.4-1.6 s after the test sees every
# agent at work: seeing that (reading each task's volume through `docker`) can take
# over a second on a loaded machine, and a run that finished before the kill ends
# the test one kill short.
AGENT_WORK = (
    "SIM: write a.txt one\nSIM: sleep 1\nSIM: append a.txt two\nSIM: sleep 2\nSIM: commit work\nSIM: print done"
)


def _agents_at_work(tmp_path: Path, run_id: str | None, before: Counter) -> bool:
    """Every unfinished task's agent has started an execution in this process (the sim agent's own record)."""
    if run_id is None:
        return False
    finished = set(terminal_counts(check_log(events_path(tmp_path, run_id))))
    now = agent_executions(run_id)
    working = [k for k in now if k not in finished and now[k] > before.get(k, 0)]
    waiting = [k for k in before if k not in finished and now[k] == before[k]]
    return len(working) + len(finished) == 3 and not waiting


def test_sigkill_during_the_agents_work_never_starts_a_tasks_session_twice(tmp_path):
    """Kill -9 while agents work; every resume continues each task's own session in its kept workspace."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    rng = random.Random("crash-agent")
    run_id: str | None = None
    kills = attempt = 0
    try:
        while True:
            attempt += 1
            before = agent_executions(run_id) if run_id else Counter()
            cmd = (
                ["--resume", run_id, "--no-tui"]
                if run_id
                else [AGENT_WORK, "--runs", "3", "--max-parallel", "3", "--no-tui", *IMG]
            )
            out = tmp_path / "out" / f"p{attempt}"
            proc = start_cli(cmd, cwd=repo, env=env, out=out)
            run_id = run_id or wait_for(lambda: run_ids(tmp_path) and run_ids(tmp_path)[0])
            killed = False
            if kills < AGENT_KILLS:
                while proc.poll() is None and not _agents_at_work(tmp_path, run_id, before):
                    time.sleep(0.02)
                time.sleep(rng.uniform(0.4, 1.6))  # somewhere in the agents' three seconds of work
                if proc.poll() is None:
                    sigkill(proc)
                    kills += 1
                    killed = True
            if not killed:
                rc, _, err = finish(proc, out)
                assert rc == 0, f"process {attempt} exited {rc}: {err[-2000:]}"
                if manifest(tmp_path, run_id)["status"] == "completed":
                    break
        events = check_log(events_path(tmp_path, run_id))
        counts = terminal_counts(events)
        assert len(counts) == 3 and set(counts.values()) == {1}, counts
        per_key: dict[str, list[dict]] = {}
        for volume in run_volumes(run_id):
            mount = subprocess.run(
                ["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", volume], capture_output=True, text=True
            ).stdout.strip()
            record_file = Path(mount) / ".sim-agent" / "executions.jsonl"
            for line in record_file.read_text().splitlines() if record_file.exists() else []:
                entry = json.loads(line)
                per_key.setdefault(entry["task_key"], []).append(entry)
        assert set(per_key) == set(counts), (sorted(per_key), sorted(counts))
        fresh = {k: sum(not x["resumed"] for x in xs) for k, xs in per_key.items()}
        assert set(fresh.values()) == {1}, f"a task's agent session was started more than once: {fresh}"
        assert all(len({x["session_id"] for x in xs}) == 1 for xs in per_key.values()), per_key
        resumed = sum(x["resumed"] for xs in per_key.values() for x in xs)
        assert kills == AGENT_KILLS and resumed >= 1, (kills, resumed)
        for e in events:
            if e.type == "task.completed":
                branch = e.payload["artifact"]["branch_final"]
                assert git(repo, "show", f"{branch}:a.txt") == "one\ntwo"
        check_snapshot_is_replay(tmp_path, run_id)
        assert running_containers(run_id) == []
        record(
            "crash-agent",
            kills_tried=kills,
            kills_survived=kills,
            processes=attempt,
            tasks=len(counts),
            agent_executions=sum(len(xs) for xs in per_key.values()),
            fresh_sessions=sum(fresh.values()),
            resumed_executions=resumed,
        )
    finally:
        for rid in {run_id, *run_ids(tmp_path)} - {None}:
            remove_run_docker(rid)
