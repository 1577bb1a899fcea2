"""A repository's devcontainer.json, read as the Dev Containers specification reads it (docs/environment.md).

Every property is honoured or named in one line at the start of a run (:data:`PROPERTIES`, the docs' table);
variables resolve as the Dev Containers CLI's ``src/spec-common/variableSubstitution.ts`` resolves them.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import msgspec

from ..errors import ConfigError
from .env_spec import EnvironmentSpec, SetupCommand

DEVCONTAINER_PATHS = (".devcontainer/devcontainer.json", ".devcontainer.json")
# The lifecycle commands the setup runs, in this order (postStartCommand once, last).
STAGES = ("onCreateCommand", "updateContentCommand", "postCreateCommand", "postStartCommand")
WORKSPACE = "/workspace"
METADATA_LABEL = "devcontainer.metadata"
_VARIABLE = re.compile(r"\$\{(.*?)\}")
_BARE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SECRET_NAME = re.compile(r"(?i)(api[_-]?key|token|secret|password|passwd|credential)")


# ---------------------------------------------------------------- what happens to each property


def _ids(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(str(k) for k in value)
    if isinstance(value, list):
        return ", ".join(json.dumps(v) if not isinstance(v, str) else v for v in value)
    return str(value)


@dataclass(frozen=True)
class Handling:
    """What a run does with one property: ``docs`` for the table, ``note`` the line said at the start of a run."""

    docs: str
    note: Callable[[Any], str] | None = None
    when: Callable[[Any], bool] = bool  # the note is said only for a value that passes this


_NOT_GRANTED = "task containers keep orchestrator's own limits (no extra capabilities, no privileged mode)"
PROPERTIES: dict[str, Handling] = {
    "name": Handling("not used (a display name)"),
    "$schema": Handling("not used"),
    "image": Handling("honoured: the image (pulled when it is not here)"),
    "build.dockerfile": Handling("honoured: built from the base commit's files, relative to the file's folder"),
    "build.context": Handling("honoured (relative to the file's folder)"),
    "build.args": Handling("honoured; variables resolved"),
    "build.target": Handling("honoured"),
    "build.options": Handling(
        "not passed to `docker build`; a line says so",
        lambda v: f"build.options are not passed to docker build ({_ids(v)})",
    ),
    "build.cacheFrom": Handling(
        "not used: orchestrator caches the built image itself; a line says so",
        lambda v: "build.cacheFrom is not used: orchestrator caches the built image itself",
    ),
    "dockerFile": Handling("honoured, as `build.dockerfile` (the older spelling, with a top-level `context`)"),
    "context": Handling("honoured with `dockerFile`, as `build.context`"),
    "containerEnv": Handling(
        "honoured: set in every container. `${containerEnv:VAR}` and a bare `${VAR}` are the image's own value"
    ),
    "remoteEnv": Handling(
        "honoured: set in every container (after `containerEnv`, which it can read with `${containerEnv:VAR}`); "
        "`null` empties a variable"
    ),
    "remoteUser": Handling(
        "honoured for the setup, which runs as this user; agents run as uid 1000 (see below); a line says which"
    ),
    "containerUser": Handling("honoured for the setup when `remoteUser` is not set, as in VS Code; a line says so"),
    "updateRemoteUserUID": Handling("not needed: no folder of your machine is mounted into a container"),
    "userEnvProbe": Handling(
        "not done: shell profiles (`.bashrc`, `.profile`, nvm, pyenv) are not read; variables come from the "
        "image, `containerEnv` and `remoteEnv`. A line says so when it is set",
        lambda v: (
            f"userEnvProbe {v}: shell profiles are not read; variables come from the image, "
            "containerEnv and remoteEnv (put what a profile adds to PATH in remoteEnv)"
        ),
        when=lambda v: v not in (None, "none"),
    ),
    "overrideCommand": Handling(
        "containers always run orchestrator's own command (as `true` would); with `false` a line says the "
        "image's command is not run",
        lambda v: (
            "overrideCommand false: the image's own command is not run; "
            "task containers run orchestrator's (sleep, under tini)"
        ),
        when=lambda v: v is False,
    ),
    "shutdownAction": Handling("not used: orchestrator stops and removes each task's container itself"),
    "init": Handling("honoured: tini is always the containers' first process"),
    "privileged": Handling(
        "not granted; a line says so",
        lambda v: f"privileged is not granted: {_NOT_GRANTED}",
        when=lambda v: v is True,
    ),
    "capAdd": Handling("not granted; a line says so", lambda v: f"capAdd ({_ids(v)}) is not granted: {_NOT_GRANTED}"),
    "securityOpt": Handling(
        "not applied; a line says so",
        lambda v: f"securityOpt ({_ids(v)}) is not applied: {_NOT_GRANTED}",
    ),
    "mounts": Handling(
        "not made: a task sees only its own workspace and home; a line says so",
        lambda v: (
            f"mounts are not made ({len(v) if isinstance(v, list) else 1}): "
            "a task sees only its own workspace (a clone of the base commit) and its own home"
        ),
    ),
    "features": Handling(
        "not installed; a line names them. Install what they provide in `onCreateCommand` or a Dockerfile",
        lambda v: (
            f"features are not installed ({_ids(v)}): install what they provide in onCreateCommand "
            "or in a Dockerfile (build.dockerfile)"
        ),
    ),
    "overrideFeatureInstallOrder": Handling("not used (features are not installed)"),
    "customizations": Handling("not used (settings for editors)"),
    "extensions": Handling("not used (the older spelling of `customizations.vscode.extensions`)"),
    "settings": Handling("not used (the older spelling of `customizations.vscode.settings`)"),
    "forwardPorts": Handling("not used: nothing connects to a task's ports"),
    "portsAttributes": Handling("not used: nothing connects to a task's ports"),
    "otherPortsAttributes": Handling("not used: nothing connects to a task's ports"),
    "appPort": Handling("not used: no port of a task's container is published"),
    "hostRequirements": Handling("not checked (`--doctor` checks the disk; `--max-parallel` bounds the load)"),
    "secrets": Handling(
        'not asked for; a line names them. Pass one with `remoteEnv`: `"NAME": "${localEnv:NAME}"`',
        lambda v: (
            f"secrets are not asked for ({_ids(v)}): tasks do not get them; "
            'pass one with remoteEnv, e.g. "NAME": "${localEnv:NAME}"'
        ),
    ),
    "workspaceFolder": Handling(
        "not used: tasks work in `/workspace`, which `${containerWorkspaceFolder}` names; a line says so",
        lambda v: (
            f"workspaceFolder {v} is not used: tasks work in /workspace, a clone of the base commit, "
            "which ${containerWorkspaceFolder} names"
        ),
    ),
    "workspaceMount": Handling(
        "not used: a task's workspace is its own clone of the base commit; a line says so",
        lambda v: "workspaceMount is not used: a task's workspace is its own clone of the base commit",
    ),
    "runArgs": Handling(
        "not passed to Docker: containers get orchestrator's own limits, network and user; a line says so",
        lambda v: (
            f"runArgs are not passed to Docker ({shlex.join(map(str, v)) if isinstance(v, list) else v}): "
            "task containers get orchestrator's own limits, network and user"
        ),
    ),
    "dockerComposeFile": Handling("refused in one line: Docker Compose environments are not supported"),
    "service": Handling("with `dockerComposeFile`, refused"),
    "runServices": Handling("with `dockerComposeFile`, refused"),
    "initializeCommand": Handling(
        "not run; a line says so. VS Code runs it on your machine before it creates the container; tasks get "
        "the base commit's files, not what it makes on your machine",
        lambda v: (
            "initializeCommand is not run: VS Code runs it on your machine before it creates the "
            "container, and tasks get the base commit's files, not what it makes there"
        ),
    ),
    "onCreateCommand": Handling("honoured: the setup's first step"),
    "updateContentCommand": Handling("honoured: the setup's second step"),
    "postCreateCommand": Handling("honoured: the setup's third step"),
    "postStartCommand": Handling(
        "runs once, last in the setup (not at each container start); a line says so",
        lambda v: (
            "postStartCommand runs once, in the setup after postCreateCommand: what it installs is "
            "kept, processes it starts are not running in tasks"
        ),
    ),
    "postAttachCommand": Handling(
        "not run: nothing attaches to a task's container; a line says so",
        lambda v: "postAttachCommand is not run: nothing attaches to a task's container",
    ),
    "waitFor": Handling("honoured, and more: every setup command finishes before any task starts"),
}
# Image metadata only: a feature's own entry.
_METADATA_ONLY = {
    "id": Handling("not used"),
    "entrypoint": Handling(
        "not run",
        lambda v: f"entrypoint {v} is not run: task containers run orchestrator's own command",
    ),
}


def property_notes(data: dict[str, Any], where: str, *, metadata: bool = False) -> list[str]:
    """The lines a run says about ``data``'s properties it does not honour as written, in the file's order."""
    known = {**PROPERTIES, **(_METADATA_ONLY if metadata else {})}
    notes, unknown = [], []
    items = []
    for key, value in data.items():
        if key == "build" and isinstance(value, dict):
            items += [(f"build.{sub}", subvalue) for sub, subvalue in value.items()]
        else:
            items.append((key, value))
    for key, value in items:
        handling = known.get(key)
        if handling is None:
            unknown.append(key)
        elif handling.note is not None and handling.when(value):
            notes.append(f"{where}: {handling.note(value)}")
    if unknown:
        notes.append(f"{where}: not part of the devcontainer specification, ignored: {', '.join(unknown)}")
    return notes


# ---------------------------------------------------------------- variables


@dataclass
class Context:
    """What the host-side variables resolve to, and which host variables were read."""

    environ: Mapping[str, str]
    local_folder: str
    config_file: str
    used: set[str] = field(default_factory=set)

    @property
    def devcontainer_id(self) -> str:
        # As the Dev Containers CLI derives it from the labels it puts on the
        # container: stable for one folder and file, unique across them.
        labels = {"devcontainer.config_file": self.config_file, "devcontainer.local_folder": self.local_folder}
        number = int(
            hashlib.sha256(json.dumps(labels, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest(), 16
        )
        digits = "0123456789abcdefghijklmnopqrstuv"
        out = ""
        while number:
            number, rest = divmod(number, 32)
            out = digits[rest] + out
        return out.rjust(52, "0")

    def secrets(self) -> list[str]:
        """Values read from the host whose names say they are secret: the sanitizer keeps them out of logs."""
        return [self.environ[n] for n in sorted(self.used) if n in self.environ and _SECRET_NAME.search(n)]


def _lookup(env: Mapping[str, str], args: list[str], match: str, where: str) -> str:
    if not args or not args[0]:
        raise ConfigError(f"{where}: {match} names no variable; write it as ${{localEnv:NAME}}")
    value = env.get(args[0])
    if value is not None:
        return value
    return args[1] if len(args) > 1 else ""


def substitute_local(value: Any, ctx: Context, where: str) -> Any:
    """``value`` (any JSON) with the host's variables resolved; ``${containerEnv:...}`` is left for later."""
    if isinstance(value, str):

        def one(m: re.Match[str]) -> str:
            name, *args = m.group(1).split(":")
            if name in ("localEnv", "env"):
                if args:
                    ctx.used.add(args[0])
                return _lookup(ctx.environ, args, m.group(0), where)
            fixed = {
                "localWorkspaceFolder": lambda: ctx.local_folder,
                "localWorkspaceFolderBasename": lambda: PurePosixPath(ctx.local_folder).name,
                "containerWorkspaceFolder": lambda: WORKSPACE,
                "containerWorkspaceFolderBasename": lambda: PurePosixPath(WORKSPACE).name,
                "devcontainerId": lambda: ctx.devcontainer_id,
            }
            return fixed[name]() if name in fixed else m.group(0)

        return _VARIABLE.sub(one, value)
    if isinstance(value, list):
        return [substitute_local(v, ctx, where) for v in value]
    if isinstance(value, dict):
        return {k: substitute_local(v, ctx, where) for k, v in value.items()}
    return value


