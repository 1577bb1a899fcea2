"""Run management: --list-runs, --show-run, --cleanup-run, --clean-containers, orphan cleanup."""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ..config import Config, load_config
from ..errors import PreflightError, UsageError
from ..jsonlog import ComponentLog
from ..log.runs import (
    RUN_LOCK_LABEL,
    RUN_MANIFEST_LABEL,
    RunDirs,
    RunManifest,
    is_live,
    lock_holder,
    manifest_status,
    read_manifest,
    remove_run_state,
)
from ..log.state import FAILED, FINISHED_OUTCOMES, RunState, parse_ts, run_outcome
from ..strategy_loader import BUILTINS, load_strategy
from .leftovers import counted
from .locate import kept_manifest, locate_run, repository_top, run_folders, run_state, runs_in, warn_unreadable_lines
from .results import fmt_cost, recorded_summary, render_summary
from .retention import RESUMABLE

if TYPE_CHECKING:
    from ..strategy import RunView, StrategyHooks


def help_strategy(name: str) -> int:
    strategy = load_strategy(name)
    print(strategy.describe())
    if name in BUILTINS:
        print(
            f'\nexample: orchestrator "PROMPT" --strategy {name}'
            + "".join(f" -S {p.name}=..." for p in strategy.params.values() if p.required)
        )
    return 0


def list_runs(repo: str | None = None) -> int:
    from .run_budget import spend_text, summary_of

    here = RunDirs.from_env()
    folders = run_folders(repo, here)
    found = [run for dirs in folders for run in runs_in(dirs)]
    if repo is not None:
        top = str(repository_top(repo))
        found = [run for run in found if run.manifest.repo_path == top]
        where = f"runs of {top} in every folder that holds some (this one, the repository's, each this host recorded)"
    else:
        where = f"runs under {here.state} (orchestrator --list-runs --repo PATH: a repository's runs, from anywhere)"
    if not found:
        print(f"no {where}")
        return 0
    print(where, file=sys.stderr)
    rows = []
    for run in found:
        m = run.manifest
        state = run_state(run.dirs, m.run_id)
        live = is_live(run.dirs, m.run_id)
        # The fold decides, as for every reader (a run that died mid-way is interrupted, whatever its manifest says).
        status = "cleaned" if run.cleaned and not live else run_outcome(state, live=live)
        if (
            not state.strategies
            and not live
            and m.status in FINISHED_OUTCOMES
            and not run.dirs.events(m.run_id).exists()
        ):
            # Retention removed a finished run's log and kept its manifest: that status was the fold's at its end.
            status = m.status
        rows.append((status, m.run_id, run, state))
    # Runs that can be resumed first: they hold work already paid for.
    rows.sort(key=lambda row: (row[0] not in ("interrupted", "budget_reached"), row[1]))
    elsewhere = any(run.dirs.state != here.state for _, _, run, _ in rows)
    print(
        f"{'RUN ID':<24} {'STATUS':<12} {'STRATEGY':<22} {'TASKS':>9} {'COST':>8}  "
        + (f"{'CREATED':<24}  STATE FOLDER" if elsewhere else "CREATED")
    )
    for status, run_id, run, state in rows:
        m = run.manifest
        done = state.counters.completed + state.counters.failed
        cost_known = any(t.cost_usd is not None for t in state.tasks.values())
        cost = fmt_cost(state.counters.cost_usd if cost_known else None)
        strategy = m.strategy_name + (f" x{m.runs}" if m.runs > 1 else "") + (" (dry)" if m.dry_run else "")
        print(
            f"{run_id:<24} {status:<12} {strategy:<22} {done:>4}/{len(state.tasks):<4} {cost:>8}  {m.created_at}"
            + (f"  {run.dirs.state}" if elsewhere else "")
            + (f"  cap: {spend_text(summary_of(state.budget) or {})}" if state.budget is not None else "")
        )
    return 0


def _locate(run_id: str, repo: str | None):
    here = RunDirs.from_env()
    run = locate_run(run_id, repo=repo, here=here)
    if run.dirs.state != here.state:
        print(f"run {run_id} is under {run.dirs.state} (where it was started)", file=sys.stderr)
    return run


