"""The project's environment: the image every container of a run uses, and the setup run once in it.

docs/environment.md says where it comes from and what is built. Blocking (the Docker CLI and git as
subprocesses): async callers use ``anyio.to_thread``. The Docker CLI streams its own progress and takes
care of BuildKit, registries and credential helpers, as ``--build-image`` does.
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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from ..errors import ConfigError, OrchestratorError, PreflightError
from ..filelock import file_lock
from ..runner import SEED_LABEL
from ..sanitize import default_sanitizer, plain_text
from . import devcontainer
from .build import LABEL_KEY, image_id
from .devcontainer import DEVCONTAINER_PATHS, WORKSPACE
from .env_spec import EnvironmentSpec, SetupCommand

__all__ = [
    "DEVCONTAINER_PATHS",
    "EnvironmentSetupError",
    "EnvironmentSpec",
    "SetupCommand",
    "build",
    "read_devcontainer",
    "resolve",
    "tools_path",
    "worktree_note",
]

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
SETUP_TAIL_LINES = 30
# What a run says about the environment that only its build could learn (the
# setup's user): kept on the image, so a cached run says it too.
NOTES_LABEL = "org.orchestrator.environment-notes"
# Where Dockerfile.environment puts the agent CLIs, tini and the simulated agent.
TOOLS_DIR = "/opt/orchestrator/bin"
AGENT_UID = "1000"
AGENT_HOME = "/home/node"


class EnvironmentSetupError(OrchestratorError):
    """The environment could not be built or its setup failed; the run stops before any task."""


# ---------------------------------------------------------------- reading


def _git(repo: str, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    run = subprocess.run(["git", "-C", repo, *args], capture_output=True, input=input)
    if check and run.returncode != 0:
        raise EnvironmentSetupError(f"git {' '.join(args)} failed in {repo}: {_said(run)}")
    return run


def _show(repo: str, commit: str, path: str) -> str | None:
    run = _git(repo, "show", f"{commit}:{path}", check=False)
    return run.stdout.decode("utf-8", "replace") if run.returncode == 0 else None


def _context(repo: str, path: str, environ: Mapping[str, str] | None) -> devcontainer.Context:
    return devcontainer.Context(
        environ=os.environ if environ is None else environ,
        local_folder=repo,
        config_file=str(PurePosixPath(repo, path)),
    )


def read_devcontainer(repo: str, commit: str, environ: Mapping[str, str] | None = None) -> EnvironmentSpec | None:
    """The environment a devcontainer at ``commit`` describes, or None when the repository has none.

    ``environ`` answers ``${localEnv:...}`` (the process's environment when None).
    """
    for path in DEVCONTAINER_PATHS:
        text = _show(repo, commit, path)
        if text is not None:
            break
    else:
        return None
    ctx = _context(repo, path, environ)
    spec = devcontainer.parse(text, path, ctx)
    # A token passed with ${localEnv:GITHUB_TOKEN} reaches the containers, as in
    # VS Code; it must not reach a log or a report.
    default_sanitizer().add_secrets(ctx.secrets())
    return spec


def worktree_note(repo: str, commit: str) -> str | None:
    """One line when the work tree's devcontainer differs from the base commit's, which is the one used."""
    paths = ["--", ".devcontainer", *DEVCONTAINER_PATHS[1:]]
    changed = _git(repo, "diff", "--name-only", commit, *paths, check=False).stdout.decode(errors="replace")
    new = _git(repo, "ls-files", "--others", "--exclude-standard", *paths, check=False).stdout.decode(errors="replace")
    names = list(dict.fromkeys([*changed.split(), *new.split()]))
    if not names:
        return None
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"environment: {shown} in your work tree differ{'s' if len(names) == 1 else ''} from the base commit "
        f"{commit[:10]}; runs use the committed devcontainer: commit the change to use it"
    )


def resolve(
    repo: str,
    commit: str,
    *,
    image: str | None,
    dockerfile: str | None,
    setup: list[str],
    use_devcontainer: bool,
    environ: Mapping[str, str] | None = None,
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
            dockerfile = devcontainer.repo_path("", dockerfile, "environment.dockerfile", "environment.dockerfile")
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
        return read_devcontainer(repo, commit, environ)
    return None


# ---------------------------------------------------------------- building


def _docker(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", *args], capture_output=True, input=input)


def _said(run: subprocess.CompletedProcess[bytes]) -> str:
    return run.stderr.decode(errors="replace").strip()[:300]


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


def _image_config(name: str) -> dict[str, Any]:
    run = _docker("image", "inspect", "-f", "{{json .Config}}", name)
    try:
        return (json.loads(run.stdout) or {}) if run.returncode == 0 else {}
    except ValueError:
        return {}


def _quoted(value: str) -> str:
    """``value`` as a Dockerfile ENV or LABEL value that ``docker commit --change`` keeps as written.

    Docker expands ``$VAR`` in those instructions; a devcontainer's value is
    already resolved, and a ``$`` left in it is the user's own.
    """
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def tools_path(path: str, image_path: str) -> str:
    """A ``PATH`` a devcontainer sets, with orchestrator's tools still found.

    Orchestrator's tool directory first (the pinned agent CLIs win over any
    of the project's), then the devcontainer's directories in their order,
    then the image's own directories it left out (git, python3 and the shell
    utilities the runner calls live there). Each directory once.
    """
    image_dirs = [d for d in image_path.split(":") if d]
    first = [TOOLS_DIR] if TOOLS_DIR in image_dirs else []
    return ":".join(dict.fromkeys([*first, *(d for d in path.split(":") if d), *image_dirs]))


def resolve_env(spec: EnvironmentSpec, image_env: Mapping[str, str]) -> tuple[dict[str, str], tuple[SetupCommand, ...]]:
    """The variables every container gets, and the setup commands, with ``${containerEnv:...}`` resolved.

    As the specification orders them: ``containerEnv`` against the image's
    environment, ``remoteEnv`` against that plus ``containerEnv``.
    """
    where = spec.source
    container = {
        k: devcontainer.substitute_container(v, image_env, f"{where} containerEnv.{k}", bare=True)
        for k, v in spec.container_env.items()
    }
    running = {**image_env, **container}
    remote = {
        k: "" if v is None else devcontainer.substitute_container(v, running, f"{where} remoteEnv.{k}", bare=True)
        for k, v in spec.remote_env.items()
    }
    env = {**container, **remote}
    if "PATH" in env:
        env["PATH"] = tools_path(env["PATH"], image_env.get("PATH", ""))
    setup = tuple(
        msgspec.structs.replace(
            c,
            shell=None if c.shell is None else devcontainer.substitute_container(c.shell, running, where, bare=False),
            argv=None
            if c.argv is None
            else tuple(devcontainer.substitute_container(a, running, where, bare=False) for a in c.argv),
        )
        for c in spec.setup
    )
    return env, setup


class _Stream:
    """Runs a command, shows each output line under a prefix, keeps the last lines for an error."""

    def __init__(self, say: Callable[[str], None], log: Path) -> None:
        self.say = say
        self.log = log

    def output(self, tail: list[str]) -> str:
        """What an error says of the output of a command run with ``show``: it is above, not printed twice."""
        return f"its output is above; all of it is in {self.log}" if tail else "it printed nothing"

    def run(
        self, cmd: list[str], *, prefix: str, input: bytes | None = None, show: bool = True
    ) -> tuple[int, list[str]]:
        # A value from ${localEnv:...} may be a token: neither the log nor the console gets it.
        scrub = default_sanitizer().scrub_text
        tail: deque[str] = deque(maxlen=SETUP_TAIL_LINES)
        with open(self.log, "a") as log:
            log.write(scrub(f"$ {shlex.join(cmd)}") + "\n")
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
                # A setup's npm or pip colours its output; the console, the log and an error show text.
                line = scrub(plain_text(raw.decode("utf-8", "replace").rstrip("\n")))
                log.write(line + "\n")
                tail.append(line)
                if show:
                    self.say(f"{prefix}{line}")
            rc = proc.wait()
        return rc, list(tail)


LAYER_FILES = ("docker/Dockerfile.environment", "docker/environment-layer.sh")


def build(
    spec: EnvironmentSpec,
    *,
    repo: str,
    commit: str,
    agent_image: str,
    say: Callable[[str], None],
    log_dir: Path,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Build (or find cached) the environment image for ``spec`` at ``commit``; its name.

    Raises :class:`PreflightError` when the user's image is neither here nor
    pullable, :class:`ConfigError` for a devcontainer the image cannot serve,
    :class:`EnvironmentSetupError` when a build or the setup fails.
    """
    from .paths import source_dir

    log_dir.mkdir(parents=True, exist_ok=True)
    agent_id = image_id(agent_image)
    if agent_id is None:
        raise EnvironmentSetupError(
            f"the agent image {agent_image!r} is missing; build it with: orchestrator --build-image"
        )
    src = source_dir()
    stream = _Stream(say, log_dir / "environment.log")
    user_image: str | None = None
    if spec.image:
        _pull(spec, say)
        user_image = spec.image
    elif spec.dockerfile:
        user_image = _user_image(spec, repo, commit, stream, say)
    base_lines = [f"agent {agent_id}"]
    user_config: dict[str, Any] = {}
    merged = spec
    if user_image is not None:
        base_lines.append(f"image {image_id(user_image)}")
        base_lines += [f"file {f} {hashlib.sha256((src / f).read_bytes()).hexdigest()}" for f in LAYER_FILES]
        user_config = _image_config(user_image)
        if spec.devcontainer:
            ctx = _context(repo, spec.source, environ)
            label = (user_config.get("Labels") or {}).get(devcontainer.METADATA_LABEL)
            merged, notes = devcontainer.apply_metadata(spec, label, user_image, ctx)
            default_sanitizer().add_secrets(ctx.secrets())
            for note in notes:
                say(note)
    user, why = _setup_user(spec, merged, user_config)
    final_lines = [
        *base_lines,
        *(f"containerEnv {k}={v}" for k, v in sorted(merged.container_env.items())),
        *(f"remoteEnv {k}={'(unset)' if v is None else '=' + v}" for k, v in sorted(merged.remote_env.items())),
        f"user {user}",
        *(f"setup {c.label} {json.dumps(c.exec_argv())}" for c in merged.setup),
        *(f"input {line}" for line in (_setup_inputs(repo, commit) if merged.setup else [])),
    ]
    digest = _hash(final_lines)
    name = f"{ENV_REPO}:{digest[:20]}"
    if _cached(name, spec, say):
        return name
    with _build_lock(digest[:20], lambda: say(f"environment: waiting for another run that is building {name}")):
        # Built meanwhile by the run that held the lock: that run's image is this one.
        if _cached(name, spec, say):
            return name
        say(f"environment: {spec.source}; building {name} (log: {log_dir / 'environment.log'})")
        base = agent_image
        if user_image is not None:
            base = _build_layer(user_image, agent_image, src, stream, say, _hash(base_lines)[:20])
        _run_setup(merged, repo, commit, base, name, digest, stream, say, user=user, why=why)
    return name


