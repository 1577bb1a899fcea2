"""The project's environment: the image every container of a run uses, and the setup run once in it.

Where it comes from, first match wins:

1. the ``environment`` configuration (``environment.image`` or
   ``environment.dockerfile``, ``environment.setup``; flags ``--env-image``,
   ``--env-dockerfile``, ``--env-setup``);
2. the repository's ``.devcontainer/devcontainer.json`` (or
   ``.devcontainer.json``) at the base commit: ``image`` or ``build``,
   ``containerEnv``/``remoteEnv`` and the ``onCreateCommand``,
   ``updateContentCommand`` and ``postCreateCommand`` lifecycle commands;
3. nothing: the agent image as it is.

What is built, each step cached under a hash of its inputs:

- the user's image (pulled, or built from their Dockerfile with the build
  context taken from the base commit, not the working tree);
- on top of it, docker/Dockerfile.environment adds what orchestrator needs
  (the pinned agent CLIs copied from the agent image, the simulated agent,
  tini, git, python3, CA certificates, uid 1000) and nothing else;
- the setup commands run once, as root, in a container holding the base
  commit's files at /workspace. What they install outside the repository is
  kept in the image (``docker commit``); what they make inside it that git
  ignores (``node_modules/``, ``.venv/``) is kept in the image as the
  workspace seed, which the runner copies into each task's own workspace.

The setup's cache key holds the environment, the setup commands and the
files at the base commit that setups read (lock files and manifests, and
everything under ``.devcontainer/``): a second run on the same base builds
nothing, and a changed lock file runs setup again.

Blocking (the Docker CLI and git as subprocesses): async callers use
``anyio.to_thread``. The Docker CLI streams its own progress and takes care
of BuildKit, registries and credential helpers, as ``--build-image`` does.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from ..errors import ConfigError, OrchestratorError
from ..filelock import file_lock
from ..runner.types import SEED_LABEL

DEVCONTAINER_PATHS = (".devcontainer/devcontainer.json", ".devcontainer.json")
LIFECYCLE = ("onCreateCommand", "updateContentCommand", "postCreateCommand")
# Keys that change nothing a run does, so naming them as "not supported" would only be noise.
_SILENT = {"name", "$schema"}
_SUPPORTED = {"image", "build", "containerEnv", "remoteEnv", *LIFECYCLE, *_SILENT}
_BUILD_SUPPORTED = {"dockerfile", "context", "args", "target"}
# Files whose content decides what a setup installs: a change to any of them
# runs the setup again. Matched against each file's name, at any depth.
SETUP_INPUTS = (
    "requirements*.txt",
    "constraints*.txt",
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "Pipfile",
    "Pipfile.lock",
    "poetry.lock",
    "uv.lock",
    "pdm.lock",
    "environment.yml",
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "bun.lockb",
    "Cargo.toml",
    "Cargo.lock",
    "go.mod",
    "go.sum",
    "Gemfile",
    "Gemfile.lock",
    ".tool-versions",
    ".python-version",
    ".nvmrc",
    "Makefile",
)
SEED_DIR = "/opt/orchestrator/seed"
ENV_REPO = "orchestrator-env"
WORKSPACE = "/workspace"
SETUP_TAIL_LINES = 30
INPUTS_LABEL = "org.orchestrator.inputs-sha256"


class EnvironmentSetupError(OrchestratorError):
    """The environment could not be built or its setup failed; the run stops before any task."""


class SetupCommand(msgspec.Struct, frozen=True):
    """One setup step: a shell line, or an argv run without a shell (a devcontainer array)."""

    label: str
    shell: str | None = None
    argv: tuple[str, ...] | None = None

    def exec_argv(self) -> list[str]:
        return list(self.argv) if self.argv is not None else ["/bin/sh", "-c", self.shell or ""]

    def display(self) -> str:
        return self.shell if self.shell is not None else shlex.join(self.argv or ())


class EnvironmentSpec(msgspec.Struct, frozen=True):
    """What a run's environment is made of, read from the configuration or a devcontainer."""

    source: str
    image: str | None = None
    dockerfile: str | None = None  # repository path, at the base commit
    context: str = ""  # repository directory, "" for the root
    build_args: dict[str, str] = msgspec.field(default_factory=dict)
    target: str | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    setup: tuple[SetupCommand, ...] = ()
    notes: tuple[str, ...] = ()