async def show_run(run_id: str, follow: bool, repo: str | None = None) -> int:
    run = _locate(run_id, repo)
    dirs, manifest = run.dirs, run.manifest
    if follow:
        from tui.dashboard import monitor

        await monitor(
            run_id,
            logs_dir=dirs.logs,
            state_dir=dirs.state,
            results_dir=dirs.results,
            max_parallel=manifest.max_parallel,
        )
        return 0
    await warn_unreadable_lines(dirs.events(run_id))
    # whatever the log says so far, nothing is decided while it runs
    state, summary = await recorded_summary(dirs, manifest, live=is_live(dirs, run_id))
    print(render_summary(summary, results_path=dirs.results / run_id))
    print(f"\nPrompt: {manifest.prompt[:200]}{'…' if len(manifest.prompt) > 200 else ''}")
    print(
        f"Repository: {manifest.repo_path} (base {manifest.base_branch}); model {manifest.model}; "
        f"plugin {manifest.plugin}; image {manifest.docker_image}"
    )
    print(f"Events: {dirs.events(run_id)}")
    hooks = _strategy_hooks(manifest)
    if hooks.show_run_report is not None:
        from .results import run_view

        view = run_view(dirs, manifest, state)
        try:
            problems = list(await anyio.to_thread.run_sync(hooks.show_run_report, view) or [])
            problems += await _check_claims(manifest, hooks, view)
        except Exception as exc:  # a report must not hide the summary
            print(f"strategy report failed: {exc}", file=sys.stderr)
            return 1
        if problems:
            for p in problems:
                print(f"✗ {p}")
            return 1
    if run.cleaned:
        print(
            f"\nCleaned up (orchestrator --cleanup-run): its containers, workspaces and state are gone, "
            f"so it cannot be resumed; its logs and results are kept ({dirs.logs / run_id}, {dirs.results / run_id})"
        )
    return 0


def show_run_html(run_id: str, *, open_browser: bool, repo: str | None = None) -> int:
    """Rebuild ``results/<run_id>/report.html`` from the event log; print its path."""
    from ..report import write_report

    run = _locate(run_id, repo)
    dirs, manifest = run.dirs, run.manifest
    if not dirs.events(run_id).exists():
        raise UsageError(f"run {run_id} has no event log at {dirs.events(run_id)}; nothing to build a report from")
    path = write_report(dirs, manifest, live=is_live(dirs, run_id))
    print(path)
    if open_browser:
        import webbrowser

        try:
            browser = webbrowser.get()
        except webbrowser.Error:
            print(f"no browser found here; open {path} on a machine that has one", file=sys.stderr)
            return 0
        browser.open(path.as_uri())
    return 0


def _strategy_hooks(manifest: RunManifest) -> StrategyHooks:
    """The run's strategy's after-run hooks, none when its file cannot be loaded any more: a strategy file moved or
    edited since the run costs only its own reports (one line says so), never the summary."""
    from ..strategy import StrategyHooks

    try:
        return load_strategy(manifest.strategy_spec).hooks
    except Exception as exc:
        print(f"strategy reports left out: could not load {manifest.strategy_spec} ({exc})", file=sys.stderr)
        return StrategyHooks()


async def _check_claims(manifest: RunManifest, hooks: StrategyHooks, view: RunView) -> list[str]:
    """The commits the strategy says its branches hold, checked by the git layer (a strategy never runs git)."""
    claimed = hooks.claimed_branches
    claims = list(claimed(view) or []) if claimed is not None else []
    if not claims:
        return []
    from ..runner import unheld_branch_claims

    verdicts = await unheld_branch_claims(manifest.repo_path, [(branch, commit) for _, branch, commit in claims])
    problems = [f"{what}: {why}" for (what, _, _), why in zip(claims, verdicts, strict=True) if why is not None]
    if not problems:
        print(f"checked {len(claims)} branch(es) in {manifest.repo_path}: every commit the run kept is on its branch")
    return problems


async def cleanup_run(run_id: str, config: Config | None = None, repo: str | None = None) -> int:
    from ..runner import docker_available, list_containers, remove_containers, remove_run_volumes, workspace_root

    run = _locate(run_id, repo)
    dirs = run.dirs
    if is_live(dirs, run_id):
        raise UsageError(f"run {run_id} is live; stop it before cleaning it up")
    if config is not None and config.runner.kubernetes is not None:
        async with contextlib.aclosing(cluster_host(config)) as host:
            names = [c["name"] for c in await list_containers(run_id, host=host)]
            await remove_containers(names, host=host)
            n_containers, n_volumes = len(names), len(await host.remove_run_volumes(run_id))
    elif config is not None and config.runner.hosts:
        from .hosts_cli import cleanup_run_everywhere

        n_containers, n_volumes = await cleanup_run_everywhere(config, run_id)
    else:
        ok, message = await docker_available()
        if not ok:
            raise PreflightError(message)
        names = [c["name"] for c in await list_containers(run_id)]
        await remove_containers(names)
        n_containers, n_volumes = len(names), len(await remove_run_volumes(run_id))
    ws = workspace_root() / run_id
    had_workspaces = ws.exists()
    shutil.rmtree(ws, ignore_errors=True)
    _keep_manifest(run)
    remove_run_state(dirs, run_id)
    print(_cleanup_line(run, n_containers, n_volumes, ws if had_workspaces else None))
    return 0


