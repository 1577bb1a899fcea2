"""Shared checks for the reliability suites (tests/test_reliability_*.py).

Every suite drives the real ``orchestrator`` command (real Docker, real git,
the sim agent) and then asks the same questions of what it left behind: is
the event log whole, does state.json equal a replay, which keys completed how
often, how often did the agent itself run per key (the sim agent's own record
in each session volume), which branches exist with which trees, and is any
container of the run still running after the process exited.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from cli_helpers import ORCH, cli_env, run_cli, wait_for  # noqa: F401  (re-exported for the suites)
from conftest import TEST_IMAGE, git

from orchestrator.log.eventlog import iter_lines
from orchestrator.log.events import decode_line
from orchestrator.log.state import encode_snapshot, replay
from orchestrator.naming import safe_component

IMG = ["--docker-image", TEST_IMAGE]


# ---------------------------------------------------------------- processes


def start_cli(args: list[str], *, cwd: Path, env: dict[str, str], out: Path) -> subprocess.Popen:
    """Start the command with stdout/stderr in files (a killed process never blocks a pipe)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [ORCH, *args],
        cwd=cwd,
        env=env,
        stdout=open(out.with_suffix(".out"), "wb"),
        stderr=open(out.with_suffix(".err"), "wb"),
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, out: Path, timeout: float = 180) -> tuple[int, str, str]:
    rc = proc.wait(timeout=timeout)
    return rc, out.with_suffix(".out").read_text(errors="replace"), out.with_suffix(".err").read_text(errors="replace")


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL the orchestrator process only (not its process group: that is what a crash looks like)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def run_ids(tmp_path: Path) -> list[str]:
    state = tmp_path / "state"
    return sorted(p.name for p in state.iterdir() if (p / "run.json").exists()) if state.exists() else []


def manifest(tmp_path: Path, run_id: str) -> dict:
    return json.loads((tmp_path / "state" / run_id / "run.json").read_text())


# ---------------------------------------------------------------- the log and the snapshot


def events_path(tmp_path: Path, run_id: str) -> Path:
    return tmp_path / "logs" / run_id / "events.jsonl"


def check_log(path: Path) -> list:
    """Every complete line decodes, carries its own start offset, and that offset seeks to it."""
    if not path.exists():
        return []
    out = []
    with open(path, "rb") as fh:
        for offset, line in iter_lines(path):
            fh.seek(offset)
            assert fh.readline() == line, f"offset {offset} does not seek to its line"
            event = decode_line(line)
            assert event.start_offset == offset, (event.start_offset, offset)
            out.append(event)
    return out


def check_snapshot_is_replay(tmp_path: Path, run_id: str) -> None:
    state_bytes = (tmp_path / "state" / run_id / "state.json").read_bytes()
    assert state_bytes == encode_snapshot(replay(events_path(tmp_path, run_id), run_id=run_id))


def terminal_counts(events) -> Counter:
    """task.completed per key (a key listed twice was paid for twice)."""
    return Counter(e.key for e in events if e.type == "task.completed")


# ---------------------------------------------------------------- docker


# Runs on test engines: no free-disk floor (the machine's disk may be small), agents offline.
NO_DISK_MIN = {
    "ORCHESTRATOR_ORCHESTRATION__HARD_MIN_FREE_DISK_GB": "0",
    "ORCHESTRATOR_ORCHESTRATION__MIN_FREE_DISK_GB": "0",
    "ORCHESTRATOR_RUNNER__NETWORK_EGRESS": "offline",
}