def _cached(name: str, spec: EnvironmentSpec, say: Callable[[str], None]) -> bool:
    config = _image_config(name)
    if not config:
        return False
    try:
        notes = json.loads((config.get("Labels") or {}).get(NOTES_LABEL) or "[]")
    except ValueError:
        notes = []
    for note in notes:
        say(str(note))
    say(f"environment: {spec.source}, image {name} (cached)")
    return True


def _pull(spec: EnvironmentSpec, say: Callable[[str], None]) -> None:
    assert spec.image is not None
    if image_id(spec.image) is not None:
        return
    say(f"environment: pulling {spec.image}")
    pulled = _docker("pull", spec.image)
    if pulled.returncode == 0 and image_id(spec.image) is not None:
        return
    lines = pulled.stderr.decode(errors="replace").strip().splitlines()
    reason = (lines[-1] if lines else "no reason given").removeprefix("Error response from daemon: ")[:200]
    ways = "give an image you have with --env-image NAME (docker images lists them)"
    if spec.devcontainer:
        ways = f"run without the devcontainer with --no-devcontainer, or {ways}"
    # A pre-flight problem, like a missing agent image: nothing was started.
    raise PreflightError(
        f"the environment image {spec.image!r} ({spec.source}) is not here and cannot be pulled ({reason}); {ways}"
    )


