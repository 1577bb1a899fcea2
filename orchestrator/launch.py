"""Starting and resuming runs: pre-flight, wiring, Ctrl+C, results.

Pre-flight runs before anything is written: a bad prompt, strategy, parameter,
config, model, plugin, repository, credential or Docker problem ends with one
line and exit 2, and no run directory exists afterwards.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec

from .auth import resolve_auth
from .config import Config, LoadedConfig, load_config, redacted
from .engine.determinism import Reporter, guard_module
from .engine.engine import Engine, EngineConfig, auto_parallel
from .errors import ConfigError, PreflightError, RunLockedError, UsageError
from .fingerprint import TaskDefaults
from .jsonlog import ComponentLog
from .runner import AuthConfig, DockerRunner, RetryConfig
from .runner.docker_containers import docker_available, image_exists
from .runner.git_ops import validate_repository, workspace_root
from .runner.plugin import get_plugin
from .runs import RunDirs, RunManifest, claim_run_id, cleanup_old_logs, is_live, now_iso, read_manifest, write_manifest
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


def _max_parallel(config: Config) -> int:
    value = config.orchestration.max_parallel_tasks
    if config.orchestration.max_parallel_instances is not None:
        print("warning: orchestration.max_parallel_instances is deprecated; use max_parallel_tasks", file=sys.stderr)
        value = config.orchestration.max_parallel_instances
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
    probe = path
    while not probe.exists():
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9
    if free_gb < config.orchestration.hard_min_free_disk_gb:
        raise PreflightError(f"only {free_gb:.1f} GB free under {probe}; at least "
                             f"{config.orchestration.hard_min_free_disk_gb:g} GB is needed: free some space")
    if free_gb < config.orchestration.min_free_disk_gb:
        warnings.append(f"only {free_gb:.1f} GB free under {probe} (recommended: "
                        f"{config.orchestration.min_free_disk_gb:g} GB)")


def _host_specs(config: Config):
    from .runner.hosts import resolve_hosts

    return resolve_hosts(config.runner.hosts)


async def _check_hosts(config: Config, image: str) -> None:
    from .runner.images import preflight_images

    specs = await anyio.to_thread.run_sync(_host_specs, config)
    await preflight_images(specs, image, sync=config.runner.sync_image)


async def _check_engines(config: Config, image: str) -> None:
    if config.runner.hosts:
        await _check_hosts(config, image)
    else:
        await _check_docker(image)


async def _check_docker(image: str) -> None:
    ok, message = await docker_available(timeout=3.0)
    if not ok:
        raise PreflightError(message)
    if not await image_exists(image):
        raise PreflightError(f"Docker image {image!r} not found; build it with scripts/setup-docker.sh "
                             f"(or: docker build -t {image} .) or pass --docker-image")


def _check_plugin(plugin_name: str, model: str, strategy: LoadedStrategy):
    plugin = get_plugin(plugin_name)
    models = plugin.known_models()
    if models is not None and model not in models:
        names = ", ".join(sorted(k for k in models if "-" not in k)) or ", ".join(sorted(models))
        raise ConfigError(f"unknown model {model!r} for plugin {plugin_name}; use one of: {names}")
    if strategy.options.requires_resume and not plugin.capabilities.supports_resume:
        raise PreflightError(f"strategy {strategy.name} resumes agent sessions, which plugin {plugin_name} cannot do; "
                             "choose another --plugin")
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
    try:
        import docker  # noqa: F401
    except ImportError:
        pass


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
        tg.start_soon(docker.run, _check_engines, loaded.config, loaded.config.runner.docker_image)
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
    default_sanitizer().add_secrets(v for k, v in loaded.environ.items() if k in SECRET_ENV_VARS)
    prompt = _read_prompt(args, config)
    if config.orchestration.runs < 1:
        raise ConfigError(f"--runs must be at least 1 (got {config.orchestration.runs})")
    max_parallel = _max_parallel(config)
    strategy = load_strategy(config.orchestration.strategy)
    base_params = dict(config.strategy.get(strategy.name, {}))
    base_params.update(config.params)
    params = parse_params(strategy, args.params, base=base_params)
    repo = str(Path(args.repo or ".").absolute())
    base_branch = config.orchestration.base_branch
    warnings: list[str] = []
    info = await anyio.to_thread.run_sync(validate_repository, repo, base_branch)
    repo = str(info.path)
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
    dirs = RunDirs.from_env()
    _check_disk(dirs.logs, config, warnings)
    _check_disk(workspace_root(), config, warnings)
    await docker.result()
    return Prepared(loaded_config=loaded, strategy=strategy, params=params, prompt=prompt, repo=repo,
                    base_branch=base_branch, model=model, plugin_name=plugin_name, image=config.runner.docker_image,
                    max_parallel=max_parallel, runs=config.orchestration.runs, auth=auth, dry_run=args.dry_run,
                    mode=args.mode, output=output_mode(args), warnings=warnings)


async def start(args) -> int:
    prep = await prepare(args)
    dirs = RunDirs.from_env()
    run_id = claim_run_id(dirs)
    manifest = RunManifest(
        run_id=run_id, created_at=now_iso(), prompt=prep.prompt,
        strategy_spec=_absolute_spec(prep.strategy.spec), strategy_name=prep.strategy.name, params=prep.params,
        runs=prep.runs, repo_path=prep.repo, base_branch=prep.base_branch, model=prep.model,
        plugin=prep.plugin_name, docker_image=prep.image, max_parallel=prep.max_parallel, dry_run=prep.dry_run,
        mode=prep.mode, config=redacted(prep.config))
    write_manifest(dirs, manifest)
    return await execute(prep, dirs, manifest, resume_fresh=False)


def _absolute_spec(spec: str) -> str:
    path, sep, func = spec.partition(":")
    if path.endswith(".py") and Path(path).exists():
        return str(Path(path).resolve()) + (sep + func if sep else "")
    return spec


async def resume(args) -> int:
    dirs = RunDirs.from_env()
    manifest = read_manifest(dirs, args.resume)
    if is_live(dirs, manifest.run_id):
        raise UsageError(f"run {manifest.run_id} is being written by a live process; wait for it or stop it first")
    loaded = load_config(config_file=args.config, cli_overrides=_cli_overrides(args))
    default_sanitizer().add_secrets(v for k, v in loaded.environ.items() if k in SECRET_ENV_VARS)
    strategy = load_strategy(manifest.strategy_spec)
    plugin = _check_plugin(manifest.plugin, manifest.model, strategy)
    auth = resolve_auth(loaded.environ, plugin=manifest.plugin, mode=manifest.mode, dry_run=manifest.dry_run)
    if not manifest.dry_run:
        plugin.validate_environment(auth)
    default_sanitizer().add_secrets(auth.secret_values())
    await anyio.to_thread.run_sync(validate_repository, manifest.repo_path, manifest.base_branch)
    await _check_engines(loaded.config, manifest.docker_image)
    prep = Prepared(loaded_config=loaded, strategy=strategy, params=manifest.params, prompt=manifest.prompt,
                    repo=manifest.repo_path, base_branch=manifest.base_branch, model=manifest.model,
                    plugin_name=manifest.plugin, image=manifest.docker_image,
                    # The hosts may have changed since the run started: their slots decide.
                    max_parallel=_max_parallel(loaded.config) if loaded.config.runner.hosts else manifest.max_parallel,
                    runs=manifest.runs, auth=auth, dry_run=manifest.dry_run, mode=manifest.mode,
                    output=output_mode(args))
    await _report_resume_plan(dirs, manifest, plugin.capabilities.supports_resume, args.resume_fresh)
    manifest.status = "running"
    manifest.finished_at = None
    write_manifest(dirs, manifest)
    return await execute(prep, dirs, manifest, resume_fresh=args.resume_fresh)


async def _report_resume_plan(dirs: RunDirs, manifest: RunManifest, supports_resume: bool, fresh: bool) -> None:
    """Say what --resume will do with each unfinished task (spec §7.4 statuses; diagnostic only)."""
    from .runner.docker_containers import container_exists
    from .runner.git_ops import workspace_path
    from .state import INTERRUPTED, RUNNING, recover

    state = recover(manifest.run_id, dirs.events(manifest.run_id),
                    [dirs.state / manifest.run_id / "state.json", dirs.logs / manifest.run_id / "state.json"])
    counts: dict[str, int] = {}
    for task in state.unfinished():
        if task.state not in (RUNNING, INTERRUPTED):
            continue
        has_container = bool(task.container_name) and await container_exists(task.container_name)
        if fresh:
            status = "restart_fresh"
        elif has_container and supports_resume and task.session_id:
            status = "resume_session"
        elif has_container:
            status = "cannot_resume"
        elif workspace_path(manifest.run_id, task.key).exists():
            status = "container_missing"
        else:
            status = "artifacts_missing"
        counts[status] = counts.get(status, 0) + 1
    done = state.counters.completed + state.counters.failed
    plan = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(counts.items())) or "no interrupted tasks"
    print(f"Resuming {manifest.run_id}: {done} task(s) already finished stay as they are; {plan}.",
          file=sys.stderr, flush=True)


def _engine_config(prep: Prepared, dirs: RunDirs, run_id: str, *, resume_fresh: bool) -> EngineConfig:
    c = prep.config
    r = c.runner
    o = c.orchestration
    plugin = get_plugin(prep.plugin_name)
    return EngineConfig(
        run_id=run_id, repo_path=prep.repo, base_branch=prep.base_branch, strategy_name=prep.strategy.name,
        logs_dir=str(dirs.logs), state_dir=str(dirs.state), results_dir=str(dirs.results),
        max_parallel=prep.max_parallel,
        defaults=TaskDefaults(model=prep.model, plugin_name=prep.plugin_name, import_policy=o.import_policy,
                              import_conflict_policy=o.import_conflict_policy, skip_empty_import=o.skip_empty_import,
                              container_cpus=r.container_cpu, container_memory=r.container_memory,
                              network_egress=r.network_egress, max_turns=r.max_turns,
                              timeout_seconds=r.container_timeout_seconds),
        flush_policy=c.events.flush_policy, flush_interval_ms=c.events.interval_ms, flush_max_batch=c.events.max_batch,
        max_final_message_bytes=c.events.max_final_message_bytes, snapshot_interval_s=c.events.snapshot_interval_s,
        resume_fresh=resume_fresh, supports_resume=plugin.capabilities.supports_resume,
        runner_options={
            "docker_image": prep.image, "reuse_container": r.reuse_container, "finalize": r.finalize,
            "review_workspace_mode": r.review_workspace_mode, "isolation_mode": r.isolation_mode,
            "session_volume_scope": r.session_volume_scope,
            "retry_config": RetryConfig(max_attempts=r.max_attempts, backoff_base_s=r.backoff_base_s,
                                        backoff_factor=r.backoff_factor, backoff_max_s=r.backoff_max_s),
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
            print("\nInterrupting: stopping containers and saving state (Ctrl+C again to exit at once)...",
                  file=sys.stderr, flush=True)
            scope.cancel()


def _make_runner(prep: Prepared, log_dir: Path, olog: ComponentLog, stop_run=None):
    """One DockerRunner, or with runner.hosts one per engine under a placing runner."""
    config = prep.config

    def make(host=None) -> DockerRunner:
        return DockerRunner(auth=prep.auth, logs_dir=log_dir, sanitizer=default_sanitizer(),
                            pricing=config.model_pricing(), dry_run=prep.dry_run, known_images=(prep.image,),
                            host=host)

    if not config.runner.hosts:
        return make()
    from .runner.hosts import MultiHostRunner

    specs = _host_specs(config)
    olog.info("docker hosts", hosts=[{"name": s.name, "engine": s.shown, "max_parallel": s.max_parallel}
                                     for s in specs])

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
    from .results import export, render_summary

    run_id = manifest.run_id
    log_dir = dirs.logs / run_id
    log_dir.mkdir(parents=True, exist_ok=True)
    config = prep.config
    echo = (lambda line: print(line, file=sys.stderr)) if config.logging.debug else None
    olog = ComponentLog(log_dir / "orchestration.jsonl", "orchestration", run_id, echo=echo)
    olog.info("run starting", config=redacted(config), sources=prep.loaded_config.sources,
              strategy=prep.strategy.name, params=prep.params, resume=resume_fresh or manifest.status == "running")
    if prep.dry_run and prep.output != "json":
        print("DRY RUN: agent tasks are answered by a deterministic simulated agent; nothing is spent.", flush=True)
    for w in prep.warnings:
        print(f"warning: {w}", file=sys.stderr)
        olog.warning(w)
    if prep.max_parallel * config.runner.container_cpu > (os.cpu_count() or 1):
        olog.warning(f"max_parallel={prep.max_parallel} x {config.runner.container_cpu} CPUs oversubscribes "
                     f"this host's {os.cpu_count()} CPUs")
    removed = cleanup_old_logs(dirs, config.logging.retention_days, keep={run_id})
    if removed:
        olog.info("removed old logs", runs=removed)
    _guard(prep.strategy, config, olog)
    run_scope_box: list[anyio.CancelScope] = []
    # With several hosts, all of them down stops the run the way Ctrl+C does: resumably.
    runner = _make_runner(prep, log_dir, olog, stop_run=lambda: [s.cancel() for s in run_scope_box])
    engine = Engine(_engine_config(prep, dirs, run_id, resume_fresh=resume_fresh), runner, log=olog)
    engine.on_divergence = lambda sid, keys: print(
        f"warning: strategy {sid} no longer asks for {len(keys)} recorded task(s): {', '.join(keys[:5])}"
        + (" ..." if len(keys) > 5 else ""), file=sys.stderr)
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
                outer.start_soon(_watch_signals_until, run_scope, flag, watcher_scope,
                                 ui_stop if prep.output == "dashboard" else None)
                await engine.run(prep.strategy.fn, prompt=prep.prompt, params=prep.params, runs=prep.runs,
                                 name=prep.strategy.name)
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
        print(f"Run interrupted. Resume with: orchestrator --resume {run_id}", file=sys.stderr, flush=True)
        return 130
    failed = any(s.status != "success" for s in state.strategies.values())
    manifest.status = "completed"
    manifest.finished_at = now_iso()
    manifest.exit_code = 1 if failed else 0
    write_manifest(dirs, manifest)
    summary = export(dirs, manifest, state)
    after_run = getattr(prep.strategy.module, "after_run", None)
    if after_run is not None:
        try:
            for line in after_run(repo_path=prep.repo, output_dir=dirs.results / run_id / "strategy_output",
                                  state=state) or []:
                print(line, file=sys.stderr)
                olog.info(line)
        except Exception as exc:  # cleanup after a finished run must not turn it into a failure
            olog.warning(f"after-run step of {prep.strategy.name} failed: {exc}")
            print(f"warning: after-run step of {prep.strategy.name} failed: {exc}", file=sys.stderr)
    olog.info("run finished", exit_code=manifest.exit_code, totals=summary["totals"])
    if prep.output == "json":
        print(msgspec.json.encode({"type": "run.summary", "summary": summary}).decode(), flush=True)
    else:
        print(render_summary(summary, results_path=dirs.results / run_id, wall_seconds=wall), flush=True)
    return manifest.exit_code


def _first_leaf(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


async def _storage_stop(err: OSError, dirs: RunDirs, manifest: RunManifest, olog: ComponentLog) -> int:
    run_id = manifest.run_id
    with anyio.CancelScope(shield=True):
        await _stop_containers(run_id, olog)
    manifest.status = "interrupted"
    manifest.exit_code = 1
    try:
        write_manifest(dirs, manifest)
    except OSError:
        pass  # the manifest lives under the state dir; if that is full too, resume still works from the log
    olog.error(f"run stopped: cannot write its records: {err}")
    where = f" ({err.filename})" if getattr(err, "filename", None) else ""
    print(f"orchestrator: error: cannot write the run's records{where}: {err.strerror or err}; "
          f"free space, then resume with: orchestrator --resume {run_id}", file=sys.stderr, flush=True)
    return 1


ORPHAN_SCAN_INTERVAL_S = 300


async def _clean_orphans(dirs: RunDirs, config: Config, olog: ComponentLog, run_id: str) -> None:
    """Remove other runs' containers past retention, at most every ORPHAN_SCAN_INTERVAL_S per state dir.

    Listing every orchestrator container costs the daemon about 0.25 ms of CPU
    per container, and hosts keep thousands (retention): each run paid that
    although a container can only become due once retention (hours) is over.
    """
    from .manage import clean_orphans

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


async def _watch_signals_until(run_scope: anyio.CancelScope, flag: _Interrupt, watcher_scope: anyio.CancelScope,
                               ui_stop: anyio.Event | None = None) -> None:
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
    tlog.info("output started", mode=prep.output, force_display_mode=prep.config.tui.force_display_mode,
              refresh_hz=prep.config.tui.refresh_hz)
    try:
        await _render(prep, dirs, run_id, stop, run_dashboard, stream_console)
    finally:
        tlog.info("output stopped", mode=prep.output)
        tlog.close()


async def _render(prep: Prepared, dirs: RunDirs, run_id: str, stop: anyio.Event, run_dashboard, stream_console) -> None:
    if prep.output == "dashboard":
        await run_dashboard(run_id, logs_dir=dirs.logs, state_dir=dirs.state, results_dir=dirs.results, stop=stop,
                            max_parallel=prep.max_parallel, force_mode=prep.config.tui.force_display_mode,
                            refresh_hz=prep.config.tui.refresh_hz)
    else:
        await stream_console(run_id, logs_dir=dirs.logs, mode=prep.output, stop=stop)
