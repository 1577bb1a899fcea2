"""Starting and resuming runs: pre-flight, wiring, Ctrl+C, results.

Pre-flight runs before anything is written: a bad prompt, strategy, parameter,
config, model, plugin, repository, credential or Docker problem ends with one
line and exit 2, and no run directory exists afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import msgspec

from .auth import resolve_auth
from .config import Config, LoadedConfig, deep_merge, load_config, redacted
from .engine.determinism import Reporter, guard_module
from .engine.engine import Engine, EngineConfig, auto_parallel
from .errors import ConfigError, GitError, PreflightError, RunLockedError, UsageError
from .fingerprint import TaskDefaults
from .image_tools import check_tools, required_tools
from .jsonlog import ComponentLog
from .jsonlog import configure as configure_logs
from .retention import record_owner
from .runner import AuthConfig, DockerRunner, Hardening, RetryConfig
from .runner.docker_containers import docker_available, image_exists
from .runner.git_ops import validate_repository, workspace_root
from .runner.plugin import get_plugin
from .runs import (
    RUN_LOCK_LABEL,
    RUN_MANIFEST_LABEL,
    RunDirs,
    RunManifest,
    claim_run_id,
    cleanup_old_logs,
    is_live,
    now_iso,
    read_manifest,
    write_manifest,
)
from .sanitize import SECRET_ENV_VARS, default_sanitizer
from .strategy_loader import LoadedStrategy, load_strategy, parse_params

MAX_PROMPT_BYTES = 10 * 1024 * 1024


@dataclass
class Prepared:
    loaded_config: LoadedConfig
    strategy: LoadedStrategy
    params: dict[str, Any]
    prompt: str
    repo: str
    base_branch: str
    model: str
    plugin_name: str
    image: str
    max_parallel: int
    runs: int
    auth: AuthConfig
    dry_run: bool
    mode: str | None
    output: str
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line each, shown as the run starts
    # On --resume, the event log's size before it: the console shows only what is new.
    console_from: int = 0

    @property
    def config(self) -> Config:
        return self.loaded_config.config


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
        from .runner.hosts import parse_host_flag

        put("runner", "hosts", [parse_host_flag(text) for text in args.docker_hosts])
    put("runner", "sync_image", getattr(args, "sync_image", None))
    put("runner", "plugin", args.plugin)
    put("events", "flush_policy", args.safe_fsync)
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


def _max_parallel(config: Config, value: int | str | None = None) -> int:
    # The deprecated max_parallel_instances was folded into this key per source
    # by load_config, so the command line still wins over it.
    if value is None:
        value = config.orchestration.max_parallel_tasks
    if config.runner.hosts:
        # Each host has its own slots; a given --max-parallel caps their sum.
        total = sum(spec.max_parallel for spec in _host_specs(config))
        if value == "auto":
            return total
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"--max-parallel must be at least 1 (got {value})")
        return min(total, value)
    if value == "auto":
        return auto_parallel(config.runner.container_cpu)
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"--max-parallel must be at least 1 (got {value})")
    return value


def _check_disk(path: Path, config: Config, warnings: list[str]) -> None:
    from .doctor import disk_check  # the same check as --doctor

    check = disk_check(path, "disk", config.orchestration.min_free_disk_gb, config.orchestration.hard_min_free_disk_gb)
    if check.status == "fail":
        raise PreflightError(f"only {check.detail}; {check.fix}")
    if check.status == "warn":
        warnings.append(f"only {check.detail} ({check.fix})")


def _host_specs(config: Config):
    from .runner.hosts import resolve_hosts

    return resolve_hosts(config.runner.hosts)


async def _check_hosts(config: Config, image: str) -> None:
    from .runner.images import preflight_images
    from .runner.transport import transport_warnings

    specs = await anyio.to_thread.run_sync(_host_specs, config)
    # Every start and every resume says it again: accepting the risk once is not
    # forgetting it.
    for warning in transport_warnings(specs):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    await preflight_images(specs, image, sync=config.runner.sync_image)


async def _check_engines(config: Config, image: str, tools: tuple[str, ...] = ()) -> None:
    if config.runner.hosts:
        await _check_hosts(config, image)
    else:
        await _check_docker(image, tools)


async def _check_docker(image: str, tools: tuple[str, ...] = ()) -> None:
    ok, message = await docker_available(timeout=3.0)
    if not ok:
        raise PreflightError(message)
    if not await image_exists(image):
        build = "orchestrator --build-image" + ("" if image == "claude-code" else f" --docker-image {image}")
        raise PreflightError(
            f"Docker image {image!r} not found; build it with {build} "
            f"(scripts/setup-docker.sh in a checkout) or pass --docker-image"
        )
    if tools:
        # The same probe as --doctor (cached per image id): a missing CLI fails here, not in every task.
        await anyio.to_thread.run_sync(check_tools, image, tools)


def _check_plugin(plugin_name: str, model: str, strategy: LoadedStrategy):
    plugin = get_plugin(plugin_name)
    models = plugin.known_models()
    if models is not None and model not in models:
        from .strategy_loader import did_you_mean

        names = ", ".join(sorted(k for k in models if "-" not in k)) or ", ".join(sorted(models))
        guess = did_you_mean(model, sorted(models))
        raise ConfigError(f"unknown model {model!r} for plugin {plugin_name}{guess}; use one of: {names}")
    if strategy.options.requires_resume and not plugin.capabilities.supports_resume:
        raise PreflightError(
            f"strategy {strategy.name} resumes agent sessions, which plugin {plugin_name} cannot do; "
            "choose another --plugin"
        )
    return plugin


def _guard(strategy: LoadedStrategy, config: Config, olog: ComponentLog | None = None) -> Reporter:
    def sink(msg: str) -> None:
        print(msg, file=sys.stderr)
        if olog is not None:
            olog.warning(msg)

    reporter = Reporter(config.orchestration.determinism, sink)
    guard_module(strategy.module, reporter)
    return reporter


def _warm_imports() -> None:
    """Import docker-py (about 0.3 s of requests/urllib3) while pre-flight reads config and git."""
    with contextlib.suppress(ImportError):
        import docker  # noqa: F401  (imported for its side effect: loading it now)


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

    threading.Thread(target=_warm_imports, daemon=True).start()
    loaded = load_config(config_file=args.config, cli_overrides=_cli_overrides(args))
    # The Docker check (a few daemon round trips) runs while git validates the
    # repository; a failure of an earlier check is still the one reported.
    docker = _EarlyCheck()
    outcome: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(
            docker.run,
            _check_engines,
            loaded.config,
            loaded.config.runner.docker_image,
            required_tools(loaded.config.runner.plugin, dry_run=args.dry_run),
        )
        try:
            outcome["prep"] = await _prepare(args, loaded, docker)
        except Exception as exc:  # raised below, outside the task group, unwrapped
            outcome["error"] = exc
            tg.cancel_scope.cancel()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["prep"]


async def _prepare(args, loaded: LoadedConfig, docker: _EarlyCheck) -> Prepared:
    config = loaded.config
    for line in loaded.warnings:
        print(line, file=sys.stderr)
    default_sanitizer().add_secrets(v for k, v in loaded.environ.items() if k in SECRET_ENV_VARS)
    prompt = _read_prompt(args, config)
    if config.orchestration.runs < 1:
        raise ConfigError(f"--runs must be at least 1 (got {config.orchestration.runs})")
    max_parallel = _max_parallel(config)
    strategy = load_strategy(config.orchestration.strategy)
    base_params = dict(config.strategy.get(strategy.name, {}))
    base_params.update(config.params)
    params = parse_params(strategy, args.params, base=base_params)
    repo = str(await anyio.Path(args.repo or ".").absolute())
    base_branch = config.orchestration.base_branch
    warnings: list[str] = []
    dirs = RunDirs.from_env()
    # The run's own folders (logs/, results/, orchestrator_state/ by default in
    # the current directory) are not the user's changes, from the first run on.
    info = await anyio.to_thread.run_sync(
        functools.partial(validate_repository, repo, base_branch, ignore=(dirs.logs, dirs.state, dirs.results))
    )
    repo = str(info.path)
    base_branch = info.base_branch
    notes = []
    if info.base_branch_chosen:
        notes.append(f"Base branch: {base_branch} ({info.base_branch_chosen}; choose another with --base-branch NAME)")
    if info.dirty:
        if config.orchestration.require_clean_wt:
            raise PreflightError(f"{repo} has uncommitted changes and --require-clean-wt is set; commit or stash them")
        warnings.append(f"{repo} has uncommitted changes; agents start from the last commit of {base_branch}")
    if strategy.options.prepare is not None:
        params = strategy.options.prepare(params, repo)
    plugin_name = config.runner.plugin
    model = config.orchestration.default_model
    plugin = _check_plugin(plugin_name, model, strategy)
    auth = resolve_auth(loaded.environ, plugin=plugin_name, mode=args.mode, dry_run=args.dry_run)
    if not args.dry_run:
        plugin.validate_environment(auth)
    default_sanitizer().add_secrets(auth.secret_values())
    _check_disk(dirs.logs, config, warnings)
    _check_disk(workspace_root(), config, warnings)
    await docker.result()
    image = await _environment_image(config, repo, info.base_commit, dry_run=args.dry_run)
    return Prepared(
        loaded_config=loaded,
        strategy=strategy,
        params=params,
        prompt=prompt,
        repo=repo,
        base_branch=base_branch,
        model=model,
        plugin_name=plugin_name,
        image=image,
        max_parallel=max_parallel,
        runs=config.orchestration.runs,
        auth=auth,
        dry_run=args.dry_run,
        mode=args.mode,
        output=output_mode(args),
        warnings=warnings,
        notes=notes,
    )


async def _environment_image(config: Config, repo: str, base_commit: str, *, dry_run: bool) -> str:
    """The image every container of the run uses: the project's environment when it has one."""
    from . import environment
    from .image import cache_dir

    env = config.environment
    spec = await anyio.to_thread.run_sync(
        functools.partial(
            environment.resolve,
            repo,
            base_commit,
            image=env.image,
            dockerfile=env.dockerfile,
            setup=list(env.setup),
            use_devcontainer=env.devcontainer,
        )
    )
    if spec is None:
        return config.runner.docker_image
    for note in spec.notes:
        print(note, file=sys.stderr)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    image = await anyio.to_thread.run_sync(
        functools.partial(
            environment.build,
            spec,
            repo=repo,
            commit=base_commit,
            agent_image=config.runner.docker_image,
            say=say,
            log_dir=cache_dir() / "logs",
        )
    )
    await anyio.to_thread.run_sync(check_tools, image, required_tools(config.runner.plugin, dry_run=dry_run))
    if config.runner.hosts:
        # Built on this machine's engine: the other engines get it like the agent
        # image (with --sync-image), or are named as lacking it.
        await _check_hosts(config, image)
    return image


