"""Shared fixtures: real git repositories and a real Docker runner with the sim agent."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Override to run the suite against another build, e.g. ORCHESTRATOR_TEST_IMAGE=orchestrator-test-agent:dev
TEST_IMAGE = os.environ.get("ORCHESTRATOR_TEST_IMAGE", "orchestrator-test-agent")
# The product image the test image is built FROM. A test image built under its own
# tag sits on a product image under its own tag too: without this the staleness
# check below compares it with the shared `claude-code` and rebuilds that one.
TEST_BASE_IMAGE = os.environ.get("ORCHESTRATOR_TEST_BASE_IMAGE", "claude-code")
sys.path.insert(0, str(Path(__file__).parent))
# These machines set PYTHONDONTWRITEBYTECODE, and pytest then rewrites the asserts
# of every test module again in each of a run's processes (a collection takes 11
# CPU-seconds instead of 4.5) instead of reading them back from tests/__pycache__.
# Only the test processes write: the commands the tests start keep the
# environment as it is.
sys.dont_write_bytecode = False


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


def docker_required() -> bool:
    """On CI, and whenever scripts/test.sh runs the suite, a missing engine or image fails every Docker test."""
    return bool(os.environ.get("CI") or os.environ.get("ORCHESTRATOR_TESTS_REQUIRE_DOCKER"))


def docker_ready() -> tuple[bool, str]:
    if shutil.which("docker") is None:
        return False, "docker CLI not installed (run scripts/setup-docker.sh)"
    try:
        if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
            return False, "Docker engine unreachable (docker info failed; run scripts/setup-docker.sh)"
    except subprocess.TimeoutExpired:
        return False, "Docker engine does not answer (docker info timed out)"
    r = subprocess.run(["docker", "image", "inspect", TEST_IMAGE], capture_output=True)
    if r.returncode != 0:
        return False, f"image {TEST_IMAGE} missing (run scripts/setup-docker.sh)"
    return True, ""


def _refresh_test_image() -> None:
    """Rebuild the test image when it is older than the simulated agent's sources (never test a stale agent).

    The check compares the image's inputs label with the sources in this
    checkout; the rebuild is ``orchestrator --build-image`` itself (cached
    layers: seconds), under a lock so that concurrent pytest processes build once.
    """
    import fcntl
    import tempfile

    from orchestrator.agent_image.build import test_image_is_current

    if test_image_is_current(TEST_BASE_IMAGE, TEST_IMAGE):
        return
    with open(Path(tempfile.gettempdir()) / "orchestrator-test-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if test_image_is_current(TEST_BASE_IMAGE, TEST_IMAGE):
            return
        r = subprocess.run(
            [
                str(Path(sys.executable).parent / "orchestrator"),
                "--build-image",
                "--docker-image",
                TEST_BASE_IMAGE,
                "--test-image",
                TEST_IMAGE,
            ],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if r.returncode != 0:
            raise pytest.UsageError(
                f"{TEST_IMAGE} is older than docker/ and rebuilding it failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
            )


_DOCKER_PROBLEM: str | None = None


# The private engine's tests in a few groups of consecutive tests. A worker
# starts its own engine for the first such test it runs (9 s and 12 CPU-seconds
# to load the slim image on a quiet machine, a minute beside five busy workers),
# so each group a worker takes can cost an engine: groups of three had all six
# workers start one, one of them for two tests. One group per module, though,
# made a chain of 15 minutes (test_hosts_*.py) that the whole run waited on with
# its CPUs idle. Four groups of equal length start first and end well before
# the rest of the run.
ENGINE_GROUPS = 4


def _group_for_workers(config, items) -> None:
    """Which tests pytest-xdist keeps together on one worker (``--dist loadgroup``).

    A fixture of module scope (a module's shared runs, for example) is made
    once per worker that runs a test of the module: the module's tests stay
    together so it is made once. The private engine's tests go in a few groups
    (ENGINE_GROUPS): grouped tests are handed out first, so these long chains
    start early.
    """

    def fixtures(item) -> dict:
        info = getattr(item, "_fixtureinfo", None)
        return info.name2fixturedefs if info is not None else {}

    engine_tests = [
        item for item in items if item.get_closest_marker("xdist_group") is None and "private_engine" in fixtures(item)
    ]
    engine_group = {
        id(item): f"private_engine_{i * ENGINE_GROUPS // len(engine_tests)}" for i, item in enumerate(engine_tests)
    }
    for item in items:
        defs = fixtures(item)
        named = item.get_closest_marker("xdist_group")
        if named is not None:
            group = named.args[0]  # a test's own group: the set-up it shares lies outside pytest's fixtures
        elif id(item) in engine_group:
            group = engine_group[id(item)]
        elif "dry_runs" in defs:
            group = "shared_runs"  # tests/shared_runs.py: made once, on the worker that reads them
        elif any(d and d[-1].scope in ("module", "class", "package") for d in defs.values()):
            group = item.module.__name__
        else:
            continue
        if named is None:
            item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, "loadgroup", False) and "@" not in item.nodeid and hasattr(item, "_id"):
            # pytest-xdist 3.8 names the group by setting ``item._nodeid``, which
            # pytest 9.2 no longer reads (the id is ``item._id``): without this every
            # group is silently spread over the workers.
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(f"{item.nodeid}@{group}")
    if getattr(config.option, "loadgroup", False):
        # Workers take work in collection order: the long chains (a group, a
        # torture test) go first, so the run does not end waiting on one of them,
        # and the tests without Docker (each a second or less) last: in file order
        # a minute-long Docker test late in the alphabet kept one worker busy while
        # the other five had nothing left to take.
        items.sort(
            key=lambda it: (
                0 if "@" in it.nodeid else 1 if "slow" in it.keywords else 2 if "docker" in it.keywords else 3
            )
        )


# tryfirst: pytest-xdist reads the groups in its own hook of this name, so they
# must be marked before it runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    global _DOCKER_PROBLEM
    _group_for_workers(config, items)
    if not any("docker" in item.keywords for item in items):
        return
    ok, why = docker_ready()
    if ok:
        _refresh_test_image()
        return
    if docker_required():
        _DOCKER_PROBLEM = why  # every Docker test fails with this line (pytest_runtest_setup)
        return
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """Name each failed test in $ORCHESTRATOR_TEST_FAILURES (scripts/test.sh runs them again alone)."""
    path = os.environ.get("ORCHESTRATOR_TEST_FAILURES")
    if path and report.failed:
        # pytest-xdist's loadgroup adds "@<group>" to the id; the test is named without it.
        nodeid = re.sub(r"@[\w.-]+$", "", report.nodeid)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(nodeid + "\n")


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With $ORCHESTRATOR_TEST_TIMELINE, write when each test ran and on which worker.

    scripts/test_timeline.py reads it: which worker ran what when, and where the
    run waited on a chain of tests instead of using both CPUs.
    """
    path = os.environ.get("ORCHESTRATOR_TEST_TIMELINE")
    if not path:
        yield
        return
    start = time.time()
    before = _cpu_seconds()
    yield
    line = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": start,
        "end": time.time(),
        # the worker's own CPU and its finished children's (the orchestrator
        # commands, git, the docker client); the engine's share is not in it
        "cpu": round(_cpu_seconds() - before, 3),
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The test cluster stops once the last Kubernetes test is done, when scripts/test.sh started it.

    Idle, its apiserver and kubelet take about 4.5 CPU-seconds a minute that the
    other workers' tests use for the rest of the run. A Kubernetes test run
    again afterwards starts it again (k8s_cluster.ensure_cluster).
    """
    if not os.environ.get("ORCHESTRATOR_TEST_K8S_STOP_AFTER") or item.get_closest_marker("kubernetes") is None:
        return
    if nextitem is None or nextitem.get_closest_marker("kubernetes") is None:
        from k8s_cluster import SCRIPT

        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=300, check=False)


def pytest_sessionfinish(session, exitstatus):
    """Under scripts/test.sh, the runs this session made leave the machine's engine when it ends.

    A finished run keeps its stopped containers and session volumes (retention),
    about 470 and 490 a session, and an engine holding thousands lists them slowly
    on every run's start and summary: a fourth session in a row on one machine took
    minutes longer (docs/reliability.md). Only exited containers whose run folder
    lies under this session's temporary directory go, with those runs' volumes.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") or not docker_required() or shutil.which("docker") is None:
        return
    base = f"{session.config._tmp_path_factory.getbasetemp()}/"
    listed = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            "label=orchestrator=true",
            "--filter",
            "status=exited",
            "--format",
            '{{.ID}} {{.Label "run_id"}} {{.Label "orchestrator.run_lock"}}',
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split("\n")
    ours = [row.split(" ", 2) for row in listed if row.count(" ") >= 2 and row.split(" ", 2)[2].startswith(base)]
    if not ours:
        return
    subprocess.run(["docker", "rm", "-f", *(c for c, _, _ in ours)], capture_output=True, check=False)
    prefixes = tuple(f"orc_home_{run}_g" for run in {r for _, r, _ in ours})
    volumes = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", "name=orc_home_"], capture_output=True, text=True, check=False
    ).stdout.split()
    doomed = [v for v in volumes if v.startswith(prefixes)]
    if doomed:
        subprocess.run(["docker", "volume", "rm", "-f", *doomed], capture_output=True, check=False)


