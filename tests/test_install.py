"""Installed like a tool: package data, --build-image, --doctor and the tools pre-flight finds in the image."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from cli_helpers import cli_env, run_cli
from conftest import REPO_ROOT, TEST_BASE_IMAGE, TEST_IMAGE, make_repo

from orchestrator.agent_image.pins import PINS_FILE, read_pins

INSTALL_IMAGE = "orchestrator-test-install"  # this test's own tag: shared images are never rebuilt here
NOCODEX_IMAGE = "orchestrator-test-nocodex"


def _out(result) -> str:
    return result.stdout + result.stderr


@pytest.mark.docker
@pytest.mark.slow
def test_uv_tool_install_then_build_image_doctor_and_dry_run_outside_the_checkout(tmp_path):
    uv = shutil.which("uv")
    assert uv, "uv is needed for this test (scripts/setup.sh installs it)"
    src = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(src)], check=True)
    env = cli_env(
        tmp_path,
        UV_TOOL_DIR=str(tmp_path / "tools"),
        UV_TOOL_BIN_DIR=str(tmp_path / "bin"),
        UV_PYTHON_DOWNLOADS="never",
        ORCHESTRATOR_CACHE_DIR=str(tmp_path / "cache"),
        OPENAI_API_KEY="sk-openai-test-0123456789abcdef",
    )
    env.pop("VIRTUAL_ENV", None)
    r = subprocess.run([uv, "tool", "install", str(src)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, _out(r)
    orch = str(tmp_path / "bin" / "orchestrator")
    work = make_repo(tmp_path / "project")  # nothing of the checkout is reachable from here

    def run(*args: str, timeout: float = 900):
        return subprocess.run([orch, *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    r = run("--build-image", "--docker-image", INSTALL_IMAGE)
    assert r.returncode == 0, _out(r)
    assert "site-packages" in r.stdout  # built from package data, not from the checkout
    assert f"done: {INSTALL_IMAGE} ready" in r.stdout
    pins = read_pins(REPO_ROOT / PINS_FILE)
    # the pinned versions are named before the build and confirmed after it
    assert f"@anthropic-ai/claude-code@{pins['claude']}, @openai/codex@{pins['codex']}" in r.stdout, r.stdout
    assert f"installed: claude {pins['claude']}, codex {pins['codex']}" in r.stdout, r.stdout

    r = run("--doctor", "--docker-image", INSTALL_IMAGE)
    assert r.returncode == 0, _out(r)
    lines = r.stdout.splitlines()
    assert not [line for line in lines if line.startswith("fail")], r.stdout
    for name in (
        "docker engine",
        f"claude in {INSTALL_IMAGE}",
        f"codex in {INSTALL_IMAGE}",
        f"git in {INSTALL_IMAGE}",
        "credentials for claude-code",
        "credentials for codex",
        "repository",
        "base branch",
        "git identity",
        "state directory",
        "logs directory",
    ):
        assert any(line.startswith("ok") and f"  {name}:" in line for line in lines), (name, r.stdout)
    for tool in ("claude", "codex"):
        assert any(f"  {tool} in {INSTALL_IMAGE}:" in line and f"(pinned: {pins[tool]})" in line for line in lines), (
            r.stdout
        )
    assert env["ANTHROPIC_API_KEY"] not in _out(r) and env["OPENAI_API_KEY"] not in _out(r)

    r = run("add a file", "--dry-run", "--no-tui", "--docker-image", INSTALL_IMAGE)
    assert r.returncode == 0, _out(r)
    assert list((tmp_path / "results").iterdir()), "the dry run left no results"


@pytest.mark.docker
def test_doctor_reports_each_failure_with_its_fix(tmp_path):
    env = cli_env(tmp_path, DOCKER_HOST="unix:///nonexistent/docker.sock", ANTHROPIC_API_KEY="")
    r = run_cli(["--doctor", "--repo", str(tmp_path / "missing")], cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 1, _out(r)
    assert "Traceback" not in _out(r)
    fails = {line.split(":")[0][6:] for line in r.stdout.splitlines() if line.startswith("fail")}
    assert {"docker engine", "credentials for claude-code", "repository"} <= fails, r.stdout
    assert all("-- fix: " in line for line in r.stdout.splitlines() if not line.startswith("ok"))


@pytest.mark.docker
def test_doctor_sees_the_tools_of_the_test_image(tmp_path):
    repo = make_repo(tmp_path / "repo")
    r = run_cli(
        ["--doctor", "--docker-image", TEST_IMAGE],
        cwd=repo,
        env=cli_env(tmp_path, ORCHESTRATOR_CACHE_DIR=str(tmp_path / "cache")),
        timeout=300,
    )
    assert f"ok    claude in {TEST_IMAGE}: simulated" in r.stdout, r.stdout
    assert f"ok    git in {TEST_IMAGE}: git version" in r.stdout, r.stdout
    assert "fail  credentials for claude-code" not in r.stdout  # cli_env sets a test key
    assert r.returncode == 1 or "fail" not in r.stdout  # codex credentials are only a warning


def _build_nocodex() -> None:
    dockerfile = (
        f"FROM {TEST_IMAGE}\nUSER root\nRUN rm -f /usr/local/bin/codex\nUSER node\n"
        "LABEL org.orchestrator.test=nocodex\n"
    )
    r = subprocess.run(
        ["docker", "build", "-q", "-t", NOCODEX_IMAGE, "-"],
        input=dockerfile,
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.docker
def test_preflight_refuses_an_image_without_the_plugins_tool(tmp_path):
    _build_nocodex()
    repo = make_repo(tmp_path / "repo")
    env = cli_env(
        tmp_path, OPENAI_API_KEY="sk-openai-test-0123456789abcdef", ORCHESTRATOR_CACHE_DIR=str(tmp_path / "cache")
    )
    r = run_cli(
        ["do it", "--plugin", "codex", "--model", "gpt-5", "--docker-image", NOCODEX_IMAGE, "--no-tui"],
        cwd=repo,
        env=env,
        timeout=300,
    )
    assert r.returncode == 2, _out(r)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "codex" in lines[0] and NOCODEX_IMAGE in lines[0] and "--build-image" in lines[0], (
        r.stderr
    )
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
    # The same image is fine for the claude-code plugin: only the tools a run executes are required.
    r = run_cli(["SIM: done", "--docker-image", NOCODEX_IMAGE, "--no-tui"], cwd=repo, env=env, timeout=300)
    assert r.returncode == 0, _out(r)


def test_test_image_staleness_follows_the_agent_sources(tmp_path):
    from orchestrator.agent_image.build import test_image_is_current
    from orchestrator.agent_image.paths import source_dir

    if not shutil.which("docker") or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("Docker engine unreachable on CI")
        pytest.skip("Docker engine unreachable")
    src = source_dir()
    assert test_image_is_current(TEST_BASE_IMAGE, TEST_IMAGE, src)  # conftest rebuilt it if it was stale
    copy = tmp_path / "src"
    shutil.copytree(src / "docker", copy / "docker")
    shutil.copy(src / "Dockerfile", copy / "Dockerfile")
    agent = next(p for p in sorted((copy / "docker").rglob("*.py")))
    agent.write_text(agent.read_text() + "\n# changed\n")
    assert not test_image_is_current(TEST_BASE_IMAGE, TEST_IMAGE, copy)


@pytest.mark.docker
def test_build_image_without_an_engine_is_one_line_and_exit_2(tmp_path):
    env = cli_env(tmp_path, DOCKER_HOST="unix:///nonexistent/docker.sock", ORCHESTRATOR_CACHE_DIR=str(tmp_path / "c"))
    r = run_cli(["--build-image", "--docker-image", INSTALL_IMAGE], cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, _out(r)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Docker engine" in lines[0] and "Traceback" not in _out(r), r.stderr


@pytest.mark.docker
def test_build_image_with_a_missing_base_image_names_it(tmp_path):
    env = cli_env(tmp_path, BASE_IMAGE="orchestrator-no-such-base:0", ORCHESTRATOR_CACHE_DIR=str(tmp_path / "c"))
    r = run_cli(["--build-image", "--docker-image", INSTALL_IMAGE], cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 2, _out(r)
    assert "BASE_IMAGE=orchestrator-no-such-base:0 is not present locally and cannot be pulled" in r.stderr


@pytest.mark.docker
@pytest.mark.slow
def test_setup_docker_script_builds_through_build_image(tmp_path):
    """scripts/setup-docker.sh is a thin caller of --build-image (own tags: the shared images are not touched)."""
    env = {
        **os.environ,
        "IMAGE_NAME": INSTALL_IMAGE,
        "TEST_IMAGE_NAME": f"{INSTALL_IMAGE}:sim",
        "ORCHESTRATOR_CACHE_DIR": str(tmp_path / "cache"),
    }
    r = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "setup-docker.sh")], env=env, capture_output=True, text=True, timeout=1800
    )
    assert r.returncode == 0, _out(r)
    assert "[build-image" in r.stdout and f"done: images {INSTALL_IMAGE} and {INSTALL_IMAGE}:sim ready" in r.stdout
    from orchestrator.agent_image.build import test_image_is_current

    assert test_image_is_current(INSTALL_IMAGE, f"{INSTALL_IMAGE}:sim")
    r = subprocess.run(
        ["docker", "run", "--rm", f"{INSTALL_IMAGE}:sim", "sh", "-c", 'readlink -f "$(command -v claude)"'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.strip() == "/usr/local/bin/orchestrator-sim-agent", _out(r)
