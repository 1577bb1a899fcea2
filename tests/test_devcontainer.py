"""A devcontainer that works in VS Code works here (issue 44).

The devcontainer.json files below are those of public repositories, each
written in with its origin (repository, path, commit). Docker Hub and the
other registries are unreachable here, so where a file names an image of a
registry, that one reference is replaced by a local stand-in, built by the
test from the local Debian image with what the real image has that the file
relies on (a user, sudo, a Python); each replacement says so. Everything else
in the files is as their projects wrote it.

The end-to-end tests run the real ``orchestrator`` command with real Docker
and git, building real images.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest
from cli_helpers import cli_env, run_cli
from conftest import TEST_BASE_IMAGE, git, make_repo
from environment_helpers import LOCAL_BASE, dry_run, made_file, resolve_at_head

from orchestrator.agent_image.devcontainer import PROPERTIES
from orchestrator.agent_image.environment import SetupCommand, resolve_env, tools_path

ROOT = Path(__file__).resolve().parent.parent


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


# ---------------------------------------------------------------- files of public repositories

# microsoft/vscode-remote-try-python, .devcontainer/devcontainer.json at
# e351212b72f76fb557c6f31956eb44756300b8b4. The image reference
# "mcr.microsoft.com/devcontainers/python:1-3.12" is replaced by {image}.
TRY_PYTHON = """// For format details, see https://aka.ms/devcontainer.json. For config options, see the
// README at: https://github.com/devcontainers/templates/tree/main/src/python
{
\t"name": "Python 3",
\t// Or use a Dockerfile or Docker Compose file. More info: https://containers.dev/guide/dockerfile
\t"image": "{image}",

\t// Features to add to the dev container. More info: https://containers.dev/features.
\t// "features": {},

\t// Configure tool-specific properties.
\t"customizations": {
\t\t// Configure properties specific to VS Code.
\t\t"vscode": {
\t\t\t"settings": {},
\t\t\t"extensions": [
\t\t\t\t"streetsidesoftware.code-spell-checker"
\t\t\t]
\t\t}
\t},
\t
\t// Use 'forwardPorts' to make a list of ports inside the container available locally.
\t// "forwardPorts": [9000],

\t// Use 'portsAttributes' to set default properties for specific forwarded ports.\x20
\t// More info: https://containers.dev/implementors/json_reference/#port-attributes
\t"portsAttributes": {
\t\t"9000": {
\t\t\t"label": "Hello Remote World",
\t\t\t"onAutoForward": "notify"
\t\t}
\t},

\t// Use 'postCreateCommand' to run commands after the container is created.
\t"postCreateCommand": "pip3 install -r requirements.txt"

\t// Uncomment to connect as root instead. More info: https://aka.ms/dev-containers-non-root.
\t// "remoteUser": "root"
}
"""

# bootc-dev/bootc, .devcontainer/devcontainer.json at 534c76ea474a356aa288f6767635e579ea2614d5:
# it extends PATH through ${containerEnv:PATH}. The image reference
# "ghcr.io/bootc-dev/devenv-debian" is replaced by {image}.
BOOTC = """{
  "name": "bootc-devenv-debian",
  "image": "{image}",
  "customizations": {
    "vscode": {
      // Arbitrary, but most of our code is in one of these two
      "extensions": [
        "rust-lang.rust-analyzer",
        "golang.Go"
      ]
    },
    "devaipod": {
      // When running under devaipod, use minimal capabilities
      // (SYS_ADMIN, NET_ADMIN, etc.) instead of full --privileged.
      "nestedContainers": true
    }
  },
  "features": {},
  // Use privileged mode for broad compatibility (Codespaces, Docker,
  // stock devcontainer CLI). devaipod overrides this with tighter
  // security via the nestedContainers customization above.
  "privileged": true,
  "postCreateCommand": {
    // Our init script
    "devenv-init": "sudo /usr/local/bin/devenv-init.sh"
  },
  "remoteEnv": {
    "PATH": "${containerEnv:PATH}:/usr/local/cargo/bin"
  }
}
"""

# devcontainers/templates, src/kubernetes-helm/.devcontainer/devcontainer.json at
# c1ca13c3ecd61ece026017bfababc041ed4d0440. Its image's tag "bullseye" is replaced
# by one no registry has, so that the pull fails wherever the test runs.
KUBERNETES_HELM = """// For format details, see https://aka.ms/devcontainer.json. For config options, see the
// README at: https://github.com/devcontainers/templates/tree/main/src/kubernetes-helm
{
\t"name": "Kubernetes - Local Configuration",
\t// Or use a Dockerfile or Docker Compose file. More info: https://containers.dev/guide/dockerfile
\t"image": "mcr.microsoft.com/devcontainers/base:orchestrator-test-no-such-tag",

\t"features": {
\t\t"ghcr.io/devcontainers/features/docker-outside-of-docker:1": {
\t\t\t"enableNonRootDocker": "true",
\t\t\t"moby": "true"
\t\t},
\t\t"ghcr.io/devcontainers/features/kubectl-helm-minikube:1": {
\t\t\t"version": "latest",
\t\t\t"helm": "latest",
\t\t\t"minikube": "none"
\t\t},
\t\t"./local-features/copy-kube-config": {}
\t},

\t"remoteEnv": {
\t\t"SYNC_LOCALHOST_KUBECONFIG": "true"
\t},

\t"initializeCommand": "cd .devcontainer && bash ensure-mount-sources",
\t"mounts": [
\t\t{
\t\t\t"source": "${env:HOME}${env:USERPROFILE}/.kube",
\t\t\t"target": "/usr/local/share/kube-localhost",
\t\t\t"type": "bind"
\t\t},
\t\t// Optional mount to also sync certs in your .minikube folder
\t\t{
\t\t\t"source": "${env:HOME}${env:USERPROFILE}/.minikube",
\t\t\t"target": "/usr/local/share/minikube-localhost",
\t\t\t"type": "bind"
\t\t}
\t]

\t// Use 'forwardPorts' to make a list of ports inside the container available locally.
\t// "forwardPorts": [],

\t// Use 'postCreateCommand' to run commands after the container is created.
\t// "postCreateCommand": "kubectl version",

\t// Configure tool-specific properties.
\t// "customizations": {},

\t// Uncomment to connect as root instead. More info: https://aka.ms/dev-containers-non-root.
\t// "remoteUser": "root"
}
"""

# astral-sh/ruff, .devcontainer/devcontainer.json at 2d8e9bfe9ba49a96432f727a61b51369f0ffce13.
RUFF = """// For format details, see https://aka.ms/devcontainer.json. For config options, see the
// README at: https://github.com/devcontainers/templates/tree/main/src/rust
{
\t"name": "Ruff",
\t"image": "mcr.microsoft.com/devcontainers/rust:0-1-bullseye",
\t"mounts": [
\t\t{
\t\t\t"source": "devcontainer-cargo-cache-${devcontainerId}",
\t\t\t"target": "/usr/local/cargo",
\t\t\t"type": "volume"
\t\t}
\t],
\t"customizations": {
\t\t"codespaces": {
\t\t\t"openFiles": [
\t\t\t\t"CONTRIBUTING.md"
\t\t\t]
\t\t},
\t\t"vscode": {
\t\t\t"extensions": [
\t\t\t\t"ms-python.python",
\t\t\t\t"rust-lang.rust-analyzer",
\t\t\t\t"fill-labs.dependi",
\t\t\t\t"tamasfe.even-better-toml",
\t\t\t\t"Swellaby.vscode-rust-test-adapter",
\t\t\t\t"charliermarsh.ruff"
\t\t\t],
\t\t\t"settings": {
\t\t\t\t"rust-analyzer.updates.askBeforeDownload": false
\t\t\t}
\t\t}
\t},
\t// Features to add to the dev container. More info: https://containers.dev/features.
\t"features": {
\t\t"ghcr.io/devcontainers/features/python": {
\t\t\t"installTools": false
\t\t}
\t},
\t// Use 'forwardPorts' to make a list of ports inside the container available locally.
\t// "forwardPorts": [],
\t"postCreateCommand": ".devcontainer/post-create.sh"
\t// Configure tool-specific properties.
\t// "customizations": {},
\t// Uncomment to connect as root instead. More info: https://aka.ms/dev-containers-non-root.
\t// "remoteUser": "root"
}
"""

# home-assistant/core, .devcontainer/devcontainer.json at 01fc1e5f988d7012adde270fc70a963b4da83677:
# the older format (a top-level dockerFile and context, extensions and settings).
HOME_ASSISTANT = """// See https://aka.ms/vscode-remote/devcontainer.json for format details.
{
  "name": "Home Assistant Dev",
  "context": "..",
  "dockerFile": "../Dockerfile.dev",
  "postCreateCommand": "mkdir -p config && pip3 install -e .",
  "appPort": 8123,
  "runArgs": ["-e", "GIT_EDITOR=code --wait"],
  "extensions": [
    "ms-python.python",
    "visualstudioexptteam.vscodeintellicode",
    "ms-azure-devops.azure-pipelines",
    "redhat.vscode-yaml",
    "esbenp.prettier-vscode"
  ],
  "settings": {
    "python.pythonPath": "/usr/local/bin/python",
    "python.linting.pylintEnabled": true,
    "python.linting.enabled": true,
    "python.formatting.provider": "black",
    "editor.formatOnPaste": false,
    "editor.formatOnSave": true,
    "editor.formatOnType": true,
    "files.trimTrailingWhitespace": true,
    "terminal.integrated.shell.linux": "/bin/bash",
    "yaml.customTags": [
      "!secret scalar",
      "!include_dir_named scalar",
      "!include_dir_list scalar",
      "!include_dir_merge_list scalar",
      "!include_dir_merge_named scalar"
    ]
  }
}
"""

# python/cpython, .devcontainer/devcontainer.json at 29853b91c79004a0ee6ff4dffecc2db40761ab1c
# (its customizations left out: editor settings, nothing a run reads).
CPYTHON = """{
    "image": "ghcr.io/python/devcontainer:2024.09.25.11038928730",
    "onCreateCommand": [
        // Install common tooling.
        "dnf",
        "install",
        "-y",
        "which",
        "zsh",
        "fish",
        // For umask fix below.
        "/usr/bin/setfacl"
    ],
    "updateContentCommand": {
        // Using the shell for `nproc` usage.
        "python": "./configure --config-cache --with-pydebug && make -s -j `nproc`",
        "docs": [
            "make",
            "--directory",
            "Doc",
            "venv",
            "html"
        ]
    },
    "postCreateCommand": {
        // https://github.com/orgs/community/discussions/26026
        "umask fix: workspace": ["sudo", "setfacl", "-bnR", "."],
        "umask fix: /tmp": ["sudo", "setfacl", "-bnR", "/tmp"]
    }
}
"""

# The label the real mcr.microsoft.com/devcontainers/python image carries: its
# remoteUser comes from devcontainers/images, src/python/.devcontainer/devcontainer.json
# at bed3eb260c3c0d78a95ba6a5c27af3601a44b3c8 ("remoteUser": "vscode").
PYTHON_IMAGE_METADATA = '[{"remoteUser": "vscode"}]'


# ---------------------------------------------------------------- reading (no Docker)


def test_the_files_of_real_projects_are_read_and_what_is_not_done_is_named(tmp_path):
    helm = resolve_at_head(
        make_repo(tmp_path / "helm", {".devcontainer/devcontainer.json": KUBERNETES_HELM}), environ={}
    )
    where = ".devcontainer/devcontainer.json"
    assert helm.remote_env == {"SYNC_LOCALHOST_KUBECONFIG": "true"}
    assert list(helm.notes) == [
        f"{where}: features are not installed (ghcr.io/devcontainers/features/docker-outside-of-docker:1, "
        "ghcr.io/devcontainers/features/kubectl-helm-minikube:1, ./local-features/copy-kube-config): install "
        "what they provide in onCreateCommand or in a Dockerfile (build.dockerfile)",
        f"{where}: initializeCommand is not run: VS Code runs it on your machine before it creates the container, "
        "and tasks get the base commit's files, not what it makes there",
        f"{where}: mounts are not made (2): a task sees only its own workspace (a clone of the base commit) "
        "and its own home",
    ]

    ruff = resolve_at_head(make_repo(tmp_path / "ruff", {".devcontainer/devcontainer.json": RUFF}), environ={})
    assert ruff.image == "mcr.microsoft.com/devcontainers/rust:0-1-bullseye"
    assert ruff.setup == (SetupCommand(label="postCreateCommand", shell=".devcontainer/post-create.sh"),)
    assert [n.split(": ", 1)[1].split(" ")[0] for n in ruff.notes] == ["mounts", "features"]

    # the older format: a top-level dockerFile, relative to the file's folder, with its context
    ha = resolve_at_head(
        make_repo(
            tmp_path / "ha",
            {".devcontainer/devcontainer.json": HOME_ASSISTANT, "Dockerfile.dev": "FROM scratch\n"},
        ),
        environ={},
    )
    assert (ha.dockerfile, ha.context, ha.image) == ("Dockerfile.dev", "", None)
    assert ha.setup == (SetupCommand(label="postCreateCommand", shell="mkdir -p config && pip3 install -e ."),)
    assert ha.notes == (
        f"{where}: runArgs are not passed to Docker (-e 'GIT_EDITOR=code --wait'): task containers get "
        "orchestrator's own limits, network and user",
    )

    # every form of a lifecycle command, comments between an array's items
    cpython = resolve_at_head(make_repo(tmp_path / "cpython", {".devcontainer/devcontainer.json": CPYTHON}), environ={})
    assert [(c.label, c.display()) for c in cpython.setup] == [
        ("onCreateCommand", "dnf install -y which zsh fish /usr/bin/setfacl"),
        ("updateContentCommand.python", "./configure --config-cache --with-pydebug && make -s -j `nproc`"),
        ("updateContentCommand.docs", "make --directory Doc venv html"),
        ("postCreateCommand.umask fix: workspace", "sudo setfacl -bnR ."),
        ("postCreateCommand.umask fix: /tmp", "sudo setfacl -bnR /tmp"),
    ]
    assert cpython.notes == ()

    bootc = resolve_at_head(
        make_repo(tmp_path / "bootc", {".devcontainer/devcontainer.json": BOOTC.replace("{image}", "x")}), environ={}
    )
    # empty features install nothing, and say nothing
    assert bootc.notes == (
        f"{where}: privileged is not granted: task containers keep orchestrator's own limits "
        "(no extra capabilities, no privileged mode)",
    )


def test_variables_resolve_as_the_specification_says(tmp_path):
    repo = make_repo(
        tmp_path / "proj",
        {
            ".devcontainer.json": json.dumps(
                {
                    "image": "${localEnv:REGISTRY:localhost}/img",
                    "containerEnv": {
                        "HOST_USER": "${localEnv:USER}",
                        "UNSET": "[${localEnv:NOPE}]",
                        "DEFAULTED": "${localEnv:NOPE:fallback}",
                        "EMPTY_IS_SET": "${localEnv:EMPTY:unused}",
                        "OLD_SPELLING": "${env:USER}",
                        "WS": "${containerWorkspaceFolder}/src:${containerWorkspaceFolderBasename}",
                        "LOCAL": "${localWorkspaceFolderBasename}",
                        "ID": "${devcontainerId}",
                        "LANG_TOO": "${containerEnv:LANG}",
                    },
                    "remoteEnv": {
                        "PATH": "${containerEnv:PATH}:/extra/bin",
                        "SEEN": "${containerEnv:HOST_USER}-${containerEnv:MISSING:dflt}-${HOME}",
                        "GONE": None,
                    },
                    "postCreateCommand": "echo ${containerWorkspaceFolder} ${containerEnv:LANG} ${HOME}",
                }
            )
        },
    )
    spec = resolve_at_head(repo, environ={"USER": "dev", "EMPTY": ""})
    assert spec.image == "localhost/img"
    env = spec.container_env
    assert (env["HOST_USER"], env["UNSET"], env["DEFAULTED"], env["EMPTY_IS_SET"], env["OLD_SPELLING"]) == (
        "dev",
        "[]",
        "fallback",
        "",
        "dev",
    )
    assert env["WS"] == "/workspace/src:workspace" and env["LOCAL"] == "proj"
    assert (
        re.fullmatch(r"[0-9a-v]{52}", env["ID"]) and env["ID"] == resolve_at_head(repo, environ={}).container_env["ID"]
    )
    # the image answers ${containerEnv:...}: left for the build, then resolved against the image's own environment
    assert env["LANG_TOO"] == "${containerEnv:LANG}"
    image_env = {"PATH": "/opt/orchestrator/bin:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/home/node"}
    final, setup = resolve_env(spec, image_env)
    assert final["LANG_TOO"] == "C.UTF-8"
    assert final["PATH"] == "/opt/orchestrator/bin:/usr/local/bin:/usr/bin:/bin:/extra/bin"
    assert final["SEEN"] == "dev-dflt-/home/node" and final["GONE"] == ""
    # a command's ${HOME} is the shell's, not the file's
    assert setup[0].shell == "echo /workspace C.UTF-8 ${HOME}"
    assert not any("${" in v for k, v in final.items()), final


def test_a_secret_taken_from_the_host_is_kept_out_of_what_the_run_writes(tmp_path):
    from orchestrator.sanitize import default_sanitizer

    token = f"value-{uuid.uuid4().hex}"  # matches no pattern of a known token: only its name says secret
    repo = make_repo(
        tmp_path / "r",
        {".devcontainer.json": json.dumps({"image": "x", "remoteEnv": {"GITHUB_TOKEN": "${localEnv:GITHUB_TOKEN}"}})},
    )
    assert resolve_at_head(repo, environ={"GITHUB_TOKEN": token}).remote_env == {"GITHUB_TOKEN": token}
    # the run's logs and reports, and the environment's build log, go through this sanitizer
    assert token not in default_sanitizer().scrub_text(f"echo {token}")


def test_a_devcontainer_only_in_the_work_tree_is_named_with_how_to_use_it(tmp_path):
    from orchestrator.agent_image.environment import worktree_note

    repo = make_repo(tmp_path / "r")
    head = git(repo, "rev-parse", "HEAD")
    assert worktree_note(str(repo), head) is None
    (repo / ".devcontainer").mkdir()
    (repo / ".devcontainer" / "devcontainer.json").write_text('{"image": "x"}')
    (repo / ".devcontainer" / "Dockerfile").write_text("FROM x\n")
    assert resolve_at_head(repo, environ={}) is None  # the base commit has none: none is used
    assert worktree_note(str(repo), head) == (
        "environment: .devcontainer/Dockerfile, .devcontainer/devcontainer.json in your work tree differ from the "
        f"base commit {head[:10]}; runs use the committed devcontainer: commit the change to use it"
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "devcontainer")
    assert worktree_note(str(repo), git(repo, "rev-parse", "HEAD")) is None


def test_a_path_a_devcontainer_sets_keeps_the_tools_reachable():
    image = "/opt/orchestrator/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    # a literal PATH that leaves out every directory of the image
    assert tools_path("/venv/bin:/home/vscode/.local/bin", image) == (
        "/opt/orchestrator/bin:/venv/bin:/home/vscode/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    )
    # the project's directories keep their order; orchestrator's pinned tools stay first
    assert tools_path(f"/venv/bin:{image}", image) == f"/opt/orchestrator/bin:/venv/bin:{image.split(':', 1)[1]}"
    # an image without orchestrator's layer (the agent image itself) gets no directory it lacks
    assert tools_path("/x", "/usr/bin:/bin") == "/x:/usr/bin:/bin"


def test_the_docs_table_names_every_property_of_the_specification():
    # The properties of https://containers.dev/implementors/json_reference/ and its
    # schema (devcontainers/spec, schemas/devContainer.base.schema.json at c95ffee).
    spec_properties = {
        "name", "forwardPorts", "portsAttributes", "otherPortsAttributes", "containerEnv", "remoteEnv",
        "remoteUser", "containerUser", "updateRemoteUserUID", "userEnvProbe", "overrideCommand", "shutdownAction",
        "init", "privileged", "capAdd", "securityOpt", "mounts", "features", "overrideFeatureInstallOrder",
        "customizations", "image", "build.dockerfile", "build.context", "build.args", "build.options",
        "build.target", "build.cacheFrom", "appPort", "workspaceMount", "workspaceFolder", "runArgs",
        "dockerComposeFile", "service", "runServices", "initializeCommand", "onCreateCommand",
        "updateContentCommand", "postCreateCommand", "postStartCommand", "postAttachCommand", "waitFor",
        "hostRequirements", "secrets", "$schema",
    }  # fmt: skip
    assert spec_properties <= set(PROPERTIES), spec_properties - set(PROPERTIES)
    doc = (ROOT / "docs" / "environment.md").read_text()
    table = doc.split("### Every property of the specification", 1)[1].split("\n#", 1)[0]
    # one place decides: the table is the code's, word for word
    rows = re.findall(r"^\| `([^`]+)` \| (.*) \|$", table, re.M)
    assert rows == [(name, handling.docs) for name, handling in PROPERTIES.items()]


# ---------------------------------------------------------------- end to end


# The issue's repro, as it was filed: ${containerEnv:PATH} reached Docker as
# written and the setup failed with "ls: not found".
REPRO = {
    "image": "orchestrator-base:bookworm",
    "remoteEnv": {"PATH": "${containerEnv:PATH}:/extra/bin"},
    "postCreateCommand": "ls /usr/bin | wc -l",
}


@pytest.mark.docker
def test_a_devcontainer_that_extends_path_through_container_env_runs(tmp_path):
    assert REPRO["image"] == LOCAL_BASE, "the repro names the local Debian image scripts/setup-docker.sh makes"
    repo = make_repo(tmp_path / "repro", {".devcontainer/devcontainer.json": json.dumps(REPRO)})
    # an edit not committed: the committed file is used, and a line says how to use the edit
    (repo / ".devcontainer" / "devcontainer.json").write_text(json.dumps({**REPRO, "name": "edited"}))
    r = dry_run(repo, tmp_path, 'SIM: exec (echo "$PATH"; git --version) > seen.txt\nSIM: commit seen')
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "${" not in out, out
    assert (
        "environment: .devcontainer/devcontainer.json in your work tree differs from the base commit "
        f"{git(repo, 'rev-parse', 'HEAD')[:10]}; runs use the committed devcontainer: commit the change to use it"
    ) in r.stderr
    if "environment: setup postCreateCommand" in r.stderr:  # not when another test built it first
        assert re.search(r"^  setup\| \d+$", r.stderr, re.M), r.stderr
    path, version = made_file(repo, "seen.txt").splitlines()
    assert path == "/opt/orchestrator/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/extra/bin"
    assert version.startswith("git version")


@pytest.mark.docker
def test_a_literal_path_in_container_env_keeps_the_agent_tools(tmp_path):
    # Before, the agent tools were gone and the run ended with "rebuild it with orchestrator --build-image".
    devcontainer = {"image": LOCAL_BASE, "containerEnv": {"PATH": "/project/bin:/usr/bin:/bin"}}
    repo = make_repo(tmp_path / "literal", {".devcontainer.json": json.dumps(devcontainer)})
    r = dry_run(
        repo,
        tmp_path,
        'SIM: exec (echo "$PATH"; command -v orchestrator-sim-agent; command -v git) > seen.txt\nSIM: commit',
    )
    assert r.returncode == 0, r.stdout + r.stderr
    path, sim, git_path = made_file(repo, "seen.txt").splitlines()
    assert path == "/opt/orchestrator/bin:/project/bin:/usr/bin:/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/sbin"
    assert (sim, git_path) == ("/opt/orchestrator/bin/orchestrator-sim-agent", "/usr/bin/git")


@pytest.mark.docker
def test_an_environment_image_that_cannot_be_pulled_is_a_preflight_error_naming_both_ways_out(tmp_path):
    repo = make_repo(tmp_path / "helm", {".devcontainer/devcontainer.json": KUBERNETES_HELM})
    r = dry_run(repo, tmp_path, "SIM: print never", timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    last = _last_line(r.stderr)
    assert last.startswith(
        "orchestrator: error: the environment image 'mcr.microsoft.com/devcontainers/base:orchestrator-test-no-such-tag' "
        "(.devcontainer/devcontainer.json) is not here and cannot be pulled ("
    ), r.stderr
    assert last.endswith(
        "; run without the devcontainer with --no-devcontainer, or give an image you have with --env-image NAME "
        "(docker images lists them)"
    ), last
    # what the file asks for that is not done was said first, one line each
    for what in ("features are not installed", "initializeCommand is not run", "mounts are not made (2)"):
        assert sum(what in line for line in r.stderr.splitlines()) == 1, (what, r.stderr)
    assert "Traceback" not in r.stderr


def _stand_in(tmp_path: Path, name: str, lines: str) -> str:
    """A local image standing in for a registry's, from the local Debian image."""
    tag = f"orchestrator-test-standin-{name}:{uuid.uuid4().hex[:8]}"
    ctx = tmp_path / f"standin-{name}"
    ctx.mkdir()
    # One apt layer for every stand-in (Docker's cache keeps it): what the real
    # images have and the files rely on, plus git, so the agent-tools layer needs no apt.
    (ctx / "Dockerfile").write_text(
        f"FROM {LOCAL_BASE}\n"
        "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "sudo python3-venv git procps ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/*\n" + lines
    )
    built = subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr
    return tag


@pytest.mark.docker
def test_bootc_s_devcontainer_runs_its_sudo_setup_as_the_image_user_and_extends_path(tmp_path):
    # Stands in for ghcr.io/bootc-dev/devenv-debian (bootc-dev/infra, devenv/Containerfile.debian):
    # a user devenv with passwordless sudo as the image's USER, an init script, cargo in /usr/local/cargo/bin.
    image = _stand_in(
        tmp_path,
        "bootc",
        "RUN useradd -m devenv -s /bin/bash && echo 'devenv ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/devenv "
        "&& chmod 0440 /etc/sudoers.d/devenv\n"
        "RUN mkdir -p /usr/local/cargo/bin && printf '#!/bin/sh\\necho cargo-stand-in\\n' > /usr/local/cargo/bin/cargo "
        "&& chmod 755 /usr/local/cargo/bin/cargo\n"
        "RUN printf '#!/bin/sh\\necho \"init by $SUDO_USER as $(id -un)\" > /etc/devenv-init.done\\n' "
        "> /usr/local/bin/devenv-init.sh && chmod 755 /usr/local/bin/devenv-init.sh\n"
        "USER devenv\n",
    )
    try:
        repo = make_repo(tmp_path / "bootc", {".devcontainer/devcontainer.json": BOOTC.replace("{image}", image)})
        r = dry_run(
            repo,
            tmp_path,
            'SIM: exec (cat /etc/devenv-init.done; echo "$PATH"; cargo; id -u) > seen.txt 2>&1\nSIM: commit seen',
        )
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stderr.splitlines()
        assert (
            "environment: the setup runs as devenv (the image's USER); agents run as the same uid 1000, "
            "named node, with home /home/node"
        ) in lines, r.stderr
        assert any(line.endswith("privileged is not granted: task containers keep orchestrator's own limits "
                                 "(no extra capabilities, no privileged mode)") for line in lines), r.stderr  # fmt: skip
        init, path, cargo, uid = made_file(repo, "seen.txt").splitlines()
        assert init == "init by devenv as root"
        assert path.startswith("/opt/orchestrator/bin:") and path.endswith(":/usr/local/cargo/bin"), path
        assert (cargo, uid) == ("cargo-stand-in", "1000")
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


@pytest.mark.docker
def test_try_python_runs_its_setup_as_the_remote_user_its_image_names(tmp_path):
    # Stands in for mcr.microsoft.com/devcontainers/python: a Python that user vscode (uid 1000)
    # installs into, first on PATH, and the image's devcontainer.metadata naming vscode.
    image = _stand_in(
        tmp_path,
        "python",
        "RUN useradd -m -u 1000 -s /bin/bash vscode && python3 -m venv /usr/local/python "
        "&& chown -R vscode /usr/local/python\n"
        "ENV PATH=/usr/local/python/bin:$PATH\n"
        f"LABEL devcontainer.metadata='{PYTHON_IMAGE_METADATA}'\n",
    )
    try:
        repo = make_repo(
            tmp_path / "try-python",
            {
                ".devcontainer/devcontainer.json": TRY_PYTHON.replace("{image}", image),
                "requirements.txt": "flask\n",  # the repository's, as it is
            },
        )
        r = dry_run(
            repo,
            tmp_path,
            'SIM: exec (python3 -c "import flask, sys; print(flask.__name__, sys.prefix)"; id -u) > seen.txt 2>&1\n'
            "SIM: commit seen",
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert (
            "environment: the setup runs as vscode (remoteUser of the image's devcontainer.metadata); agents run as "
            "the same uid 1000, named node, with home /home/node"
        ) in r.stderr.splitlines(), r.stderr
        # comments parsed; customizations and portsAttributes are an editor's, and say nothing
        assert ".devcontainer/devcontainer.json:" not in r.stderr, r.stderr
        assert made_file(repo, "seen.txt").splitlines() == ["flask /usr/local/python", "1000"]
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


@pytest.mark.docker
def test_a_tool_missing_from_an_image_is_named_with_its_real_cause(tmp_path):
    # An agent image whose PATH leaves out /usr/local/bin: the tool is there, the PATH is the fix.
    tag = f"orchestrator-test-narrowpath:{uuid.uuid4().hex[:8]}"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {TEST_BASE_IMAGE}\nENV PATH=/usr/bin:/bin\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True)
    try:
        repo = make_repo(tmp_path / "plain")
        r = dry_run(repo, tmp_path, "SIM: print never", "--docker-image", tag, timeout=300)
        assert r.returncode == 2, r.stdout + r.stderr
        assert _last_line(r.stderr) == (
            f"orchestrator: error: Docker image '{tag}' has no orchestrator-sim-agent on its PATH: it is in "
            "/usr/local/bin, which the PATH (/usr/bin:/bin) does not include; add /usr/local/bin to the image's "
            "PATH (ENV PATH) or pick another --docker-image"
        )
        doctor = run_cli(
            ["--doctor", "--dry-run", "--repo", str(repo), "--docker-image", tag], cwd=repo, env=cli_env(tmp_path)
        )
        assert (
            f"fail  orchestrator-sim-agent in {tag}: missing (a dry run runs it): it is in /usr/local/bin, which "
            "the PATH (/usr/bin:/bin) does not include -- fix: add /usr/local/bin to the image's PATH (ENV PATH) "
            "or pick another --docker-image"
        ) in doctor.stdout.splitlines(), doctor.stdout
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)

    # An environment whose setup removed a tool: no PATH can bring it back, and --doctor says what did it.
    gone = make_repo(
        tmp_path / "gone",
        {
            ".devcontainer.json": json.dumps(
                {
                    "image": LOCAL_BASE,
                    "postCreateCommand": "rm /opt/orchestrator/bin/orchestrator-sim-agent",
                }
            )
        },
    )
    doctor = run_cli(["--doctor", "--repo", str(gone)], cwd=gone, env=cli_env(tmp_path), timeout=600)
    line = next(
        (x for x in doctor.stdout.splitlines() if x.startswith("fail  orchestrator-sim-agent in the environment")), ""
    )
    assert "missing: it is not on the PATH (" in line and line.endswith(
        "-- fix: did the setup of .devcontainer.json remove it?"
    ), doctor.stdout
    r = dry_run(gone, tmp_path, "SIM: print never", timeout=300)
    assert r.returncode == 2 and "did the setup of .devcontainer.json remove it?" in _last_line(r.stderr), r.stderr
