"""Work an agent leaves uncommitted reaches the branch, or is counted when discarded (issue 15, item 6).

Real command, real git, real Docker, the sim agent: its prompt writes files and
never commits them.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import git, make_repo
from reliability_helpers import IMG, check_log, cli_env, events_path, remove_run_docker, run_cli, run_ids, wait_for

pytestmark = [pytest.mark.docker]

PROMPT = "SIM: write notes.txt hello\nSIM: write sub/more.txt more\nSIM: write debug.log noise\nSIM: print done"

STRATEGY = """
async def leave(prompt, base_branch, ctx, *, uncommitted: str = "commit", import_policy: str = "auto"):
    task = {"prompt": prompt, "base_branch": base_branch, "import_policy": import_policy}
    if uncommitted != "default":
        task["uncommitted"] = uncommitted
    return await ctx.wait(ctx.run(task, key=ctx.key("task")))
"""


def run(tmp_path: Path, *params: str, prompt: str = PROMPT, execs: list[str] | None = None):
    """Run the task; ``execs`` receives the command line of every ``docker exec`` in the run's containers."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# demo\n", ".gitignore": "*.log\n"})
    strategy = tmp_path / "leave.py"
    strategy.write_text(STRATEGY)
    env = cli_env(tmp_path)
    since = f"{time.time() - 1:.3f}"
    proc = run_cli([prompt, "--strategy", f"{strategy}:leave", *params, "--no-tui", *IMG], cwd=repo, env=env)
    (run_id,) = run_ids(tmp_path)
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        events = check_log(events_path(tmp_path, run_id))
        (done,) = [e for e in events if e.type == "task.completed"]
        summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
        (row,) = summary["strategies"][0]["tasks"]
        if execs is not None:
            execs += docker_execs(run_id, since)
        return repo, done.payload, row, proc.stdout
    finally:
        remove_run_docker(run_id)