# ---------------------------------------------------------------- reading


def _git(repo: str, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    run = subprocess.run(["git", "-C", repo, *args], capture_output=True, input=input)
    if check and run.returncode != 0:
        raise EnvironmentSetupError(f"git {' '.join(args)} failed in {repo}: {_said(run)}")
    return run


def _show(repo: str, commit: str, path: str) -> str | None:
    run = _git(repo, "show", f"{commit}:{path}", check=False)
    return run.stdout.decode("utf-8", "replace") if run.returncode == 0 else None


def _commands(value: Any, label: str, where: str) -> list[SetupCommand]:
    """A lifecycle command in any of the devcontainer's three forms, in order."""
    if value is None:
        return []
    if isinstance(value, str):
        return [SetupCommand(label=label, shell=value)] if value.strip() else []
    if isinstance(value, list):
        if not value or not all(isinstance(a, str) for a in value):
            raise ConfigError(f"{where}: {label} must be a string, a list of strings or an object of those")
        return [SetupCommand(label=label, argv=tuple(value))]
    if isinstance(value, dict):
        out: list[SetupCommand] = []
        # The spec runs an object's commands in parallel; here they run one
        # after another, in the file's order, so their output and failures
        # read as a sequence and a cached result does not depend on timing.
        for name, sub in value.items():
            if isinstance(sub, dict):
                raise ConfigError(f"{where}: {label}.{name} must be a string or a list of strings")
            out += _commands(sub, f"{label}.{name}", where)
        return out
    raise ConfigError(f"{where}: {label} must be a string, a list of strings or an object of those")


def _expand(value: str, where: str, notes: list[str]) -> str | None:
    """Devcontainer variables: the workspace folder is /workspace; containerEnv:X is the image's own $X."""
    value = value.replace("${containerWorkspaceFolder}", WORKSPACE).replace(
        "${containerWorkspaceFolderBasename}", "workspace"
    )
    while "${containerEnv:" in value:
        start = value.index("${containerEnv:")
        end = value.find("}", start)
        if end < 0:
            break
        value = value[:start] + "${" + value[start + len("${containerEnv:") : end] + "}" + value[end + 1 :]
    if "${localEnv:" in value or "${localWorkspaceFolder" in value:
        notes.append(f"{where}: a value names the host's environment or folder (${{localEnv:...}}); it is left out")
        return None
    return value


def _env(raw: Any, key: str, where: str, notes: list[str]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ConfigError(f"{where}: {key} must be an object of strings")
    out = {}
    for name, value in raw.items():
        expanded = _expand(value, f"{where} {key}.{name}", notes)
        if expanded is not None:
            out[name] = expanded
    return out


def read_devcontainer(repo: str, commit: str) -> EnvironmentSpec | None:
    """The environment a devcontainer at ``commit`` describes, or None when the repository has none."""
    import json5

    for path in DEVCONTAINER_PATHS:
        text = _show(repo, commit, path)
        if text is not None:
            break
    else:
        return None
    where = path
    try:
        data = json5.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where} is not valid JSON with comments: {exc}; fix it or pass --no-devcontainer") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a JSON object")
    if "dockerComposeFile" in data:
        raise ConfigError(
            f"{where} uses dockerComposeFile: Docker Compose environments are not supported; give it an "
            "`image` or `build.dockerfile`, or set environment.image in the configuration (or --no-devcontainer)"
        )
    notes: list[str] = []
    unsupported = sorted(k for k in data if k not in _SUPPORTED)
    folder = str(PurePosixPath(path).parent)
    folder = "" if folder == "." else folder
    spec: dict[str, Any] = {"source": where}
    if isinstance(data.get("image"), str) and data["image"].strip():
        spec["image"] = data["image"].strip()
    elif isinstance(data.get("build"), dict):
        build = data["build"]
        unsupported += [f"build.{k}" for k in sorted(build) if k not in _BUILD_SUPPORTED]
        dockerfile = build.get("dockerfile") or "Dockerfile"
        if not isinstance(dockerfile, str):
            raise ConfigError(f"{where}: build.dockerfile must be a string")
        context = build.get("context", ".")
        if not isinstance(context, str):
            raise ConfigError(f"{where}: build.context must be a string")
        spec["dockerfile"] = _repo_path(folder, dockerfile, where, "build.dockerfile")
        spec["context"] = _repo_path(folder, context, where, "build.context")
        args = build.get("args") or {}
        if not isinstance(args, dict) or not all(isinstance(v, str) for v in args.values()):
            raise ConfigError(f"{where}: build.args must be an object of strings")
        build_args = {}
        for key, value in args.items():
            expanded = _expand(value, f"{where} build.args.{key}", notes)
            if expanded is not None:
                build_args[key] = expanded
        spec["build_args"] = build_args
        if isinstance(build.get("target"), str):
            spec["target"] = build["target"]
    else:
        raise ConfigError(f"{where} names no `image` and no `build.dockerfile`; add one, or pass --no-devcontainer")
    env = _env(data.get("containerEnv"), "containerEnv", where, notes)
    env.update(_env(data.get("remoteEnv"), "remoteEnv", where, notes))
    spec["env"] = env
    setup: list[SetupCommand] = []
    for key in LIFECYCLE:
        setup += _commands(data.get(key), key, where)
    spec["setup"] = tuple(setup)
    if unsupported:
        notes.insert(0, f"{where}: not supported here, ignored: {', '.join(unsupported)}")
    spec["notes"] = tuple(notes)
    return EnvironmentSpec(**spec)


