"""Pre-flight: everything checked before a run writes anything. A problem (prompt, strategy, configuration, model,
plugin, repository, credentials, Docker) ends with one line and exit 2, and no run directory exists afterwards."""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ..agent_image.tools import build_command, check_tools, required_tools
from ..config import Config, EnvironmentConfig, LoadedConfig, load_config
from ..engine.engine import auto_parallel
from ..errors import ConfigError, PreflightError, RunnerError, UsageError
from ..log.runs import RunDirs, RunManifest
from ..runner import (
    AuthConfig,
    HostSpec,
    RunnerPlugin,
    docker_available,
    get_plugin,
    image_exists,
    register_plugins,
    validate_repository,
    workspace_root,
)
from ..sanitize import SECRET_ENV_VARS, default_sanitizer
from ..strategy import prepare_runtime
from ..strategy_loader import LoadedStrategy, load_strategy, parse_params
from . import run_branches, run_budget
from .auth import resolve_auth
from .hosts_cli import host_specs

MAX_PROMPT_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class Prepared:
    """The run's plan: what pre-flight made of the arguments and configuration; everything after reads it."""

    loaded_config: LoadedConfig
    strategy: LoadedStrategy
    params: dict[str, Any]
    prompt: str
    repo: str
    base_branch: str
    model: str
    plugin: RunnerPlugin  # resolved once, by pre-flight
    hosts: tuple[HostSpec, ...]  # runner.hosts resolved once, by pre-flight; () for one engine or a cluster
    image: str  # the project's environment image, or the agent image
    max_parallel: int
    runs: int
    auth: AuthConfig
    dry_run: bool
    mode: str | None
    output: str
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # one line each, shown as the run starts
    # On --resume, the event log's size before it: the console shows only what is new.
    console_from: int = 0

    @property
    def config(self) -> Config:
        return self.loaded_config.config

    @property
    def plugin_name(self) -> str:
        return self.plugin.name


def _cli_overrides(args) -> dict[str, Any]:
    over: dict[str, Any] = {}

    def put(section: str, key: str, value: Any) -> None:
        if value is not None:
            over.setdefault(section, {})[key] = value

    put("orchestration", "default_model", args.model)
    put("orchestration", "base_branch", args.base_branch)
    put("orchestration", "strategy", args.strategy)
    put("orchestration", "runs", args.runs)
    put("orchestration", "max_parallel_tasks", args.max_parallel)
    put("orchestration", "require_clean_wt", args.require_clean_wt)
    put("runner", "docker_image", args.docker_image)
    put("environment", "image", getattr(args, "env_image", None))
    put("environment", "dockerfile", getattr(args, "env_dockerfile", None))
    put("environment", "setup", getattr(args, "env_setup", None))
    if getattr(args, "no_devcontainer", None):
        put("environment", "devcontainer", False)
    if getattr(args, "docker_hosts", None):
        from ..runner import parse_host_flag

        put("runner", "hosts", [parse_host_flag(text) for text in args.docker_hosts])
    put("runner", "sync_image", getattr(args, "sync_image", None))
    if kube := {k: v for k in ("kubeconfig", "namespace") if (v := getattr(args, k, None)) is not None}:
        put("runner", "kubernetes", kube)
    put("runner", "plugin", args.plugin)
    put("events", "flush_policy", args.safe_fsync)
    put("budget", "max_cost_usd", getattr(args, "max_cost", None))
    put("budget", "max_tokens", getattr(args, "max_tokens", None))
    if args.debug:
        put("logging", "debug", True)
    return over


def output_mode(args) -> str:
    if args.json:
        return "json"
    if args.quiet:
        return "quiet"
    if args.no_tui or not sys.stdout.isatty():
        return "plain"
    return "dashboard"


def _read_prompt(args, config: Config) -> str:
    prompt = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
    if prompt is None:
        prompt = config.prompt
    if prompt is None:
        raise UsageError('no prompt given: orchestrator "what the agents should do" (or --resume RUN_ID, --help)')
    if not prompt.strip():
        raise UsageError("the prompt is empty; say what the agents should do")
    if len(prompt.encode("utf-8", "surrogatepass")) > MAX_PROMPT_BYTES:
        raise UsageError("the prompt is larger than 10 MB; put the material in the repository and refer to it")
    return prompt


