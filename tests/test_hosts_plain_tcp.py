"""Plain ``tcp://`` engines (issue 31): refused to another machine, before any connection.

Every agent's API key (in each exec's environment) and the repository (the
copy-in tar) cross the link to the engine. Plain TCP to another machine is
refused at pre-flight; ``insecure: true`` accepts it with a warning on every
start; loopback stays allowed. Nothing here touches an address but loopback:
the network guard (an audit hook, in this process and, through
``sitecustomize``, in the ``orchestrator`` subprocess) records any name lookup
or connection to anything else, and the tests assert it recorded none. For the
``insecure: true`` run, the guard's resolver answers one made-up name
(``engine.far.test``) with 127.0.0.1, where tests/engine_proxy.py forwards
plain TCP to the private engine: the product sees a name that is not loopback
and the bytes never leave the machine.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import anyio
import pytest
import yaml
from cli_helpers import only_run_id, run_cli
from conftest import git, make_repo
from engine_proxy import EngineProxy
from net_guard_helpers import guard_log, guarded_env
from reliability_helpers import NO_DISK_MIN, check_log, events_path, host_containers, remove_run

from orchestrator.errors import ConfigError, PreflightError
from orchestrator.runner.hosts import resolve_hosts
from orchestrator.runner.transport import is_loopback, transport_warnings

PROMPT = "SIM: write t.txt {word}\nSIM: commit t"
FAR_NAME = "engine.far.test"
FAR_URLS = [
    "tcp://192.0.2.10:2375",  # TEST-NET-1
    "tcp://10.1.2.3:2375",
    f"tcp://{FAR_NAME}:2375",  # a name: resolving it would itself be traffic
    "tcp://[2001:db8::1]:2375",
    "tcp://ci:pw-0123456@192.0.2.10:2375",
]

# ---------------------------------------------------------------- the network guard

_seen: list[str] | None = None


def _in_process_hook(event: str, args: tuple) -> None:
    if _seen is None:
        return
    if event == "socket.getaddrinfo" or event.startswith("socket.gethostby"):
        _seen.append(f"{event} {args[0]!r}")
    elif event == "socket.__new__" and args[1] in (socket.AF_INET, socket.AF_INET6):
        _seen.append(f"{event} family {args[1]}")
    elif event == "socket.connect" and args[0].family != socket.AF_UNIX:
        _seen.append(f"{event} {args[1]!r}")


_hook_installed = False


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Fails the test if anything in this process looks up a name or opens a network socket."""
    global _seen, _hook_installed
    if not _hook_installed:  # audit hooks cannot be removed: one, switched on per test
        sys.addaudithook(_in_process_hook)
        _hook_installed = True
    (tmp_path / "no-certs").mkdir()
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tmp_path / "no-certs"))
    _seen = []
    try:
        yield
        assert _seen == [], f"network traffic during pre-flight: {_seen}"
    finally:
        _seen = None


def _hosts_config(tmp_path: Path, hosts: list[dict]) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"runner": {"hosts": hosts}}))
    return path


def _check_refusal(text: str, name: str, host: str) -> None:
    assert f"Docker host {name}" in text, text
    assert "clear text" in text and "API key" in text and "repository" in text, text
    assert f"ssh://USER@{host}" in text and "cert_path" in text and "docker context" in text, text


# ---------------------------------------------------------------- no connection at all


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("tcp://127.0.0.1:2375", True),
        ("tcp://127.8.9.10:2375", True),
        ("tcp://localhost:2375", True),
        ("tcp://LOCALHOST:2375", True),
        ("tcp://[::1]:2375", True),
        ("tcp://[::ffff:127.0.0.1]:2375", True),
        ("tcp://192.0.2.10:2375", False),
        ("tcp://0.0.0.0:2375", False),
        ("tcp://localhost.example:2375", False),
        ("tcp://runsc:2375", False),  # a name in /etc/hosts is still a name
        ("tcp://[2001:db8::1]:2375", False),
    ],
)
def test_loopback_is_decided_from_the_url_without_a_lookup(no_network, url, loopback):
    assert is_loopback(url) is loopback