def substitute_container(value: str, env: Mapping[str, str], where: str, *, bare: bool) -> str:
    """``${containerEnv:VAR}`` (and, with ``bare``, ``${VAR}``) as the container's environment ``env`` has it."""

    def one(m: re.Match[str]) -> str:
        name, *args = m.group(1).split(":")
        if name == "containerEnv":
            return _lookup(env, args, m.group(0), where)
        if bare and not args and _BARE.fullmatch(m.group(0)):
            return env.get(name, "")
        return m.group(0)

    return _VARIABLE.sub(one, value)


# ---------------------------------------------------------------- reading


def _commands(value: Any, label: str, where: str) -> list[SetupCommand]:
    """A lifecycle command in any of the devcontainer's three forms, in order."""
    if value is None:
        return []
    if isinstance(value, str):
        return [SetupCommand(label=label, shell=value)] if value.strip() else []
    if isinstance(value, list) and value and all(isinstance(a, str) for a in value):
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


def _env(raw: Any, key: str, where: str, *, nulls: bool) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and (isinstance(v, str) or (nulls and v is None)) for k, v in raw.items()
    ):
        kind = "strings (or null)" if nulls else "strings"
        raise ConfigError(f"{where}: {key} must be an object of {kind}")
    for name, value in raw.items():
        if isinstance(value, str) and ("\n" in value or "\r" in value):
            raise ConfigError(f"{where}: {key}.{name} holds a line break, which no container's environment can hold")
    return dict(raw)