def _setup_user(spec: EnvironmentSpec, merged: EnvironmentSpec, user_config: dict[str, Any]) -> tuple[str, str | None]:
    """Who runs a setup, and why: VS Code runs lifecycle commands as remoteUser, else containerUser, else the
    image's USER. The configuration's setup runs as root."""
    if not spec.devcontainer:
        return "root", None
    for key, attr in (("remoteUser", "remote_user"), ("containerUser", "container_user")):
        value = getattr(merged, attr)
        if value:
            return value, key if getattr(spec, attr) else f"{key} of the image's devcontainer.metadata"
    image_user = str(user_config.get("User") or "").strip()
    if image_user:
        return image_user, "the image's USER"
    return "root", None


@contextlib.contextmanager
def _build_lock(key: str, on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold this machine's lock on building the image ``key``.

    Runs started together on one project need the same environment: without
    it each would run the whole setup (installs from the network, minutes)
    and tag the same name, so the second waits and takes the first's image.
    """
    from .paths import cache_dir

    directory = cache_dir() / "environment-builds"
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / f"{key}.lock", on_wait=on_wait):
        yield


def _user_image(spec: EnvironmentSpec, repo: str, commit: str, stream: _Stream, say: Callable[[str], None]) -> str:
    """The image the devcontainer's (or configuration's) Dockerfile builds, built once per context and arguments."""
    tree = _git(repo, "rev-parse", f"{commit}:{spec.context}" if spec.context else f"{commit}^{{tree}}").stdout
    key = _hash(
        [
            f"context {tree.decode().strip()}",
            f"dockerfile {spec.dockerfile}",
            f"target {spec.target}",
            *(f"arg {k}={v}" for k, v in sorted(spec.build_args.items())),
        ]
    )[:20]
    tag = f"orchestrator-env-base:{key}"
    if image_id(tag) is not None:
        return tag
    with _build_lock(f"base-{key}", lambda: say(f"environment: waiting for another run that is building {tag}")):
        if image_id(tag) is not None:
            return tag
        assert spec.dockerfile is not None
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
            raise EnvironmentSetupError(f"building {dockerfile} ({spec.source}) failed; {stream.output(tail)}")
    return tag


def _build_layer(base: str, agent_image: str, src: Path, stream: _Stream, say: Callable[[str], None], key: str) -> str:
    tag = f"orchestrator-env-layer:{key}"
    if image_id(tag) is not None:
        return tag
    _check_base(base)
    say(f"environment: adding the agent tools to {base}")
    with tempfile.TemporaryDirectory(prefix="orchestrator-env.") as tmp:
        for rel in LAYER_FILES:
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, Path(tmp) / rel)
        cmd = ["docker", "build", "-f", str(Path(tmp) / LAYER_FILES[0]), "-t", tag]
        cmd += ["--build-arg", f"BASE={base}", "--build-arg", f"AGENT_IMAGE={agent_image}"]
        cmd += ["--label", "orchestrator.agent_image.environment=layer", tmp]
        rc, tail = stream.run(cmd, prefix="  layer| ", show=False)
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
made="$(git ls-files --others --exclude-standard --directory --no-empty-directory)"
if [ -n "$made" ]; then
  printf '%s\\n' "$made" | head -n 10 | sed 's/^/orchestrator-untracked: /'
  printf 'orchestrator-untracked-count: %s\\n' "$(printf '%s\\n' "$made" | wc -l)"
fi
mkdir -p {SEED_DIR}
git ls-files -z --others --ignored --exclude-standard --directory | tar --null -T - -cf - | tar -C {SEED_DIR} -xf -
chown -R {AGENT_UID}:{AGENT_UID} {SEED_DIR}
find {WORKSPACE} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +
"""


