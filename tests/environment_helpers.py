"""What the project-environment tests (test_environment.py, test_devcontainer.py) share: the local Debian image,
an environment resolved at a repository's HEAD, a dry run of the command and the file a task's branch holds."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cli_helpers import cli_env, run_cli
from conftest import git

from orchestrator.agent_image.environment import resolve


def _local_debian() -> str:
    """The plain Debian image scripts/setup-docker.sh based the agent image on (no python, no pip)."""
    for name in ("orchestrator-base:bookworm", "debian:bookworm-slim"):
        try:
            if subprocess.run(["docker", "image", "inspect", name], capture_output=True, timeout=30).returncode == 0:
                return name
        except (OSError, subprocess.TimeoutExpired):
            break
    return "orchestrator-base:bookworm"  # missing: the Docker tests fail naming it


LOCAL_BASE = _local_debian()


def resolve_at_head(repo: Path, **kw):
    """The environment the run would use for ``repo``'s HEAD; ``kw`` overrides the configuration's settings."""
    params = {"image": None, "dockerfile": None, "setup": [], "use_devcontainer": True} | kw
    return resolve(str(repo), git(repo, "rev-parse", "HEAD"), **params)


def dry_run(repo: Path, tmp_path: Path, prompt: str, *extra: str, timeout: float = 900):
    env = cli_env(tmp_path)
    return run_cli([prompt, "--repo", str(repo), "--dry-run", "--no-tui", *extra], cwd=repo, env=env, timeout=timeout)


def made_file(repo: Path, path: str) -> str:
    """``path`` on the last branch the run made."""
    branches = [b for b in git(repo, "branch", "--format=%(refname:short)").split() if b != "main"]
    assert branches, "the task made no branch"
    return git(repo, "show", f"{branches[-1]}:{path}")