async def start(args) -> int:
    prep = await prepare(args)
    dirs = RunDirs.from_env()
    await _exclude_output_folders(prep.repo, dirs)
    run_id = claim_run_id(dirs)
    record_owner(dirs, run_id)
    manifest = RunManifest(
        run_id=run_id,
        created_at=now_iso(),
        prompt=prep.prompt,
        strategy_spec=_absolute_spec(prep.strategy.spec),
        strategy_name=prep.strategy.name,
        params=prep.params,
        runs=prep.runs,
        repo_path=prep.repo,
        base_branch=prep.base_branch,
        model=prep.model,
        plugin=prep.plugin_name,
        docker_image=prep.image,
        max_parallel=prep.max_parallel,
        dry_run=prep.dry_run,
        mode=prep.mode,
        config=redacted(prep.config),
        config_file=str(await anyio.Path(args.config).absolute()) if args.config else None,
        cli_overrides=_cli_overrides(args),
        structured_outputs=True,
    )
    write_manifest(dirs, manifest)
    return await execute(prep, dirs, manifest, resume_fresh=False)


async def _exclude_output_folders(repo: str, dirs: RunDirs) -> None:
    """List the run's folders that lie inside the repository in its ``.git/info/exclude``.

    So ``git status`` (the user's, and the next run's clean-tree check) never
    shows them; ``.git/info/exclude`` is never committed, unlike ``.gitignore``.
    """
    from .runner.git_ops import exclude_locally

    try:
        await anyio.to_thread.run_sync(exclude_locally, repo, (dirs.logs, dirs.state, dirs.results))
    except (OSError, GitError) as exc:  # a convenience: the clean-tree check ignores these folders anyway
        print(f"warning: could not add the output folders to {repo}/.git/info/exclude: {exc}", file=sys.stderr)


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
RESUME_FLAGS = "--max-parallel, --no-tui, --json, --quiet, --debug, --resume-fresh"


