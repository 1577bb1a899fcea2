"""A run's life: start, resume, Ctrl+C and the end of the run (before it: .preflight, .wiring; after: .after_run)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any, Literal, cast

import anyio
import msgspec

from ..agent_image.tools import required_tools
from ..config import deep_merge, load_config, redacted
from ..engine.determinism import Reporter, guard_module
from ..engine.engine import Engine
from ..errors import GitError, RunLockedError, UsageError
from ..jsonlog import ComponentLog
from ..jsonlog import configure as configure_logs
from ..log import events as E
from ..log.runs import (
    RunDirs,
    RunManifest,
    claim_run_id,
    cleanup_old_logs,
    is_live,
    now_iso,
    read_manifest,
    write_manifest,
)
from ..log.state import (
    FINISHED_OUTCOMES,
    OUTCOME_BUDGET_REACHED,
    OUTCOME_FAILED,
    OUTCOME_INTERRUPTED,
    RunState,
    run_outcome,
)
from ..runner import get_plugin, register_plugins, validate_repository
from ..sanitize import SECRET_ENV_VARS, default_sanitizer
from ..strategy_loader import load_strategy
from . import run_budget
from .after_run import _clean_orphans, _delete_unneeded_branches, _release_run_folder, _write_report, first_cause
from .hosts_cli import host_specs
from .leftovers import count_leftovers, counted, leftover_lines
from .preflight import (
    Prepared,
    _absolute_spec,
    _check_agent,
    _check_engines,
    _cli_overrides,
    _max_parallel,
    _resumed_config,
    check_resume_flags,
    output_mode,
    prepare,
)
from .retention import record_owner
from .wiring import _engine_config, _fields, _make_runner


async def start(args) -> int:
    prep = await prepare(args)
    dirs = RunDirs.from_env()
    await _exclude_output_folders(prep.repo, dirs)
    run_id = claim_run_id(dirs)
    record_owner(dirs, run_id)
    manifest = RunManifest(
        run_id=run_id,
        created_at=now_iso(),
        strategy_spec=_absolute_spec(prep.strategy.spec),
        strategy_name=prep.strategy.name,
        **_fields(prep, "prompt", "params", "runs", "base_branch", "model", "max_parallel", "dry_run", "mode"),
        **_fields(prep, repo_path="repo", plugin="plugin_name", docker_image="image"),
        config=redacted(prep.config),
        config_file=str(await anyio.Path(args.config).absolute()) if args.config else None,
        cli_overrides=_cli_overrides(args),
        structured_outputs=True,
    )
    write_manifest(dirs, manifest)
    return await execute(prep, dirs, manifest, resumed=False, resume_fresh=False)


async def _exclude_output_folders(repo: str, dirs: RunDirs) -> None:
    """The run's folders in the repository's ``.git/info/exclude`` (never committed, unlike ``.gitignore``),
    so ``git status`` (the user's, and the next run's clean-tree check) never shows them."""
    from ..runner import exclude_locally

    try:
        await anyio.to_thread.run_sync(exclude_locally, repo, (dirs.logs, dirs.state, dirs.results))
    except (OSError, GitError) as exc:  # a convenience: the clean-tree check ignores these folders anyway
        print(f"warning: could not add the output folders to {repo}/.git/info/exclude: {exc}", file=sys.stderr)


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
    from .locate import warn_unreadable_lines

    await warn_unreadable_lines(dirs.events(manifest.run_id))
    if manifest.status in FINISHED_OUTCOMES:
        return await _already_finished(dirs, manifest, output_mode(args))
    prep = await _resume_plan(args, dirs, manifest)
    await _report_resume_plan(dirs, manifest, prep.plugin.capabilities.supports_resume, args.resume_fresh)
    manifest.status = "running"
    manifest.finished_at = None
    write_manifest(dirs, manifest)
    return await execute(prep, dirs, manifest, resumed=True, resume_fresh=args.resume_fresh)


async def _resume_plan(args, dirs: RunDirs, manifest: RunManifest) -> Prepared:
    """The plan of a resumed run: the recorded configuration, checked again as a start checks it."""
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
    if args.max_parallel is not None:  # at least 1: the flag's own check
        manifest.max_parallel = args.max_parallel
    strategy = load_strategy(manifest.strategy_spec)
    register_plugins(loaded.config.runner.plugin_modules)
    plugin = get_plugin(manifest.plugin)  # the run's one lookup: the plan carries it
    auth = _check_agent(loaded, plugin, strategy, model=manifest.model, mode=manifest.mode, dry_run=manifest.dry_run)
    if manifest.status == run_budget.BUDGET_REACHED:
        from ..log.state import recover

        recorded = recover(manifest.run_id, dirs.events(manifest.run_id), [dirs.state / manifest.run_id / "state.json"])
        run_budget.check_resume(loaded.config, recorded.budget, manifest.run_id)
    await anyio.to_thread.run_sync(validate_repository, manifest.repo_path, manifest.base_branch)
    hosts = await host_specs(loaded.config)
    await _check_engines(loaded.config, manifest.docker_image, required_tools(plugin, dry_run=manifest.dry_run), hosts)
    # Earlier lines are not reprinted: they would look like finished work running again.
    events = anyio.Path(dirs.events(manifest.run_id))
    return Prepared(
        loaded_config=loaded,
        strategy=strategy,
        plugin=plugin,
        hosts=hosts,
        auth=auth,
        **_fields(manifest, "params", "prompt", "base_branch", "model", "runs", "dry_run", "mode"),
        **_fields(manifest, repo="repo_path", image="docker_image"),
        # The hosts may have changed since the run started: their slots decide,
        # under the cap given now or at the start.
        max_parallel=_max_parallel(loaded.config, args.max_parallel, hosts) if hosts else manifest.max_parallel,
        output=output_mode(args),
        console_from=(await events.stat()).st_size if await events.exists() else 0,
    )


async def _already_finished(dirs: RunDirs, manifest: RunManifest, output: str) -> int:
    """``--resume`` of a run that finished: one line saying so, then its summary; nothing runs again."""
    from .results import recorded_summary, render_summary

    run_id = manifest.run_id
    _, summary = await recorded_summary(dirs, manifest)
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
    """Say what --resume will do with each unfinished task (diagnostic only)."""
    from ..log.state import INTERRUPTED, RUNNING
    from ..runner import workspace_path
    from .locate import run_state

    state = run_state(dirs, manifest.run_id)
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
    plan = ", ".join(f"{counted(n, 'task')} {_RESUME_PLANS[s][n != 1]}" for s, n in sorted(counts.items()))
    print(
        f"Resuming {manifest.run_id}: {counted(done, 'task')} already finished {'stays' if done == 1 else 'stay'} "
        f"as {'it is' if done == 1 else 'they are'}; {plan or 'no interrupted tasks'}.",
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


async def _watch_signals(
    scope: anyio.CancelScope, requested: anyio.Event, watcher_scope: anyio.CancelScope, ui_stop: anyio.Event | None
) -> None:
    with watcher_scope, anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if requested.is_set():
                # Second Ctrl+C: leave at once. The log holds only whole lines or a torn
                # last line, which readers skip and the next writer trims.
                os._exit(130)
            requested.set()
            if ui_stop is not None:
                ui_stop.set()  # close the dashboard now, so the acknowledgement below shows at once
            print(
                "\nInterrupting: stopping containers and saving state (Ctrl+C again to exit at once)...",
                file=sys.stderr,
                flush=True,
            )
            scope.cancel()


async def execute(prep: Prepared, dirs: RunDirs, manifest: RunManifest, *, resumed: bool, resume_fresh: bool) -> int:
    """Run the strategy to its end (or an interrupt) and write what it leaves. ``resumed``: not the first start, which
    the caller says, since a first start's manifest says ``running`` just as a resumed one's does."""
    run_id = manifest.run_id
    olog = _open_run_log(prep, dirs, run_id, resumed=resumed)
    _announce(prep, dirs, run_id, olog)
    run_scope_box: list[anyio.CancelScope] = []

    def stop_run() -> None:  # with several hosts, all of them down stops the run the way Ctrl+C does: resumably
        for scope in run_scope_box:
            scope.cancel()

    runner = _make_runner(prep, dirs.logs / run_id, olog, stop_run=stop_run)
    engine = Engine(
        _engine_config(prep, dirs, run_id, resume_fresh=resume_fresh, structured_outputs=manifest.structured_outputs),
        runner,
        log=olog,
    )
    _wire_events(prep, engine, runner, resumed=resumed)
    storage_error: OSError | None = None
    locked: BaseException | None = None
    try:
        await _drive(prep, dirs, engine, olog, run_id, run_scope_box)
    except* RunLockedError as group:
        # Two --resume of one run at once both pass the is_live() pre-check; the
        # event log lock decides. The loser reports it as one line (exit 2).
        locked = first_cause(group)
    except* OSError as group:
        # The run's records cannot be written (disk full, I/O error). The event
        # log ends on its last whole line, so the run is stopped, not corrupted.
        storage_error = cast(OSError, first_cause(group))  # every leaf of the group is one
    finally:
        await runner.aclose()
    if locked is not None:
        raise locked
    if storage_error is not None:
        return await _storage_stop(storage_error, dirs, manifest, olog)
    return await _finish(prep, dirs, manifest, engine.state, olog)


def _open_run_log(prep: Prepared, dirs: RunDirs, run_id: str, *, resumed: bool) -> ComponentLog:
    config = prep.config
    # Every component log of this process (the runner's and the TUI's too) rotates
    # at the configured size and, with --debug, streams to stderr.
    configure_logs(
        max_bytes=int(config.logging.max_component_log_mb * 1024 * 1024),
        backups=config.logging.component_log_backups,
        echo=config.logging.debug,
    )
    olog = ComponentLog(dirs.logs / run_id / "orchestration.jsonl", "orchestration", run_id)  # makes the folder
    olog.info(
        "run starting",
        config=redacted(config),
        sources=prep.loaded_config.sources,
        strategy=prep.strategy.name,
        params=prep.params,
        resume=resumed,
    )
    return olog


def _announce(prep: Prepared, dirs: RunDirs, run_id: str, olog: ComponentLog) -> None:
    """What the start says before the run: the dry run, the notes, the warnings; old logs go, the strategy is guarded."""
    config = prep.config
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

    def determinism_warning(msg: str) -> None:
        print(msg, file=sys.stderr)
        olog.warning(msg)

    guard_module(prep.strategy.module, Reporter(config.orchestration.determinism, determinism_warning))


def _wire_events(prep: Prepared, engine: Engine, runner: Any, *, resumed: bool) -> None:
    # The dashboard reads only events and state: what this start printed before it
    # took the screen (a dry run, the start-up warnings) stays visible there.
    engine.note_run_event(
        E.RUN_STARTED,
        E.RunStarted(dry_run=prep.dry_run, resumed=resumed, warnings=list(prep.warnings)),
    )
    if hasattr(runner, "status_table"):
        # The hosts, their slots and which are down reach the dashboard as hosts.status events.
        def hosts_status(table: list[dict[str, Any]]) -> E.HostsStatus:
            return E.HostsStatus(hosts=[E.HostStatus(**row) for row in table])

        engine.note_run_event(E.HOSTS_STATUS, hosts_status(runner.status_table()))
        runner.on_status = lambda table: engine.note_run_event(E.HOSTS_STATUS, hosts_status(table))
    engine.on_divergence = lambda sid, keys: print(
        f"warning: strategy {sid} no longer asks for {len(keys)} recorded task(s): {', '.join(keys[:5])}"
        + (" ..." if len(keys) > 5 else ""),
        file=sys.stderr,
    )


async def _drive(
    prep: Prepared,
    dirs: RunDirs,
    engine: Engine,
    olog: ComponentLog,
    run_id: str,
    run_scope_box: list[anyio.CancelScope],
) -> None:
    """The strategy under the live view and the signal watcher; containers stop on Ctrl+C or a stopping cap."""
    config = prep.config
    interrupt = anyio.Event()
    ui_stop = anyio.Event()
    watcher_scope = anyio.CancelScope()
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
                _watch_signals, run_scope, interrupt, watcher_scope, ui_stop if prep.output == "dashboard" else None
            )
            await engine.run(
                prep.strategy.fn, prompt=prep.prompt, params=prep.params, runs=prep.runs, name=prep.strategy.name
            )
        if interrupt.is_set() or (engine.budget_stopped and config.budget.on_reached == "stop"):
            with anyio.CancelScope(shield=True):
                await _stop_containers(run_id, olog)
        watcher_scope.cancel()
        ui_stop.set()


async def _finish(prep: Prepared, dirs: RunDirs, manifest: RunManifest, state: RunState, olog: ComponentLog) -> int:
    """Record how the run ended, clean what it no longer needs, write its summary and report."""
    from .results import render_summary

    run_id = manifest.run_id
    # The status is the fold's, as every reader of the run decides it (--list-runs, --show-run, the report).
    outcome = run_outcome(state)
    if outcome == OUTCOME_INTERRUPTED:
        return await _interrupted(prep, dirs, manifest, state, olog)
    manifest.status = outcome
    if outcome == OUTCOME_BUDGET_REACHED:
        # Resumable with a higher cap: it is not finished, and says so in its own exit code.
        manifest.finished_at = None
        manifest.exit_code = run_budget.EXIT_BUDGET_REACHED
    else:
        manifest.finished_at = now_iso()
        manifest.exit_code = 1 if outcome == OUTCOME_FAILED else 0
    # The ending is written to run.json last: killed before that, the run still reads as
    # running, and --resume does this tidy-up again (each step can be done twice), where a
    # run recorded as finished first would stay without its clean-up, summary and report.
    try:
        if outcome in FINISHED_OUTCOMES:  # a run stopped at its cap still needs its branches to go on
            await _delete_unneeded_branches(prep, dirs, manifest, state, olog)
        if manifest.status in FINISHED_OUTCOMES:  # nothing of it runs again (a resumable run keeps its store)
            await _release_run_folder(manifest, olog)
        summary = await _write_results(prep, dirs, manifest, state, olog)
    finally:
        write_manifest(dirs, manifest)
    olog.info("run finished", exit_code=manifest.exit_code, totals=summary["totals"])
    if prep.output == "json":
        print(msgspec.json.encode({"type": "run.summary", "summary": summary}).decode(), flush=True)
    else:
        print(render_summary(summary, results_path=dirs.results / run_id), flush=True)
    return manifest.exit_code


async def _interrupted(
    prep: Prepared, dirs: RunDirs, manifest: RunManifest, state: RunState, olog: ComponentLog
) -> int:
    """Ctrl+C (or SIGTERM) ended the session: record it, write its results, say how to resume; exit 130."""
    manifest.status = OUTCOME_INTERRUPTED
    manifest.exit_code = 130
    write_manifest(dirs, manifest)
    olog.info("run interrupted")
    with anyio.CancelScope(shield=True):
        # summary.json too: one an earlier session wrote must not go on telling its own status
        summary = await _write_results(prep, dirs, manifest, state, olog)
    lines = [f"Run interrupted. Resume with: orchestrator --resume {manifest.run_id}", *leftover_lines(summary)[1:]]
    print("\n".join(lines), file=sys.stderr, flush=True)
    return 130


async def _write_results(
    prep: Prepared, dirs: RunDirs, manifest: RunManifest, state: RunState, olog: ComponentLog
) -> dict[str, Any]:
    """summary.json and the rest, then the report; returns the summary. Merge advice only for a selected branch that
    still holds what the run recorded; the leftovers are counted last, after the clean-ups, the containers stopped."""
    from .results import check_repository, export

    checked = await anyio.to_thread.run_sync(check_repository, manifest, state)
    summary = export(dirs, manifest, state, checked, await count_leftovers(manifest.run_id, prep.hosts))
    await _write_report(dirs, manifest, prep.strategy.hooks, olog, state=state)
    return summary


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


async def _stop_containers(run_id: str, olog: ComponentLog) -> None:
    from ..runner import stop_run_containers

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
    tlog = ComponentLog(dirs.logs / run_id / "tui.jsonl", "tui", run_id)
    tlog.info(
        "output started",
        mode=prep.output,
        force_display_mode=prep.config.tui.force_display_mode,
        refresh_hz=prep.config.tui.refresh_hz,
    )
    try:
        # Each view is imported when chosen: a run without a terminal (CI, scripts, every
        # test) does not pay for loading the dashboard.
        if prep.output == "dashboard":
            from tui.dashboard import run_dashboard

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
            from tui.console import stream_console

            mode: Literal["plain", "json"] = "json" if prep.output == "json" else "plain"
            await stream_console(run_id, logs_dir=dirs.logs, mode=mode, stop=stop, since=prep.console_from)
    finally:
        tlog.info("output stopped", mode=prep.output)
        tlog.close()