def pytest_runtest_setup(item):
    if _DOCKER_PROBLEM is not None and "docker" in item.keywords:
        pytest.fail(f"Docker is required here (CI or scripts/test.sh) but not ready: {_DOCKER_PROBLEM}", pytrace=False)


@pytest.fixture
def run_id(tmp_path, monkeypatch):
    """A fresh run id for tests that drive the runner directly, with a workspace root of its own.

    The run's containers and session volumes are removed afterwards: the
    machine's Docker engine is shared.
    """
    rid = "t" + uuid.uuid4().hex[:10]
    monkeypatch.setenv("ORCHESTRATOR_WORKSPACE_ROOT", str(tmp_path / "ws"))
    yield rid
    subprocess.run(
        f"docker rm -f $(docker ps -aq --filter label=run_id={rid}) >/dev/null 2>&1; "
        f"docker volume rm $(docker volume ls -q --filter label=run_id={rid}) >/dev/null 2>&1",
        shell=True,
        check=False,
    )


# The api key of the ``runner`` fixture: tests plant it and check it never leaks.
RUNNER_SECRET = "plantedSecretValue-7f3a9c41d2"


@pytest.fixture
async def runner(tmp_path):
    """A DockerRunner on this machine's engine with RUNNER_SECRET as its api key, closed afterwards."""
    from orchestrator.runner import AuthConfig, DockerRunner
    from orchestrator.sanitize import Sanitizer

    r = DockerRunner(
        auth=AuthConfig(api_key=RUNNER_SECRET),
        logs_dir=tmp_path / "logs",
        sanitizer=Sanitizer(),
        pricing={"sonnet": (0.003, 0.015)},
    )
    yield r
    await r.aclose()


