"""The ways Docker users reach a remote engine, each for real on this machine.

Every form ends on the session's private dockerd (tests/private_engine.py):
``tcp://127.0.0.1:PORT`` with ``--tlsverify`` and a throwaway CA, ``ssh://``
through a private ``sshd`` on 127.0.0.1 whose ``docker system dial-stdio``
talks to the private engine, and a ``docker context`` in a temporary
DOCKER_CONFIG. Nothing listens anywhere but 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import git, make_repo
from private_engine import client_cert_dir, free_port, make_ca
from reliability_helpers import NO_DISK_MIN, check_log, events_path, host_containers, remove_run

PROMPT = "SIM: write t.txt {word}\nSIM: commit t"


def _config(tmp_path: Path, hosts: list[dict]) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"runner": {"hosts": hosts}}))
    return path


def _check_placed_and_imported(tmp_path: Path, repo: Path, result, engine, host: str, word: str) -> str:
    """The one task ran on ``host`` (the private engine, archive path) and its branch was imported."""
    run_id = only_run_id(tmp_path)
    assert result.returncode == 0, result.stderr
    events = check_log(events_path(tmp_path, run_id))
    assert {e.payload["host"] for e in events if e.type == "task.started"} == {host}
    (done,) = [e for e in events if e.type == "task.completed"]
    assert git(repo, "show", f"{done.payload['artifact']['branch_final']}:t.txt") == word
    containers = host_containers(engine.url, run_id)
    assert containers and {c["Config"]["Labels"]["orchestrator.host"] for c in containers} == {host}
    ws = next(m for m in containers[0]["Mounts"] if m["Destination"] == "/workspace")
    assert ws["Type"] == "volume", ws
    return run_id


# ---------------------------------------------------------------- tcp:// with TLS


@pytest.mark.docker
def test_tcp_tls_host_places_a_task_and_imports_its_branch(tmp_path, private_engine):
    certs = client_cert_dir(tmp_path / "certs", private_engine.ca)
    config = _config(tmp_path, [{"name": "t", "docker": private_engine.tls_url, "cert_path": str(certs)}])
    repo = make_repo(tmp_path / "repo")
    # Where a proxy re-signs traffic, these name the proxy's CA: the engine's own CA
    # (cert_path) must still be the one its certificate is checked against.
    other = make_ca(tmp_path / "proxy-ca", name="proxy-ca")[0]
    env = cli_env(tmp_path, **NO_DISK_MIN, REQUESTS_CA_BUNDLE=str(other), CURL_CA_BUNDLE=str(other))
    args = ["--config", str(config), "--docker-image", private_engine.image]
    result = run_cli([PROMPT.format(word="tls"), "--no-tui", *args], cwd=repo, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    run_id = only_run_id(tmp_path)
    try:
        _check_placed_and_imported(tmp_path, repo, result, private_engine, "t", "tls")
        checked = run_cli(["--hosts", *args], cwd=repo, env=env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert " up " in checked.stdout and "rtt" in checked.stdout, checked.stdout
        assert "transport TLS verified" in checked.stdout and "warning" not in checked.stderr, checked
    finally:
        remove_run(private_engine.url, run_id)


@pytest.mark.docker
def test_tcp_tls_with_the_wrong_ca_is_one_line_naming_the_host(tmp_path, private_engine):
    """Client certificate from the engine's CA, but a ca.pem of another CA: the engine's
    certificate is not trusted. One line at pre-flight names the host, no traceback."""
    certs = client_cert_dir(tmp_path / "certs", private_engine.ca)
    other = make_ca(tmp_path / "other", name="other-ca")
    shutil.copy(other[0], certs / "ca.pem")
    config = _config(tmp_path, [{"name": "wrongca", "docker": private_engine.tls_url, "cert_path": str(certs)}])
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    result = run_cli(
        [PROMPT.format(word="x"), "--no-tui", "--config", str(config), "--docker-image", private_engine.image],
        cwd=repo,
        env=env,
        timeout=300,
    )
    assert result.returncode != 0
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert "wrongca" in line and "certificate" in line.lower(), line
    # The fix is the CA file, not starting Docker: the line says which file.
    assert str(certs / "ca.pem") in line and "start Docker" not in line, line


@pytest.mark.docker
def test_a_password_in_a_host_url_is_never_shown_or_written(tmp_path, private_engine):
    """docker-py refuses a URL with user:password, and its error repeats the URL:
    the line the user sees and every file the run writes keep the password out."""
    port = private_engine.tls_url.rsplit(":", 1)[1]
    secret = "pw-s3cret-9431"
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    result = run_cli(
        [
            PROMPT.format(word="x"),
            "--no-tui",
            "--docker-image",
            private_engine.image,
            "--docker-host",
            f"p=tcp://ci:{secret}@127.0.0.1:{port}",
        ],
        cwd=repo,
        env=env,
        timeout=300,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    assert "host p" in result.stderr or "'p'" in result.stderr, result.stderr
    assert secret not in result.stdout + result.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file() and "repo" not in path.relative_to(tmp_path).parts[:1]:
            assert secret.encode() not in path.read_bytes(), path


# ---------------------------------------------------------------- ssh://


@pytest.fixture
def sshd(tmp_path, private_engine):
    """A private sshd on 127.0.0.1 whose ``docker`` talks to the private engine.

    Returns (url, env): the client side uses this test's key and known_hosts
    through an ``ssh`` on PATH that adds ``-F`` (docker-py runs ``ssh`` by name,
    and OpenSSH reads ~/.ssh of the passwd entry, whatever HOME says).
    """
    if not Path("/usr/sbin/sshd").exists() or shutil.which("ssh") is None or os.geteuid() != 0:
        pytest.skip("openssh-server/openssh-client (scripts/setup.sh installs them) and root are needed")
    d = tmp_path / "ssh"
    (d / "bin").mkdir(parents=True)
    for key in ("host_key", "id_client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    port = free_port()
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    client_pub = (d / "id_client.pub").read_text().strip()
    # The remote side's `docker system dial-stdio` reaches the private engine.
    (d / "authorized_keys").write_text(f'environment="DOCKER_HOST={private_engine.url}" {client_pub}\n')
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "PermitUserEnvironment yes\n"
    )
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (d / "ssh_config").write_text(
        f"Host 127.0.0.1\n  IdentityFile {d / 'id_client'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
    )
    wrapper = d / "bin" / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {d / "ssh_config"} "$@"\n')
    wrapper.chmod(0o755)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        env = {"PATH": f"{d / 'bin'}:{os.environ['PATH']}"}
        deadline = time.time() + 30
        while subprocess.run([str(wrapper), "-p", str(port), f"{user}@127.0.0.1", "true"]).returncode != 0:
            assert proc.poll() is None and time.time() < deadline, (d / "sshd.log").read_text()
            time.sleep(0.3)
        yield f"ssh://{user}@127.0.0.1:{port}", env
    finally:
        proc.send_signal(signal.SIGTERM)  # this sshd's own pid only
        proc.wait(timeout=30)


@pytest.mark.docker
def test_ssh_host_places_a_task_imports_its_branch_and_reports_up(tmp_path, private_engine, sshd):
    url, ssh_env = sshd
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN, **ssh_env)
    args = ["--docker-image", private_engine.image, "--docker-host", f"s={url}:1"]
    checked = run_cli(["--hosts", *args], cwd=repo, env=env, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (row,) = [line for line in checked.stdout.splitlines() if line.startswith("s ")]
    assert " up " in row and "rtt" in row and f"image {private_engine.image}: same" in row, row
    assert "transport ssh" in row, row
    result = run_cli([PROMPT.format(word="ssh"), "--no-tui", *args], cwd=repo, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    run_id = only_run_id(tmp_path)
    try:
        _check_placed_and_imported(tmp_path, repo, result, private_engine, "s", "ssh")
    finally:
        remove_run(private_engine.url, run_id)


# ---------------------------------------------------------------- docker context


@pytest.mark.docker
@pytest.mark.parametrize("endpoint", ["unix", "tcp-tls"])
def test_context_host_places_a_task_and_imports_its_branch(tmp_path, private_engine, endpoint):
    docker_config = tmp_path / "docker-config"
    docker_config.mkdir()
    if endpoint == "unix":
        spec = f"host={private_engine.url}"
    else:  # the context keeps its own copy of the TLS files
        certs = client_cert_dir(tmp_path / "certs", private_engine.ca)
        spec = f"host={private_engine.tls_url},ca={certs / 'ca.pem'},cert={certs / 'cert.pem'},key={certs / 'key.pem'}"
    created = subprocess.run(
        ["docker", "--config", str(docker_config), "context", "create", "orc-private", "--docker", spec],
        capture_output=True,
        text=True,
    )
    assert created.returncode == 0, created.stderr
    config = _config(tmp_path, [{"name": "c", "context": "orc-private", "max_parallel": 1}])
    repo = make_repo(tmp_path / "repo")
    other = make_ca(tmp_path / "proxy-ca", name="proxy-ca")[0]  # must not replace the context's CA
    # The real docker CLI behind a wrapper that notes each call: the context is read once per start.
    bindir, calls = tmp_path / "bin", tmp_path / "docker-calls"
    bindir.mkdir()
    (bindir / "docker").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {shutil.which("docker")} "$@"\n')
    (bindir / "docker").chmod(0o755)
    path = f"{bindir}:{os.environ['PATH']}"
    env = cli_env(tmp_path, **NO_DISK_MIN, DOCKER_CONFIG=str(docker_config), REQUESTS_CA_BUNDLE=str(other), PATH=path)
    result = run_cli(
        [PROMPT.format(word="ctx"), "--no-tui", "--config", str(config), "--docker-image", private_engine.image],
        cwd=repo,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert calls.read_text().splitlines().count("context inspect orc-private") == 1, calls.read_text()
    run_id = only_run_id(tmp_path)
    try:
        _check_placed_and_imported(tmp_path, repo, result, private_engine, "c", "ctx")
        # The context is gone later: a finished run is still shown and summarised, its engine not counted.
        subprocess.run(["docker", "--config", str(docker_config), "context", "rm", "-f", "orc-private"], check=True)
        for args in (["--show-run", run_id], ["--resume", run_id, "--no-tui"]):
            shown = run_cli(args, cwd=repo, env=env, timeout=120)
            assert shown.returncode == 0, (args, shown.stderr)
            assert "Traceback" not in shown.stderr, shown.stderr
            assert "containers and volumes not counted (docker context 'orc-private' not found" in shown.stdout, (
                shown.stdout
            )
    finally:
        remove_run(private_engine.url, run_id)


# ---------------------------------------------------------------- cert_path checks


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"name": "t", "docker": "tcp://h:2376"}, ["'t'", "ca.pem, cert.pem, key.pem"]),
        ({"name": "t", "docker": "ssh://ci@h"}, ["'t'", "tcp://"]),
        ({"name": "t", "context": "x"}, ["'t'", "context"]),
    ],
)
def test_bad_cert_path_is_one_clear_error(tmp_path, entry, words):
    from orchestrator.errors import ConfigError
    from orchestrator.runner.hosts import resolve_hosts

    entry = {**entry, "cert_path": str(tmp_path)}
    with pytest.raises(ConfigError) as info:
        resolve_hosts([entry])
    assert all(w in str(info.value) for w in words), str(info.value)


def test_cert_path_is_read_from_the_config_file(tmp_path):
    from orchestrator.config import load_config
    from orchestrator.runner.hosts import resolve_hosts

    certs = client_cert_dir(tmp_path / "certs", make_ca(tmp_path / "ca"))
    config = _config(tmp_path, [{"name": "t", "docker": "tcp://127.0.0.1:2376", "cert_path": str(certs)}])
    loaded = load_config(config_file=str(config), cli_overrides={}, cwd=tmp_path, environ={}).config
    (spec,) = resolve_hosts(loaded.runner.hosts)
    assert spec.tls is not None and spec.tls.verify
    assert spec.tls.ca == str(certs / "ca.pem") and spec.tls.cert == (str(certs / "cert.pem"), str(certs / "key.pem"))


@pytest.mark.docker
def test_tcp_tls_with_a_client_certificate_the_engine_rejects_is_one_line(tmp_path, private_engine):
    """The engine's CA is trusted, but the client certificate comes from another CA:
    the engine refuses the client. One line names the host and the client
    certificate to replace, no traceback, nothing of the run's is left half-made."""
    certs = client_cert_dir(tmp_path / "certs", make_ca(tmp_path / "stranger", name="stranger-ca"))
    shutil.copy(private_engine.ca[0], certs / "ca.pem")
    config = _config(tmp_path, [{"name": "strangerclient", "docker": private_engine.tls_url, "cert_path": str(certs)}])
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN)
    args = ["--config", str(config), "--docker-image", private_engine.image]
    result = run_cli([PROMPT.format(word="x"), "--no-tui", *args], cwd=repo, env=env, timeout=300)
    assert result.returncode != 0
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert "strangerclient" in line and "start Docker" not in line, line
    # The fix is the client certificate, not the CA file that is right.
    assert "refused this client's TLS certificate" in line and f"replace {certs / 'cert.pem'}" in line, line
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").iterdir())
    checked = run_cli(["--hosts", *args], cwd=repo, env=env)
    assert checked.returncode == 1 and "Traceback" not in checked.stderr
    assert "strangerclient DOWN" in checked.stdout and "refused this client's TLS certificate" in checked.stdout
    # The host answers no one: copying the image there is not the fix.
    assert "--sync-image" not in checked.stdout, checked.stdout


