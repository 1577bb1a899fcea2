"""The real ``orchestrator`` command end to end: real Docker, real git, the sim agent."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time

import cli_helpers
import pytest
from cli_helpers import ORCH, TEST_KEY, only_run_id, run_cli, wait_for
from conftest import TEST_IMAGE, git, make_repo

from orchestrator.log.eventlog import read_events
from orchestrator.log.state import encode_snapshot, replay
from orchestrator.naming import ghash, session_volume_name

pytestmark = pytest.mark.docker
IMG = ["--docker-image", TEST_IMAGE]


def cli_env(tmp_path, **extra):
    """The user's default: tasks online, on the engine's bridge network (the other files run theirs offline)."""
    return cli_helpers.cli_env(tmp_path, **{"ORCHESTRATOR_RUNNER__NETWORK_EGRESS": "online", **extra})


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo")


def all_output_files(tmp_path):
    for d in ("logs", "state", "results"):
        yield from (p for p in (tmp_path / d).rglob("*") if p.is_file())


def test_full_run_with_two_executions(tmp_path, repo):
    prompt = "SIM: write feature.txt hello\nSIM: commit add feature\nSIM: exec echo $ANTHROPIC_API_KEY\nSIM: print done"
    result = run_cli([prompt, "--runs", "2", "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path))
    assert result.returncode == 0, result.stderr
    run_id = only_run_id(tmp_path)
    events = list(read_events(tmp_path / "logs" / run_id / "events.jsonl"))
    assert [e.type for e in events].count("task.completed") == 2
    assert [e.type for e in events].count("strategy.completed") == 2
    state_bytes = (tmp_path / "state" / run_id / "state.json").read_bytes()
    assert state_bytes == encode_snapshot(replay(tmp_path / "logs" / run_id / "events.jsonl", run_id=run_id))
    summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
    assert summary["totals"]["completed"] == 2 and summary["status"] == "completed"
    branches = (tmp_path / "results" / run_id / "branches.txt").read_text().split()
    assert len(branches) == 2 and branches == summary["final_branches"]
    for b in branches:
        assert git(repo, "show", f"{b}:feature.txt") == "hello"
    metrics = (tmp_path / "results" / run_id / "metrics.csv").read_text().splitlines()
    assert metrics[0].startswith("timestamp,key") and len(metrics) == 3
    assert "Run Complete" in result.stdout and f"git merge {branches[0]}" in result.stdout
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    logs = tmp_path / "logs" / run_id
    for name in ("orchestration.jsonl", "runner.jsonl", "tui.jsonl"):  # component logs, one JSON object per line
        lines = [json.loads(line) for line in (logs / name).read_text().splitlines()]
        assert lines and all({"timestamp", "component", "level", "run_id", "message"} <= set(x) for x in lines)
    for path in all_output_files(tmp_path):
        assert TEST_KEY not in path.read_text(errors="replace"), path
    assert TEST_KEY not in result.stdout + result.stderr


def test_prompt_reaches_the_agent_byte_for_byte(tmp_path, repo):
    prompt = "Say \"hi\" and 'bye'\n\ttabs, $HOME, `backticks`, emoji 🚀🧪, ünïcödé\n" + ("0123456789abcdef" * 6400)
    assert len(prompt.encode()) > 100_000
    result = run_cli([prompt, "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path))
    assert result.returncode == 0, result.stderr
    run_id = only_run_id(tmp_path)
    volume = session_volume_name(run_id, ghash(f"{run_id}/s1/task"))
    record = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{volume}:/h", TEST_IMAGE, "cat", "/h/.sim-agent/executions.jsonl"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    executions = [json.loads(line) for line in record.splitlines()]
    assert [e["prompt_sha256"] for e in executions] == [hashlib.sha256(prompt.encode()).hexdigest()]
    subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)


def test_failed_strategy_exits_1_with_the_failure_in_the_summary(tmp_path, repo):
    result = run_cli(["SIM: fail 3 the agent gave up", "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path))
    assert result.returncode == 1, result.stderr
    assert "Failed" in result.stdout and "strategy failed" in result.stdout
    summary = json.loads((tmp_path / "results" / only_run_id(tmp_path) / "summary.json").read_text())
    assert summary["strategies"][0]["status"] == "failed" and summary["totals"]["failed"] == 1


def test_dry_run_needs_no_credentials_and_says_so(tmp_path, repo):
    result = run_cli(
        ["add a greeting", "--dry-run", "--no-tui", *IMG], cwd=repo, env=cli_env(tmp_path, ANTHROPIC_API_KEY="")
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("DRY RUN")
    summary = json.loads((tmp_path / "results" / only_run_id(tmp_path) / "summary.json").read_text())
    assert summary["dry_run"] is True and len(summary["branches"]) == 1
    assert git(repo, "ls-tree", "-r", "--name-only", summary["branches"][0]).count("sim/") == 1


@pytest.mark.exclusive  # it bounds the product's own stopping time: 10.2 s against 10 on six loaded workers
def test_sigint_interrupts_and_resume_finishes_without_duplicates(tmp_path, repo):
    env = cli_env(tmp_path)
    prompt = "SIM: write work.txt data\nSIM: commit work\nSIM: sleep 6\nSIM: print finished"
    proc = subprocess.Popen(
        [ORCH, prompt, "--runs", "3", "--max-parallel", "3", "--no-tui", *IMG],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def started():
        state = tmp_path / "state"
        runs = [p.name for p in state.iterdir()] if state.exists() else []
        if not runs:
            return None
        path = tmp_path / "logs" / runs[0] / "events.jsonl"
        n = sum(1 for e in read_events(path) if e.type == "task.started") if path.exists() else 0
        return runs[0] if n == 3 else None

    run_id = wait_for(started)

    def agents_reported_their_sessions():
        path = tmp_path / "logs" / run_id / "events.jsonl"
        return sum(1 for e in read_events(path) if e.type == "task.session") == 3

    # the agents are mid-run (on a loaded machine 1.5 s after task.started was sometimes before they began)
    wait_for(agents_reported_their_sessions, timeout=120)
    time.sleep(0.5)
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.time() - t0 < 10
    assert f"Resume with: orchestrator --resume {run_id}" in err
    events_path = tmp_path / "logs" / run_id / "events.jsonl"
    events = list(read_events(events_path))
    assert [e.type for e in events].count("task.interrupted") == 3
    state = json.loads((tmp_path / "state" / run_id / "state.json").read_text())
    assert {t["state"] for t in state["tasks"]} == {"INTERRUPTED"}
    assert all(t["interrupted_at"] for t in state["tasks"])
    running = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
    ).stdout.split()
    assert running == []
    manifest = json.loads((tmp_path / "state" / run_id / "run.json").read_text())
    assert manifest["status"] == "interrupted"

    result = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env)
    assert result.returncode == 0, result.stderr
    said = f"Resuming {run_id}: 0 tasks already finished stay as they are; 3 tasks resume their agent sessions."
    assert said in result.stderr
    # only what is new is printed: the earlier run's [STARTED]/[INTERRUPTED] lines are not shown again
    assert "[INTERRUPTED]" not in result.stdout, result.stdout
    assert result.stdout.count("[STARTED]") == 3 and result.stdout.count("[COMPLETED]") == 3, result.stdout
    events = list(read_events(events_path))
    sessions = {e.key: e.payload.get("session_id") for e in events if e.type == "task.interrupted"}
    assert all(sessions.values()), sessions  # the agent sessions were captured at interruption
    resumed = {
        e.key: e.payload.get("session_id")
        for e in events
        if e.type == "task.started"
        and e.start_offset > max(x.start_offset for x in events if x.type == "task.interrupted")
    }
    assert resumed == sessions  # each task resumed its own agent session
    completed = [e.key for e in events if e.type == "task.completed"]
    assert len(completed) == 3 and len(set(completed)) == 3
    branches = sorted(json.loads((tmp_path / "results" / run_id / "summary.json").read_text())["branches"])
    assert len(branches) == 3 and all(b.startswith(f"simple_{run_id}_k") for b in branches)
    assert not any(b.endswith(("_2", "_3")) for b in git(repo, "branch", "--format=%(refname:short)").split())

    # resuming a finished run does nothing and changes nothing; it says so and shows the summary
    before = events_path.read_bytes()
    again = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env)
    assert again.returncode == 0
    assert f"Run {run_id} already finished" in again.stderr and "nothing to resume" in again.stderr
    assert "Resuming" not in again.stderr
    assert "[STARTED]" not in again.stdout and "[COMPLETED]" not in again.stdout, again.stdout
    assert all(b in again.stdout for b in branches), again.stdout
    after = list(read_events(events_path))
    assert [e.type for e in after if e.start_offset >= len(before)] == []


def test_management_commands(tmp_path, repo):
    env = cli_env(tmp_path)
    result = run_cli(["SIM: write x.txt 1\nSIM: commit x", "--no-tui", *IMG], cwd=repo, env=env)
    assert result.returncode == 0, result.stderr
    run_id = only_run_id(tmp_path)
    listed = run_cli(["--list-runs"], cwd=repo, env=env)
    assert listed.returncode == 0 and run_id in listed.stdout and "completed" in listed.stdout
    shown = run_cli(["--show-run", run_id], cwd=repo, env=env)
    assert shown.returncode == 0 and f"simple_{run_id}_k" in shown.stdout
    dry = run_cli(["--clean-containers", "--dry-run"], cwd=repo, env=env)
    assert dry.returncode == 0
    names = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
    ).stdout.split()
    assert len(names) == 1  # kept (stopped) for retention; dry run removed nothing
    cleaned = run_cli(["--cleanup-run", run_id], cwd=repo, env=env)
    assert cleaned.returncode == 0, cleaned.stderr
    assert (
        subprocess.run(
            ["docker", "ps", "-a", "-q", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
        ).stdout.split()
        == []
    )
    volumes = subprocess.run(
        # "_g" ends the run id: a name filter matches any part of a name, and another
        # test's run started in the same second is run_id + "_2".
        ["docker", "volume", "ls", "-q", "--filter", f"name=orc_home_{run_id}_g"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert volumes == []
    assert not (tmp_path / "state" / run_id).exists()
    # What cleanup kept (logs, results) is still shown; the run is no longer resumable.
    kept = run_cli(["--show-run", run_id], cwd=repo, env=env)
    assert kept.returncode == 0 and "Cleaned up" in kept.stdout and "Resume with" not in kept.stdout
    assert run_cli(["--resume", run_id], cwd=repo, env=env).returncode == 2
    helped = run_cli(["--help-strategy", "simple"], cwd=repo, env=env)
    assert helped.returncode == 0 and "import_policy" in helped.stdout


@pytest.mark.slow
@pytest.mark.exclusive  # a bound on the product's own time: measured alone, not beside five other workers
def test_ctrl_c_with_20_running_containers_exits_130_within_10s(tmp_path, repo):
    env = cli_env(tmp_path)
    proc = subprocess.Popen(
        [ORCH, "SIM: sleep 60", "--runs", "20", "--max-parallel", "20", "--no-tui", *IMG],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def all_running():
        state = tmp_path / "state"
        runs = [p.name for p in state.iterdir()] if state.exists() else []
        if not runs:
            return None
        out = subprocess.run(
            ["docker", "ps", "-q", "--filter", f"label=run_id={runs[0]}"], capture_output=True, text=True
        ).stdout.split()
        path = tmp_path / "logs" / runs[0] / "runner.jsonl"
        execs = path.read_text().count('"runner.exec.started"') if path.exists() else 0
        return runs[0] if len(out) == 20 and execs == 20 else None

    try:
        run_id = wait_for(all_running, timeout=120, interval=0.3)
        t0 = time.time()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        elapsed = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert elapsed < 10, f"took {elapsed:.1f}s"
    events = list(read_events(tmp_path / "logs" / run_id / "events.jsonl"))
    assert [e.type for e in events].count("task.interrupted") == 20
    assert (
        subprocess.run(
            ["docker", "ps", "-q", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
        ).stdout.split()
        == []
    )
    names = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
    ).stdout.split()
    subprocess.run(["docker", "rm", "-f", *names], capture_output=True)


def _start_and_interrupt(tmp_path, repo, env, args, n_tasks):
    proc = subprocess.Popen([ORCH, *args], cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def started():
        state = tmp_path / "state"
        runs = [p.name for p in state.iterdir()] if state.exists() else []
        path = tmp_path / "logs" / runs[0] / "events.jsonl" if runs else None
        if path is None or not path.exists():
            return None
        return runs[0] if sum(1 for e in read_events(path) if e.type == "task.started") == n_tasks else None

    run_id = wait_for(started)
    # the agents are mid-task: they wrote their file (so their sessions are known)
    wait_for(lambda: len(list((tmp_path / "ws" / run_id).glob("*/work.txt"))) == n_tasks)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    return run_id


def test_resume_keeps_the_configuration_recorded_when_the_run_started(tmp_path, repo):
    (repo / "orchestrator.yaml").write_text("runner:\n  container_memory: 1g\n  max_turns: 5\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "orchestrator config")
    # The environment stands in for a code default of the version that started the run:
    # at resume it is gone, as a default changed by an upgrade would be.
    env = cli_env(tmp_path, ORCHESTRATOR_RUNNER__CONTAINER_CPU="1")
    prompt = "SIM: write work.txt data\nSIM: commit work\nSIM: sleep 8\nSIM: print finished"
    run_id = _start_and_interrupt(tmp_path, repo, env, [prompt, "--runs", "2", "--no-tui", *IMG], 2)
    events_path = tmp_path / "logs" / run_id / "events.jsonl"
    scheduled = {
        e.key: e.payload["task_fingerprint_hash"] for e in read_events(events_path) if e.type == "task.scheduled"
    }
    assert len(scheduled) == 2

    # Between run and resume: everything that shapes a task's input changes.
    (repo / "orchestrator.yaml").write_text(
        "runner:\n  container_memory: 2g\n  max_turns: 9\n  network_egress: offline\n"
        "orchestration:\n  import_policy: never\n"
    )
    del env["ORCHESTRATOR_RUNNER__CONTAINER_CPU"]
    manifest_path = tmp_path / "state" / run_id / "run.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["config"]["runner"]["container_cpu"] == 1  # recorded fully resolved, defaults included
    assert manifest["config"]["orchestration"]["import_policy"] == "auto"
    manifest["config"]["runner"]["option_of_an_older_version"] = True  # a key this version no longer knows
    del manifest["config"]["runner"]["failure_retention_hours"]  # a key added since: takes its default
    manifest_path.write_text(json.dumps(manifest))

    before = events_path.read_bytes()
    for flags, named in (
        (["--model", "opus"], "--model"),
        (["-S", "import_policy=never"], "-S"),
        (["--config", str(repo / "orchestrator.yaml")], "--config"),
        (["--docker-image", TEST_IMAGE], "--docker-image"),
        (["--dry-run"], "--dry-run"),
    ):
        refused = run_cli(["--resume", run_id, "--no-tui", *flags], cwd=repo, env=env)
        assert refused.returncode == 2, (flags, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and "--max-parallel" in lines[0], lines
    assert events_path.read_bytes() == before  # refused before anything was written

    result = run_cli(["--resume", run_id, "--no-tui", "--max-parallel", "1", "--debug"], cwd=repo, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "KeyConflict" not in result.stderr + result.stdout
    note = [line for line in result.stderr.splitlines() if line.startswith("note: the run keeps")]
    assert len(note) == 1 and "runner.container_memory" in note[0] and "orchestration.import_policy" in note[0]
    assert "runner.container_cpu" in note[0]  # the changed "default"
    # flags given at the start are the same sources, not changes
    assert "orchestration.runs" not in note[0] and "runner.docker_image" not in note[0], note
    events = list(read_events(events_path))
    assert {e.key: e.payload["task_fingerprint_hash"] for e in events if e.type == "task.scheduled"} == scheduled
    assert sorted(e.key for e in events if e.type == "task.completed") == sorted(scheduled)  # once each
    resumed = {
        e.key: e.payload.get("session_id") for e in events if e.type == "task.started" and e.start_offset >= len(before)
    }
    interrupted = {e.key: e.payload.get("session_id") for e in events if e.type == "task.interrupted"}
    assert len(resumed) == 2 and resumed == interrupted  # each continued the session it had (when one was seen)
    summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
    assert len(summary["branches"]) == 2 and summary["status"] == "completed"
    assert json.loads(manifest_path.read_text())["max_parallel"] == 1
