"""Shared fixtures: real git repositories and a real Docker runner with the sim agent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_IMAGE = "orchestrator-test-agent"
sys.path.insert(0, str(Path(__file__).parent))


def git(cwd, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "dev@example.com")
    git(path, "config", "user.name", "Dev")
    for name, text in (files or {"README.md": "# demo\n"}).items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture
def git_repo(tmp_path) -> Path:
    return make_repo(tmp_path / "repo")


def docker_ready() -> tuple[bool, str]:
    if shutil.which("docker") is None:
        return False, "docker CLI not installed (run scripts/setup-docker.sh)"
    r = subprocess.run(["docker", "image", "inspect", TEST_IMAGE], capture_output=True)
    if r.returncode != 0:
        return False, f"image {TEST_IMAGE} missing (run scripts/setup-docker.sh)"
    return True, ""


def pytest_collection_modifyitems(config, items):
    ok, why = docker_ready()
    if ok or os.environ.get("CI"):
        return  # on CI a missing engine must fail loudly, never skip
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def workspace_root(tmp_path, monkeypatch):
    """Isolated workspace root per test so parallel tests never share /tmp/orchestrator."""
    root = tmp_path / "ws"
    monkeypatch.setenv("ORCHESTRATOR_WORKSPACE_ROOT", str(root))
    return root


@pytest.fixture(scope="session")
def private_engine():
    """A second dockerd of the test session's own, with the test image loaded.

    Tests that stop, kill or restart an engine use this one: the host's engine is
    shared by everyone on the machine and is never signalled (see private_engine.py).
    """
    from private_engine import PrivateEngine, private_engine_missing

    why = private_engine_missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"cannot start a private Docker engine: {why}")
        pytest.skip(f"cannot start a private Docker engine: {why}")
    engine = PrivateEngine()
    # Our own tag on today's test image: other sessions may rebuild the shared tag
    # meanwhile, and the run's pre-flight rightly refuses engines whose IDs differ.
    engine.image = f"{TEST_IMAGE}:private-{os.getpid()}"
    subprocess.run(["docker", "tag", TEST_IMAGE, engine.image], check=True, capture_output=True)
    try:
        engine.start()
        engine.load_image(engine.image)
        yield engine
    finally:
        engine.close()
        subprocess.run(["docker", "rmi", engine.image], capture_output=True)