CLUSTER_AUTO_PARALLEL = 4


def _max_parallel(config: Config, value: int | str | None = None, hosts: tuple[HostSpec, ...] = ()) -> int:
    # The deprecated max_parallel_instances was folded into this key per source
    # by load_config, so the command line still wins over it.
    if value is None:
        value = config.orchestration.max_parallel_tasks
    if config.runner.kubernetes is not None and value == "auto":
        # The cluster's scheduler places the Pods; this machine's CPUs say nothing of its room.
        return CLUSTER_AUTO_PARALLEL
    # Each host has its own slots; a given --max-parallel caps their sum.
    total = sum(spec.max_parallel for spec in hosts) if hosts else None
    if value == "auto":
        return auto_parallel(config.runner.container_cpu) if total is None else total
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"--max-parallel must be at least 1 (got {value})")
    return value if total is None else min(total, value)


@dataclass(frozen=True)
class Check:
    """One line of ``--doctor``, and the checks a run's pre-flight makes the same way."""

    status: str  # ok | warn | fail
    name: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4}  {self.name}: {self.detail}"
        return f"{text} -- fix: {self.fix}" if self.fix and self.status != "ok" else text


def existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def disk_check(path: Path, label: str, min_gb: float, hard_min_gb: float) -> Check:
    probe = existing(path)
    free_gb = shutil.disk_usage(probe).free / 1e9
    detail = f"{free_gb:.1f} GB free under {probe}"
    if free_gb < hard_min_gb:
        return Check("fail", f"free disk ({label})", detail, f"at least {hard_min_gb:g} GB is needed: free some space")
    if free_gb < min_gb:
        return Check("warn", f"free disk ({label})", detail, f"recommended: {min_gb:g} GB")
    return Check("ok", f"free disk ({label})", detail)


def _check_disk(path: Path, config: Config, warnings: list[str]) -> None:
    check = disk_check(path, "disk", config.orchestration.min_free_disk_gb, config.orchestration.hard_min_free_disk_gb)
    if check.status == "fail":
        raise PreflightError(f"only {check.detail}; {check.fix}")
    if check.status == "warn":
        warnings.append(f"only {check.detail} ({check.fix})")


# Said once at every start on a cluster: a NetworkPolicy is only words where the
# network plugin does not enforce it, and nothing in the API says which.
NETWORK_POLICY_NOTE = (
    "note: offline tasks get a deny-all NetworkPolicy on Kubernetes; it holds only where the cluster's network "
    "plugin enforces NetworkPolicy (Calico, Cilium and others do; the plain bridge and flannel plugins do not)"
)


async def _check_cluster(config: Config, image: str) -> str:
    """Pre-flight on a cluster: the kubeconfig (plain HTTP refused), an answer, the namespace, the image."""
    from ..runner import ClusterSpec, KubeHost, check_cluster_image

    if config.runner.hosts:
        raise ConfigError("runner.kubernetes and runner.hosts (--docker-host) exclude each other; keep one")
    kube = config.runner.kubernetes
    assert kube is not None
    host = KubeHost(ClusterSpec.of(kube))
    if _warming is not None:
        await anyio.to_thread.run_sync(_warming.join)  # it imports the client, and requests with it
    async with contextlib.aclosing(host):
        try:
            version = await host.ping()
        except RunnerError as exc:
            raise PreflightError(f"Kubernetes cluster ({host.cluster.shown}) does not answer: {exc}") from None
        core = await host.core()
        try:
            await host.call(f"read namespace {kube.namespace}", core.read_namespace, kube.namespace)
        except RunnerError as exc:
            if "404" in str(exc) or "not found" in str(exc):
                raise PreflightError(
                    f"namespace {kube.namespace} does not exist on the cluster; create it with "
                    f"`kubectl create namespace {kube.namespace}` or pass --namespace"
                ) from None
        line = await check_cluster_image(host, image, load_command=kube.load_command, sync=config.runner.sync_image)
    if line:
        print(line, file=sys.stderr, flush=True)
    print(f"Kubernetes {version}, namespace {kube.namespace}", file=sys.stderr, flush=True)
    print(NETWORK_POLICY_NOTE, file=sys.stderr, flush=True)
    return version