def check_resume_flags(args) -> None:
    given = [flag for dest, flag in RECORDED_FLAGS if getattr(args, dest, None) not in (None, False, [])]
    if given:
        raise UsageError(
            f"{', '.join(given)} cannot be used with --resume: the run keeps the configuration it "
            f"started with (allowed with --resume: {RESUME_FLAGS}); start a new run to change it"
        )


def _resumed_config(dirs: RunDirs, manifest: RunManifest, current: LoadedConfig) -> LoadedConfig:
    """The recorded configuration, with today's settings only where they cannot change a result."""
    from .config import PLACEMENT_KEYS, PRESENTATION_SECTIONS, changed_keys, recorded_config

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
    config = msgspec.structs.replace(config, **{s: getattr(current.config, s) for s in PRESENTATION_SECTIONS})
    placement = {key.split(".", 1)[1]: getattr(current.config.runner, key.split(".", 1)[1]) for key in PLACEMENT_KEYS}
    config = msgspec.structs.replace(config, runner=msgspec.structs.replace(config.runner, **placement))
    return LoadedConfig(
        config=config, environ=current.environ, sources=[f"{where} (recorded when the run started)", *current.sources]
    )


async def resume(args) -> int:
    check_resume_flags(args)
    dirs = RunDirs.from_env()
    try:
        manifest = read_manifest(dirs, args.resume)
    except UsageError as exc:
        from .locate import check_run_id, not_here_hint

        raise UsageError(not_here_hint(check_run_id(args.resume), dirs) or str(exc)) from None
    if is_live(dirs, manifest.run_id):
        raise UsageError(f"run {manifest.run_id} is being written by a live process; wait for it or stop it first")
    if manifest.status == "completed":
        return await _already_finished(dirs, manifest, output_mode(args))
    # Today's configuration from the same sources as at the start (same file, same
    # flags): it differs from the recorded one only where something changed since.
    config_file = (
        manifest.config_file if manifest.config_file and await anyio.Path(manifest.config_file).exists() else None
    )
    current = load_config(
        config_file=config_file, cli_overrides=deep_merge(manifest.cli_overrides, _cli_overrides(args))
    )
    default_sanitizer().add_secrets(v for k, v in current.environ.items() if k in SECRET_ENV_VARS)
    loaded = _resumed_config(dirs, manifest, current)
    if args.max_parallel is not None:
        if args.max_parallel < 1:
            raise ConfigError(f"--max-parallel must be at least 1 (got {args.max_parallel})")
        manifest.max_parallel = args.max_parallel
    strategy = load_strategy(manifest.strategy_spec)
    plugin = _check_plugin(manifest.plugin, manifest.model, strategy)
    auth = resolve_auth(loaded.environ, plugin=manifest.plugin, mode=manifest.mode, dry_run=manifest.dry_run)
    if not manifest.dry_run:
        plugin.validate_environment(auth)
    default_sanitizer().add_secrets(auth.secret_values())
    await anyio.to_thread.run_sync(validate_repository, manifest.repo_path, manifest.base_branch)
    await _check_engines(
        loaded.config, manifest.docker_image, required_tools(manifest.plugin, dry_run=manifest.dry_run)
    )
    prep = Prepared(
        loaded_config=loaded,
        strategy=strategy,
        params=manifest.params,
        prompt=manifest.prompt,
        repo=manifest.repo_path,
        base_branch=manifest.base_branch,
        model=manifest.model,
        plugin_name=manifest.plugin,
        image=manifest.docker_image,
        # The hosts may have changed since the run started: their slots decide,
        # under the cap given now or at the start.
        max_parallel=_max_parallel(loaded.config, args.max_parallel)
        if loaded.config.runner.hosts
        else manifest.max_parallel,
        runs=manifest.runs,
        auth=auth,
        dry_run=manifest.dry_run,
        mode=manifest.mode,
        output=output_mode(args),
    )
    await _report_resume_plan(dirs, manifest, plugin.capabilities.supports_resume, args.resume_fresh)
    # Earlier lines are not reprinted: they would look like finished work running again.
    events = dirs.events(manifest.run_id)
    prep.console_from = (await anyio.Path(events).stat()).st_size if await anyio.Path(events).exists() else 0
    manifest.status = "running"
    manifest.finished_at = None
    write_manifest(dirs, manifest)
    return await execute(prep, dirs, manifest, resume_fresh=args.resume_fresh)