@pytest.mark.docker
def test_ssh_host_runs_eight_tasks_at_once(tmp_path, private_engine, sshd):
    """Eight tasks at once on one ssh:// host. docker-py made a new ssh connection for
    every API call: the burst of handshakes went past sshd's MaxStartups (10), the
    dropped ones reached tasks as Broken pipe, and ssh's complaints reached the
    terminal. Then pooled connections broke on reuse (a response closed the ssh
    process's stdout; closing a connection whose ssh had exited raised). Every
    task must come through, with nothing retried and nothing from ssh on stderr."""
    url, ssh_env = sshd
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN, **ssh_env)
    args = ["--docker-image", private_engine.image, "--docker-host", f"s={url}:8"]
    result = run_cli([PROMPT.format(word="$TASK"), "--runs", "8", "--no-tui", *args], cwd=repo, env=env, timeout=600)
    run_id = only_run_id(tmp_path)
    try:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        events = check_log(events_path(tmp_path, run_id))
        done = [e for e in events if e.type == "task.completed"]
        assert len(done) == 8 and not [e for e in events if e.type == "task.failed"]
        for e in done:
            assert git(repo, "show", f"{e.payload['artifact']['branch_final']}:t.txt")
        assert "kex_exchange" not in result.stderr and "Connection reset" not in result.stderr, result.stderr
        runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
        assert "runner.retry.scheduled" not in runner_log
    finally:
        remove_run(private_engine.url, run_id)