def _repo_path(folder: str, rel: str, where: str, key: str) -> str:
    """A path of the devcontainer (relative to its folder) as a path in the repository."""
    parts: list[str] = []
    for part in PurePosixPath(folder, rel).parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ConfigError(f"{where}: {key} {rel!r} points outside the repository")
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def resolve(
    repo: str,
    commit: str,
    *,
    image: str | None,
    dockerfile: str | None,
    setup: list[str],
    use_devcontainer: bool,
) -> EnvironmentSpec | None:
    """The run's environment: the configuration's when it sets one, else the devcontainer's, else None."""
    if image and dockerfile:
        raise ConfigError(
            "environment.image and environment.dockerfile (--env-image, --env-dockerfile) exclude each other; keep one"
        )
    if image or dockerfile or setup:
        notes = []
        if use_devcontainer and any(_show(repo, commit, p) is not None for p in DEVCONTAINER_PATHS):
            notes.append("environment: the configuration's environment is used; the repository's devcontainer is not")
        context = ""
        if dockerfile:
            dockerfile = _repo_path("", dockerfile, "environment.dockerfile", "environment.dockerfile")
            if _show(repo, commit, dockerfile) is None:
                raise ConfigError(
                    f"environment.dockerfile {dockerfile!r} does not exist at the base commit; commit it first"
                )
            context = str(PurePosixPath(dockerfile).parent)
            context = "" if context == "." else context
        return EnvironmentSpec(
            source="the environment configuration",
            image=image,
            dockerfile=dockerfile,
            context=context,
            setup=tuple(SetupCommand(label=f"environment.setup[{i}]", shell=cmd) for i, cmd in enumerate(setup)),
            notes=tuple(notes),
        )
    if use_devcontainer:
        return read_devcontainer(repo, commit)
    return None


# ---------------------------------------------------------------- building


def _docker(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", *args], capture_output=True, input=input)


def _said(run: subprocess.CompletedProcess[bytes]) -> str:
    return run.stderr.decode(errors="replace").strip()[:300]


def _image_id(name: str) -> str | None:
    run = _docker("image", "inspect", "-f", "{{.Id}}", name)
    return run.stdout.decode().strip() if run.returncode == 0 else None


def _hash(lines: list[str]) -> str:
    return hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()


def _setup_inputs(repo: str, commit: str) -> list[str]:
    """``path blob`` of each file at ``commit`` whose content decides what a setup installs."""
    out = _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit).stdout.decode("utf-8", "replace")
    found = []
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        name = PurePosixPath(path).name
        if path.startswith(".devcontainer/") or any(fnmatch.fnmatchcase(name, pat) for pat in SETUP_INPUTS):
            found.append(f"{path} {meta.split()[-1]}")
    return sorted(found)


