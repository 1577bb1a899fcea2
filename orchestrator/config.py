"""Configuration: typed sections, one precedence order (docs/cli.md, "Configuration"). Each source is validated on
its own first, so an unknown key or a wrong type is reported with the file or variable it came from."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from .errors import ConfigError
from .parsing import did_you_mean, parse_value


class ContainerLimitsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Containment of every task container (see docs/docker.md for why each exists)."""

    pids_limit: Annotated[int, msgspec.Meta(ge=64)] = 512
    nofile: Annotated[int, msgspec.Meta(ge=256)] = 4096


class HostConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One Docker engine of ``runner.hosts``: ``{name: local}``, ``{name, docker: URL}`` or ``{name, context}``."""

    name: str
    docker: str | None = None  # ssh://user@host, tcp://host:2376, unix:///path
    context: str | None = None  # a `docker context` name
    max_parallel: int | None = None
    # tcp:// with TLS: a directory holding ca.pem, cert.pem and key.pem (what the
    # Docker CLI reads from DOCKER_CERT_PATH); without it, DOCKER_CERT_PATH or ~/.docker.
    cert_path: str | None = None
    # Plain tcp:// (no TLS) to an engine on another machine is refused: credentials and
    # the repository would cross the network in clear text. true accepts that, with a
    # warning on every start.
    insecure: bool = False


class KubernetesConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``runner.kubernetes``: run every task as a Pod of this cluster (docs/scaling.md, "Kubernetes")."""

    kubeconfig: str | None = None  # default: KUBECONFIG, then ~/.kube/config
    context: str | None = None  # default: the kubeconfig's current context
    namespace: str = "default"
    # A Pod still Pending after this long (no room, image missing) fails its task
    # with the reason the cluster gave.
    pending_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 300
    image_pull_policy: Literal["IfNotPresent", "Never", "Always"] = "IfNotPresent"
    # Session PersistentVolumeClaims: the class ("" for a PV without one, None for
    # the cluster's default) and the size each asks for.
    storage_class: str | None = None
    session_size: str = "1Gi"
    # How long a new session claim may stay unbound before the task starts a fresh
    # session without one (and says why).
    session_bind_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30
    # --sync-image: a command that loads an image into the cluster's nodes, given the
    # image name as its last argument (e.g. "bash scripts/setup-k8s.sh load-image").
    load_command: str | None = None
    # An API server over plain http:// to another machine is refused; true accepts it.
    insecure: bool = False


class RunnerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Docker engines to place tasks on; empty: the one local engine, as always.
    hosts: list[HostConfig] = msgspec.field(default_factory=list)
    # A Kubernetes cluster to run every task on as a Pod, instead of Docker engines.
    kubernetes: KubernetesConfig | None = None
    sync_image: bool = False
    docker_image: str = "claude-code"
    plugin: str = "claude-code"
    # More plugins, beyond the built-in ones: name -> importable module that defines PLUGIN.
    plugin_modules: dict[str, str] = msgspec.field(default_factory=dict)
    container_cpu: float = 2
    container_memory: str = "4g"
    container_timeout_seconds: float = 3600
    container_limits: ContainerLimitsConfig = msgspec.field(default_factory=ContainerLimitsConfig)
    secret_scan: Literal["block", "warn", "off"] = "block"
    max_workspace_mb: Annotated[int, msgspec.Meta(ge=0)] = 2048
    # Remote engines (runner.hosts): each keeps the repository's objects in a cache
    # volume, so history crosses the link once (docs/scaling.md). 0: no cache, every
    # task gets a full copy. Past the size, or unused for the days, it is rebuilt.
    object_cache_max_mb: Annotated[int, msgspec.Meta(ge=0)] = 20480
    object_cache_expiry_days: Annotated[float, msgspec.Meta(gt=0)] = 14
    max_turns: int | None = None
    network_egress: Literal["online", "offline", "proxy"] = "online"
    review_workspace_mode: Literal["ro", "rw"] = "ro"
    isolation_mode: Literal["full_copy", "shared_objects"] = "shared_objects"
    session_volume_scope: Literal["run", "global"] = "run"
    reuse_container: bool = True
    finalize: bool = True
    max_attempts: int = 3
    backoff_base_s: float = 10
    backoff_factor: float = 6
    backoff_max_s: float = 360
    success_retention_hours: float = 2
    failure_retention_hours: float = 24


class EnvironmentConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The project's own toolchain for agents and evaluations (see docs/environment.md)."""

    # The user's image (a registry name or a local tag), or a Dockerfile in the
    # repository built with its own folder as context; at most one of them.
    image: str | None = None
    dockerfile: str | None = None
    # Shell commands run once, as root, in /workspace at the base commit.
    setup: list[str] = msgspec.field(default_factory=list)
    # Use the repository's .devcontainer/devcontainer.json when nothing above is set.
    devcontainer: bool = True


class OrchestrationConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    default_model: str = "sonnet"
    # None: `main` when the repository has it, else its current branch (the run says which).
    base_branch: str | None = None
    strategy: str = "simple"
    runs: int = 1
    max_parallel_tasks: int | Literal["auto"] = "auto"
    import_policy: Literal["auto", "never", "always"] = "auto"
    import_conflict_policy: Literal["fail", "overwrite", "suffix"] = "fail"
    skip_empty_import: bool = True
    min_free_disk_gb: float = 20
    hard_min_free_disk_gb: float = 1
    require_clean_wt: bool = False
    determinism: Literal["warn", "strict", "off"] = "warn"
    clean_orphans_on_start: bool = True


class EventsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    flush_policy: Literal["interval", "per_event"] = "interval"
    interval_ms: int = 50
    max_batch: int = 256
    max_final_message_bytes: int = 65536
    snapshot_interval_s: float = 30


class TuiConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    force_display_mode: Literal["detailed", "compact", "dense"] | None = None
    refresh_hz: float = 10


class LoggingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    debug: bool = False
    retention_days: float = 7
    # Component logs (orchestration/runner/tui.jsonl) rotate at this size; 0 = never.
    max_component_log_mb: float = 64
    component_log_backups: int = 3


class BudgetConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The run-wide spending cap (``--max-cost``, ``--max-tokens``; see docs/cli.md)."""

    max_cost_usd: Annotated[float, msgspec.Meta(gt=0)] | None = None
    max_tokens: Annotated[int, msgspec.Meta(gt=0)] | None = None
    # finish: running agent tasks finish; stop: they are interrupted like Ctrl+C, sessions kept
    on_reached: Literal["finish", "stop"] = "finish"


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    runner: RunnerConfig = msgspec.field(default_factory=RunnerConfig)
    environment: EnvironmentConfig = msgspec.field(default_factory=EnvironmentConfig)
    orchestration: OrchestrationConfig = msgspec.field(default_factory=OrchestrationConfig)
    events: EventsConfig = msgspec.field(default_factory=EventsConfig)
    tui: TuiConfig = msgspec.field(default_factory=TuiConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    budget: BudgetConfig = msgspec.field(default_factory=BudgetConfig)
    # pricing.<provider>.<model>.{input_per_1k_usd, output_per_1k_usd}
    pricing: dict[str, dict[str, dict[str, float]]] = msgspec.field(default_factory=dict)
    # Default strategy parameters: strategy.<name with _ for ->.<param>
    strategy: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    # A run can be described entirely in a file (long prompts): prompt, params.
    prompt: str | None = None
    params: dict[str, Any] = msgspec.field(default_factory=dict)

    def model_pricing(self) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for models in self.pricing.values():
            for model, rates in models.items():
                out[model] = (float(rates.get("input_per_1k_usd", 0)), float(rates.get("output_per_1k_usd", 0)))
        return out


# Environment variables that are not config keys.
PATH_VARS = {
    "ORCHESTRATOR_LOGS_DIR",
    "ORCHESTRATOR_STATE_DIR",
    "ORCHESTRATOR_RESULTS_DIR",
    "ORCHESTRATOR_WORKSPACE_ROOT",
}
ALIASES = {"ORCHESTRATOR_DEFAULT_MODEL": ("orchestration", "default_model"), "ORCHESTRATOR_DEBUG": ("logging", "debug")}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _normalize(data: dict[str, Any], source: str, warnings: list[str] | None = None) -> dict[str, Any]:
    """One source's spellings folded into the canonical keys before it is merged, so precedence is decided on the
    canonical key (a deprecated alias in the file cannot beat ``--max-parallel``). Accepted: ``events.flush_policy``
    as a mapping ``{mode, interval_ms, max_batch}``, ``tui.refresh_rate`` in milliseconds per frame, and the
    deprecated ``orchestration.max_parallel_instances``."""
    out = dict(data)
    events = out.get("events")
    if isinstance(events, dict) and isinstance(events.get("flush_policy"), dict):
        events = dict(events)
        nested = events.pop("flush_policy")
        unknown = sorted(set(nested) - {"mode", "interval_ms", "max_batch"})
        if unknown:
            raise ConfigError(
                f"{source}: unknown configuration key 'events.flush_policy.{unknown[0]}' "
                "(use mode, interval_ms or max_batch)"
            )
        events |= {"flush_policy" if key == "mode" else key: value for key, value in nested.items()}
        out["events"] = events
    tui = out.get("tui")
    if isinstance(tui, dict) and "refresh_rate" in tui:
        tui = dict(tui)
        rate = tui.pop("refresh_rate")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            raise ConfigError(f"{source}: tui.refresh_rate: expected milliseconds per frame above 0, got {rate!r}")
        tui.setdefault("refresh_hz", 1000.0 / rate)
        out["tui"] = tui
    orch = out.get("orchestration")
    if isinstance(orch, dict) and "max_parallel_instances" in orch:
        orch = dict(orch)
        value = orch.pop("max_parallel_instances")
        if value is not None:
            orch.setdefault("max_parallel_tasks", value)
            if warnings is not None:
                warnings.append(
                    f"warning: {source}: orchestration.max_parallel_instances is deprecated; use max_parallel_tasks"
                )
        out["orchestration"] = orch
    return out


def _validate(data: dict[str, Any], source: str) -> None:
    try:
        msgspec.convert(_normalize(data, source), Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_explain(exc)}") from None


def _explain(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    msg, _, where = text.partition(" - at `$")
    key = where.rstrip("`").strip(".").replace("[", ".").replace("]", "").replace("'", "")
    # msgspec says "Object contains unknown field `x` - at `$.runner`": make it a dotted key.
    if "unknown field" in text:
        key = f"{key}.{text.split('`')[1]}".strip(".")
        return f"unknown configuration key {key!r}{_key_guess(key)}"
    if where:
        bound = _BOUND.fullmatch(msg)
        if bound is not None:  # msgspec's "Expected `float` > 0.0", said as a person would
            kind, op, limit = bound.groups()
            limit = limit[:-2] if limit.endswith(".0") else limit
            return f"{key} must be {_KINDS.get(kind, kind)} {_OPS[op]} {limit}"
        return f"{key}: {msg}"
    return text


_BOUND = re.compile(r"Expected `(\w+)` (>=|>|<=|<) (-?[\d.]+)")
_KINDS = {"int": "a whole number", "float": "a number"}
_OPS = {">=": "of at least", ">": "greater than", "<=": "of at most", "<": "less than"}


def _key_guess(key: str) -> str:
    """`` (did you mean runner.docker_image?)`` for a mistyped key of a known section, else ``""``."""
    *parents, last = key.split(".")
    struct: Any = Config
    for name in parents:
        fields = {f.encode_name: f.type for f in msgspec.structs.fields(struct)}
        struct = fields.get(name)
        if not (isinstance(struct, type) and issubclass(struct, msgspec.Struct)):
            return ""
    names = [f.encode_name for f in msgspec.structs.fields(struct)]
    return did_you_mean(last, names, prefix="".join(f"{p}." for p in parents))


def load_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    # PyYAML takes about 30 ms to import: only a run that has a YAML file pays for it.
    import yaml

    try:
        if path.suffix.lower() != ".json":
            data = yaml.safe_load(text) or {}
        elif text.strip():
            data = json.loads(text)
        else:
            data = {}
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        line = line + 1 if line is not None else getattr(exc, "lineno", None)
        where = f"{path}:{line}" if line else str(path)
        reason = getattr(exc, "problem", None) or getattr(exc, "msg", None) or str(exc).splitlines()[0]
        raise ConfigError(
            f"{where}: malformed {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: {reason}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (runner:, orchestration:, ...)")
    return data


def read_dotenv(path: Path) -> dict[str, str]:
    """``.env`` as python-dotenv reads it (quotes, escapes, ``export``, inline ``# comments``), no interpolation. A
    line that is not ``KEY=VALUE`` is an error naming the file and line: a misspelt credential line would otherwise
    show up later as "no credentials"."""
    from dotenv.parser import parse_stream

    try:
        text = path.read_text("utf-8")
    except OSError:
        return {}
    values: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        if binding.error or (binding.key is not None and binding.value is None):
            raise ConfigError(f"{path}:{binding.original.line}: expected KEY=VALUE")
        if binding.key is not None and binding.value is not None:
            values[binding.key] = binding.value
    return values


def _env_to_dict(env: dict[str, str], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith("ORCHESTRATOR_") or name in PATH_VARS:
            continue
        path: tuple[str, ...]
        if name in ALIASES:
            path = ALIASES[name]
        else:
            rest = name[len("ORCHESTRATOR_") :]
            if "__" not in rest:
                continue  # other ORCHESTRATOR_* variables are read where they are used
            path = tuple(p.lower() for p in rest.split("__"))
        if path[0] == "strategy" and len(path) == 3:
            path = ("strategy", path[1].replace("_", "-"), path[2])
        value = parse_value(raw)
        node = out
        for p in path[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"{source} variable {name}: {'.'.join(path[:-1])} is also set as a single value; "
                    "set one form or the other"
                )
        node[path[-1]] = value
        alone: Any = value
        for p in reversed(path):
            alone = {p: alone}
        _validate(alone, f"{source} variable {name}")
    return out


class LoadedConfig(msgspec.Struct, frozen=True, kw_only=True):
    config: Config
    environ: dict[str, str]  # process env overlaid on .env (for credentials)
    sources: list[str]
    warnings: list[str] = msgspec.field(default_factory=list)  # one line each, for stderr


def load_config(
    *,
    config_file: str | None,
    cli_overrides: dict[str, Any],
    cwd: Path | None = None,
    environ: dict[str, str] | None = None,
) -> LoadedConfig:
    cwd = cwd or Path.cwd()
    environ = dict(os.environ if environ is None else environ)
    sources = ["defaults"]
    merged: dict[str, Any] = {}
    path = Path(config_file) if config_file else (cwd / "orchestrator.yaml")
    if config_file and not path.exists():
        raise ConfigError(f"config file {config_file} does not exist")
    parts: list[tuple[dict[str, Any], str]] = []  # (settings, source), each validated, lowest precedence first
    if path.exists():
        parts.append((load_file(path), str(path)))
        _validate(*parts[-1])
    dotenv_path = cwd / ".env"
    dotenv = read_dotenv(dotenv_path) if dotenv_path.exists() else {}
    if dotenv:
        parts.append((_env_to_dict(dotenv, str(dotenv_path)), str(dotenv_path)))
    if env_part := _env_to_dict(environ, "environment"):
        parts.append((env_part, "environment"))
    if cli_overrides:
        parts.append((cli_overrides, "command line"))
        _validate(*parts[-1])
    warnings: list[str] = []
    for data, source in parts:
        merged = deep_merge(merged, _normalize(data, source, warnings))
        sources.append(source)
    try:
        config = msgspec.convert(merged, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"configuration: {_explain(exc)}") from None
    effective_env = {**dotenv, **environ}
    return LoadedConfig(config=config, environ=effective_env, sources=sources, warnings=warnings)


def redacted(config: Config) -> dict[str, Any]:
    """The resolved config for the log (it holds no secrets, but scrub anyway)."""
    from .sanitize import default_sanitizer, redact_url

    data = msgspec.to_builtins(config)
    for host in data.get("runner", {}).get("hosts") or []:
        if host.get("docker"):
            host["docker"] = redact_url(host["docker"])  # a password in a host URL is never written
    return default_sanitizer().scrub(data)


def recorded_config(data: dict[str, Any], source: str) -> Config:
    """The configuration a run recorded, fully resolved, at its start (``run.json``): a default changed in the code
    since does not change it; a key this version no longer knows is dropped, a key it added takes its default."""
    known: dict[str, Any] = {}
    for field in msgspec.structs.fields(Config):
        if field.encode_name not in data:
            continue
        value = data[field.encode_name]
        section = field.type if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct) else None
        if section is not None and isinstance(value, dict):
            names = {f.encode_name for f in msgspec.structs.fields(section)}
            value = {k: v for k, v in value.items() if k in names}
        known[field.encode_name] = value
    try:
        return msgspec.convert(known, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(
            f"{source}: the recorded configuration is not valid for this version: {_explain(exc)}; "
            "finish the run with the version that started it"
        ) from None


# Sections whose settings cannot change what a task does or produces: a resumed
# run takes them from today's configuration, the rest from what it recorded.
PRESENTATION_SECTIONS = ("tui", "logging")
# The spending cap is not a task input either: a resume may raise it
# (``--resume RUN_ID --max-cost HIGHER``) and no recorded task changes.
RESUME_SECTIONS = ("budget",)
# Settings that say only where tasks run, not what they do: a resumed run takes
# them from today's configuration too, so it goes on when the set of Docker
# hosts changed in between (an engine gone for good, one added).
PLACEMENT_KEYS = ("runner.hosts", "runner.sync_image")


def changed_keys(recorded: Config, current: Config) -> list[str]:
    """Dotted keys whose value differs between the two, presentation sections and max_parallel_tasks excepted."""
    a, b = msgspec.to_builtins(recorded), msgspec.to_builtins(current)
    out: list[str] = []

    def walk(x: Any, y: Any, prefix: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict) and prefix.count(".") < 1:
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{prefix}.{k}" if prefix else k)
        elif x != y:
            out.append(prefix)

    for section in sorted(set(a) | set(b)):
        if section in PRESENTATION_SECTIONS or section in RESUME_SECTIONS:
            continue
        walk(a.get(section), b.get(section), section)
    return [k for k in out if k not in ("orchestration.max_parallel_tasks", *PLACEMENT_KEYS)]