def _user_ids(container: str, user: str, spec: EnvironmentSpec, why: str | None) -> tuple[str, str]:
    """The setup user's uid and the HOME its commands get: the agents' home for uid 1000, so what a setup
    puts in ``~`` (``pip install --user``, caches) is what agents find in theirs."""
    name = user.split(":", 1)[0]
    if name in ("root", "0"):
        return "0", "/root"
    got = _docker("exec", "-u", "root", container, "getent", "passwd", name)
    fields = got.stdout.decode(errors="replace").strip().split(":")
    if got.returncode == 0 and len(fields) >= 6:
        uid, home = fields[2], fields[5]
    elif name.isdigit():
        uid, home = name, "/"
    else:
        raise ConfigError(
            f"{spec.source}: {why or 'the setup user'} {name!r} is not a user of the environment image; "
            "create the user in the image, or name one it has"
        )
    return uid, AGENT_HOME if uid == AGENT_UID else home


def _user_note(user: str, why: str, uid: str) -> str:
    runs = f"environment: the setup runs as {user} ({why}); agents run as"
    if uid == "0":
        return f"{runs} uid {AGENT_UID} (node): the agent CLIs refuse to skip their permission prompts as root"
    if uid == AGENT_UID:
        return f"{runs} the same uid {AGENT_UID}, named node, with home {AGENT_HOME}"
    return (
        f"{runs} uid {AGENT_UID} (node), not as {user} (uid {uid}): "
        f"the files it leaves in the workspace are given to uid {AGENT_UID}"
    )