class _Stream:
    """Runs a command, shows each output line under a prefix, keeps the last lines for an error."""

    def __init__(self, say: Callable[[str], None], log: Path) -> None:
        self.say = say
        self.log = log

    def run(
        self, cmd: list[str], *, prefix: str, input: bytes | None = None, show: bool = True
    ) -> tuple[int, list[str]]:
        tail: deque[str] = deque(maxlen=SETUP_TAIL_LINES)
        with open(self.log, "a") as log:
            log.write(f"$ {shlex.join(cmd)}\n")
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            if input is not None:
                assert proc.stdin is not None
                try:
                    proc.stdin.write(input)
                finally:
                    proc.stdin.close()
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                log.write(line + "\n")
                tail.append(line)
                if show:
                    self.say(f"{prefix}{line}")
            rc = proc.wait()
        return rc, list(tail)


def build(
    spec: EnvironmentSpec,
    *,
    repo: str,
    commit: str,
    agent_image: str,
    say: Callable[[str], None],
    log_dir: Path,
) -> str:
    """Build (or find cached) the environment image for ``spec`` at ``commit``; its name."""
    from .paths import source_dir

    log_dir.mkdir(parents=True, exist_ok=True)
    agent_id = _image_id(agent_image)
    if agent_id is None:
        raise EnvironmentSetupError(
            f"the agent image {agent_image!r} is missing; build it with: orchestrator --build-image"
        )
    src = source_dir()
    layer_files = ("docker/Dockerfile.environment", "docker/environment-layer.sh")
    base_lines = [f"agent {agent_id}"]
    if spec.image:
        user_id = _image_id(spec.image)
        if user_id is None:
            say(f"environment: pulling {spec.image}")
            pulled = _docker("pull", spec.image)
            user_id = _image_id(spec.image)
            if pulled.returncode != 0 or user_id is None:
                detail = pulled.stderr.decode(errors="replace").strip().splitlines()
                raise EnvironmentSetupError(
                    f"the environment image {spec.image!r} ({spec.source}) is not here and cannot be pulled: "
                    f"{detail[-1] if detail else 'no reason given'}"
                )
        base_lines.append(f"image {user_id}")
    elif spec.dockerfile:
        tree = _git(repo, "rev-parse", f"{commit}:{spec.context}" if spec.context else f"{commit}^{{tree}}").stdout
        base_lines += [
            f"context {tree.decode().strip()}",
            f"dockerfile {spec.dockerfile}",
            f"target {spec.target}",
            *(f"arg {k}={v}" for k, v in sorted(spec.build_args.items())),
        ]
    if spec.image or spec.dockerfile:
        base_lines += [f"file {f} {hashlib.sha256((src / f).read_bytes()).hexdigest()}" for f in layer_files]
    final_lines = [
        *base_lines,
        *(f"env {k}={v}" for k, v in sorted(spec.env.items())),
        *(f"setup {c.label} {json.dumps(c.exec_argv())}" for c in spec.setup),
        *(f"input {line}" for line in (_setup_inputs(repo, commit) if spec.setup else [])),
    ]
    digest = _hash(final_lines)
    name = f"{ENV_REPO}:{digest[:20]}"
    if _image_id(name) is not None:
        say(f"environment: {spec.source}, image {name} (cached)")
        return name
    with _build_lock(digest, lambda: say(f"environment: waiting for another run that is building {name}")):
        # Built meanwhile by the run that held the lock: that run's image is this one.
        if _image_id(name) is not None:
            say(f"environment: {spec.source}, image {name} (cached)")
            return name
        _build(spec, repo, commit, agent_image, src, layer_files, base_lines, name, digest, say, log_dir)
    return name