def _user(raw: Any, key: str, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"{where}: {key} must be a user name")
    return raw.strip()


def repo_path(folder: str, rel: str, where: str, key: str) -> str:
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


def parse(text: str, where: str, ctx: Context) -> EnvironmentSpec:
    """The environment the devcontainer ``text`` (found at repository path ``where``) describes."""
    import json5

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
    data = substitute_local(data, ctx, where)
    folder = str(PurePosixPath(where).parent)  # "." at the root: repo_path drops it
    spec: dict[str, Any] = {"source": where, "devcontainer": True}
    build = data.get("build")
    if build is None and isinstance(data.get("dockerFile"), str):
        # The older spelling: dockerFile and context at the top level.
        build = {"dockerfile": data["dockerFile"], "context": data.get("context", ".")}
    if isinstance(data.get("image"), str) and data["image"].strip():
        spec["image"] = data["image"].strip()
    elif isinstance(build, dict):
        dockerfile = build.get("dockerfile") or build.get("dockerFile") or "Dockerfile"
        if not isinstance(dockerfile, str):
            raise ConfigError(f"{where}: build.dockerfile must be a string")
        context = build.get("context", ".")
        if not isinstance(context, str):
            raise ConfigError(f"{where}: build.context must be a string")
        spec["dockerfile"] = repo_path(folder, dockerfile, where, "build.dockerfile")
        spec["context"] = repo_path(folder, context, where, "build.context")
        args = build.get("args") or {}
        if not isinstance(args, dict) or not all(isinstance(v, str) for v in args.values()):
            raise ConfigError(f"{where}: build.args must be an object of strings")
        for key, value in args.items():
            if "${containerEnv:" in value:
                raise ConfigError(
                    f"{where}: build.args.{key} uses ${{containerEnv:...}}, which only a built image can answer; "
                    "use ${localEnv:NAME} or a value"
                )
        spec["build_args"] = dict(args)
        if isinstance(build.get("target"), str):
            spec["target"] = build["target"]
    else:
        raise ConfigError(f"{where} names no `image` and no `build.dockerfile`; add one, or pass --no-devcontainer")
    spec.update(_runtime(data, where))
    spec["notes"] = tuple(property_notes(data, where))
    return EnvironmentSpec(**spec)


