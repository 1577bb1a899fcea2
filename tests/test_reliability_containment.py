"""Containing a hostile agent, and keeping credentials out of branches (the real command, Docker, sim agent).

The container: no capability at all (so no raw sockets), a process limit, an
open-file limit, Docker's default seccomp profile, a read-only /proc/sys. The
import: the task's commits are scanned for the run's credentials (also
base64-, hex- and percent-encoded) and common token shapes before the branch
reaches the repository; a symlink stays a symlink object and is never followed.
"""

from __future__ import annotations

import base64
import json
import subprocess

import pytest
from cli_helpers import TEST_KEY, run_events
from conftest import git, make_repo
from reliability_helpers import IMG, cli_env, record, remove_run_docker, run_cli, run_ids

pytestmark = pytest.mark.docker


def _inspect(run_id: str) -> list[dict]:
    names = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True, check=True
    ).stdout.split()
    return json.loads(subprocess.run(["docker", "inspect", *names], capture_output=True, text=True, check=True).stdout)


PROBES = {
    # each line: name, then a command that succeeds only if the agent got through
    "raw_socket": "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)'",
    "mount_tmpfs": "mount -t tmpfs none /tmp",
    "unshare_user": "unshare -r true",
    "unshare_mount": "unshare -m true",
    "proc_sys_write": "sh -c 'echo 1 > /proc/sys/kernel/sysrq'",
    "chown_root": "chown root /tmp/owned",
    "caps_effective_nonzero": "grep -q '^CapEff:.*[1-9a-f]' /proc/self/status",
}


def test_task_containers_drop_every_capability_and_limit_processes_and_open_files(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, ORCHESTRATOR_RUNNER__CONTAINER_LIMITS__PIDS_LIMIT="300")
    lines = ["#!/bin/sh", "touch /tmp/owned"]
    lines += [
        f"if {cmd} >/dev/null 2>&1; then echo '{name}: yes'; else echo '{name}: no'; fi" for name, cmd in PROBES.items()
    ]
    lines += ['echo "nofile: $(ulimit -n)"']
    script = "\n".join(lines).replace("\\", "\\\\").replace("\n", "\\n") + "\\n"
    prompt = f"SIM: write probe.sh {script}\nSIM: exec sh probe.sh > probe.out 2>&1\nSIM: commit probe\nSIM: print done"
    result = run_cli([prompt, "--no-tui", *IMG], cwd=repo, env=env)
    (run_id,) = run_ids(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        (container,) = _inspect(run_id)
        host = container["HostConfig"]
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
        assert host["PidsLimit"] == 300
        assert {"Name": "nofile", "Soft": 4096, "Hard": 4096} in host["Ulimits"]
        assert "no-new-privileges" in host["SecurityOpt"]
        assert not any("seccomp" in opt for opt in host["SecurityOpt"])  # Docker's default profile stays on
        (branch,) = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())["branches"]
        out = dict(line.split(": ", 1) for line in git(repo, "show", f"{branch}:probe.out").splitlines())
        assert {name: out[name] for name in PROBES} == {name: "no" for name in PROBES}, out
        assert out["nofile"] == "4096"
        record(
            "hostile",
            tried=len(PROBES) + 1,
            contained=len(PROBES) + 1,
            what="raw socket, mount, unshare -r/-m, /proc/sys write, chown, capabilities, open files",
        )
    finally:
        remove_run_docker(run_id)


def _run_leak(tmp_path, content_cmd: str, **env_extra):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, **env_extra)
    prompt = f"SIM: write notes.md some notes\n{content_cmd}\nSIM: commit add config\nSIM: print done"
    result = run_cli([prompt, "--no-tui", *IMG], cwd=repo, env=env)
    (run_id,) = run_ids(tmp_path)
    return repo, run_id, result


@pytest.mark.parametrize(
    "how,command",
    [
        ("plain", f"SIM: write config.env ANTHROPIC_API_KEY={TEST_KEY}"),
        ("base64", "SIM: write config.env blob=" + base64.b64encode(b'{"k": "' + TEST_KEY.encode() + b'"}').decode()),
        ("hex", "SIM: write config.env k=" + TEST_KEY.encode().hex()),
        ("token shape", "SIM: write config.env GITHUB_TOKEN=ghp_" + "a1B2" * 9),
    ],
)
def test_a_branch_holding_a_credential_is_not_imported(tmp_path, how, command):
    repo, run_id, result = _run_leak(tmp_path, command)
    try:
        assert result.returncode != 0
        failed = [e for e in run_events(tmp_path, run_id) if e["type"] == "task.failed"]
        assert len(failed) == 1 and failed[0]["payload"]["error_type"] == "secret"
        message = failed[0]["payload"]["message"]
        assert "config.env:1" in message and "notes.md" not in message
        assert git(repo, "branch", "--list", "simple_*") == ""  # nothing imported
        for path in (tmp_path / "logs" / run_id).iterdir():
            assert TEST_KEY not in path.read_text(errors="replace"), path
            assert TEST_KEY.encode().hex() not in path.read_text(errors="replace"), path
        workspaces = list((tmp_path / "ws").rglob("config.env"))
        assert workspaces, "the workspace is kept for inspection"
        # The finished run's object store is gone; the kept workspace borrows from the repository instead.
        assert not list((tmp_path / "ws" / run_id).glob("*objects_*")), list((tmp_path / "ws" / run_id).iterdir())
        # (the agent's user owns it: git asks to be told it is safe to read)
        assert git(workspaces[0].parent, "-c", "safe.directory=*", "log", "--format=%s") == "add config\ninitial"
        record(
            "commit scan", tried=1, handled=1, what=f"credential committed ({how}): import refused, error_type secret"
        )
    finally:
        remove_run_docker(run_id)


def test_secret_scan_warn_imports_and_reports(tmp_path):
    repo, run_id, result = _run_leak(
        tmp_path, f"SIM: write config.env KEY={TEST_KEY}", ORCHESTRATOR_RUNNER__SECRET_SCAN="warn"
    )
    try:
        assert result.returncode == 0, result.stderr
        (branch,) = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())["branches"]
        assert "config.env" in git(repo, "ls-tree", "--name-only", branch)
        log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
        warning = [json.loads(line) for line in log.splitlines() if "runner.secret_scan.warning" in line]
        assert warning and "config.env:1" in warning[0]["findings"] and TEST_KEY not in log
    finally:
        remove_run_docker(run_id)


def test_a_symlink_to_a_host_path_stays_a_symlink_object(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    secret_file = tmp_path / "host-secret.txt"
    secret_file.write_text("host only\n")
    prompt = (
        f"SIM: exec ln -s {secret_file} host-link\nSIM: exec ln -s /etc/passwd passwd-link\n"
        "SIM: commit links\nSIM: print done"
    )
    result = run_cli([prompt, "--no-tui", *IMG], cwd=repo, env=env)
    (run_id,) = run_ids(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        (branch,) = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())["branches"]
        tree = {line.split("\t")[1]: line.split()[0] for line in git(repo, "ls-tree", branch).splitlines()}
        assert tree["host-link"] == "120000" and tree["passwd-link"] == "120000"
        assert git(repo, "cat-file", "-p", f"{branch}:host-link") == str(secret_file)
        assert "host only" not in git(repo, "log", "-p", branch)
        assert git(repo, "status", "--porcelain") == ""  # the host checkout was not touched
        record("hostile", tried=1, contained=1, what="symlinks to host paths imported as symlink objects")
    finally:
        remove_run_docker(run_id)
