"""More of the real command: review-loop, dirty trees, start-up cleanup of orphans and old logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from cli_helpers import ORCH, cli_env, only_run_id, run_cli, wait_for
from conftest import TEST_IMAGE, git, make_repo

from orchestrator.log.eventlog import read_events

pytestmark = pytest.mark.docker
IMG = ["--docker-image", TEST_IMAGE]


@pytest.fixture
def engine_image(private_engine, monkeypatch):
    """The tests of the start-up scan and --clean-containers use an engine of their own.

    They plant old-looking containers, which any other test's run would remove
    on the shared engine (its start-up scan), and their own scans would remove
    other tests' containers: on the shared engine they had to run alone.
    DOCKER_HOST reaches the command and every ``docker`` call of the test.
    """
    monkeypatch.setenv("DOCKER_HOST", private_engine.url)
    return private_engine.image


def test_review_loop_from_an_ideas_folder(tmp_path):
    repo = make_repo(tmp_path / "repo")
    ideas = tmp_path / "ideas"
    ideas.mkdir()
    (ideas / "01-cache.md").write_text("Cache parsed headers\n")
    (ideas / "02-stream.md").write_text("Stream the input instead of reading it whole\n")
    result = run_cli(
        [
            "improve the parser",
            "--strategy",
            "review-loop",
            "-S",
            f"ideas={ideas}",
            "-S",
            "test_command=true",
            "--dry-run",
            "--no-tui",
            *IMG,
        ],
        cwd=repo,
        env=cli_env(tmp_path),
    )
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


def test_start_removes_orphans_and_old_logs_but_not_resumable_runs(tmp_path, engine_image):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    old_ts = "2020-01-01T00:00:00.000Z"
    names = {"orphan": f"orch-test-orphan-{os.getpid()}", "resumable": f"orch-test-resumable-{os.getpid()}"}
    # a resumable (interrupted) run whose container must survive
    (tmp_path / "state" / "run_20200101_000001").mkdir(parents=True)
    (tmp_path / "state" / "run_20200101_000001" / "run.json").write_text(
        json.dumps(
            {
                "run_id": "run_20200101_000001",
                "created_at": old_ts,
                "prompt": "p",
                "strategy_spec": "simple",
                "strategy_name": "simple",
                "params": {},
                "runs": 1,
                "repo_path": str(repo),
                "base_branch": "main",
                "model": "sonnet",
                "plugin": "claude-code",
                "docker_image": engine_image,
                "max_parallel": 2,
                "status": "interrupted",
            }
        )
    )
    for what, run_id in (("orphan", "run_unknown_orphan"), ("resumable", "run_20200101_000001")):
        subprocess.run(
            [
                "docker",
                "create",
                "--name",
                names[what],
                "--label",
                "orchestrator=true",
                "--label",
                f"run_id={run_id}",
                "--label",
                f"orchestrator.last_active_ts={old_ts}",
                engine_image,
                "true",
            ],
            check=True,
            capture_output=True,
        )
    old_logs = tmp_path / "logs" / "run_20200101_000002"
    old_logs.mkdir(parents=True)
    (old_logs / "events.jsonl").write_text("")
    past = time.time() - 30 * 86400
    os.utime(old_logs / "events.jsonl", (past, past))
    try:
        result = run_cli(["SIM: print x", "--no-tui", "--docker-image", engine_image], cwd=repo, env=env)
        assert result.returncode == 0, result.stderr
        present = subprocess.run(
            ["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True
        ).stdout.split()
        assert names["orphan"] not in present
        assert names["resumable"] in present
        assert not old_logs.exists()
        # the scan is rate-limited per state directory, with no marker among the runs
        assert all((p / "run.json").exists() for p in (tmp_path / "state").iterdir())
        names["late"] = f"orch-test-late-{os.getpid()}"
        subprocess.run(
            [
                "docker",
                "create",
                "--name",
                names["late"],
                "--label",
                "orchestrator=true",
                "--label",
                "run_id=run_unknown_late",
                "--label",
                f"orchestrator.last_active_ts={old_ts}",
                engine_image,
                "true",
            ],
            check=True,
            capture_output=True,
        )
        again = run_cli(["SIM: print x", "--no-tui", "--docker-image", engine_image], cwd=repo, env=env)
        assert again.returncode == 0, again.stderr
        present = subprocess.run(
            ["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True
        ).stdout.split()
        assert names["late"] in present  # scanned a moment ago: not again within 5 minutes
        second = max(p.name for p in (tmp_path / "state").iterdir())
        log = (tmp_path / "logs" / second / "orchestration.jsonl").read_text()
        assert "scanned recently" in log
        assert all((p / "run.json").exists() for p in (tmp_path / "state").iterdir())
    finally:
        subprocess.run(["docker", "rm", "-f", *names.values()], capture_output=True)


def test_clean_containers_removes_stopped_past_retention_and_never_running_ones(tmp_path, engine_image):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    old_ts = "2020-01-01T00:00:00.000Z"
    pid = os.getpid()
    names = {
        "stopped_old": f"orch-cc-old-{pid}",
        "stopped_new": f"orch-cc-new-{pid}",
        "running_old": f"orch-cc-run-{pid}",
    }
    now_ts = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    try:
        for what, ts in (("stopped_old", old_ts), ("stopped_new", now_ts), ("running_old", old_ts)):
            cmd = [
                "docker",
                "run",
                "-d",
                "--name",
                names[what],
                "--label",
                "orchestrator=true",
                "--label",
                f"run_id=run_cc_{pid}",
                "--label",
                f"orchestrator.last_active_ts={ts}",
                engine_image,
                "sleep",
                "infinity" if what == "running_old" else "0",
            ]
            subprocess.run(cmd, check=True, capture_output=True)

        def short_ones_exited() -> bool:
            r = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Status}}", names["stopped_old"], names["stopped_new"]],
                capture_output=True,
                text=True,
            )
            return r.stdout.split() == ["exited", "exited"]

        wait_for(short_ones_exited, timeout=120, interval=0.1)
        listed = run_cli(["--clean-containers", "--dry-run"], cwd=repo, env=env)
        assert listed.returncode == 0 and f"would remove {names['stopped_old']}" in listed.stdout
        assert names["stopped_new"] not in listed.stdout and names["running_old"] not in listed.stdout
        removed = run_cli(["--clean-containers", "--force"], cwd=repo, env=env)
        assert removed.returncode == 0, removed.stderr
        present = subprocess.run(
            ["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True
        ).stdout.split()
        assert names["stopped_old"] not in present
        assert names["stopped_new"] in present and names["running_old"] in present
    finally:
        subprocess.run(["docker", "rm", "-f", *names.values()], capture_output=True)


def test_own_output_folders_in_the_repository_never_count_as_changes(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = {
        k: v
        for k, v in cli_env(tmp_path).items()
        if k not in ("ORCHESTRATOR_LOGS_DIR", "ORCHESTRATOR_STATE_DIR", "ORCHESTRATOR_RESULTS_DIR")
    }
    tracked = git(repo, "ls-files")
    for attempt in (1, 2):  # the second run finds the first one's logs/, results/, orchestrator_state/
        result = run_cli(["SIM: print x", "--require-clean-wt", "--no-tui", *IMG], cwd=repo, env=env)
        assert result.returncode == 0, (attempt, result.stderr)
        assert "uncommitted changes" not in result.stderr, (attempt, result.stderr)
    for d in ("logs", "results", "orchestrator_state"):
        assert (repo / d).is_dir(), d
    assert git(repo, "status", "--porcelain") == ""  # the user's `git status` does not show them either
    exclude = (repo / ".git" / "info" / "exclude").read_text().splitlines()
    for line in ("/logs/", "/results/", "/orchestrator_state/"):
        assert exclude.count(line) == 1, exclude  # added once, not once per run
    assert git(repo, "ls-files") == tracked and not (repo / ".gitignore").exists()  # no tracked file changed
    # a real change is still one
    (repo / "README.md").write_text("changed\n")
    refused = run_cli(["SIM: print x", "--require-clean-wt", "--no-tui", *IMG], cwd=repo, env=env)
    assert refused.returncode == 2 and "uncommitted changes" in refused.stderr


def _age(path, days=30):
    past = time.time() - days * 86400
    for p in [*path.rglob("*"), path]:
        os.utime(p, (past, past))


def test_retention_keeps_an_old_interrupted_run_and_list_runs_shows_it_first(tmp_path, engine_image):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    done = run_cli(["SIM: print done", "--no-tui", "--docker-image", engine_image], cwd=repo, env=env)
    assert done.returncode == 0, done.stderr
    completed_id = only_run_id(tmp_path)
    proc = subprocess.Popen(
        [
            ORCH,
            "SIM: write work.txt data\nSIM: commit work\nSIM: sleep 30\nSIM: print finished",
            "--no-tui",
            "--docker-image",
            engine_image,
        ],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def started():
        runs = [p.name for p in (tmp_path / "state").iterdir() if p.name != completed_id]
        path = tmp_path / "logs" / runs[0] / "events.jsonl" if runs else None
        return runs[0] if path and path.exists() and any(e.type == "task.started" for e in read_events(path)) else None

    interrupted_id = wait_for(started)
    time.sleep(1.5)  # the agent is mid-task
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    for run_id in (completed_id, interrupted_id):
        _age(tmp_path / "logs" / run_id)  # both far past the 7-day retention
    kept = (tmp_path / "logs" / interrupted_id / "events.jsonl").read_bytes()

    later = run_cli(["SIM: print later", "--no-tui", "--docker-image", engine_image], cwd=repo, env=env)
    assert later.returncode == 0, later.stderr
    assert not (tmp_path / "logs" / completed_id).exists()  # finished and old: retention deletes it
    assert (tmp_path / "logs" / interrupted_id / "events.jsonl").read_bytes() == kept  # resumable: untouched

    listed = run_cli(["--list-runs"], cwd=repo, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert rows[0][:2] == [interrupted_id, "interrupted"], listed.stdout  # resumable runs first
    assert {r[0] for r in rows[1:]} == {p.name for p in (tmp_path / "state").iterdir()} - {interrupted_id}

    resumed = run_cli(["--resume", interrupted_id, "--no-tui"], cwd=repo, env=env)
    assert resumed.returncode == 0, resumed.stderr
    events = list(read_events(tmp_path / "logs" / interrupted_id / "events.jsonl"))
    assert [e.type for e in events].count("task.scheduled") == 1  # the recorded task was continued, not redone
    assert [e.type for e in events].count("task.completed") == 1


def _recreate_as_old(name: str, old_ts: str) -> None:
    """Re-create a stopped task container unchanged but for an old last-active time (as if it ran for days)."""
    info = json.loads(subprocess.run(["docker", "inspect", name], capture_output=True, text=True, check=True).stdout)[0]
    cfg, host = info["Config"], info["HostConfig"]
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    labels = {**cfg["Labels"], "orchestrator.last_active_ts": old_ts}
    cmd = [
        "docker",
        "create",
        "--name",
        name,
        "--user",
        cfg["User"],
        "-w",
        cfg["WorkingDir"],
        "--read-only",
        "--security-opt",
        "no-new-privileges",
        "-v",
        f"{mounts['/workspace']['Source']}:/workspace:rw",
        "--mount",
        f"type=volume,src={mounts['/home/node']['Name']},dst=/home/node",
    ]
    for path, opts in (host.get("Tmpfs") or {}).items():
        cmd += ["--tmpfs", f"{path}:{opts}" if opts else path]
    for k, v in labels.items():
        cmd += ["--label", f"{k}={v}"]
    for e in cfg["Env"]:
        cmd += ["-e", e]
    subprocess.run(["docker", "rm", "-f", name], check=True, capture_output=True)
    subprocess.run([*cmd, cfg["Image"], *cfg["Cmd"]], check=True, capture_output=True)


def test_orphan_scan_never_removes_a_live_run_from_another_directory(tmp_path, engine_image):
    """Two live runs, two directories: the start-up scan of one never kills the other's container."""
    old_ts = "2020-01-01T00:00:00.000Z"
    repo_a, repo_b = make_repo(tmp_path / "a" / "repo"), make_repo(tmp_path / "b" / "repo")
    env_a, env_b = cli_env(tmp_path / "a"), cli_env(tmp_path / "b")
    prompt = "SIM: write work.txt data\nSIM: commit work\nSIM: sleep 45\nSIM: print finished"
    proc = subprocess.Popen(
        [ORCH, prompt, "--no-tui", "--docker-image", engine_image],
        cwd=repo_a,
        env=env_a,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    state_a = tmp_path / "a" / "state"
    run_a = wait_for(lambda: next((p.name for p in state_a.iterdir()), None) if state_a.exists() else None)
    wait_for(lambda: list((tmp_path / "a" / "ws" / run_a).glob("*/work.txt")))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    container = subprocess.run(
        ["docker", "ps", "-a", "--format", "{{.Names}}", "--filter", f"label=run_id={run_a}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert len(container) == 1
    container = container[0]
    lock_a = tmp_path / "a" / "logs" / run_a / "events.jsonl.lock"
    labels = json.loads(
        subprocess.run(
            ["docker", "inspect", "-f", "{{json .Config.Labels}}", container], capture_output=True, text=True
        ).stdout
    )
    assert labels.get("orchestrator.run_lock") == str(lock_a)  # the way from a container to its run's lock
    assert labels.get("orchestrator.run_manifest") == str(state_a / run_a / "run.json")  # ... and to its status
    # Run A has been going for days: its container is far past the 2-hour retention.
    _recreate_as_old(container, old_ts)

    pid = os.getpid()
    dead_lock = tmp_path / "dead" / "events.jsonl.lock"  # a run that ended: its lock file, held by nobody
    dead_lock.parent.mkdir()
    dead_lock.write_text("")
    manifests = {}
    for status in ("interrupted", "completed"):  # stopped runs of another directory, one resumable
        manifests[status] = tmp_path / "dead" / f"{status}.json"
        manifests[status].write_text(
            json.dumps(
                {
                    "run_id": f"run_other_{status}",
                    "created_at": old_ts,
                    "prompt": "p",
                    "strategy_spec": "simple",
                    "strategy_name": "simple",
                    "params": {},
                    "runs": 1,
                    "repo_path": str(repo_b),
                    "base_branch": "main",
                    "model": "sonnet",
                    "plugin": "claude-code",
                    "docker_image": engine_image,
                    "max_parallel": 1,
                    "status": status,
                }
            )
        )
    others = {
        "dead": (f"orch-test-dead-{pid}", ["--label", f"orchestrator.run_lock={dead_lock}"]),
        "unknown": (f"orch-test-nolock-{pid}", []),
        "missing": (f"orch-test-missing-{pid}", ["--label", f"orchestrator.run_lock={tmp_path}/gone/x.lock"]),
    }
    stopped = {
        status: (
            f"orch-test-{status}-{pid}",
            [
                "--label",
                f"orchestrator.run_lock={dead_lock}",
                "--label",
                f"orchestrator.run_manifest={manifests[status]}",
            ],
        )
        for status in manifests
    }
    resumed = None
    try:
        resumed = subprocess.Popen(
            [ORCH, "--resume", run_a, "--no-tui"],
            cwd=repo_a,
            env=env_a,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        events_a = tmp_path / "a" / "logs" / run_a / "events.jsonl"
        wait_for(lambda: [e for e in read_events(events_a) if e.type == "task.started"][1:])  # A works again
        wait_for(
            lambda: (
                subprocess.run(
                    ["docker", "inspect", "-f", "{{.State.Running}}", container], capture_output=True, text=True
                ).stdout.strip()
                == "true"
            )
        )

        # Just before B starts (a scan from another directory running an older orchestrator would take them too)
        for what, (name, extra) in others.items():
            subprocess.run(
                [
                    "docker",
                    "run",
                    "-d",
                    "--name",
                    name,
                    "--label",
                    "orchestrator=true",
                    "--label",
                    f"run_id=run_other_{what}_{pid}",
                    "--label",
                    f"orchestrator.last_active_ts={old_ts}",
                    *extra,
                    engine_image,
                    "sleep",
                    "infinity",
                ],
                check=True,
                capture_output=True,
            )
        for status, (name, extra) in stopped.items():
            subprocess.run(
                [
                    "docker",
                    "create",
                    "--name",
                    name,
                    "--label",
                    "orchestrator=true",
                    "--label",
                    f"run_id=run_other_{status}_{pid}",
                    "--label",
                    f"orchestrator.last_active_ts={old_ts}",
                    *extra,
                    engine_image,
                    "true",
                ],
                check=True,
                capture_output=True,
            )
        # B's first start scans
        b = run_cli(["SIM: print from b", "--no-tui", "--docker-image", engine_image], cwd=repo_b, env=env_b)
        assert b.returncode == 0, b.stderr
        assert resumed.poll() is None, "run A should still be live while B starts"
        present = subprocess.run(
            ["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True
        ).stdout.split()
        assert container in present  # run A is live: its lock is held
        assert others["dead"][0] not in present  # provably dead: removed
        assert others["unknown"][0] in present and others["missing"][0] in present  # unknown: kept
        assert stopped["interrupted"][0] in present  # a resumable run of another directory: kept
        assert stopped["completed"][0] not in present  # a finished one past retention: removed
        _out, err = resumed.communicate(timeout=180)
        assert resumed.returncode == 0, err
        assert [e.type for e in read_events(events_a)].count("task.completed") == 1
    finally:
        if resumed is not None and resumed.poll() is None:
            resumed.kill()
        subprocess.run(
            ["docker", "rm", "-f", *(n for n, _ in [*others.values(), *stopped.values()])], capture_output=True
        )


def test_clean_containers_takes_its_retention_from_the_config_file(tmp_path, engine_image):
    # An hour old: inside the default 2 h retention (so no other run's orphan scan
    # removes it meanwhile), past the half hour that the config file sets.
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    name = f"orch-cc-cfg-{os.getpid()}"
    ts = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 3600))
    (tmp_path / "short.yaml").write_text("runner:\n  success_retention_hours: 0.5\n  failure_retention_hours: 0.5\n")
    try:
        subprocess.run(
            [
                "docker",
                "create",
                "--name",
                name,
                "--label",
                "orchestrator=true",
                "--label",
                f"run_id=run_cfg_{os.getpid()}",
                "--label",
                f"orchestrator.last_active_ts={ts}",
                engine_image,
            ],
            check=True,
            capture_output=True,
        )
        default = run_cli(["--clean-containers", "--dry-run"], cwd=repo, env=env)
        assert default.returncode == 0, default.stderr
        assert name not in default.stdout
        short = run_cli(
            ["--clean-containers", "--dry-run", "--config", str(tmp_path / "short.yaml")], cwd=repo, env=env
        )
        assert short.returncode == 0 and f"would remove {name}" in short.stdout, short.stdout + short.stderr
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
