"""The Docker runner against real Docker, real git and the simulated agent.

Every test needs a running Docker engine and the ``orchestrator-test-agent``
image (``scripts/setup-docker.sh``); without them they are skipped locally and
fail on CI (see conftest).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import anyio
import msgspec
import pytest
from conftest import RUNNER_SECRET, runner_log
from conftest import TEST_IMAGE as IMAGE

from orchestrator.runner import (
    AuthConfig,
    ContainerLimits,
    DockerRunner,
    RetryConfig,
    container_exists,
    git_ops,
    list_containers,
    run_instance,
    stop_run_containers,
)

SECRET = RUNNER_SECRET  # the runner fixture's api key (conftest)


# Skipped (locally) or failed (CI, scripts/test.sh) by conftest when Docker or the image is missing.
pytestmark = [pytest.mark.docker]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("hello\n")
    git(path, "add", "README.md")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return path


def fields(run_id: str, key: str = "task", **kw):
    base = dict(
        run_id=run_id,
        task_key=key,
        docker_image=IMAGE,
        retry_config=RetryConfig(max_attempts=3, backoff_base_s=0.05, backoff_factor=2, backoff_max_s=0.2),
    )
    base.update(kw)
    return base


def inspect(name: str) -> dict:
    return json.loads(subprocess.run(["docker", "inspect", name], check=True, capture_output=True, text=True).stdout)[0]


async def test_task_writes_and_commits_branch_is_imported(repo, run_id, runner):
    res = await run_instance(
        "SIM: write a.txt hi\nSIM: write b.txt one\\ntwo\nSIM: commit add files",
        repo,
        runner=runner,
        **fields(run_id, branch_name="feat_one"),
    )
    assert res.status == "success", res.error
    art = res.artifact
    assert art is not None and art.has_changes and art.branch_final == "feat_one"
    assert art.commit_count == 1 and art.lines_added == 3 and art.lines_deleted == 0
    assert git(repo, "show", "feat_one:a.txt") == "hi\n"
    assert res.session_id and res.metrics.tokens_in > 0 and res.metrics.cost_usd is not None
    # success: workspace removed after the completion event that names it
    events = runner_log(runner)
    done = [e for e in events if e["message"] == "runner.instance.completed"]
    assert done and not await anyio.Path(done[0]["workspace_path"]).exists()
    assert res.workspace_path is None
    assert inspect(res.container_name)["State"]["Running"] is False  # finalize: stopped, kept
    # the git layer's audit line for the import reaches runner.jsonl with its fields
    audit = [e for e in events if e["message"].startswith("git import ")]
    assert len(audit) == 1 and audit[0]["outcome"] == "imported" and audit[0]["branch"] == "feat_one"
    assert audit[0]["commit_count"] == 1 and audit[0]["size"] > 0 and audit[0]["duration_s"] >= 0
    assert audit[0]["workspace"] == done[0]["workspace_path"]


async def test_review_task_cannot_write_workspace_and_gets_no_branch(repo, run_id, runner):
    res = await run_instance(
        "SIM: exec echo x > /workspace/a.txt\nSIM: fail 1 write failed",
        repo,
        runner=runner,
        **fields(run_id, import_policy="never", branch_name="rev_b"),
    )
    assert res.status == "failed"
    assert "read-only" in res.error and "/workspace" in res.error
    assert res.artifact is None
    assert "rev_b" not in git(repo, "branch")

    # a review that only reads succeeds with an artifact without changes
    ok = await run_instance(
        "SIM: print looks good",
        repo,
        runner=runner,
        **fields(run_id, key="rev2", import_policy="never", branch_name="rev_c"),
    )
    assert ok.status == "success", ok.error
    assert ok.artifact.has_changes is False and ok.artifact.branch_final is None
    assert ok.artifact.commit == git(repo, "rev-parse", "main").strip()
    assert ok.final_message == "looks good"


async def test_container_cannot_see_host_repo_other_workspaces_or_docker_socket(repo, run_id, runner):
    # task A fails, so its workspace stays on the host
    a = await run_instance("", repo, runner=runner, **fields(run_id, key="A", plugin_name="command", command="false"))
    assert a.status == "failed" and await anyio.Path(a.workspace_path).is_dir()
    probes = [
        str(repo),
        a.workspace_path,
        str(Path(a.workspace_path).parent),
        "/var/run/docker.sock",
        "/run/docker.sock",
    ]
    script = "; ".join(f"if test -e '{p}'; then echo VISIBLE:{p}; fi" for p in probes)
    script += "; ls /workspace; git -C /workspace remote"
    b = await run_instance("", repo, runner=runner, **fields(run_id, key="B", plugin_name="command", command=script))
    assert b.status == "success", b.error
    assert "VISIBLE" not in b.final_message
    assert "README.md" in b.final_message


async def test_ratelimited_task_retries_and_resumes_the_same_session(repo, run_id, runner):
    res = await run_instance(
        "SIM: ratelimit 2\nSIM: write r.txt ok\nSIM: commit r", repo, runner=runner, **fields(run_id, key="rl")
    )
    assert res.status == "success", res.error
    assert res.retry_attempts == 2
    events = runner_log(runner)
    finished = [e for e in events if e["message"] == "runner.exec.finished"]
    assert len(finished) == 3
    sessions = {e["session_id"] for e in finished}
    assert sessions == {res.session_id} and res.session_id
    started = [e for e in events if e["message"] == "runner.exec.started"]
    assert [e["resume_session_id"] for e in started][1:] == [res.session_id] * 2
    volumes = {e["volume"] for e in events if e["message"] == "runner.container.ready"}
    assert len(volumes) == 1
    # the sim agent recorded three executions of this task in the session volume
    check = await run_instance(
        "",
        repo,
        runner=runner,
        **fields(
            run_id,
            key="rl-check",
            session_group_key="rl",
            plugin_name="command",
            command='grep -c \'"task_key": *"rl"\' /home/node/.sim-agent/executions.jsonl',
        ),
    )
    assert check.final_message.strip() == "3"


@pytest.mark.exclusive  # a bound on the product's own time: measured alone, not beside five other workers
async def test_timeout_stops_quickly(repo, run_id, runner):
    t = time.monotonic()
    res = await run_instance("SIM: hang", repo, runner=runner, **fields(run_id, timeout_seconds=3))
    elapsed = time.monotonic() - t
    assert res.status == "timeout" and res.error_type == "timeout"
    assert elapsed < 8
    assert inspect(res.container_name)["State"]["Running"] is False
    assert await anyio.Path(res.workspace_path).is_dir()  # kept for resume/debugging


# Serves one request on the container's loopback, by name: what the agent CLIs' scripted API server needs.
LOOPBACK = (
    "ls /sys/class/net; "
    "python3 -c \"import socket, threading; s = socket.create_server(('localhost', 0)); "
    "threading.Thread(target=lambda: s.accept()[0].sendall(b'served')).start(); "
    "print(socket.create_connection(('localhost', s.getsockname()[1])).recv(6).decode())\""
)


async def test_offline_network_has_only_loopback(repo, run_id, runner):
    res = await run_instance(
        "",
        repo,
        runner=runner,
        **fields(run_id, plugin_name="command", network_egress="offline", command=LOOPBACK),
    )
    assert res.status == "success", res.error
    assert res.final_message.split() == ["lo", "served"], res.final_message
    # No network from the engine at all (not network_mode none, which still sets one up):
    # the run folder's hosts file stands in for the one the engine writes only then.
    config = inspect(res.container_name)
    assert config["Config"]["NetworkDisabled"] is True, config["HostConfig"]["NetworkMode"]
    binds = dict(b.rsplit(":", 2)[1::-1] for b in config["HostConfig"]["Binds"])
    assert Path(binds["/etc/hosts"]) == Path(binds["/workspace"]).parent / ".offline-hosts", binds
    online = await run_instance(
        "", repo, runner=runner, **fields(run_id, key="on", plugin_name="command", command="ls /sys/class/net")
    )
    assert "eth0" in online.final_message.split()


async def test_an_offline_container_restarted_after_its_hosts_file_went_gets_it_back(repo, run_id, runner):
    """The task's stopped container is started again for the next task of its key; the run
    folder's hosts file was deleted meanwhile (a user clearing the workspace root). Docker
    would make a missing bind source an empty directory, and the container would not start."""
    offline = fields(run_id, plugin_name="command", network_egress="offline", command=LOOPBACK)
    first = await run_instance("", repo, runner=runner, **offline)
    assert first.status == "success", first.error
    binds = dict(b.rsplit(":", 2)[1::-1] for b in inspect(first.container_name)["HostConfig"]["Binds"])
    hosts = anyio.Path(binds["/etc/hosts"])
    await hosts.unlink()
    second = await run_instance("", repo, runner=runner, **offline)
    assert second.status == "success", second.error
    assert inspect(second.container_name)["Id"] == inspect(first.container_name)["Id"]  # started again, not re-created
    assert second.final_message.split() == ["lo", "served"], second.final_message
    assert await hosts.is_file()


async def test_cancellation_stops_container_and_propagates(repo, run_id, runner):
    started = anyio.Event()
    seen: dict[str, object] = {}

    def on_event(ev):
        if ev["type"] == "runner.exec.started":
            started.set()

    async def task():
        try:
            await run_instance("SIM: sleep 60", repo, runner=runner, event_callback=on_event, **fields(run_id))
        except anyio.get_cancelled_exc_class():
            seen["cancelled"] = True
            raise

    t = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(task)
        with anyio.fail_after(30):
            await started.wait()
        await anyio.sleep(0.3)
        tg.cancel_scope.cancel()
    assert seen.get("cancelled") is True
    assert time.monotonic() - t < 20
    names = [c["name"] for c in await list_containers(run_id)]
    assert len(names) == 1
    assert inspect(names[0])["State"]["Running"] is False
    assert git_ops.workspace_path(run_id, "task").is_dir()
    assert any(e["message"] == "runner.instance.interrupted" for e in runner_log(runner))


async def test_secrets_never_reach_logs_or_results(repo, run_id, runner, tmp_path):
    seen: list[dict] = []
    res = await run_instance(
        f"SIM: exec echo $ANTHROPIC_API_KEY\nSIM: print the key is {SECRET}",
        repo,
        runner=runner,
        event_callback=seen.append,
        **fields(run_id),
    )
    assert res.status == "success", res.error
    assert "[REDACTED]" in res.final_message
    assert SECRET not in msgspec.json.encode(res).decode()
    assert SECRET not in json.dumps(seen)
    for path in (tmp_path / "logs").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    # credentials are passed to the exec only, not stored in the container config
    assert SECRET not in json.dumps(inspect(res.container_name))
    # and a failing agent's error message is scrubbed too
    bad = await run_instance(f"SIM: fail 3 boom {SECRET}", repo, runner=runner, **fields(run_id, key="bad"))
    assert bad.status == "failed" and SECRET not in (bad.error or "")


async def test_command_plugin_success_and_failure(repo, run_id, runner):
    ok = await run_instance(
        "", repo, runner=runner, **fields(run_id, plugin_name="command", command="echo line1; echo line2")
    )
    assert ok.status == "success" and ok.final_message.strip() == "line1\nline2"
    assert ok.artifact is not None and ok.artifact.has_changes is False
    bad = await run_instance(
        "",
        repo,
        runner=runner,
        **fields(run_id, key="bad", plugin_name="command", command="echo doing; echo broken-thing >&2; exit 7"),
    )
    assert bad.status == "failed" and bad.error_type == "command" and bad.exit_code == 7
    assert "broken-thing" in bad.error
    assert bad.retry_attempts == 0


async def test_include_branches_visible_in_workspace(repo, run_id, runner):
    git(repo, "branch", "feature-x")
    git(repo, "branch", "hidden-y")
    res = await run_instance(
        "",
        repo,
        runner=runner,
        **fields(
            run_id,
            plugin_name="command",
            command="git branch --format='%(refname:short)'",
            include_branches=("feature-x",),
        ),
    )
    assert res.status == "success", res.error
    assert sorted(res.final_message.split()) == ["feature-x", "main"]


async def test_labels_and_mounts_exactly_as_specified(repo, run_id, runner):
    res = await run_instance(
        "",
        repo,
        runner=runner,
        **fields(
            run_id,
            key="lbl",
            strategy_execution_id="se1",
            strategy_index=2,
            session_group_key="grp",
            plugin_name="command",
            command="true",
            finalize=False,
            container_limits=ContainerLimits(cpus=1.5, memory="1g"),
        ),
    )
    assert res.status == "success", res.error
    info = inspect(res.container_name)
    assert info["State"]["Running"] is True  # finalize=False leaves it running
    labels = info["Config"]["Labels"]
    expected = {
        "orchestrator": "true",
        "run_id": run_id,
        "strategy_execution_id": "se1",
        "strategy_index": "2",
        "task_key": "lbl",
        "session_group_key": "grp",
        "instance_id": res.instance_id,
    }
    assert {k: labels.get(k) for k in expected} == expected
    assert labels["orchestrator.last_active_ts"].endswith("Z")
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    # and the run's object store (the default isolation_mode), read-only
    store = git_ops.object_store_objects(git_ops.workspace_path(run_id, "lbl"), repo)
    inside = f"/{store.parent.name}/objects"
    assert set(mounts) == {"/workspace", "/home/node", inside}
    assert mounts[inside]["Type"] == "bind" and mounts[inside]["RW"] is False
    assert mounts[inside]["Source"] == str(store)
    assert mounts["/workspace"]["Type"] == "bind" and mounts["/workspace"]["RW"] is True
    assert mounts["/workspace"]["Source"] == str(git_ops.workspace_path(run_id, "lbl"))
    assert mounts["/home/node"]["Type"] == "volume" and mounts["/home/node"]["Name"].startswith(f"orc_home_{run_id}_g")
    hc = info["HostConfig"]
    assert set(hc["Tmpfs"]) == {"/tmp"} and "size=256m" in hc["Tmpfs"]["/tmp"]
    assert hc["ReadonlyRootfs"] is True and hc["NanoCpus"] == 1_500_000_000 and hc["Memory"] == 1 << 30
    assert hc["Privileged"] is False
    assert info["Config"]["User"] == "node" and info["Config"]["Cmd"] == ["sleep", "infinity"]
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env["TASK_KEY"] == "lbl" and env["SESSION_GROUP_KEY"] == "grp" and env["GIT_AUTHOR_NAME"] == "AI Agent"

    # same task as a review: the RW container is replaced by one with a RO workspace, same volume
    rev = await run_instance(
        "",
        repo,
        runner=runner,
        **fields(
            run_id,
            key="lbl",
            strategy_execution_id="se1",
            strategy_index=2,
            session_group_key="grp",
            plugin_name="command",
            command="touch /workspace/x 2>&1; echo done",
            import_policy="never",
        ),
    )
    assert "Read-only file system" in rev.final_message
    info2 = inspect(rev.container_name)
    m2 = {m["Destination"]: m for m in info2["Mounts"]}
    assert m2["/workspace"]["RW"] is False and m2["/home/node"]["Name"] == mounts["/home/node"]["Name"]
    assert any(e["message"] == "runner.container.replaced" for e in runner_log(runner))
    assert await stop_run_containers(run_id) == 0  # finalize=True stopped it already


async def test_reuse_keeps_container_and_missing_image_fails_clearly(repo, run_id, runner):
    first = await run_instance("", repo, runner=runner, **fields(run_id, plugin_name="command", command="true"))
    cid = inspect(first.container_name)["Id"]
    second = await run_instance("", repo, runner=runner, **fields(run_id, plugin_name="command", command="true"))
    assert second.status == "success" and inspect(second.container_name)["Id"] == cid
    assert await container_exists(first.container_name)
    missing = await run_instance(
        "",
        repo,
        runner=runner,
        **fields(run_id, key="m", plugin_name="command", command="true", docker_image="orchestrator-no-such-image"),
    )
    assert missing.status == "failed" and missing.error_type == "container"
    assert "scripts/setup-docker.sh" in missing.error


def test_backoff_schedule():
    from orchestrator.runner.docker_runner import backoff_delay

    assert [backoff_delay(n, base=10, factor=6, cap=360) for n in range(4)] == [10, 60, 360, 360]


def test_transient_patterns():
    from orchestrator.runner.docker_containers import is_transient

    assert is_transient("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
    assert is_transient("read timeout")
    assert not is_transient('409 Client Error: Conflict ("Error response from daemon: name in use")')


async def test_large_prompt_goes_through_stdin(repo, run_id, runner):
    prompt = "SIM: print big-ok\n" + ("lorem ipsum " * 15_000)  # ~180 KB, over the argv limit
    res = await run_instance(prompt, repo, runner=runner, **fields(run_id))
    assert res.status == "success", res.error
    assert res.final_message == "big-ok"
    started = [e for e in runner_log(runner) if e["message"] == "runner.exec.started"]
    assert started[-1]["prompt_via_stdin"] is True


async def test_review_agent_write_fails_fast_with_clear_message(repo, run_id, runner):
    seen: list[dict] = []
    res = await run_instance(
        "SIM: write a.txt hi\nSIM: print reviewed",
        repo,
        runner=runner,
        event_callback=seen.append,
        **fields(run_id, import_policy="never"),
    )
    # the write fails inside the agent; an agent that carries on still delivers its review
    # (no commit: the simulated agent reports a commit git refuses as its failure)
    assert res.status == "success", res.error
    assert res.artifact.has_changes is False and res.artifact.branch_final is None
    warn = [e for e in seen if e["type"] == "runner.workspace.read_only_write"]
    assert warn and "/workspace is mounted read-only for review tasks" in warn[0]["detail"]
    tool_errors = [e for e in seen if e["type"] == "runner.tool_result" and "Read-only file system" in json.dumps(e)]
    assert tool_errors


async def test_plugin_error_after_container_start_stops_container_and_raises(repo, run_id, runner):
    from orchestrator.errors import ConfigError

    with pytest.raises(ConfigError):
        await run_instance("   ", repo, runner=runner, **fields(run_id))  # claude-code rejects an empty prompt
    names = [c["name"] for c in await list_containers(run_id)]
    assert names and all(inspect(n)["State"]["Running"] is False for n in names)
    with pytest.raises(ConfigError, match="unknown model 'gpt-nope' for plugin claude-code"):
        await run_instance("x", repo, runner=runner, **fields(run_id, key="m", model="gpt-nope"))


async def test_transient_docker_error_is_retried(repo, run_id, tmp_path):
    import docker
    import requests

    class FlakyAPI:
        def __init__(self, api):
            self._api, self.failures = api, 1

        def __getattr__(self, name):
            return getattr(self._api, name)

        def create_container(self, *a, **k):
            if self.failures:
                self.failures -= 1
                raise requests.exceptions.ConnectionError("Connection refused")
            return self._api.create_container(*a, **k)

    class FlakyClient:
        def __init__(self):
            self._real = docker.from_env()
            self.api = FlakyAPI(self._real.api)

        def close(self):
            self._real.close()

    async with DockerRunner(
        auth=AuthConfig(api_key=SECRET), logs_dir=tmp_path / "logs2", client_factory=FlakyClient
    ) as r:
        res = await run_instance("", repo, runner=r, **fields(run_id, plugin_name="command", command="echo ok"))
        nofail = await run_instance(
            "", repo, runner=r, **fields(run_id, key="k2", plugin_name="command", command="exit 3")
        )
    assert res.status == "success" and res.retry_attempts == 1 and res.final_message.strip() == "ok"
    assert nofail.status == "failed" and nofail.retry_attempts == 0  # a command failure is not retried