@pytest.mark.docker
def test_ssh_host_that_refuses_the_login_is_one_line_naming_the_host(tmp_path, private_engine, sshd):
    """ssh refuses the login (no such user): pre-flight stops with one line that names
    the host and says what ssh said, at once (no retries of a refusal), no traceback."""
    url, ssh_env = sshd
    port = url.rsplit(":", 1)[1]
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN, **ssh_env)
    args = ["--docker-image", private_engine.image, "--docker-host", f"refuser=ssh://nosuchuser@127.0.0.1:{port}:1"]
    result = run_cli([PROMPT.format(word="x"), "--no-tui", *args], cwd=repo, env=env, timeout=300)
    assert result.returncode != 0
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert "refuser" in line and "Permission denied" in line, line
    checked = run_cli(["--hosts", *args], cwd=repo, env=env, timeout=120)
    assert checked.returncode == 1 and "refuser" in checked.stdout and "Permission denied" in checked.stdout


# ---------------------------------------------------------------- transport security (issue 31)


def test_the_ssh_command_keeps_host_key_checking():
    """Nothing the orchestrator adds to ``ssh`` loosens host-key checking: no
    StrictHostKeyChecking (=no or accept-new), no known-hosts file of its own (an
    empty or /dev/null one trusts any key), and BatchMode so an unknown key fails
    instead of asking."""
    from orchestrator.runner.ssh_transport import ssh_command

    args = ssh_command("big1", "ci", "2222")
    options = [args[i + 1] for i, a in enumerate(args) if a == "-o"]
    assert "BatchMode=yes" in options, args
    keys = {o.split("=", 1)[0].lower() for o in options}
    assert not keys & {"stricthostkeychecking", "userknownhostsfile", "globalknownhostsfile", "checkhostip"}, args
    assert not any("/dev/null" in a or "known_hosts" in a.lower() for a in args), args
    assert args[-3:-1] == ["--", "big1"] and args[args.index("-l") : args.index("-l") + 2] == ["-l", "ci"]


