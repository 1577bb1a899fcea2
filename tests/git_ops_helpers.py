"""Real git in temporary directories for the git isolation tests: a host repository with a side branch, agent
workspaces prepared from it, and the git config of the machine kept out. conftest.py offers the fixtures ``host``
and ``isolated_git_config`` (a module asks for the latter with ``pytestmark``: it must not apply to every test)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.runner.git_ops import _prepare_workspace_sync

IDENTITY = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def git(cwd: Path, *args: str, check: bool = True) -> str:
    env = {**os.environ, **IDENTITY}
    proc = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {args} failed: {proc.stderr}")
    return proc.stdout.strip()


def commit_file(repo: Path, name: str, content: str, message: str) -> str:
    (repo / name).write_text(content)
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def heads(repo: Path) -> dict[str, str]:
    out = git(repo, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/")
    return dict(line.split(" ") for line in out.splitlines())


def note(repo: Path, commit: str) -> str:
    return git(repo, "notes", "--ref=orchestrator", "show", commit, check=False)


@pytest.fixture
def isolated_git_config(monkeypatch, tmp_path):
    # No user/system config: notes must work without a configured identity.
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-global-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for k in IDENTITY:
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    repo = tmp_path / "host"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit_file(repo, "a.txt", "one\ntwo\n", "first")
    commit_file(repo, "b.txt", "bee\n", "second")
    git(repo, "checkout", "-q", "-b", "side")
    commit_file(repo, "side.txt", "side\n", "side work")
    git(repo, "checkout", "-q", "main")
    return repo


def make_ws(host: Path, ws: Path, *, changes: bool, n: int = 0, **kw) -> Path:
    _prepare_workspace_sync(host, "main", ws, **kw)
    if changes:
        commit_file(ws, f"agent{n}.txt", f"agent {n}\nline\n", f"agent work {n}")
        (ws / "a.txt").write_text("one\n")
        git(ws, "commit", "-q", "-am", "drop a line")
    return ws


def land(host: Path, ws: Path, branch: str) -> None:
    """Put the workspace HEAD on ``branch`` of the host behind the API's back."""
    git(
        host, "fetch", "-q", "--upload-pack=git -c 'safe.directory=*' upload-pack", str(ws), f"HEAD:refs/heads/{branch}"
    )


def ws_head(ws: Path) -> str:
    return git(ws, "rev-parse", "HEAD")