def docker(url: str | None, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``docker [-H url] args...``, its output captured as text (``url`` None: the local engine)."""
    return subprocess.run(["docker", *(["-H", url] if url else []), *args], capture_output=True, text=True, check=check)


def host_containers(url: str | None, run_id: str) -> list[dict]:
    """``docker inspect`` of every container of ``run_id`` on the engine at ``url``."""
    names = docker(url, "ps", "-aq", "--filter", f"label=run_id={run_id}").stdout.split()
    return json.loads(docker(url, "inspect", *names).stdout) if names else []


def remove_run(url: str | None, run_id: str) -> None:
    """Remove the containers and volumes labelled with ``run_id`` from the engine at ``url``: the machine is shared."""
    names = docker(url, "ps", "-aq", "--filter", f"label=run_id={run_id}").stdout.split()
    if names:
        docker(url, "rm", "-f", *names)
    volumes = docker(url, "volume", "ls", "-q", "--filter", f"label=run_id={run_id}").stdout.split()
    if volumes:
        docker(url, "volume", "rm", "-f", *volumes)


def running_containers(run_id: str) -> list[str]:
    """Containers of the run that are RUNNING: after the process has exited, these are orphans."""
    return docker(None, "ps", "-q", "--filter", f"label=run_id={run_id}").stdout.split()


def all_containers(run_id: str) -> list[str]:
    return docker(None, "ps", "-a", "--format", "{{.Names}}", "--filter", f"label=run_id={run_id}").stdout.split()


def run_volumes(run_id: str) -> list[str]:
    prefix = f"orc_home_{safe_component(run_id)}_g"
    return [
        v
        for v in docker(None, "volume", "ls", "-q", "--filter", f"name={prefix}").stdout.split()
        if v.startswith(prefix)
    ]


_MOUNTS: dict[str, str] = {}


def agent_executions(run_id: str) -> Counter:
    """Agent executions per task key, from the sim agent's own record in every session volume.

    The volumes are local (we are root on the Docker host), so the record is read
    from the volume's mount point instead of starting a container per volume.
    """
    counts: Counter = Counter()
    for volume in run_volumes(run_id):
        # A volume's mount point never changes: asked once, as the crash tests poll this.
        mount = _MOUNTS.get(volume) or _MOUNTS.setdefault(
            volume, docker(None, "volume", "inspect", "-f", "{{.Mountpoint}}", volume).stdout.strip()
        )
        record = Path(mount) / ".sim-agent" / "executions.jsonl"
        if not record.exists():
            continue
        for line in record.read_text().splitlines():
            if line.strip():
                counts[json.loads(line).get("task_key")] += 1
    return counts


def remove_run_docker(run_id: str) -> None:
    """Tests clean up after themselves: the machine is shared."""
    names = all_containers(run_id)
    if names:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True)
    volumes = run_volumes(run_id)
    if volumes:
        subprocess.run(["docker", "volume", "rm", "-f", *volumes], capture_output=True)


# ---------------------------------------------------------------- git


def branches(repo: Path, prefix: str = "") -> dict[str, str]:
    """Branch name -> tree id (commit ids differ between runs; trees must not)."""
    out = git(repo, "for-each-ref", "--format=%(refname:short) %(objectname)", f"refs/heads/{prefix}*")
    result = {}
    for line in out.splitlines():
        name, _ = line.split(" ", 1)
        result[name] = git(repo, "rev-parse", f"{name}^{{tree}}")
    return result


def normalized_branches(repo: Path, events, run_id: str, strategy: str) -> dict[str, str]:
    """Branches of one run keyed by task key without the run id: comparable across runs."""
    trees = branches(repo, f"{safe_component(strategy)}_{safe_component(run_id)}_")
    by_branch = {}
    for e in events:
        if e.type == "task.completed":
            final = (e.payload.get("artifact") or {}).get("branch_final")
            if final:
                by_branch[final] = e.key.split("/", 1)[1]
    # tree-beam's after-run hook deletes the rejected candidates' branches it listed
    results = repo.parent / "results" / run_id / "strategy_output"
    listed = results / "delete_branches.txt"
    deleted = (
        {ln.split(" ", 1)[0] for ln in listed.read_text().splitlines() if ln.strip()} if listed.exists() else set()
    )
    assert set(trees) == set(by_branch) - deleted, (sorted(trees), sorted(by_branch), sorted(deleted))
    return {by_branch[name]: tree for name, tree in trees.items()}


# ---------------------------------------------------------------- the counts report


def record(suite: str, **counts) -> None:
    """Append this test's counts for bench/reliability_report.py (only when it asks for them)."""
    target = os.environ.get("RELIABILITY_REPORT")
    if target:
        with open(target, "a") as fh:
            fh.write(json.dumps({"suite": suite, **counts}) + "\n")


def wait_run_started(proc: subprocess.Popen, out: Path, tmp_path: Path, timeout: float = 300) -> str:
    """The id of the run ``proc`` started (it must still be running meanwhile)."""

    def started():
        assert proc.poll() is None, out.with_suffix(".err").read_text()
        return run_ids(tmp_path) and run_ids(tmp_path)[0]

    return wait_for(started, timeout=timeout)


def interrupt_when_sessions_known(
    proc: subprocess.Popen, out: Path, tmp_path: Path, run_id: str, tasks: int, timeout: float = 300
) -> list:
    """Ctrl+C once ``tasks`` tasks have started and their agents announced a session;
    the run must stop resumably (exit 130). Returns the run's events."""

    def sessions_known():
        events = check_log(events_path(tmp_path, run_id))
        log = tmp_path / "logs" / run_id / "runner.jsonl"
        text = log.read_text() if log.exists() else ""
        return len([e for e in events if e.type == "task.started"]) == tasks and text.count('"runner.init"') >= tasks

    wait_for(sessions_known, timeout=timeout, interval=0.5)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    rc, _, err = finish(proc, out, timeout=120)
    assert rc == 130, err
    return check_log(events_path(tmp_path, run_id))


def interrupted_run_on_two_hosts(tmp_path, repo, engine, env):
    """Two tasks, one per engine (``engine``: a private one), interrupted mid-agent. Returns (run_id, key -> host)."""
    prompt = "SIM: write a.txt $TASK\nSIM: commit a\nSIM: sleep 30\nSIM: print done"
    out = tmp_path / "out" / "first"
    proc = start_cli(
        [
            prompt,
            "--runs",
            "2",
            "--no-tui",
            "--docker-image",
            engine.image,
            "--docker-host",
            "local=local:1",
            "--docker-host",
            f"b={engine.url}:1",
        ],
        cwd=repo,
        env=env,
        out=out,
    )

    run_id = wait_run_started(proc, out, tmp_path)
    events = interrupt_when_sessions_known(proc, out, tmp_path, run_id, tasks=2, timeout=180)
    hosts = {e.key: e.payload["host"] for e in events if e.type == "task.started"}
    assert sorted(hosts.values()) == ["b", "local"]
    interrupted = [e for e in events if e.type == "task.interrupted"]
    assert len(interrupted) == 2 and all(e.payload.get("session_id") for e in interrupted), interrupted
    return run_id, hosts


# Writes notes.txt without committing and works on (sleeps) the first time; run again in the same session volume,
# it commits what the workspace holds: only a resume in the workspace the first execution left keeps notes.txt.
RESUMABLE_PROMPT = (
    'SIM: exec if [ -f "$HOME/.first-done" ]; then git add -A && git commit -qm "notes, resumed"; '
    'else touch "$HOME/.first-done"; echo work > notes.txt; sleep 600; fi\n'
    "SIM: print done"
)


def sim_executions(run_id: str) -> list[dict]:
    """The sim agent's own record of every execution (session id, resumed or not, cwd)."""
    out = []
    for volume in run_volumes(run_id):
        mount = docker(None, "volume", "inspect", "-f", "{{.Mountpoint}}", volume).stdout.strip()
        record = Path(mount) / ".sim-agent" / "executions.jsonl"
        if record.exists():
            out += [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    return out


def runner_messages(tmp_path: Path, run_id: str, message: str) -> list[dict]:
    """The runner log's records with this ``message``."""
    lines = (tmp_path / "logs" / run_id / "runner.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("message") == message]