def _keep_manifest(run) -> None:
    """Copy the manifest next to the kept logs, so ``--show-run`` still reads them (never ``--resume``)."""
    target = kept_manifest(run.dirs, run.manifest.run_id)
    if run.cleaned or not target.parent.is_dir():
        return  # already kept, or the logs are gone (retention): nothing left to show
    try:
        target.write_bytes(run.dirs.manifest(run.manifest.run_id).read_bytes())
    except OSError as exc:
        print(f"warning: could not keep the run's manifest with its logs ({exc}); --show-run will not find it")


def _cleanup_line(run, n_containers: int, n_volumes: int, ws) -> str:
    dirs, run_id = run.dirs, run.manifest.run_id
    removed = [counted(n_containers, "container"), counted(n_volumes, "volume")]
    if ws is not None:
        removed.append(f"the workspaces ({ws})")
    if not run.cleaned:
        removed.append(f"the state ({dirs.state / run_id})")
    kept = [
        f"the {what} ({path})"
        for what, path in (("logs", dirs.logs / run_id), ("results", dirs.results / run_id))
        if path.exists()
    ]
    kept.append(f"its branches in {run.manifest.repo_path}")
    readable = f"; orchestrator --show-run {run_id} still reads them" if (dirs.logs / run_id).exists() else ""
    return f"removed {_and(removed)}; kept {_and(kept)}{readable}; the run can no longer be resumed"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _age_hours(container: dict[str, Any]) -> float:
    when = parse_ts(container["labels"].get("orchestrator.last_active_ts"))
    if when is None:
        when = float(container.get("created") or time.time())
    return (time.time() - when) / 3600


def _retention_hours(
    container: dict[str, Any], dirs: RunDirs, config: Config, cache: dict[str, RunState | None]
) -> float:
    run_id = container["labels"].get("run_id", "")
    if run_id not in cache:
        cache[run_id] = run_state(dirs, run_id) if dirs.events(run_id).exists() else None
    state = cache[run_id]
    key = container["labels"].get("task_key")
    task = state.tasks.get(key) if state is not None and key else None
    if task is not None and task.state == FAILED:
        return config.runner.failure_retention_hours
    return config.runner.success_retention_hours


async def _candidates(dirs: RunDirs, config: Config, *, current: str | None, include_running_unknown: bool, host=None):
    from ..runner import list_containers

    rows = await list_containers(host=host)
    # Hundreds of retained containers mean as many file checks (and a state
    # replay per run): on a worker thread, since a run may be going on meanwhile.
    return await anyio.to_thread.run_sync(
        functools.partial(
            _select_candidates, rows, dirs, config, current=current, include_running_unknown=include_running_unknown
        )
    )


def _select_candidates(
    rows: list[dict[str, Any]], dirs: RunDirs, config: Config, *, current: str | None, include_running_unknown: bool
) -> list[dict[str, Any]]:
    cache: dict[str, RunState | None] = {}
    out = []
    for c in rows:
        run_id = c["labels"].get("run_id", "")
        if run_id == current or (run_id and is_live(dirs, run_id)):
            continue  # never touch a live run's containers
        holder = lock_holder(c["labels"].get(RUN_LOCK_LABEL))
        if holder == "live":
            continue  # a live run started from another directory
        known = bool(run_id) and dirs.manifest(run_id).exists()
        if c["status"] == "running" and (known or not include_running_unknown or holder != "dead"):
            continue  # a running container goes only when its run is provably dead
        if _age_hours(c) < _retention_hours(c, dirs, config, cache):
            continue
        out.append(c)
    return out


def cluster_host(config: Config):
    """The run's Kubernetes namespace as an engine (``runner.kubernetes``), for listing and removing Pods."""
    from ..runner import ClusterSpec, KubeHost

    return KubeHost(ClusterSpec.of(config.runner.kubernetes))


async def clean_orphans(dirs: RunDirs, config: Config, olog: ComponentLog, *, current: str) -> None:
    """On start: remove containers (on a cluster: Pods) of unknown or finished runs that are past retention."""
    if config.runner.kubernetes is None:
        await _clean_orphans_on(dirs, config, olog, current=current, host=None)
        return
    async with contextlib.aclosing(cluster_host(config)) as host:
        await _clean_orphans_on(dirs, config, olog, current=current, host=host)


