"""The project's environment: agents and evaluations run with the project's own toolchain.

Reading a devcontainer or the configuration runs against real git repositories;
the end-to-end tests run the real `orchestrator` command on projects whose
tests need their toolchain (pytest and an editable install, an npm dependency),
with real Docker and the simulated agent running the project's tests inside
the environment.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from cli_helpers import ORCH, cli_env, only_run_id, run_cli, strategy_args
from conftest import TEST_BASE_IMAGE, git, make_repo
from environment_helpers import LOCAL_BASE, dry_run, made_file, resolve_at_head

from orchestrator.agent_image.environment import SetupCommand
from orchestrator.errors import ConfigError


def test_a_devcontainer_with_comments_and_every_command_form_is_read(tmp_path):
    repo = make_repo(
        tmp_path / "r",
        {
            ".devcontainer/devcontainer.json": """{
  // JSON with comments and trailing commas, as VS Code writes it
  "name": "demo",
  "image": "python:3.12-bookworm",
  "containerEnv": {"WS": "${containerWorkspaceFolder}/src", "P": "${containerEnv:PATH}:/x",},
  "remoteEnv": {"TOKEN_FROM_HOST": "${localEnv:TOKEN}"},
  "onCreateCommand": "pip install -e .",
  "updateContentCommand": ["make", "deps"],
  "postCreateCommand": {"a": "echo a", "b": ["echo", "b"]},
  "features": {"ghcr.io/devcontainers/features/node:1": {}},
  "forwardPorts": [8000],
}"""
        },
    )
    spec = resolve_at_head(repo, environ={"TOKEN": "from-the-host"})
    assert spec.source == ".devcontainer/devcontainer.json"
    assert spec.image == "python:3.12-bookworm"
    # the image answers ${containerEnv:PATH} when it is built; the host answers ${localEnv:...} now
    assert spec.container_env == {"WS": "/workspace/src", "P": "${containerEnv:PATH}:/x"}
    assert spec.remote_env == {"TOKEN_FROM_HOST": "from-the-host"}
    assert spec.setup == (
        SetupCommand(label="onCreateCommand", shell="pip install -e ."),
        SetupCommand(label="updateContentCommand", argv=("make", "deps")),
        SetupCommand(label="postCreateCommand.a", shell="echo a"),
        SetupCommand(label="postCreateCommand.b", argv=("echo", "b")),
    )
    # one line for what is not done; forwardPorts concerns an editor and says nothing
    assert spec.notes == (
        ".devcontainer/devcontainer.json: features are not installed (ghcr.io/devcontainers/features/node:1): "
        "install what they provide in onCreateCommand or in a Dockerfile (build.dockerfile)",
    )


def test_a_devcontainer_build_resolves_its_paths_from_its_own_folder(tmp_path):
    repo = make_repo(
        tmp_path / "r",
        {
            ".devcontainer/devcontainer.json": '{"build": {"dockerfile": "Dockerfile", "context": "..", '
            '"args": {"V": "1"}, "cacheFrom": "x"}}',
            ".devcontainer/Dockerfile": "FROM scratch\n",
        },
    )
    spec = resolve_at_head(repo)
    assert (spec.dockerfile, spec.context, spec.build_args) == (".devcontainer/Dockerfile", "", {"V": "1"})
    assert spec.notes == (
        ".devcontainer/devcontainer.json: build.cacheFrom is not used: orchestrator caches the built image itself",
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"dockerComposeFile": "compose.yml", "service": "app"}', "Docker Compose environments are not supported"),
        ('{"name": "nothing to run"}', "names no `image` and no `build.dockerfile`"),
        ('{"image": "x", ', "is not valid JSON"),
        ('{"image": "x", "postCreateCommand": 3}', "postCreateCommand must be a string"),
        ('{"build": {"dockerfile": "../../Dockerfile"}}', "points outside the repository"),
        ('{"build": {"args": {"P": "${containerEnv:PATH}"}}}', "only a built image can answer"),
        ('{"image": "x", "containerEnv": {"A": "${localEnv}"}}', "names no variable"),
    ],
)
def test_a_devcontainer_that_cannot_work_is_refused_in_one_line(tmp_path, text, message):
    repo = make_repo(tmp_path / "r", {".devcontainer.json": text})
    with pytest.raises(ConfigError, match=message) as info:
        resolve_at_head(repo)
    assert "\n" not in str(info.value)


def test_the_configuration_wins_over_a_devcontainer_and_is_read_at_the_base_commit(tmp_path):
    repo = make_repo(tmp_path / "r", {".devcontainer.json": '{"image": "a"}', "env/Dockerfile": "FROM scratch\n"})
    spec = resolve_at_head(repo, dockerfile="env/Dockerfile", setup=["make"])
    assert (spec.dockerfile, spec.context, spec.image) == ("env/Dockerfile", "env", None)
    assert spec.setup == (SetupCommand(label="environment.setup[0]", shell="make"),)
    assert "devcontainer is not" in spec.notes[0]
    assert resolve_at_head(repo, use_devcontainer=False) is None
    with pytest.raises(ConfigError, match="does not exist at the base commit"):
        resolve_at_head(repo, dockerfile="env/Missing")
    # a file only in the working tree is not the base commit's
    (repo / "later.json").write_text("{}")
    assert resolve_at_head(make_repo(tmp_path / "plain")) is None


# ---------------------------------------------------------------- end to end


TESTS_THEN_COMMIT = "SIM: exec ({cmd}) > result.txt 2>&1; echo exit=$? >> result.txt\nSIM: commit ran the tests"


# The tests of _python_repo's project run one after another on one test worker: its
# environment (apt, a venv, pip from PyPI) is the suite's costliest build, and the
# image is cached by what the setup reads, so the first test builds it for all three.
# Each still builds it when it runs alone.
PYTHON_ENVIRONMENT = pytest.mark.xdist_group("python_environment")


def _python_repo(path: Path, extra: dict[str, str] | None = None) -> Path:
    """A Python project whose tests need pytest and the package installed in editable mode."""
    files = {
        ".devcontainer/devcontainer.json": json.dumps(
            {
                "image": LOCAL_BASE,
                "containerEnv": {"DEMO_FLAG": "on"},
                "onCreateCommand": "apt-get update -qq && apt-get install -y -qq --no-install-recommends "
                "python3-pip python3-venv >/dev/null",
                "postCreateCommand": {
                    "venv": ["python3", "-m", "venv", ".venv"],
                    "deps": ".venv/bin/pip install -q pytest -e .",
                },
            }
        ),
        "pyproject.toml": '[project]\nname = "demo"\nversion = "0.1"\n[build-system]\nrequires = ["setuptools"]\n'
        'build-backend = "setuptools.build_meta"\n[tool.setuptools]\npy-modules = ["demo"]\n',
        "demo.py": "def add(a, b):\n    return a + b\n",
        "tests/test_demo.py": "import os\nimport demo\n\ndef test_add():\n    assert demo.add(1, 2) == 3\n"
        '    assert os.environ["DEMO_FLAG"] == "on"\n',
        ".gitignore": ".venv/\n*.egg-info/\n__pycache__/\n",
    }
    return make_repo(path, files | (extra or {}))


@pytest.mark.docker
@pytest.mark.slow
@PYTHON_ENVIRONMENT
def test_a_python_project_gets_pytest_and_its_editable_install_from_its_devcontainer(tmp_path):
    repo = _python_repo(tmp_path / "py")
    r = dry_run(repo, tmp_path, TESTS_THEN_COMMIT.format(cmd=".venv/bin/python -m pytest -q"))
    assert r.returncode == 0, r.stdout + r.stderr
    result = made_file(repo, "result.txt")
    assert "1 passed" in result and "exit=0" in result, result
    # what the setup made inside the repository came to the task, and was not committed as the agent's work
    made = [b for b in git(repo, "branch", "--format=%(refname:short)").split() if b != "main"]
    changed = git(repo, "diff", "--name-only", "main", made[0]).split()
    assert changed == ["result.txt"], changed


def _node_repo(path: Path, nonce: str) -> Path:
    package = {"name": "demo", "version": "1.0.0", "description": nonce, "dependencies": {"is-number": "7.0.0"}}
    lock = {
        "name": "demo",
        "version": "1.0.0",
        "lockfileVersion": 3,
        "requires": True,
        "packages": {
            "": {"name": "demo", "version": "1.0.0", "dependencies": {"is-number": "7.0.0"}},
            "node_modules/is-number": {
                "version": "7.0.0",
                "resolved": "https://registry.npmjs.org/is-number/-/is-number-7.0.0.tgz",
                "integrity": "sha512-41Cifkg6e8TylSpdtTpeLVMqvSBEVzTttHvERD741+pnZ8ANv0004MRL43QKPDlK9cGvNp6NZWZUBlbGXYxxng==",
                "engines": {"node": ">=0.12.0"},
            },
        },
    }
    return make_repo(
        path,
        {
            # the agent image has Node and npm: a stand-in for a user's Node image
            ".devcontainer/devcontainer.json": json.dumps({"image": TEST_BASE_IMAGE, "postCreateCommand": "npm ci"}),
            "package.json": json.dumps(package, indent=2) + "\n",
            "package-lock.json": json.dumps(lock, indent=2) + "\n",
            "test.js": "const isNumber = require('is-number');\nif (!isNumber(5)) process.exit(1);\n"
            "console.log('node test passed');\n",
            ".gitignore": "node_modules/\n",
        },
    )


@pytest.mark.docker
@pytest.mark.slow
def test_a_node_project_runs_npm_ci_once_and_every_task_gets_its_own_node_modules(tmp_path):
    repo = _node_repo(tmp_path / "node", uuid.uuid4().hex)  # a new lock input: the first run sets up
    prompt = (
        "SIM: exec node test.js > result.txt 2>&1; echo exit=$? >> result.txt; "
        "md5sum node_modules/is-number/index.js > seen.txt; echo changed >> node_modules/is-number/index.js\n"
        "SIM: commit ran the tests"
    )
    r = dry_run(repo, tmp_path / "a", prompt, "--runs", "2", "--max-parallel", "2")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "environment: setup postCreateCommand: npm ci" in out
    branches = [b for b in git(repo, "branch", "--format=%(refname:short)").split() if b != "main"]
    results = {git(repo, "show", f"{b}:result.txt") for b in branches}
    assert all("node test passed" in text and "exit=0" in text for text in results), results
    # each task saw the files as setup left them, whatever the other task did to its own copy
    seen = [git(repo, "show", f"{b}:seen.txt") for b in branches]
    assert len(seen) >= 2 and len(set(seen)) == 1, seen

    # the same base again: nothing is built and no setup runs
    r = dry_run(repo, tmp_path / "b", prompt)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "(cached)" in out and "environment: setup" not in out, out

    # a changed lock file runs the setup again
    lock = json.loads((repo / "package-lock.json").read_text())
    lock["name"] = "demo-renamed"
    (repo / "package-lock.json").write_text(json.dumps(lock, indent=2) + "\n")
    git(repo, "commit", "-qam", "lock changed")
    r = dry_run(repo, tmp_path / "c", prompt)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "environment: setup postCreateCommand: npm ci" in r.stderr


@pytest.mark.docker
def test_two_runs_started_together_build_their_environment_once(tmp_path):
    # Two runs of one project at once need the same new environment. Each used to
    # run the whole setup (for a real project, minutes of installs) and tag the
    # same name; now the second waits for the first's image.
    nonce = uuid.uuid4().hex
    repo = make_repo(
        tmp_path / "repo",
        {
            ".devcontainer.json": json.dumps(
                {"image": LOCAL_BASE, "onCreateCommand": f"sleep 6 && echo {nonce} > /etc/env-marker"}
            )
        },
    )
    args = [ORCH, "SIM: exec cat /etc/env-marker > out.txt\nSIM: commit out", "--dry-run", "--no-tui"]
    procs = [
        subprocess.Popen(args, cwd=repo, env=cli_env(tmp_path / n), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for n in ("a", "b")
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    said = [(out + err).decode(errors="replace") for out, err in outs]
    assert [p.returncode for p in procs] == [0, 0], said
    setups = [text.count("environment: setup onCreateCommand") for text in said]
    assert sorted(setups) == [0, 1], said
    waited = said[setups.index(0)]
    assert "environment: waiting for another run that is building" in waited and "(cached)" in waited, waited
    branches = [b for b in git(repo, "branch", "--format=%(refname:short)").split() if b != "main"]
    assert len(branches) == 2 and {git(repo, "show", f"{b}:out.txt") for b in branches} == {nonce}, branches


@pytest.mark.docker
@pytest.mark.slow
def test_a_devcontainer_dockerfile_is_built_from_the_base_commit(tmp_path):
    repo = make_repo(
        tmp_path / "df",
        {
            ".devcontainer/devcontainer.json": json.dumps(
                {
                    "build": {"dockerfile": "Dockerfile", "context": "..", "args": {"MARK": "from-args"}},
                    "postCreateCommand": ["sh", "-c", "cat /etc/env-mark > made-by-setup.txt"],
                }
            ),
            # an image with a uid-1000 user of its own, as devcontainer images often have
            ".devcontainer/Dockerfile": f"FROM {LOCAL_BASE}\nARG MARK\nCOPY marker.txt /etc/from-context\n"
            'RUN echo "$MARK" > /etc/env-mark && useradd -u 1000 -m vscode\n',
            "marker.txt": "committed\n",
            ".gitignore": "made-by-setup.txt\n",
        },
    )
    (repo / "marker.txt").write_text("uncommitted edit\n")  # the build context is the commit, not the work tree
    r = dry_run(
        repo,
        tmp_path,
        TESTS_THEN_COMMIT.format(cmd="cat /etc/env-mark /etc/from-context made-by-setup.txt; git --version; id -u"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    result = made_file(repo, "result.txt")
    assert result.splitlines()[:3] == ["from-args", "committed", "from-args"], result
    assert "git version" in result and "exit=0" in result
    assert result.splitlines()[-2] == "1000", result  # the agent ran as uid 1000, the image's own user


@pytest.mark.docker
def test_an_image_that_cannot_take_the_agent_tools_is_refused_in_one_line(tmp_path):
    tag = f"orchestrator-test-noshell:{uuid.uuid4().hex[:8]}"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM {TEST_BASE_IMAGE} AS src\nFROM scratch\nCOPY --from=src /usr/bin/tini-static /tini\n"
    )
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True)
    try:
        repo = make_repo(tmp_path / "r", {".devcontainer.json": json.dumps({"image": tag})})
        r = dry_run(repo, tmp_path, "SIM: print never", timeout=300)
        assert r.returncode == 1, r.stdout + r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith(f"orchestrator: error: the environment image {tag} has no /bin/sh"), r.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


@pytest.mark.docker
def test_a_failing_setup_stops_the_run_before_any_task_and_its_output_is_shown_once(tmp_path):
    script = "; ".join(f"echo line-{i}" for i in range(1, 41)) + "; exit 7"
    repo = make_repo(
        tmp_path / "bad", {".devcontainer.json": json.dumps({"image": TEST_BASE_IMAGE, "onCreateCommand": script})}
    )
    r = dry_run(repo, tmp_path, "SIM: print never")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the setup failed (.devcontainer.json, onCreateCommand, exit 7)" in r.stderr
    # Its output is shown as it runs, once: the error after it repeated its last 30 lines.
    said = [line.split()[-1] for line in r.stderr.splitlines() if line.split()[-1:] and "line-" in line.split()[-1]]
    assert said == [f"line-{i}" for i in range(1, 41)], r.stderr
    assert "its output is above; all of it is in " in r.stderr and "environment.log" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # no run was started: nothing to resume, nothing written
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").iterdir())


@pytest.mark.docker
def test_what_a_setup_leaves_that_git_does_not_ignore_is_named_by_its_folder(tmp_path):
    # A setup that makes a virtualenv in a repository that does not ignore it: the warning
    # listed its files (.venv/lib/m1.py, .venv/lib/m10.py, ...), not .venv/.
    setup = (
        "mkdir -p .venv/lib sub/cache && for i in $(seq 1 25); do : > .venv/lib/m$i.py; done; "
        f": > stray.txt; : > sub/cache/x; echo {uuid.uuid4().hex}"  # a new setup: not a cached image
    )
    repo = make_repo(tmp_path / "r", {"sub/keep.txt": "kept\n"})
    r = dry_run(repo, tmp_path, "SIM: print hi", "--env-setup", setup, timeout=600)
    built = [line.split()[-1] for line in r.stderr.splitlines() if line.startswith("environment: built ")]
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        (warning,) = [line for line in r.stderr.splitlines() if line.startswith("warning: the setup made files")]
        assert warning.endswith("(add them to .gitignore to keep them): .venv/, stray.txt, sub/cache/"), warning
    finally:
        for image in built:
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


def test_image_and_dockerfile_together_are_refused(tmp_path):
    repo = make_repo(tmp_path / "r")
    r = dry_run(repo, tmp_path, "x", "--env-image", "a", "--env-dockerfile", "Dockerfile", timeout=120)
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith("orchestrator: error: environment.image and environment.dockerfile")
    )


@pytest.mark.docker
def test_a_task_runs_in_the_agent_image_when_the_project_has_no_environment(tmp_path):
    repo = make_repo(tmp_path / "plain")
    r = dry_run(repo, tmp_path, "SIM: write a.txt x\nSIM: commit a", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "environment:" not in r.stderr
    manifest = json.loads((tmp_path / "state" / only_run_id(tmp_path) / "run.json").read_text())
    assert manifest["docker_image"] == "claude-code"


@pytest.mark.docker
def test_doctor_builds_the_environment_and_reports_its_tools_or_the_failed_setup(tmp_path):
    env = cli_env(tmp_path)
    repo = make_repo(tmp_path / "ok")
    r = run_cli(
        ["--doctor", "--repo", str(repo), "--env-setup", f"echo {uuid.uuid4().hex} > /etc/made"],
        cwd=repo,
        env=env,
        timeout=600,
    )
    lines = r.stdout.splitlines()
    assert any(
        line.startswith("ok    environment: the environment configuration: image orchestrator-env:") for line in lines
    ), r.stdout
    for tool in ("git", "claude", "orchestrator-sim-agent"):
        assert any(line.startswith(f"ok    {tool} in the environment:") for line in lines), r.stdout

    bad = make_repo(
        tmp_path / "bad",
        {
            ".devcontainer.json": json.dumps(
                {"image": TEST_BASE_IMAGE, "postCreateCommand": "echo broken-step >&2; exit 3"}
            )
        },
    )
    r = run_cli(["--doctor", "--repo", str(bad)], cwd=bad, env=env, timeout=600)
    assert r.returncode == 1
    assert any(
        line.startswith("fail  environment: the setup failed (.devcontainer.json, postCreateCommand, exit 3)")
        for line in r.stdout.splitlines()
    ), r.stdout
    assert "broken-step" in r.stderr


# Times the project's test suite; valid only when the tests ran and passed. Each
# committed sim/*.txt (one per implemented idea) is worth 10.
TIMED_TESTS = """import json, os, subprocess, time
t = time.monotonic()
run = subprocess.run([".venv/bin/python", "-m", "pytest", "-q"], capture_output=True, text=True)
n = len(os.listdir("sim")) if os.path.isdir("sim") else 0
print(run.stdout[-500:], run.stderr[-500:])
print(json.dumps({"metrics": {"throughput": 100 + 10 * n, "test_s": time.monotonic() - t}, "valid": run.returncode == 0}))
"""


@pytest.mark.docker
@pytest.mark.slow
@PYTHON_ENVIRONMENT
def test_a_tree_beam_dry_run_evaluates_the_base_and_its_candidates_in_the_environment(tmp_path):
    repo = _python_repo(tmp_path / "tb", {"bench_eval.py": TIMED_TESTS})
    r = dry_run(
        repo,
        tmp_path,
        "make the tests faster",
        *strategy_args(
            "tree-beam",
            eval_command="python3 bench_eval.py",
            primary_metric="throughput",
            ideas_per_node=2,
            max_depth=1,
            beam_width=1,
            max_total_evals=3,
        ),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    tree = json.loads((tmp_path / "results" / only_run_id(tmp_path) / "strategy_output" / "tree.json").read_text())
    root = tree["nodes"][0]
    assert root["id"] == "n0"
    evals = tree["evaluations"]
    assert evals, tree
    for e in evals:
        assert e["evaluation"]["valid"] is True, e["evaluation"]
        assert e["evaluation"]["metrics"]["throughput"] > 100, e["evaluation"]


@pytest.mark.docker
@pytest.mark.slow
def test_the_environment_reaches_another_engine_with_sync_image(tmp_path, private_engine):
    from reliability_helpers import NO_DISK_MIN, remove_run

    nonce = uuid.uuid4().hex
    repo = make_repo(
        tmp_path / "repo",
        {
            # A small user image and the private engine's slim agent image: what is
            # tested is that the environment crosses to the other engine, and a
            # smaller image crosses sooner (the test agent's would be 1.8 GB).
            ".devcontainer.json": json.dumps(
                {
                    "image": LOCAL_BASE,
                    "onCreateCommand": f"echo {nonce} > /etc/env-marker && mkdir -p build && echo seeded > build/seed.txt",
                }
            ),
            ".gitignore": "build/\n",
        },
    )
    env = cli_env(tmp_path, **NO_DISK_MIN)
    args = [
        "SIM: exec cat /etc/env-marker build/seed.txt > out.txt\nSIM: commit out",
        "--dry-run",
        "--no-tui",
        "--docker-host",
        f"b={private_engine.url}:1",
        "--docker-image",
        private_engine.image,
    ]
    refused = run_cli(args, cwd=repo, env=env, timeout=900)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--sync-image" in refused.stderr.strip().splitlines()[-1], refused.stderr
    synced = run_cli([*args, "--sync-image"], cwd=repo, env=env, timeout=900)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "syncing image to host b" in synced.stderr
    run_id = next(
        p.name
        for p in (tmp_path / "state").iterdir()
        if json.loads((p / "run.json").read_text())["dry_run"] and (p / "run.json").exists()
    )
    try:
        runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
        assert '"runner.archive.copied_in"' in runner_log  # it ran on the other engine, from a copied-in clone
        assert made_file(repo, "out.txt").split() == [nonce, "seeded"]
    finally:
        remove_run(private_engine.url, run_id)
        images = private_engine.docker("images", "-q", "orchestrator-env").stdout.split()
        if images:
            private_engine.docker("rmi", "-f", *images)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.fidelity
@PYTHON_ENVIRONMENT
def test_the_real_claude_code_runs_the_projects_tests_in_the_environment(tmp_path):
    from fidelity_helpers import ensure_image, fidelity_env, remove_run_resources

    repo = _python_repo(tmp_path / "py", {"run-tests.sh": ".venv/bin/python -m pytest -q\n"})
    # the environment as a run builds it
    r = dry_run(repo, tmp_path / "dry", "SIM: print ok")
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads((tmp_path / "dry" / "state" / only_run_id(tmp_path / "dry") / "run.json").read_text())
    env_image = manifest["docker_image"]
    assert env_image.startswith("orchestrator-env:")
    # the real CLIs of that environment, behind the scripted API
    image = ensure_image(env_image, f"orchestrator-fidelity:env-{env_image.split(':')[1][:12]}")
    env = fidelity_env(tmp_path / "real")
    try:
        r = run_cli(
            [
                "FIDELITY: tests",
                *("--plugin", "claude-code", "--model", "sonnet", "--docker-image", image),
                *("--no-devcontainer", "--no-tui"),
            ],
            cwd=repo,
            env=env,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        output = made_file(repo, "test-output.txt")
        assert "1 passed" in output and "exit=0" in output, output
    finally:
        remove_run_resources(tmp_path / "real" / "state")
        subprocess.run(["docker", "rmi", image], capture_output=True)


def test_a_setups_terminal_codes_reach_neither_the_console_nor_the_log(tmp_path):
    """npm, pip and test runners colour what they print; a setup's lines are shown as text."""
    from orchestrator.agent_image.environment import _Stream

    shown: list[str] = []
    log = tmp_path / "environment.log"
    rc, tail = _Stream(shown.append, log).run(
        ["sh", "-c", r"printf '\033[32madded 3 packages\033[0m\n\033]0;title\007done\n'"], prefix="  setup| "
    )
    assert rc == 0
    assert tail == ["added 3 packages", "done"]
    assert shown == ["  setup| added 3 packages", "  setup| done"]
    assert "\x1b" not in log.read_text()