@contextlib.contextmanager
def _build_lock(digest: str, on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold this machine's lock on building the environment ``digest``.

    Runs started together on one project need the same environment: without
    it each would run the whole setup (installs from the network, minutes)
    and tag the same name, so the second waits and takes the first's image.
    """
    from .paths import cache_dir

    directory = cache_dir() / "environment-builds"
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / f"{digest[:20]}.lock", on_wait=on_wait):
        yield


def _build(
    spec: EnvironmentSpec,
    repo: str,
    commit: str,
    agent_image: str,
    src: Path,
    layer_files: tuple[str, ...],
    base_lines: list[str],
    name: str,
    digest: str,
    say: Callable[[str], None],
    log_dir: Path,
) -> None:
    say(f"environment: {spec.source}; building {name} (log: {log_dir / 'environment.log'})")
    stream = _Stream(say, log_dir / "environment.log")
    base = agent_image
    if spec.dockerfile:
        base = _build_user_image(spec, repo, commit, stream, say, _hash(base_lines)[:20])
    elif spec.image:
        base = spec.image
    if base != agent_image:
        base = _build_layer(base, agent_image, src, layer_files, stream, say, _hash(base_lines)[:20])
    _run_setup(spec, repo, commit, base, name, digest, stream, say)


def _build_user_image(
    spec: EnvironmentSpec, repo: str, commit: str, stream: _Stream, say: Callable[[str], None], key: str
) -> str:
    assert spec.dockerfile is not None
    tag = f"orchestrator-env-base:{key}"
    if _image_id(tag) is not None:
        return tag
    context = spec.context
    dockerfile = spec.dockerfile
    if context and not (dockerfile == context or dockerfile.startswith(context + "/")):
        raise ConfigError(
            f"{spec.source}: the Dockerfile {dockerfile} lies outside the build context {context or '.'}; "
            "move it inside or widen build.context"
        )
    rel = dockerfile[len(context) + 1 :] if context else dockerfile
    # The context is the base commit's tree, not the working tree: every
    # task starts from that commit, and uncommitted files never leave the host.
    archive = _git(repo, "archive", "--format=tar", f"{commit}:{context}" if context else commit).stdout
    cmd = ["docker", "build", "-f", rel, "-t", tag, "--label", "orchestrator.agent_image.environment=base"]
    for k, v in sorted(spec.build_args.items()):
        cmd += ["--build-arg", f"{k}={v}"]
    if spec.target:
        cmd += ["--target", spec.target]
    cmd.append("-")
    say(f"environment: building your image from {dockerfile}")
    rc, tail = stream.run(cmd, prefix="  build| ", input=archive)
    if rc != 0:
        raise EnvironmentSetupError(
            f"building {dockerfile} ({spec.source}) failed; its last lines:\n" + "\n".join(tail)
        )
    return tag


def _build_layer(
    base: str,
    agent_image: str,
    src: Path,
    files: tuple[str, ...],
    stream: _Stream,
    say: Callable[[str], None],
    key: str,
) -> str:
    tag = f"orchestrator-env-layer:{key}"
    if _image_id(tag) is not None:
        return tag
    _check_base(base)
    say(f"environment: adding the agent tools to {base}")
    with tempfile.TemporaryDirectory(prefix="orchestrator-env.") as tmp:
        for rel in files:
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, Path(tmp) / rel)
        rc, tail = stream.run(
            [
                "docker",
                "build",
                "-f",
                str(Path(tmp) / files[0]),
                "-t",
                tag,
                "--build-arg",
                f"BASE={base}",
                "--build-arg",
                f"AGENT_IMAGE={agent_image}",
                "--label",
                "orchestrator.agent_image.environment=layer",
                tmp,
            ],
            prefix="  layer| ",
            show=False,
        )
    if rc != 0:
        said = [line for line in tail if "orchestrator-environment:" in line]
        if said:
            reason = said[-1].split("orchestrator-environment:", 1)[1].strip()
            raise EnvironmentSetupError(f"the environment image {base} cannot run agents: {reason}")
        raise EnvironmentSetupError(f"adding the agent tools to {base} failed; the last lines:\n" + "\n".join(tail))
    return tag


def _check_base(base: str) -> None:
    """One line, before any build, when the user's image cannot take the agent tools."""
    probe = _docker(
        "run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "/bin/sh", base, "-c",
        "ldd --version 2>&1 | head -n 1; command -v apt-get || echo no-apt",
    )  # fmt: skip
    said = probe.stdout.decode(errors="replace").lower()
    if probe.returncode != 0 and not said:
        raise EnvironmentSetupError(
            f"the environment image {base} has no /bin/sh; agents need a Debian- or Ubuntu-based image "
            f"({(_said(probe).splitlines() or [''])[0][:160]})"
        )
    if "glibc" not in said and "gnu libc" not in said:
        raise EnvironmentSetupError(
            f"the environment image {base} has no glibc (Alpine or another musl image?); "
            "the agent CLIs need a Debian- or Ubuntu-based image"
        )


_COLLECT_SEED = f"""set -e
cd {WORKSPACE}
made="$(git status --porcelain --untracked-files=all | grep '^??' | cut -c4- | head -n 20 || true)"
if [ -n "$made" ]; then printf 'orchestrator-untracked: %s\\n' $made; fi
mkdir -p {SEED_DIR}
git ls-files -z --others --ignored --exclude-standard --directory | tar --null -T - -cf - | tar -C {SEED_DIR} -xf -
chown -R 1000:1000 {SEED_DIR}
find {WORKSPACE} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +
"""


def _run_setup(
    spec: EnvironmentSpec,
    repo: str,
    commit: str,
    base: str,
    name: str,
    digest: str,
    stream: _Stream,
    say: Callable[[str], None],
) -> None:
    container = f"orchestrator-env-setup-{digest[:12]}-{os.getpid()}"
    run = _docker(
        "run",
        "-d",
        "--name",
        container,
        "--user",
        "root",
        "--workdir",
        WORKSPACE,
        "--label",
        "orchestrator.agent_image.environment=setup",
        "--entrypoint",
        "sleep",
        base,
        "infinity",
    )
    if run.returncode != 0:
        raise EnvironmentSetupError(f"cannot start a container from {base} for the setup: {_said(run)}")
    try:
        env_args = [a for k, v in sorted(spec.env.items()) for a in ("-e", f"{k}={v}")]
        seed_label: list[str] = []
        if spec.setup:
            # The base commit's files, as a repository: setups may call git
            # (setuptools-scm, versioning scripts), and git tells below which
            # of the files the setup made are ignored ones.
            archive = _git(repo, "archive", "--format=tar", commit).stdout
            copied = _docker("cp", "-", f"{container}:{WORKSPACE}", input=archive)
            if copied.returncode != 0:
                raise EnvironmentSetupError(f"cannot copy the base commit into the setup container: {_said(copied)}")
            init = _docker(
                "exec",
                "-u",
                "root",
                "-w",
                WORKSPACE,
                container,
                "sh",
                "-c",
                "git init -q && git add -A && git -c user.name=orchestrator -c user.email=orchestrator@localhost "
                "commit -qm base --no-verify && chown -R 1000:1000 .",
            )
            if init.returncode != 0:
                raise EnvironmentSetupError(f"cannot prepare the setup's workspace: {_said(init)}")
            for step in spec.setup:
                say(f"environment: setup {step.label}: {step.display()}")
                rc, tail = stream.run(
                    [
                        "docker",
                        "exec",
                        "-u",
                        "root",
                        "-e",
                        "HOME=/root",
                        "-w",
                        WORKSPACE,
                        *env_args,
                        container,
                        *step.exec_argv(),
                    ],
                    prefix="  setup| ",
                )
                if rc != 0:
                    raise EnvironmentSetupError(
                        f"the setup failed ({spec.source}, {step.label}, exit {rc}): {step.display()}\n"
                        f"its last {len(tail)} lines of output:\n" + "\n".join(tail)
                    )
            rc, tail = stream.run(
                ["docker", "exec", "-u", "root", container, "sh", "-c", _COLLECT_SEED], prefix="", show=False
            )
            if rc != 0:
                raise EnvironmentSetupError("keeping the files the setup made failed:\n" + "\n".join(tail))
            made = [line.split(":", 1)[1].strip() for line in tail if line.startswith("orchestrator-untracked:")]
            if made:
                say(
                    "warning: the setup made files that git does not ignore; tasks do not get them "
                    f"(add them to .gitignore to keep them): {', '.join(made[:10])}"
                )
            seed_label = ["--change", f"LABEL {SEED_LABEL}={SEED_DIR}"]
        changes = [
            "--change",
            f"LABEL {INPUTS_LABEL}={digest}",
            "--change",
            "LABEL orchestrator.agent_image.environment=image",
            *seed_label,
            "--change",
            "USER node",
            "--change",
            f"WORKDIR {WORKSPACE}",
            "--change",
            'CMD ["sleep", "infinity"]',
        ]
        entry = _docker("image", "inspect", "-f", "{{json .Config.Entrypoint}}", base).stdout.decode().strip()
        changes += ["--change", f"ENTRYPOINT {entry if entry not in ('', 'null') else '[]'}"]
        for k, v in sorted(spec.env.items()):
            changes += ["--change", f"ENV {k}={json.dumps(v)}"]
        committed = _docker("commit", *changes, container, name)
        if committed.returncode != 0:
            raise EnvironmentSetupError(f"cannot save the environment image {name}: {_said(committed)}")
        say(f"environment: built {name}")
    finally:
        _docker("rm", "-f", container)