def runner_log(runner) -> list[dict]:
    """Every record a DockerRunner wrote to its runner.jsonl."""
    return [json.loads(line) for line in runner.log_path.read_text().splitlines()]


@pytest.fixture
def workspace_root(tmp_path, monkeypatch):
    """Isolated workspace root per test so parallel tests never share /tmp/orchestrator."""
    root = tmp_path / "ws"
    monkeypatch.setenv("ORCHESTRATOR_WORKSPACE_ROOT", str(root))
    return root


SLIM_TEST_IMAGE = "orchestrator-test-slim"


def _slim_test_image() -> str:
    """docker/Dockerfile.test-slim, built on the host engine: the private engines' image.

    Built from this checkout every session (cached layers: a second or so), under
    a lock so that the workers of one run build it once. It runs only the
    simulated agent, which is all the private engines' tests run.
    """
    import fcntl

    with open(Path(tempfile.gettempdir()) / "orchestrator-test-slim.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = subprocess.run(
            ["docker", "build", "-q", "-f", "docker/Dockerfile.test-slim", "-t", SLIM_TEST_IMAGE, "."],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if r.returncode != 0:
        pytest.fail(f"building {SLIM_TEST_IMAGE} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return SLIM_TEST_IMAGE


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
    # tls: it also listens on tcp://127.0.0.1:<port> with --tlsverify (the tcp:// host tests)
    engine = PrivateEngine(tls=True)
    # Our own tag on the slim test image: other sessions may rebuild the shared tag
    # meanwhile, and the run's pre-flight rightly refuses engines whose IDs differ.
    engine.image = f"{SLIM_TEST_IMAGE}:private-{os.getpid()}"
    subprocess.run(["docker", "tag", _slim_test_image(), engine.image], check=True, capture_output=True)
    try:
        engine.start()
        engine.load_image(engine.image)
        yield engine
    finally:
        engine.close()
        subprocess.run(["docker", "rmi", engine.image], capture_output=True)


@pytest.fixture
def proxy_dir():
    """A short directory for tests/engine_proxy.py's socket."""
    # A unix socket path is limited to 108 bytes, too short for some tmp_path names.
    path = Path(tempfile.mkdtemp(prefix="prx-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# A session fixture lives here to be one instance for every file that reads it (imported last:
# shared_runs imports this module).
# Headless Chromium with the network off, for the report's browser tests (per module).
from browser_helpers import browser  # noqa: E402, F401
from git_ops_helpers import host, isolated_git_config  # noqa: E402, F401
from shared_runs import dry_runs  # noqa: E402, F401
from tmux_helpers import sessions  # noqa: E402, F401