# The properties an image's devcontainer.metadata may set too: the EnvironmentSpec fields _runtime reads.
_RUNTIME = ("container_env", "remote_env", "remote_user", "container_user", "setup")


def _runtime(data: dict[str, Any], where: str, origin: str = "") -> dict[str, Any]:
    """Those properties of a devcontainer (or of one metadata entry, whose commands are labelled ``origin``)."""
    return {
        "container_env": _env(data.get("containerEnv"), "containerEnv", where, nulls=False),
        "remote_env": _env(data.get("remoteEnv"), "remoteEnv", where, nulls=True),
        "remote_user": _user(data.get("remoteUser"), "remoteUser", where),
        "container_user": _user(data.get("containerUser"), "containerUser", where),
        "setup": tuple(c for stage in STAGES for c in _commands(data.get(stage), stage + origin, where)),
    }


# ---------------------------------------------------------------- the image's metadata


def apply_metadata(
    spec: EnvironmentSpec, label: str | None, image: str, ctx: Context
) -> tuple[EnvironmentSpec, list[str]]:
    """``spec`` with the image's ``devcontainer.metadata`` label (an array, or one object) merged in, as the
    specification merges it (the file last), and the lines a run says about it.

    Environment variables per name, last wins; users last wins; lifecycle
    commands collected, the image's before the file's, stage by stage.
    """
    try:
        data = json.loads(label) if label else []
    except ValueError:
        return spec, [f"{image}: its devcontainer.metadata label is not JSON; it is not used"]
    snippets = [e for e in (data if isinstance(data, list) else [data]) if isinstance(e, dict)]
    if not snippets:
        return spec, []
    where = f"{image} (its devcontainer.metadata)"
    layers: list[dict[str, Any]] = []
    notes: list[str] = []
    for entry in snippets:
        entry = substitute_local(entry, ctx, where)
        layers.append(_runtime(entry, where, f" (from {image})"))
        notes += property_notes(entry, where, metadata=True)
    layers.append({name: getattr(spec, name) for name in _RUNTIME})  # the file's own, last
    merged = msgspec.structs.replace(
        spec,
        container_env={k: v for layer in layers for k, v in layer["container_env"].items()},
        remote_env={k: v for layer in layers for k, v in layer["remote_env"].items()},
        remote_user=next((layer["remote_user"] for layer in reversed(layers) if layer["remote_user"]), None),
        container_user=next((layer["container_user"] for layer in reversed(layers) if layer["container_user"]), None),
        setup=tuple(c for stage in STAGES for layer in layers for c in layer["setup"] if c.stage == stage),
    )
    # One line per kind of thing not done, however many entries (features) ask for it.
    return merged, list(dict.fromkeys(notes))
