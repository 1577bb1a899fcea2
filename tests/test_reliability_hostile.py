"""Hostile agents and hostile names, through the real command.

An agent runs arbitrary commands in its container; it must see only its own
clone at /workspace, its session volume and /tmp: not the host repository,
other tasks' workspaces, the Docker socket or host paths, and it cannot write
outside /workspace. With ``runner.network_egress=offline`` it has no network
at all (checked from inside without sending a packet anywhere but 127.0.0.1).
Keys and strategy names full of ``../``, spaces, ``--upload-pack=``, newlines
and unicode still give valid branch and container names.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap

import pytest
from conftest import git, make_repo
from reliability_helpers import (
    IMG,
    all_containers,
    check_log,
    check_snapshot_is_replay,
    cli_env,
    events_path,
    record,
    remove_run_docker,
    run_cli,
    run_ids,
    running_containers,
)

pytestmark = pytest.mark.docker
# Docker's own rule for container names
DOCKER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")


def probe_script(host_repo: str, workspace_root: str) -> str:
    """Shell that reports what the agent can reach; one 'name: verdict' line per probe."""
    probes = {
        "docker_socket": "test -e /var/run/docker.sock -o -e /run/docker.sock",
        "host_repo": f"test -e '{host_repo}/.git'",
        "host_workspaces": f"test -e '{workspace_root}'",
        # The run's object store is mounted read-only at /<store name>/objects.
        "object_store_visible": "ls -d /objects_*.git/objects >/dev/null",
        "write_object_store": 'touch "$(ls -d /objects_*.git/objects | head -1)/pwned"',
        "host_root_files": "test -e /root/.bashrc -o -e /etc/shadow -a -r /etc/shadow",
        "write_etc": "touch /etc/pwned",
        "write_usr": "touch /usr/pwned",
        "write_root": "touch /pwned",
        "write_parent": "touch /workspace/../pwned",
        "write_tmp": "touch /tmp/ok",
        "write_home": "touch /home/node/ok",
        "net_devices_besides_lo": "ls /sys/class/net | grep -qv '^lo$'",
        "default_route": "grep -qv '^Iface' /proc/net/route",
        "loopback_refused": (
            "python3 -c \"import socket\ntry:\n socket.create_connection(('127.0.0.1', 9), 2)\n"
            'except ConnectionRefusedError:\n raise SystemExit(0)\nraise SystemExit(1)"'
        ),
    }
    lines = ["#!/bin/sh"]
    for name, cmd in probes.items():
        lines.append(f"if {cmd} 2>/dev/null; then echo '{name}: yes'; else echo '{name}: no'; fi")
    return "\n".join(lines) + "\n"


def test_an_agent_cannot_reach_the_host_other_workspaces_or_the_network(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, ORCHESTRATOR_RUNNER__NETWORK_EGRESS="offline")
    script = probe_script(str(repo), str(tmp_path / "ws")).replace("\\", "\\\\").replace("\n", "\\n")
    prompt = (
        f"SIM: write probe.sh {script}\nSIM: exec sh probe.sh > probe.out 2>&1\n"
        "SIM: write-outside /etc/x\nSIM: write-outside /home/node/../../x\nSIM: commit probe\nSIM: print done"
    )
    result = run_cli([prompt, "--runs", "2", "--no-tui", *IMG], cwd=repo, env=env)
    (run_id,) = run_ids(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        summary = json.loads((tmp_path / "results" / run_id / "summary.json").read_text())
        assert len(summary["branches"]) == 2
        for branch in summary["branches"]:
            verdicts = dict(line.split(": ") for line in git(repo, "show", f"{branch}:probe.out").splitlines())
            assert verdicts == {
                "docker_socket": "no",
                "host_repo": "no",
                "host_workspaces": "no",
                "object_store_visible": "yes",
                "write_object_store": "no",
                "host_root_files": "no",
                "write_etc": "no",
                "write_usr": "no",
                "write_root": "no",
                "write_parent": "no",
                "write_tmp": "yes",
                "write_home": "yes",
                "net_devices_besides_lo": "no",
                "default_route": "no",
                "loopback_refused": "yes",
            }, verdicts
        assert not (repo / "pwned").exists() and not (tmp_path / "ws" / "pwned").exists()
        runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
        assert "write-outside /etc/x: failed" in runner_log
        assert "write-outside /home/node/../../x: failed" in runner_log
        record("hostile", tried=16, contained=16)
    finally:
        remove_run_docker(run_id)


HOSTILE_KEYS = [
    "../../etc/passwd",
    "with space",
    "--upload-pack=touch /tmp/pwned",
    "new\nline",
    "ünïcødé 🚀",
    "refs/heads/main",
    "x.lock",
    "..",
    "-",
    "a" * 300,
    "semi;colon$(id)`id`",
    "@{-1}",
    "trailing.",
]


def hostile_strategy_file(path) -> str:
    path.write_text(
        textwrap.dedent(f"""
        KEYS = {HOSTILE_KEYS!r}


        async def ünïcødé_策略(prompt, base_branch, ctx):
            handles = [ctx.run({{"prompt": f"SIM: write f{{i}}.txt {{i}}\\nSIM: commit c{{i}}"}}, key=ctx.key(k))
                       for i, k in enumerate(KEYS)]
            return await ctx.wait_all(handles)
    """)
    )
    return str(path)


def test_hostile_keys_and_strategy_names_give_valid_branch_and_container_names(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    strategy = hostile_strategy_file(tmp_path / "hostile strategy --upload-pack=x.py")
    result = run_cli(["go", "--strategy", strategy, "--max-parallel", "4", "--no-tui", *IMG], cwd=repo, env=env)
    (run_id,) = run_ids(tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        events = check_log(events_path(tmp_path, run_id))
        check_snapshot_is_replay(tmp_path, run_id)
        completed = [e for e in events if e.type == "task.completed"]
        assert len(completed) == len(HOSTILE_KEYS)
        branches = [e.payload["artifact"]["branch_final"] for e in completed]
        assert len(set(branches)) == len(HOSTILE_KEYS)
        for b in branches:
            assert subprocess.run(["git", "check-ref-format", f"refs/heads/{b}"]).returncode == 0, b
            assert not b.startswith("-") and "/" not in b and len(b) < 100, b
        assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"
        assert not (tmp_path / "pwned").exists() and not list(repo.glob("*pwned*"))
        names = all_containers(run_id)
        assert len(names) == len(HOSTILE_KEYS)
        assert all(DOCKER_NAME.match(n) for n in names), names
        assert running_containers(run_id) == []
        record(
            "bad input",
            tried=len(HOSTILE_KEYS) + 1,
            handled=len(HOSTILE_KEYS) + 1,
            what="hostile task keys + unicode strategy name",
        )
    finally:
        remove_run_docker(run_id)