def docker_execs(run_id: str, since: str) -> list[str]:
    """What the daemon says was exec'd in the run's containers (its own record, not the runner's)."""
    out = subprocess.run(
        [
            "docker",
            "events",
            "--since",
            since,
            "--until",
            f"{time.time() + 1:.3f}",
            "--filter",
            f"label=run_id={run_id}",
            "--filter",
            "event=exec_create",
            "--format",
            "{{.Action}}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    execs = [line.split(":", 1)[1].strip() for line in out.stdout.splitlines() if line.startswith("exec_create")]
    assert execs, "docker events saw no exec of the run (at least the agent's)"
    return execs


def commit_execs(execs: list[str]) -> list[str]:
    """The execs that ran the status-and-commit step after the agent (UNCOMMITTED_SCRIPT; the daemon names
    a command by its first line)."""
    return [e for e in execs if e.startswith("sh -c n=$(git status")]


@pytest.mark.parametrize("uncommitted", ["default", "commit"])
def test_changes_the_agent_left_uncommitted_are_committed_in_a_commit_of_their_own(uncommitted, tmp_path):
    execs: list[str] = []
    repo, payload, row, _ = run(tmp_path, "-S", f"uncommitted={uncommitted}", execs=execs)
    assert len(commit_execs(execs)) == 1, execs
    artifact = payload["artifact"]
    branch = artifact["branch_final"]
    assert branch, f"the agent's files never reached a branch: {payload}"
    assert (artifact["uncommitted_files"], artifact["auto_committed"]) == (2, True)  # debug.log is ignored
    assert git(repo, "show", f"{branch}:notes.txt") == "hello"
    assert git(repo, "show", f"{branch}:sub/more.txt") == "more"
    assert "debug.log" not in git(repo, "ls-tree", "-r", "--name-only", branch).split()
    subject = git(repo, "log", "-1", "--format=%s%n%b", branch)
    assert "left uncommitted" in subject
    assert git(repo, "rev-list", "--count", f"main..{branch}") == "1"
    assert (row["uncommitted_files"], row["auto_committed"]) == (2, True)


def test_discard_keeps_the_old_behaviour_and_says_how_many_files_were_left_behind(tmp_path):
    execs: list[str] = []
    _repo, payload, row, stdout = run(tmp_path, "-S", "uncommitted=discard", execs=execs)
    assert commit_execs(execs) == [], "nothing is committed under discard: the agent's exec counted the files"
    artifact = payload["artifact"]
    assert artifact["branch_final"] is None and artifact["has_changes"] is False
    assert (artifact["uncommitted_files"], artifact["auto_committed"]) == (2, False)
    assert (row["uncommitted_files"], row["auto_committed"]) == (2, False)
    assert "2 file(s) the agent left uncommitted were discarded" in stdout


def test_an_agent_that_committed_its_work_costs_no_exec_after_it(tmp_path):
    """The count comes from the agent's own exec (its wrapper), so a clean tree needs no second exec."""
    execs: list[str] = []
    repo, payload, row, _ = run(
        tmp_path, prompt="SIM: write notes.txt hello\nSIM: commit add notes\nSIM: print done", execs=execs
    )
    artifact = payload["artifact"]
    assert (artifact["uncommitted_files"], artifact["auto_committed"]) == (0, False)
    assert git(repo, "show", f"{artifact['branch_final']}:notes.txt") == "hello"
    assert git(repo, "log", "-1", "--format=%s", artifact["branch_final"]) == "add notes"
    assert commit_execs(execs) == [], execs
    assert (row["uncommitted_files"], row["auto_committed"]) == (0, False)


def test_review_tasks_that_never_import_are_untouched(tmp_path):
    _repo, payload, _row, _ = run(tmp_path, "-S", "import_policy=never")
    artifact = payload["artifact"]
    assert (artifact["uncommitted_files"], artifact["auto_committed"]) == (0, False)
    assert artifact["branch_final"] is None


def test_the_uncommitted_policy_does_not_change_recorded_fingerprints():
    from orchestrator.engine.fingerprint import TaskDefaults, fingerprint, normalize_task
    from orchestrator.errors import ConfigError

    def fp(task):
        return fingerprint(normalize_task(task, TaskDefaults(), default_base_branch="main"))

    # the fingerprint this task had before the field existed: recorded runs still resume
    recorded = "e881d39745aeb6677882a5ffbff465671643c70a59c3b2ad2d25aec135b55e52"
    assert fp({"prompt": "fix the bug"}) == recorded
    assert fp({"prompt": "fix the bug", "uncommitted": "commit"}) == recorded
    assert fp({"prompt": "fix the bug", "uncommitted": "discard"}) != recorded
    with pytest.raises(ConfigError, match="uncommitted='keep' is invalid; use one of commit, discard"):
        fp({"prompt": "fix the bug", "uncommitted": "keep"})


@pytest.fixture
def bare_container():
    """A container of the test image as tasks get one (tini as PID 1, which reaps what a killed wrapper
    leaves), with a git repository in /workspace and nothing running in it."""
    from conftest import TEST_IMAGE

    name = f"orch-test-wrapper-{time.monotonic_ns()}"
    subprocess.run(
        ["docker", "run", "-d", "--name", name, "--user", "node", TEST_IMAGE, "sleep", "600"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        exec_in(name, "sh", "-c", "mkdir -p /workspace && cd /workspace && git init -q && touch a b", user="root")
        exec_in(name, "chown", "-R", "node", "/workspace", user="root")
        # a base commit, as every task's clone has (the wrapper checks git can read it)
        exec_in(name, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def exec_in(container: str, *argv: str, user: str = "node", detach: bool = False) -> subprocess.CompletedProcess:
    flags = ["-d"] if detach else []
    return subprocess.run(
        ["docker", "exec", *flags, "-u", user, "-w", "/workspace", container, *argv],
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_the_agent_wrapper_keeps_the_agents_output_and_status_and_adds_the_count_last(bare_container):
    from orchestrator.runner.docker_agent import AGENT_WRAPPER_SCRIPT
    from orchestrator.runner.docker_exec import _take_end_line

    r = exec_in(
        bare_container,
        "sh",
        "-c",
        AGENT_WRAPPER_SCRIPT,
        "orchestrator-agent",
        "sh",
        "-c",
        "echo out; printf 'err without newline' >&2; touch c; exit 7",
    )
    assert (r.returncode, r.stdout) == (7, b"out\n")
    agent_stderr, held, count = _take_end_line(r.stderr)
    assert (agent_stderr + held, count) == (b"err without newline", b"3")  # a, b and the agent's c


def test_the_agent_wrapper_does_not_start_the_agent_when_git_cannot_read_the_base_commit(bare_container):
    """The repository is unusable inside the container (here its objects are gone):
    the agent is not started, and the wrapper's marked line carries git's cause."""
    from orchestrator.runner.docker_agent import AGENT_WRAPPER_SCRIPT, _git_unusable
    from orchestrator.runner.docker_exec import ExecOutput
    from orchestrator.runner.plugin import AgentOutcome

    assert exec_in(bare_container, "find", ".git/objects", "-type", "f", "-delete").returncode == 0
    r = exec_in(bare_container, "sh", "-c", AGENT_WRAPPER_SCRIPT, "orchestrator-agent", "sh", "-c", "touch ran")
    assert r.returncode == 125 and r.stdout == b""
    assert exec_in(bare_container, "test", "-e", "ran").returncode != 0, "the agent ran"
    error = _git_unusable(ExecOutput(outcome=AgentOutcome(), exit_code=r.returncode, stderr_tail=r.stderr))
    assert error is not None and error.category == "git"
    assert "unusable inside its container" in str(error) and "HEAD" in str(error), error
    # an agent's own exit status 125, without the wrapper's line, is the agent's
    assert _git_unusable(ExecOutput(outcome=AgentOutcome(), exit_code=125, stderr_tail=b"boom\n")) is None


@pytest.mark.parametrize("wrapper", ["AGENT_WRAPPER_SCRIPT", "EXEC_WRAPPER_SCRIPT"])
def test_stopping_a_wrapped_agent_signals_the_agent_and_waits_for_it(bare_container, wrapper):
    """END_AGENT_SCRIPT reaches through either wrapper: the agent gets SIGTERM and its grace to save."""
    from orchestrator.runner import docker_agent
    from orchestrator.runner.docker_core import END_AGENT_SCRIPT

    script = getattr(docker_agent, wrapper)

    agent = (
        "trap 'sleep 1; echo saved > saved.txt; exit 0' TERM; echo started > started.txt; while :; do sleep 0.1; done"
    )
    exec_in(bare_container, "sh", "-c", script, "orchestrator-agent", "sh", "-c", agent, detach=True)
    wait_for(lambda: exec_in(bare_container, "test", "-e", "started.txt").returncode == 0, timeout=60)
    r = exec_in(bare_container, "sh", "-c", END_AGENT_SCRIPT, "end-agent", "100")
    assert r.returncode == 0, r
    assert exec_in(bare_container, "cat", "saved.txt").stdout == b"saved\n"