def _run_setup(
    spec: EnvironmentSpec,
    repo: str,
    commit: str,
    base: str,
    name: str,
    digest: str,
    stream: _Stream,
    say: Callable[[str], None],
    *,
    user: str,
    why: str | None,
) -> None:
    image_env = dict(e.split("=", 1) for e in _image_config(base).get("Env") or () if "=" in e)
    env, setup = resolve_env(spec, image_env)
    container = f"orchestrator-env-setup-{digest[:12]}-{os.getpid()}"
    args = ["run", "-d", "--name", container, "--user", "root", "--workdir", WORKSPACE]
    args += ["--label", "orchestrator.agent_image.environment=setup", "--entrypoint", "sleep", base, "infinity"]
    run = _docker(*args)
    if run.returncode != 0:
        raise EnvironmentSetupError(f"cannot start a container from {base} for the setup: {_said(run)}")
    try:
        uid, home = _user_ids(container, user, spec, why)
        notes = [_user_note(user, why, uid)] if why else []
        for note in notes:
            say(note)
        seed_label: list[str] = []
        if setup:
            _copy_base_commit(repo, commit, container, owner=AGENT_UID if uid == "0" else uid)
            env_args = [a for k, v in sorted(env.items()) for a in ("-e", f"{k}={v}")]
            argv = ["docker", "exec", "-u", user, "-e", f"HOME={home}", "-w", WORKSPACE, *env_args, container]
            for step in setup:
                shown = default_sanitizer().scrub_text(step.display())
                say(f"environment: setup {step.label}: {shown}")
                rc, tail = stream.run([*argv, *step.exec_argv()], prefix="  setup| ")
                if rc != 0:
                    raise EnvironmentSetupError(
                        f"the setup failed ({spec.source}, {step.label}, exit {rc}): {shown}\n" + stream.output(tail)
                    )
            _keep_seed(container, stream, say)
            seed_label = [f"LABEL {SEED_LABEL}={SEED_DIR}"]
        _commit_image(container, base, name, digest, env, notes, seed_label)
        say(f"environment: built {name}")
    finally:
        _docker("rm", "-f", container)


def _copy_base_commit(repo: str, commit: str, container: str, *, owner: str) -> None:
    """The base commit's files, as a repository owned by ``owner`` (the agents' uid when root runs the setup).

    Setups may call git (setuptools-scm, versioning scripts), and git tells
    afterwards which of the files the setup made are ignored ones.
    """
    archive = _git(repo, "archive", "--format=tar", commit).stdout
    copied = _docker("cp", "-", f"{container}:{WORKSPACE}", input=archive)
    if copied.returncode != 0:
        raise EnvironmentSetupError(f"cannot copy the base commit into the setup container: {_said(copied)}")
    script = (
        "git init -q && git add -A && git -c user.name=orchestrator -c user.email=orchestrator@localhost "
        f"commit -qm base --no-verify && chown -R {owner} ."
    )
    init = _docker("exec", "-u", "root", "-w", WORKSPACE, container, "sh", "-c", script)
    if init.returncode != 0:
        raise EnvironmentSetupError(f"cannot prepare the setup's workspace: {_said(init)}")


def _keep_seed(container: str, stream: _Stream, say: Callable[[str], None]) -> None:
    """Keep the ignored files the setup made; name (not keep) the ones git does not ignore."""
    rc, tail = stream.run(["docker", "exec", "-u", "root", container, "sh", "-c", _COLLECT_SEED], prefix="", show=False)
    if rc != 0:
        raise EnvironmentSetupError("keeping the files the setup made failed:\n" + "\n".join(tail))
    # A folder the setup made (.venv/, node_modules/) is named once, not file by file.
    made = [line.split(":", 1)[1].strip() for line in tail if line.startswith("orchestrator-untracked:")]
    count = next((int(ln.split(":")[1]) for ln in tail if ln.startswith("orchestrator-untracked-count:")), 0)
    if made:
        more = f" and {count - len(made)} more" if count > len(made) else ""
        say(
            "warning: the setup made files that git does not ignore; tasks do not get them "
            f"(add them to .gitignore to keep them): {', '.join(made)}{more}"
        )


def _commit_image(
    container: str, base: str, name: str, digest: str, env: dict[str, str], notes: list[str], seed_label: list[str]
) -> None:
    entry = _docker("image", "inspect", "-f", "{{json .Config.Entrypoint}}", base).stdout.decode().strip()
    instructions = [
        f"LABEL {LABEL_KEY}={digest}",
        "LABEL orchestrator.agent_image.environment=image",
        f"LABEL {NOTES_LABEL}={_quoted(json.dumps(notes))}",
        *seed_label,
        "USER node",
        f"WORKDIR {WORKSPACE}",
        'CMD ["sleep", "infinity"]',
        f"ENTRYPOINT {entry if entry not in ('', 'null') else '[]'}",
        *(f"ENV {k}={_quoted(v)}" for k, v in sorted(env.items())),
    ]
    changes = [arg for instruction in instructions for arg in ("--change", instruction)]
    committed = _docker("commit", *changes, container, name)
    if committed.returncode != 0:
        raise EnvironmentSetupError(f"cannot save the environment image {name}: {_said(committed)}")