async def _check_engines(
    config: Config, image: str, tools: tuple[str, ...] = (), hosts: tuple[HostSpec, ...] = ()
) -> None:
    if config.runner.kubernetes is not None:
        await _check_cluster(config, image)
    elif hosts:
        from ..runner import preflight_images, transport_warnings

        # Every start and every resume says it again: accepting the risk once is not forgetting it.
        for warning in transport_warnings(hosts):
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        await preflight_images(hosts, image, sync=config.runner.sync_image)
    else:
        await _check_docker(image, tools)


async def _check_docker(image: str, tools: tuple[str, ...] = ()) -> None:
    ok, message = await docker_available()
    if not ok:
        raise PreflightError(message)
    if not await image_exists(image):
        raise PreflightError(
            f"Docker image {image!r} not found; build it with {build_command(image)} "
            f"(scripts/setup-docker.sh in a checkout) or pass --docker-image"
        )
    if tools:
        # The same probe as --doctor (cached per image id): a missing CLI fails here, not in every task.
        await anyio.to_thread.run_sync(check_tools, image, tools)


def _check_agent(
    loaded: LoadedConfig, plugin: RunnerPlugin, strategy: LoadedStrategy, *, model: str, mode: str | None, dry_run: bool
) -> AuthConfig:
    """The plugin against the model and the strategy, and its credentials: what a start and a resume both check."""
    models = plugin.known_models()
    if models is not None and model not in models:
        from ..parsing import did_you_mean

        names = ", ".join(sorted(k for k in models if "-" not in k)) or ", ".join(sorted(models))
        guess = did_you_mean(model, sorted(models))
        raise ConfigError(f"unknown model {model!r} for plugin {plugin.name}{guess}; use one of: {names}")
    if strategy.options.requires_resume and not plugin.capabilities.supports_resume:
        raise PreflightError(
            f"strategy {strategy.name} resumes agent sessions, which plugin {plugin.name} cannot do; "
            "choose another --plugin"
        )
    auth = resolve_auth(loaded.environ, plugin=plugin, mode=mode, dry_run=dry_run)
    if not dry_run:
        plugin.validate_environment(auth)
    run_budget.check_measurable(loaded.config, plugin=plugin, model=model, mode=mode, auth=auth)
    default_sanitizer().add_secrets(auth.secret_values())
    return auth


def _warm_imports(cluster: bool) -> None:
    """Import docker-py (0.3 s) and, on a cluster, the Kubernetes client while pre-flight reads config and git: in one
    thread, since two threads importing requests at once can each meet the other's half-loaded module."""
    with contextlib.suppress(ImportError):
        import docker  # noqa: F401  (imported for its side effect: loading it now)
    if cluster:
        with contextlib.suppress(ImportError):
            import kubernetes.client  # noqa: F401  (as docker above)


# The thread of _warm_imports of this process's pre-flight, which the cluster check waits for.
_warming: Any = None


class _EarlyCheck:
    """A pre-flight check started ahead of the others; its error is raised where it used to be checked."""

    def __init__(self) -> None:
        self._done = anyio.Event()
        self._error: Exception | None = None

    async def run(self, fn, *args: Any) -> None:
        try:
            await fn(*args)
        except Exception as exc:
            self._error = exc
        finally:
            self._done.set()

    async def result(self) -> None:
        await self._done.wait()
        if self._error is not None:
            raise self._error


async def prepare(args) -> Prepared:
    import threading

    global _warming
    loaded = load_config(config_file=args.config, cli_overrides=_cli_overrides(args))
    _warming = threading.Thread(target=_warm_imports, args=(loaded.config.runner.kubernetes is not None,), daemon=True)
    _warming.start()
    register_plugins(loaded.config.runner.plugin_modules)
    plugin = get_plugin(loaded.config.runner.plugin)  # the run's one lookup: the plan carries it
    tools = required_tools(plugin, dry_run=args.dry_run)
    hosts = await host_specs(loaded.config)  # once: the plan carries them
    # The Docker check (a few daemon round trips) runs while git validates the
    # repository; a failure of an earlier check is still the one reported.
    docker = _EarlyCheck()
    async with anyio.create_task_group() as tg:
        tg.start_soon(docker.run, _check_engines, loaded.config, loaded.config.runner.docker_image, tools, hosts)
        try:
            return await _prepare(args, loaded, plugin, hosts, docker)
        except Exception as exc:  # raised below, outside the task group, unwrapped
            error = exc
            tg.cancel_scope.cancel()
    raise error