@pytest.mark.parametrize("url", FAR_URLS)
def test_plain_tcp_to_another_machine_is_refused_before_any_connection(no_network, tmp_path, url):
    """The run's own pre-flight (hosts_cli.host_specs, the plan's one resolution), in this process: it raises before
    it makes a client (docker-py talks to the engine as the client is made), and no
    name is looked up, no network socket made."""
    from orchestrator.app import hosts_cli
    from orchestrator.config import load_config

    host = url.rpartition("@")[2].removeprefix("tcp://").rpartition(":")[0]
    with pytest.raises(PreflightError) as refused:
        resolve_hosts([{"name": "far", "docker": url}])
    _check_refusal(str(refused.value), "far", host)
    assert "pw-0123456" not in str(refused.value)

    config = load_config(
        config_file=None, cli_overrides={"runner": {"hosts": [{"name": "far", "docker": url}]}}, environ={}
    ).config
    with pytest.raises(PreflightError):
        anyio.run(hosts_cli.host_specs, config)


def test_insecure_true_accepts_plain_tcp_with_a_warning(no_network):
    (spec,) = resolve_hosts([{"name": "far", "docker": "tcp://192.0.2.10:2375", "insecure": True}])
    assert spec.transport == "plain (insecure)"
    (warning,) = transport_warnings([spec])
    assert "Docker host far (tcp://192.0.2.10:2375)" in warning and "clear text" in warning, warning
    # Loopback needs no such thing, and says nothing.
    (spec,) = resolve_hosts([{"name": "lo", "docker": "tcp://127.0.0.1:2375"}])
    assert spec.transport == "plain (loopback)" and transport_warnings([spec]) == []


@pytest.mark.parametrize(
    "entry", [{"name": "s", "docker": "ssh://ci@far", "insecure": True}, {"name": "local", "insecure": True}]
)
def test_insecure_on_a_host_that_is_not_plain_tcp_is_one_clear_error(no_network, entry):
    with pytest.raises(ConfigError) as info:
        resolve_hosts([entry])
    assert "insecure" in str(info.value) and "tcp://" in str(info.value), str(info.value)