async def _already_finished(dirs: RunDirs, manifest: RunManifest, output: str) -> int:
    """``--resume`` of a run that finished: one line saying so, then its summary; nothing runs again."""
    from .results import build_summary, render_summary, selection_claims
    from .selection import unheld_branches
    from .state import recover

    run_id = manifest.run_id
    state = recover(
        run_id, dirs.events(run_id), [dirs.state / run_id / "state.json", dirs.logs / run_id / "state.json"]
    )
    unheld = await anyio.to_thread.run_sync(
        functools.partial(unheld_branches, manifest.repo_path, selection_claims(manifest, state))
    )
    summary = build_summary(manifest, state, unheld)
    print(
        f"Run {run_id} already finished{f' at {manifest.finished_at}' if manifest.finished_at else ''}; "
        "nothing to resume. Its summary:",
        file=sys.stderr,
        flush=True,
    )
    if output == "json":
        print(msgspec.json.encode({"type": "run.summary", "summary": summary}).decode(), flush=True)
    elif output != "quiet":
        print(render_summary(summary, results_path=dirs.results / run_id), flush=True)
    return manifest.exit_code or 0


async def _report_resume_plan(dirs: RunDirs, manifest: RunManifest, supports_resume: bool, fresh: bool) -> None:
    """Say what --resume will do with each unfinished task (diagnostic only).

    A task continues in the workspace it left (the container is re-created if
    it is gone), with its session when it reported one; a task whose workspace
    is gone starts afresh.
    """
    from .runner.git_ops import workspace_path
    from .state import INTERRUPTED, RUNNING, recover

    state = recover(
        manifest.run_id,
        dirs.events(manifest.run_id),
        [dirs.state / manifest.run_id / "state.json", dirs.logs / manifest.run_id / "state.json"],
    )
    counts: dict[str, int] = {}
    for task in state.unfinished():
        if task.state not in (RUNNING, INTERRUPTED):
            continue
        if fresh:
            status = "restart_fresh"
        elif not supports_resume:
            status = "restart"
        elif not workspace_path(manifest.run_id, task.key).exists():
            status = "restart_workspace_missing"
        elif task.session_id:
            status = "resume_session"
        else:
            status = "new_session_in_kept_workspace"
        counts[status] = counts.get(status, 0) + 1
    done = state.counters.completed + state.counters.failed
    plan = ", ".join(_resume_phrase(s, n) for s, n in sorted(counts.items())) or "no interrupted tasks"
    print(
        f"Resuming {manifest.run_id}: {_tasks(done)} already finished {'stays' if done == 1 else 'stay'} "
        f"as {'it is' if done == 1 else 'they are'}; {plan}.",
        file=sys.stderr,
        flush=True,
    )