@pytest.mark.docker
def test_an_ssh_host_with_an_unknown_host_key_is_refused_not_trusted(tmp_path, private_engine, sshd):
    """The engine's ssh host key is not in known_hosts (a new machine, or one posing as
    it): ssh refuses it, and so does the orchestrator; it never trusts the key."""
    url, ssh_env = sshd
    (tmp_path / "ssh" / "known_hosts").write_text("")
    config = tmp_path / "ssh" / "ssh_config"
    # ssh's own default (ask, which BatchMode turns into a refusal), not the fixture's "yes".
    config.write_text(config.read_text().replace("  StrictHostKeyChecking yes\n", ""))
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN, **ssh_env)
    args = ["--docker-image", private_engine.image, "--docker-host", f"unknownkey={url}:1"]
    checked = run_cli(["--hosts", *args], cwd=repo, env=env, timeout=120)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    (row,) = [line for line in checked.stdout.splitlines() if line.startswith("unknownkey ")]
    assert "DOWN" in row and "transport ssh" in row and "Host key verification failed" in row, row
    result = run_cli([PROMPT.format(word="x"), "--no-tui", *args], cwd=repo, env=env, timeout=300)
    assert result.returncode != 0 and "Host key verification failed" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr


@pytest.mark.docker
def test_a_context_that_skips_tls_verification_works_and_warns_naming_the_host(tmp_path, private_engine):
    """A docker context with skip-tls-verify and no CA of its own: TLS, the engine's
    certificate unchecked (it was plain HTTP to a TLS port), and a warning naming
    the host on --hosts and on the run's start."""
    docker_config = tmp_path / "docker-config"
    docker_config.mkdir()
    certs = client_cert_dir(tmp_path / "certs", private_engine.ca)
    spec = f"host={private_engine.tls_url},cert={certs / 'cert.pem'},key={certs / 'key.pem'},skip-tls-verify=true"
    created = subprocess.run(
        ["docker", "--config", str(docker_config), "context", "create", "orc-skip", "--docker", spec],
        capture_output=True,
        text=True,
    )
    assert created.returncode == 0, created.stderr
    config = _config(tmp_path, [{"name": "unverified", "context": "orc-skip", "max_parallel": 1}])
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **NO_DISK_MIN, DOCKER_CONFIG=str(docker_config))
    args = ["--config", str(config), "--docker-image", private_engine.image]
    warning = "warning: Docker host unverified (" + private_engine.tls_url + ") uses TLS without checking"
    checked = run_cli(["--hosts", *args], cwd=repo, env=env, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (row,) = [line for line in checked.stdout.splitlines() if line.startswith("unverified ")]
    assert " up " in row and "transport TLS unverified" in row, row
    assert warning in checked.stderr and "SkipTLSVerify" in checked.stderr, checked.stderr
    assert "InsecureRequestWarning" not in checked.stderr, checked.stderr
    result = run_cli([PROMPT.format(word="skip"), "--no-tui", *args], cwd=repo, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(warning) == 1 and "InsecureRequestWarning" not in result.stderr, result.stderr
    run_id = only_run_id(tmp_path)
    try:
        _check_placed_and_imported(tmp_path, repo, result, private_engine, "unverified", "skip")
    finally:
        remove_run(private_engine.url, run_id)


def test_doctor_shows_each_hosts_transport_security(tmp_path):
    """--doctor reads the transports from the configuration (no engine is contacted):
    ssh, TLS verified, TLS unverified (a SkipTLSVerify context), plain on loopback,
    plain with insecure: true; the last two that expose credentials are warnings."""
    from net_guard_helpers import guard_log, guarded_env

    docker_config = tmp_path / "docker-config"
    docker_config.mkdir()
    created = subprocess.run(
        ["docker", "--config", str(docker_config), "context", "create", "orc-skip", "--docker",
         "host=tcp://ctx.far.test:2376,skip-tls-verify=true"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    certs = client_cert_dir(tmp_path / "certs", make_ca(tmp_path / "ca"))
    config = _config(
        tmp_path,
        [
            {"name": "viassh", "docker": "ssh://ci@ssh.far.test"},
            {"name": "viatls", "docker": "tcp://tls.far.test:2376", "cert_path": str(certs)},
            {"name": "viaskip", "context": "orc-skip"},
            {"name": "vialo", "docker": "tcp://127.0.0.1:2375"},
            {"name": "viaplain", "docker": "tcp://plain.far.test:2375", "insecure": True},
        ],
    )
    repo = make_repo(tmp_path / "repo")
    env = guarded_env(tmp_path, DOCKER_CONFIG=str(docker_config))
    result = run_cli(["--doctor", "--config", str(config), "--docker-image", "no-such-image-h31"], cwd=repo, env=env)
    lines = {line.split(":")[0].split()[-1]: line for line in result.stdout.splitlines() if "docker host " in line}
    assert lines["viassh"].startswith("ok ") and "transport ssh" in lines["viassh"], lines
    assert lines["viatls"].startswith("ok ") and "transport TLS verified" in lines["viatls"], lines
    assert lines["viaskip"].startswith("warn") and "transport TLS unverified" in lines["viaskip"], lines
    assert "docker context 'orc-skip' has SkipTLSVerify" in lines["viaskip"], lines
    assert lines["vialo"].startswith("ok ") and "transport plain (loopback)" in lines["vialo"], lines
    assert lines["viaplain"].startswith("warn") and "transport plain (insecure)" in lines["viaplain"], lines
    assert "clear text" in lines["viaplain"], lines
    assert guard_log(env) == []