@pytest.mark.parametrize("how", ["flag", "config", "hosts-check"])
def test_the_cli_refuses_plain_tcp_to_another_machine_in_one_line(tmp_path, how):
    """The real command, every lookup and connection watched: exit 2, one line naming
    the host, what would travel in clear and the fixes; no run is created."""
    repo = make_repo(tmp_path / "repo")
    env = guarded_env(tmp_path)
    far = f"tcp://{FAR_NAME}:2375"
    if how == "config":
        config = _hosts_config(tmp_path, [{"name": "far", "docker": far}])
        args = ["x", "--no-tui", "--config", str(config)]
    else:
        args = (["--hosts"] if how == "hosts-check" else ["x", "--no-tui"]) + ["--docker-host", f"far={far}"]
    result = run_cli(args, cwd=repo, env=env, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    _check_refusal(result.stderr, "far", FAR_NAME)
    assert guard_log(env) == []
    for folder in ("state", "logs", "results"):
        assert not (tmp_path / folder).exists() or not any((tmp_path / folder).iterdir()), folder


# ---------------------------------------------------------------- against a real engine


def _placed_on(tmp_path: Path, repo: Path, engine, host: str, word: str) -> str:
    run_id = only_run_id(tmp_path)
    events = check_log(events_path(tmp_path, run_id))
    assert {e.payload["host"] for e in events if e.type == "task.started"} == {host}
    (done,) = [e for e in events if e.type == "task.completed"]
    assert git(repo, "show", f"{done.payload['artifact']['branch_final']}:t.txt") == word
    assert host_containers(engine.url, run_id)
    return run_id


@pytest.mark.docker
def test_plain_tcp_on_loopback_still_runs_with_no_warning(tmp_path, private_engine):
    proxy = EngineProxy(private_engine.socket, None)  # plain TCP on 127.0.0.1 only
    repo = make_repo(tmp_path / "repo")
    env = guarded_env(tmp_path, **NO_DISK_MIN)
    args = ["--docker-image", private_engine.image, "--docker-host", f"lo={proxy.url}:1"]
    run_id = None
    try:
        checked = run_cli(["--hosts", *args], cwd=repo, env=env, timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        (row,) = [line for line in checked.stdout.splitlines() if line.startswith("lo ")]
        assert " up " in row and "transport plain (loopback)" in row, row
        assert "warning" not in checked.stderr, checked.stderr
        result = run_cli([PROMPT.format(word="lo"), "--no-tui", *args], cwd=repo, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "clear text" not in result.stderr, result.stderr
        run_id = _placed_on(tmp_path, repo, private_engine, "lo", "lo")
        assert proxy.requests, "the run did not go through the plain tcp:// listener"
        assert guard_log(env) == []
    finally:
        proxy.close()
        if run_id:
            remove_run(private_engine.url, run_id)


@pytest.mark.docker
def test_insecure_true_runs_over_plain_tcp_and_warns_on_every_start(tmp_path, private_engine):
    """A name that is not loopback (the guard resolves it to 127.0.0.1): refused without
    ``insecure: true``; with it, the run works and warns, and so does the next start."""
    proxy = EngineProxy(private_engine.socket, None)
    far = f"tcp://{FAR_NAME}:{proxy.port}"
    repo = make_repo(tmp_path / "repo")
    env = guarded_env(tmp_path, alias=FAR_NAME, **NO_DISK_MIN)
    config = _hosts_config(tmp_path, [{"name": "far", "docker": far, "max_parallel": 1, "insecure": True}])
    args = ["--no-tui", "--config", str(config), "--docker-image", private_engine.image]
    run_ids: list[str] = []
    try:
        refused = run_cli(
            ["x", "--no-tui", "--docker-image", private_engine.image, "--docker-host", f"far={far}:1"],
            cwd=repo,
            env=env,
        )
        assert refused.returncode == 2 and "Docker host far" in refused.stderr, refused.stderr
        assert not proxy.requests
        warning = f"warning: Docker host far ({far}) uses plain TCP (insecure: true)"
        for word in ("one", "two"):
            result = run_cli([PROMPT.format(word=word), *args], cwd=repo, env=env, timeout=300)
            assert result.returncode == 0, result.stderr
            assert result.stderr.count(warning) == 1 and "clear text" in result.stderr, result.stderr
            run_id = next(
                p.name for p in (tmp_path / "state").iterdir() if (p / "run.json").exists() and p.name not in run_ids
            )
            run_ids.append(run_id)
            log = (tmp_path / "logs" / run_id / "orchestration.jsonl").read_text().splitlines()
            assert any(json.loads(line).get("message", "").startswith("Docker host far") for line in log), log
        assert proxy.requests
        checked = run_cli(["--hosts", *args[1:]], cwd=repo, env=env, timeout=120)
        assert "transport plain (insecure)" in checked.stdout and warning in checked.stderr, checked
        assert guard_log(env) == []
    finally:
        proxy.close()
        for run_id in run_ids:
            remove_run(private_engine.url, run_id)


def test_tls_without_verification_from_the_environment_warns_naming_the_host(no_network, tmp_path, monkeypatch):
    """DOCKER_CERT_PATH with DOCKER_TLS_VERIFY=0 (as the Docker CLI reads them): TLS to
    another machine is allowed, but the engine is unchecked, and the warning says why."""
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.pem").write_text("not read until a client is made\n")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(certs))
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "0")
    (spec,) = resolve_hosts([{"name": "far", "docker": "tcp://192.0.2.10:2376"}])
    assert spec.transport == "TLS unverified"
    (warning,) = transport_warnings([spec])
    assert warning.startswith("Docker host far (tcp://192.0.2.10:2376) uses TLS without checking"), warning
    assert "DOCKER_TLS_VERIFY" in warning, warning
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    (spec,) = resolve_hosts([{"name": "far", "docker": "tcp://192.0.2.10:2376"}])
    assert spec.transport == "TLS verified" and transport_warnings([spec]) == []