# What --resume does with an unfinished task: (one task, several tasks).
_RESUME_PLANS = {
    "resume_session": ("resumes its agent session", "resume their agent sessions"),
    "new_session_in_kept_workspace": (
        "starts a new session in its kept workspace",
        "start new sessions in their kept workspaces",
    ),
    "restart_workspace_missing": ("restarts (its workspace is gone)", "restart (their workspaces are gone)"),
    "restart_fresh": ("restarts in a fresh clone (--resume-fresh)", "restart in fresh clones (--resume-fresh)"),
    "restart": ("restarts (the plugin cannot resume sessions)", "restart (the plugin cannot resume sessions)"),
}


def _tasks(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"


def _resume_phrase(status: str, n: int) -> str:
    one, many = _RESUME_PLANS.get(status, (status.replace("_", " "), status.replace("_", " ")))
    return f"{_tasks(n)} {one if n == 1 else many}"


def _engine_config(
    prep: Prepared, dirs: RunDirs, run_id: str, *, resume_fresh: bool, structured_outputs: bool = True
) -> EngineConfig:
    c = prep.config
    r = c.runner
    o = c.orchestration
    plugin = get_plugin(prep.plugin_name)
    return EngineConfig(
        run_id=run_id,
        repo_path=prep.repo,
        base_branch=prep.base_branch,
        strategy_name=prep.strategy.name,
        logs_dir=str(dirs.logs),
        state_dir=str(dirs.state),
        results_dir=str(dirs.results),
        max_parallel=prep.max_parallel,
        defaults=TaskDefaults(
            model=prep.model,
            plugin_name=prep.plugin_name,
            import_policy=o.import_policy,
            import_conflict_policy=o.import_conflict_policy,
            skip_empty_import=o.skip_empty_import,
            container_cpus=r.container_cpu,
            container_memory=r.container_memory,
            network_egress=r.network_egress,
            max_turns=r.max_turns,
            timeout_seconds=r.container_timeout_seconds,
        ),
        flush_policy=c.events.flush_policy,
        flush_interval_ms=c.events.interval_ms,
        flush_max_batch=c.events.max_batch,
        max_final_message_bytes=c.events.max_final_message_bytes,
        snapshot_interval_s=c.events.snapshot_interval_s,
        resume_fresh=resume_fresh,
        supports_resume=plugin.capabilities.supports_resume,
        structured_outputs=structured_outputs,
        runner_options={
            "docker_image": prep.image,
            "reuse_container": r.reuse_container,
            "finalize": r.finalize,
            "review_workspace_mode": r.review_workspace_mode,
            "isolation_mode": r.isolation_mode,
            "session_volume_scope": r.session_volume_scope,
            "labels": {RUN_LOCK_LABEL: str(dirs.lock(run_id)), RUN_MANIFEST_LABEL: str(dirs.manifest(run_id))},
            "retry_config": RetryConfig(
                max_attempts=r.max_attempts,
                backoff_base_s=r.backoff_base_s,
                backoff_factor=r.backoff_factor,
                backoff_max_s=r.backoff_max_s,
            ),
        },
    )


class _Interrupt:
    def __init__(self) -> None:
        self.requested = False


async def _watch_signals(scope: anyio.CancelScope, flag: _Interrupt, ui_stop: anyio.Event | None = None) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if flag.requested:
                # Second Ctrl+C: leave at once. The log holds only whole lines or a torn
                # last line, which readers skip and the next writer trims.
                os._exit(130)
            flag.requested = True
            if ui_stop is not None:
                ui_stop.set()  # close the dashboard now, so the acknowledgement below shows at once
            print(
                "\nInterrupting: stopping containers and saving state (Ctrl+C again to exit at once)...",
                file=sys.stderr,
                flush=True,
            )
            scope.cancel()


def _make_runner(prep: Prepared, log_dir: Path, olog: ComponentLog, stop_run=None):
    """One DockerRunner, or with runner.hosts one per engine under a placing runner."""
    config = prep.config

    limits = config.runner.container_limits
    hardening = Hardening(
        pids_limit=limits.pids_limit,
        nofile=limits.nofile,
        secret_scan=config.runner.secret_scan,
        max_workspace_mb=config.runner.max_workspace_mb,
    )

    def make(host=None) -> DockerRunner:
        return DockerRunner(
            auth=prep.auth,
            logs_dir=log_dir,
            sanitizer=default_sanitizer(),
            pricing=config.model_pricing(),
            dry_run=prep.dry_run,
            known_images=(prep.image,),
            host=host,
            hardening=hardening,
        )

    if not config.runner.hosts:
        return make()
    from .runner.hosts import MultiHostRunner
    from .runner.transport import transport_warnings

    specs = _host_specs(config)
    olog.info(
        "docker hosts",
        hosts=[
            {"name": s.name, "engine": s.shown, "max_parallel": s.max_parallel, "transport": s.transport} for s in specs
        ],
    )
    for warning in transport_warnings(specs):
        olog.warning(warning)

    def host_event(event: dict) -> None:
        olog.warning(event["type"], **{k: v for k, v in event.items() if k != "type"})
        if event["type"] == "runner.host.down":
            print(f"warning: Docker host {event['host']} is down: {event['reason']}", file=sys.stderr, flush=True)

    def all_down() -> None:
        olog.error("every Docker host is down; stopping the run (resumable)")
        print("error: every Docker host is down; stopping the run", file=sys.stderr, flush=True)
        if stop_run is not None:
            stop_run()

    return MultiHostRunner(specs, make, on_host_event=host_event, on_all_down=all_down if stop_run else None)


async def execute(prep: Prepared, dirs: RunDirs, manifest: RunManifest, *, resume_fresh: bool) -> int:
    from .results import export, render_summary, selection_claims
    from .selection import unheld_branches

    run_id = manifest.run_id
    log_dir = dirs.logs / run_id
    log_dir.mkdir(parents=True, exist_ok=True)
    config = prep.config
    echo = (lambda line: print(line, file=sys.stderr)) if config.logging.debug else None
    # Every component log of this process (the runner's and the TUI's too) rotates
    # at the configured size and, with --debug, streams to stderr.
    configure_logs(
        max_bytes=int(config.logging.max_component_log_mb * 1024 * 1024),
        backups=config.logging.component_log_backups,
        echo=echo,
    )
    olog = ComponentLog(log_dir / "orchestration.jsonl", "orchestration", run_id)
    olog.info(
        "run starting",
        config=redacted(config),
        sources=prep.loaded_config.sources,
        strategy=prep.strategy.name,
        params=prep.params,
        resume=resume_fresh or manifest.status == "running",
    )
    if prep.dry_run and prep.output != "json":
        print("DRY RUN: agent tasks are answered by a deterministic simulated agent; nothing is spent.", flush=True)
    for note in prep.notes:
        if prep.output != "json":
            print(note, flush=True)
        olog.info(note)
    for w in prep.warnings:
        print(f"warning: {w}", file=sys.stderr)
        olog.warning(w)
    if prep.max_parallel * config.runner.container_cpu > (os.cpu_count() or 1):
        olog.warning(
            f"max_parallel={prep.max_parallel} x {config.runner.container_cpu} CPUs oversubscribes "
            f"this host's {os.cpu_count()} CPUs"
        )
    removed = cleanup_old_logs(dirs, config.logging.retention_days, keep={run_id})
    if removed:
        olog.info("removed old logs", runs=removed)
    _guard(prep.strategy, config, olog)
    run_scope_box: list[anyio.CancelScope] = []
    # With several hosts, all of them down stops the run the way Ctrl+C does: resumably.

    def stop_run() -> None:
        for scope in run_scope_box:
            scope.cancel()

    runner = _make_runner(prep, log_dir, olog, stop_run=stop_run)
    engine = Engine(
        _engine_config(prep, dirs, run_id, resume_fresh=resume_fresh, structured_outputs=manifest.structured_outputs),
        runner,
        log=olog,
    )
    from .events import RUN_STARTED

    # The dashboard reads only events and state: what this start printed before it
    # took the screen (a dry run, the start-up warnings) stays visible there.
    engine.note_run_event(
        RUN_STARTED,
        {
            "dry_run": prep.dry_run,
            "resumed": resume_fresh or manifest.status == "running",
            "warnings": list(prep.warnings),
        },
    )
    if hasattr(runner, "status_table"):
        # The dashboard reads only events and state: the hosts, their slots and
        # which are down reach it as hosts.status events.
        from .events import HOSTS_STATUS

        engine.note_run_event(HOSTS_STATUS, {"hosts": runner.status_table()})
        runner.on_status = lambda table: engine.note_run_event(HOSTS_STATUS, {"hosts": table})
    engine.on_divergence = lambda sid, keys: print(
        f"warning: strategy {sid} no longer asks for {len(keys)} recorded task(s): {', '.join(keys[:5])}"
        + (" ..." if len(keys) > 5 else ""),
        file=sys.stderr,
    )
    flag = _Interrupt()
    started = time.monotonic()
    ui_stop = anyio.Event()
    watcher_scope = anyio.CancelScope()
    storage_error: OSError | None = None
    locked: BaseException | None = None
    try:
        async with anyio.create_task_group() as outer:
            outer.start_soon(_output, prep, dirs, run_id, ui_stop)
            if config.orchestration.clean_orphans_on_start:
                # Alongside the run, not before it: listing every orchestrator container
                # on a host that keeps many (retention) takes the daemon a few tenths of
                # a second. Only other, dead runs' containers are touched.
                outer.start_soon(_clean_orphans, dirs, config, olog, run_id)
            with anyio.CancelScope() as run_scope:
                run_scope_box.append(run_scope)
                outer.start_soon(
                    _watch_signals_until,
                    run_scope,
                    flag,
                    watcher_scope,
                    ui_stop if prep.output == "dashboard" else None,
                )
                await engine.run(
                    prep.strategy.fn, prompt=prep.prompt, params=prep.params, runs=prep.runs, name=prep.strategy.name
                )
            if flag.requested:
                with anyio.CancelScope(shield=True):
                    await _stop_containers(run_id, olog)
            watcher_scope.cancel()
            ui_stop.set()
    except* RunLockedError as group:
        # Two --resume of one run at once both pass the is_live() pre-check; the
        # event log lock decides. The loser reports it as one line (exit 2).
        locked = _first_leaf(group)
    except* OSError as group:
        # The run's records cannot be written (disk full, I/O error). The event
        # log ends on its last whole line, so the run is stopped, not corrupted.
        storage_error = _first_leaf(group)
    finally:
        await runner.aclose()
    if locked is not None:
        raise locked
    if storage_error is not None:
        return await _storage_stop(storage_error, dirs, manifest, olog)
    wall = time.monotonic() - started
    state = engine.state
    if flag.requested or any(s.status == "running" for s in state.strategies.values()):
        manifest.status = "interrupted"
        manifest.exit_code = 130
        write_manifest(dirs, manifest)
        olog.info("run interrupted")
        with anyio.CancelScope(shield=True):
            await _write_report(dirs, manifest, prep.strategy.module, olog)
        print(f"Run interrupted. Resume with: orchestrator --resume {run_id}", file=sys.stderr, flush=True)
        return 130
    failed = any(s.status != "success" for s in state.strategies.values())
    manifest.status = "completed"
    manifest.finished_at = now_iso()
    manifest.exit_code = 1 if failed else 0
    write_manifest(dirs, manifest)
    await _delete_unneeded_branches(prep, dirs, run_id, state, olog)
    # Merge advice only for a selected branch that still holds what the run recorded.
    unheld = await anyio.to_thread.run_sync(
        functools.partial(unheld_branches, manifest.repo_path, selection_claims(manifest, state))
    )
    summary = export(dirs, manifest, state, unheld)
    await _write_report(dirs, manifest, prep.strategy.module, olog)
    olog.info("run finished", exit_code=manifest.exit_code, totals=summary["totals"])
    if prep.output == "json":
        print(msgspec.json.encode({"type": "run.summary", "summary": summary}).decode(), flush=True)
    else:
        print(render_summary(summary, results_path=dirs.results / run_id, wall_seconds=wall), flush=True)
    return manifest.exit_code


async def _delete_unneeded_branches(prep, dirs: RunDirs, run_id: str, state, olog: ComponentLog) -> None:
    """After a finished run: delete the branches the strategy no longer needs, through the git layer.

    A strategy names them (``branches_to_delete(output_dir, state) -> [branch]``) but
    never runs git itself; the git layer deletes only branches this run created that
    nobody moved or checked out since. Cleanup must not turn a finished run into a failure.
    """
    hook = getattr(prep.strategy.module, "branches_to_delete", None)
    if hook is None:
        return
    from .runner import delete_run_branches

    try:
        names = list(hook(output_dir=dirs.results / run_id / "strategy_output", state=state) or [])
        if not names:
            return
        outcome = await delete_run_branches(prep.repo, names, run_id=run_id)
    except Exception as exc:
        olog.warning(f"branch cleanup after {prep.strategy.name} failed: {exc}")
        print(f"warning: branch cleanup after {prep.strategy.name} failed: {exc}", file=sys.stderr)
        return
    deleted = sum(1 for how in outcome.values() if how == "deleted")
    kept = {name: how for name, how in outcome.items() if how not in ("deleted", "missing")}
    line = f"{prep.strategy.name}: deleted {deleted} branch(es) it no longer needs" + (
        f"; kept {len(kept)}: " + ", ".join(f"{n} ({how})" for n, how in kept.items()) if kept else ""
    )
    print(line, file=sys.stderr)
    olog.info(line, outcome=outcome)


async def _write_report(dirs: RunDirs, manifest: RunManifest, module, olog: ComponentLog):
    """Write results/<run_id>/report.html; a report that cannot be written never fails the run."""
    from .report import write_report

    try:
        return await anyio.to_thread.run_sync(lambda: write_report(dirs, manifest, module=module))
    except Exception as exc:
        olog.warning(f"run report not written: {exc}")
        print(
            f"warning: run report not written: {exc} (rebuild it with orchestrator --show-run "
            f"{manifest.run_id} --html)",
            file=sys.stderr,
        )
        return None


_E = TypeVar("_E", bound=BaseException)


def _first_leaf(group: BaseExceptionGroup[_E]) -> _E:
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return cast(_E, leaf)  # every leaf of the group is an _E


async def _storage_stop(err: OSError, dirs: RunDirs, manifest: RunManifest, olog: ComponentLog) -> int:
    run_id = manifest.run_id
    with anyio.CancelScope(shield=True):
        await _stop_containers(run_id, olog)
    manifest.status = "interrupted"
    manifest.exit_code = 1
    # The manifest lives under the state dir; if that is full too, resume still works from the log.
    with contextlib.suppress(OSError):
        write_manifest(dirs, manifest)
    olog.error(f"run stopped: cannot write its records: {err}")
    where = f" ({err.filename})" if getattr(err, "filename", None) else ""
    print(
        f"orchestrator: error: cannot write the run's records{where}: {err.strerror or err}; "
        f"free space, then resume with: orchestrator --resume {run_id}",
        file=sys.stderr,
        flush=True,
    )
    return 1


ORPHAN_SCAN_INTERVAL_S = 300


async def _clean_orphans(dirs: RunDirs, config: Config, olog: ComponentLog, run_id: str) -> None:
    """Remove other runs' containers past retention, at most every ORPHAN_SCAN_INTERVAL_S per state dir.

    Listing every orchestrator container costs the daemon about 0.25 ms of CPU
    per container, and hosts keep thousands (retention): each run paid that
    although a container can only become due once retention (hours) is over.
    """
    from .manage import clean_orphans
    from .retention import expire_leftovers

    marker = _orphan_scan_marker(dirs)
    try:
        age = time.time() - marker.stat().st_mtime
    except OSError:
        age = None
    if age is not None and 0 <= age < ORPHAN_SCAN_INTERVAL_S:
        olog.info("orphan cleanup skipped: this state directory was scanned recently", seconds_ago=round(age))
        return
    try:
        await clean_orphans(dirs, config, olog, current=run_id)
        await expire_leftovers(dirs, config, olog, current=run_id)
    except Exception as exc:  # cleanup must never stop a run
        olog.warning(f"orphan cleanup skipped: {exc}")
        return
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass  # the next start scans again


def _orphan_scan_marker(dirs: RunDirs) -> Path:
    # Outside the state directory, whose entries are the runs (users and tools list them).
    key = hashlib.sha256(str(dirs.state.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "orchestrator-orphan-scans" / key


async def _watch_signals_until(
    run_scope: anyio.CancelScope, flag: _Interrupt, watcher_scope: anyio.CancelScope, ui_stop: anyio.Event | None = None
) -> None:
    with watcher_scope:
        await _watch_signals(run_scope, flag, ui_stop)


async def _stop_containers(run_id: str, olog: ComponentLog) -> None:
    from .runner.docker_containers import stop_run_containers

    try:
        with anyio.fail_after(15):
            n = await stop_run_containers(run_id, timeout=2)
        olog.info("stopped run containers", count=n)
    except Exception as exc:
        olog.warning(f"stopping containers failed: {exc}")


async def _output(prep: Prepared, dirs: RunDirs, run_id: str, stop: anyio.Event) -> None:
    """The live view: dashboard on a terminal, else a line stream; both only read the log."""
    if prep.output == "quiet":
        await stop.wait()
        return
    from tui.console import stream_console
    from tui.dashboard import run_dashboard

    tlog = ComponentLog(dirs.logs / run_id / "tui.jsonl", "tui", run_id)
    tlog.info(
        "output started",
        mode=prep.output,
        force_display_mode=prep.config.tui.force_display_mode,
        refresh_hz=prep.config.tui.refresh_hz,
    )
    try:
        await _render(prep, dirs, run_id, stop, run_dashboard, stream_console)
    finally:
        tlog.info("output stopped", mode=prep.output)
        tlog.close()


async def _render(prep: Prepared, dirs: RunDirs, run_id: str, stop: anyio.Event, run_dashboard, stream_console) -> None:
    if prep.output == "dashboard":
        await run_dashboard(
            run_id,
            logs_dir=dirs.logs,
            state_dir=dirs.state,
            results_dir=dirs.results,
            stop=stop,
            max_parallel=prep.max_parallel,
            force_mode=prep.config.tui.force_display_mode,
            refresh_hz=prep.config.tui.refresh_hz,
        )
    else:
        await stream_console(run_id, logs_dir=dirs.logs, mode=prep.output, stop=stop, since=prep.console_from)