async def _clean_orphans_on(dirs: RunDirs, config: Config, olog: ComponentLog, *, current: str, host) -> None:
    from ..runner import remove_containers

    victims = []
    for c in await _candidates(dirs, config, current=current, include_running_unknown=True, host=host):
        run_id = c["labels"].get("run_id", "")
        if dirs.manifest(run_id).exists():
            try:
                if read_manifest(dirs, run_id).status in RESUMABLE:
                    continue  # resumable: its containers hold agent sessions
            except UsageError:
                pass
        if manifest_status(c["labels"].get(RUN_MANIFEST_LABEL)) not in ("completed", "failed", "gone"):
            continue  # resumable from another directory, or cannot tell: kept
        victims.append(c["name"])
    if victims:
        await remove_containers(victims, host=host)
        olog.info("removed orphan containers", containers=victims)


async def clean_containers(dry_run: bool, force: bool, config: Config | None = None) -> int:
    from ..runner import docker_available

    dirs = RunDirs.from_env()
    config = config or load_config(config_file=None, cli_overrides={}).config
    if config.runner.kubernetes is not None:
        async with contextlib.aclosing(cluster_host(config)) as host:
            return await _clean_containers_on(dirs, config, dry_run, force, host)
    if config.runner.hosts:
        return await _clean_containers_on_hosts(dirs, config, dry_run, force)
    ok, message = await docker_available()
    if not ok:
        raise PreflightError(message)
    return await _clean_containers_on(dirs, config, dry_run, force, None)


def _confirmed(what: str, force: bool) -> bool:
    """Whether to remove ``what``: yes with --force or without a terminal to ask, else the user's answer."""
    if force or not sys.stdin.isatty():
        return True
    # Asked on this thread: nothing else runs yet, and a worker thread blocked in
    # input() would keep Ctrl+C from ending the prompt.
    if input(f"Remove {what}? [y/N] ").strip().lower() in ("y", "yes"):
        return True
    print("nothing removed")
    return False


def _victim_line(c: dict[str, Any], dry_run: bool, where: str = "") -> str:
    return (
        f"{'would remove' if dry_run else 'remove'} {c['name']}{where} ({c['status']}, "
        f"run {c['labels'].get('run_id', '?')}, {_age_hours(c):.1f} h old)"
    )


async def _clean_containers_on(dirs: RunDirs, config: Config, dry_run: bool, force: bool, host) -> int:
    from ..runner import remove_containers

    victims = await _candidates(dirs, config, current=None, include_running_unknown=False, host=host)
    if not victims:
        print("no stopped orchestrator containers past retention")
        return 0
    for c in victims:
        print(_victim_line(c, dry_run))
    if dry_run or not _confirmed(f"{len(victims)} container(s)", force):
        return 0
    await remove_containers([c["name"] for c in victims], host=host)
    print(f"removed {len(victims)} container(s)")
    return 0


async def _clean_containers_on_hosts(dirs: RunDirs, config: Config, dry_run: bool, force: bool) -> int:
    """--clean-containers with runner.hosts: the same selection on every engine."""
    from ..errors import RunnerError
    from ..runner import list_caches, remove_caches
    from .hosts_cli import engines, host_specs, remove_with_workspaces, workspace_volumes

    found: list[tuple[str, Any, list[dict[str, Any]]]] = []
    caches = 0
    for label, host in engines(await host_specs(config)):
        try:
            victims = await _candidates(dirs, config, current=None, include_running_unknown=False, host=host)
        except RunnerError as exc:
            print(f"warning: Docker host {label} skipped: {exc}")
            await host.aclose()
            continue
        found.append((label, host, victims))
        for c in victims:
            print(_victim_line(c, dry_run, f" on {label}"))
        if victims:
            try:
                # A remote engine's task keeps its workspace in a volume: it goes with the container.
                for volume in await workspace_volumes(host, None, [c["name"] for c in victims]):
                    print(f"{'would remove' if dry_run else 'remove'} workspace volume {volume} on {label}")
            except RunnerError as exc:
                print(f"warning: Docker host {label}: cannot list workspace volumes: {exc}")
        if host.archive:
            try:
                # An engine's object cache is rebuilt by the next run that needs it.
                for cache in await list_caches(host):
                    caches += 1
                    print(f"{'would remove' if dry_run else 'remove'} object cache {cache['name']} on {label}")
            except RunnerError as exc:
                print(f"warning: Docker host {label}: cannot list object caches: {exc}")
    total = sum(len(v) for _, _, v in found)
    try:
        if not total and not caches:
            print("no stopped orchestrator containers past retention")
            return 0
        what = f"{total} container(s)" + (f" and {caches} object cache(s)" if caches else "")
        if dry_run or not _confirmed(what, force):
            return 0
        for label, host, victims in found:
            if victims:
                await remove_with_workspaces(host, [c["name"] for c in victims])
            if host.archive and caches:
                _, kept = await remove_caches(host)
                for name in kept:
                    print(f"kept object cache {name} on {label}: a container still mounts it")
        print(f"removed {total} container(s)")
        return 0
    finally:
        for _, host, _ in found:
            await host.aclose()