async def _prepare(
    args, loaded: LoadedConfig, plugin: RunnerPlugin, hosts: tuple[HostSpec, ...], docker: _EarlyCheck
) -> Prepared:
    config = loaded.config
    for line in loaded.warnings:
        print(line, file=sys.stderr)
    default_sanitizer().add_secrets(v for k, v in loaded.environ.items() if k in SECRET_ENV_VARS)
    prompt = _read_prompt(args, config)
    if config.orchestration.runs < 1:
        raise ConfigError(f"--runs must be at least 1 (got {config.orchestration.runs})")
    max_parallel = _max_parallel(config, hosts=hosts)
    strategy = load_strategy(config.orchestration.strategy)
    params = parse_params(strategy, args.params, base={**config.strategy.get(strategy.name, {}), **config.params})
    repo = str(await anyio.Path(args.repo or ".").absolute())
    base_branch = config.orchestration.base_branch
    warnings: list[str] = []
    dirs = RunDirs.from_env()
    # The run's own folders (logs/, results/, orchestrator_state/ by default in
    # the current directory) are not the user's changes, from the first run on.
    info = await anyio.to_thread.run_sync(
        functools.partial(validate_repository, repo, base_branch, ignore=(dirs.logs, dirs.state, dirs.results))
    )
    repo, base_branch = str(info.path), info.base_branch
    notes = []
    if info.base_branch_chosen:
        notes.append(f"Base branch: {base_branch} ({info.base_branch_chosen}; choose another with --base-branch NAME)")
    if info.dirty:
        if config.orchestration.require_clean_wt:
            raise PreflightError(f"{repo} has uncommitted changes and --require-clean-wt is set; commit or stash them")
        warnings.append(f"{repo} has uncommitted changes; agents start from the last commit of {base_branch}")
    if strategy.options.prepare is not None:
        with prepare_runtime(run_branches):  # what it may ask of other runs
            params = strategy.options.prepare(params, repo)
    model = config.orchestration.default_model
    auth = _check_agent(loaded, plugin, strategy, model=model, mode=args.mode, dry_run=args.dry_run)
    _check_disk(dirs.logs, config, warnings)
    _check_disk(workspace_root(), config, warnings)
    await docker.result()
    image = await _environment_image(
        config, repo, info.base_commit, required_tools(plugin, dry_run=args.dry_run), hosts
    )
    return Prepared(
        loaded_config=loaded,
        strategy=strategy,
        params=params,
        prompt=prompt,
        repo=repo,
        base_branch=base_branch,
        model=model,
        plugin=plugin,
        hosts=hosts,
        image=image,
        max_parallel=max_parallel,
        runs=config.orchestration.runs,
        auth=auth,
        dry_run=args.dry_run,
        mode=args.mode,
        output=output_mode(args),
        warnings=tuple(warnings),
        notes=tuple(notes),
    )


def resolve_environment(env: EnvironmentConfig, repo: str, commit: str) -> Any:
    """The project's environment as configured (``environment.resolve``'s spec), None without one."""
    from ..agent_image import environment

    return environment.resolve(
        repo,
        commit,
        image=env.image,
        dockerfile=env.dockerfile,
        setup=list(env.setup),
        use_devcontainer=env.devcontainer,
    )


def build_environment(spec: Any, repo: str, commit: str, agent_image: str) -> str:
    """The environment's image, built on this machine's engine (its output on stderr) unless it is already there."""
    from ..agent_image import environment
    from ..agent_image.paths import cache_dir

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    return environment.build(
        spec, repo=repo, commit=commit, agent_image=agent_image, say=say, log_dir=cache_dir() / "logs"
    )


async def _environment_image(
    config: Config, repo: str, base_commit: str, tools: tuple[str, ...], hosts: tuple[HostSpec, ...]
) -> str:
    """The image every container of the run uses: the project's environment when it has one."""
    from ..agent_image import environment

    env = config.environment
    spec = await anyio.to_thread.run_sync(resolve_environment, env, repo, base_commit)
    if env.devcontainer and (spec is None or spec.devcontainer):
        # A devcontainer edited but not committed is the first thing a user tries.
        note = await anyio.to_thread.run_sync(environment.worktree_note, repo, base_commit)
        if note:
            print(note, file=sys.stderr)
    if spec is None:
        return config.runner.docker_image
    for note in spec.notes:
        print(note, file=sys.stderr)
    image = await anyio.to_thread.run_sync(build_environment, spec, repo, base_commit, config.runner.docker_image)
    await anyio.to_thread.run_sync(functools.partial(check_tools, image, tools, source=spec.source))
    if config.runner.kubernetes is not None or hosts:
        # Built on this machine's engine: the other engines get it like the agent
        # image (with --sync-image), or are named as lacking it.
        await _check_engines(config, image, hosts=hosts)
    return image


def _absolute_spec(spec: str) -> str:
    path, sep, func = spec.partition(":")
    if path.endswith(".py") and Path(path).exists():
        return str(Path(path).resolve()) + (sep + func if sep else "")
    return spec


# Flags that shape what a task does or produces. A resumed run keeps what it
# started with: a different value would make every recorded task a different
# one, and the work already paid for would be done again (or refused).
RECORDED_FLAGS = (
    ("prompt", "a prompt"),
    ("strategy", "--strategy"),
    ("params", "-S"),
    ("runs", "--runs"),
    ("repo", "--repo"),
    ("base_branch", "--base-branch"),
    ("model", "--model"),
    ("plugin", "--plugin"),
    ("docker_image", "--docker-image"),
    ("config", "--config"),
    ("mode", "--mode"),
    ("safe_fsync", "--safe-fsync"),
    ("require_clean_wt", "--require-clean-wt"),
    ("dry_run", "--dry-run"),
)
RESUME_FLAGS = "--max-parallel, --max-cost, --max-tokens, --no-tui, --json, --quiet, --debug, --resume-fresh"


def check_resume_flags(args) -> None:
    given = [flag for dest, flag in RECORDED_FLAGS if getattr(args, dest, None) not in (None, False, [])]
    if given:
        raise UsageError(
            f"{', '.join(given)} cannot be used with --resume: the run keeps the configuration it "
            f"started with (allowed with --resume: {RESUME_FLAGS}); start a new run to change it"
        )


def _resumed_config(dirs: RunDirs, manifest: RunManifest, current: LoadedConfig) -> LoadedConfig:
    """The recorded configuration, with today's settings only where they cannot change a result."""
    from ..config import PLACEMENT_KEYS, PRESENTATION_SECTIONS, RESUME_SECTIONS, changed_keys, recorded_config

    if not manifest.config:  # a manifest from before configurations were recorded
        return current
    where = dirs.manifest(manifest.run_id)
    config = recorded_config(manifest.config, str(where))
    if current.config.orchestration.base_branch is None:
        # Not given today: it would resolve to a branch again, and the run keeps the one it started from.
        base = msgspec.structs.replace(current.config.orchestration, base_branch=config.orchestration.base_branch)
        current = msgspec.structs.replace(current, config=msgspec.structs.replace(current.config, orchestration=base))
    changed = changed_keys(config, current.config)
    if changed:
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        print(
            f"note: the run keeps the configuration it started with; changed since, not applied: {shown}",
            file=sys.stderr,
            flush=True,
        )
    config = msgspec.structs.replace(
        config, **{s: getattr(current.config, s) for s in (*PRESENTATION_SECTIONS, *RESUME_SECTIONS)}
    )
    placement = {key.split(".", 1)[1]: getattr(current.config.runner, key.split(".", 1)[1]) for key in PLACEMENT_KEYS}
    config = msgspec.structs.replace(config, runner=msgspec.structs.replace(config.runner, **placement))
    return LoadedConfig(
        config=config, environ=current.environ, sources=[f"{where} (recorded when the run started)", *current.sources]
    )
