"""Wiring a run: the engine's configuration and the runner it drives."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..engine.engine import EngineConfig
from ..engine.fingerprint import TaskDefaults
from ..jsonlog import ComponentLog
from ..log.runs import RUN_LOCK_LABEL, RUN_MANIFEST_LABEL, RunDirs
from ..runner import DockerRunner, Hardening, ObjectCacheSettings, RetryConfig
from ..sanitize import default_sanitizer
from . import run_budget
from .preflight import Prepared


def _fields(section: Any, *names: str, **renamed: str) -> dict[str, Any]:
    """Settings of a config section as keywords of a struct that names them the same (or as ``renamed``)."""
    return {name: getattr(section, name) for name in names} | {k: getattr(section, v) for k, v in renamed.items()}


def _engine_config(
    prep: Prepared, dirs: RunDirs, run_id: str, *, resume_fresh: bool, structured_outputs: bool = True
) -> EngineConfig:
    c = prep.config
    r = c.runner
    o = c.orchestration
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
            **_fields(o, "import_policy", "import_conflict_policy", "skip_empty_import"),
            **_fields(r, "container_memory", "network_egress", "max_turns", container_cpus="container_cpu"),
            timeout_seconds=r.container_timeout_seconds,
        ),
        **_fields(
            c.events,
            "flush_policy",
            "max_final_message_bytes",
            "snapshot_interval_s",
            flush_interval_ms="interval_ms",
            flush_max_batch="max_batch",
        ),
        resume_fresh=resume_fresh,
        supports_resume=prep.plugin.capabilities.supports_resume,
        structured_outputs=structured_outputs,
        budget=run_budget.cap_of(c),
        budget_rates=run_budget.rates_of(c, prep.plugin),
        runner_options={
            "docker_image": prep.image,
            **_fields(r, "reuse_container", "finalize", "review_workspace_mode", "isolation_mode"),
            "session_volume_scope": r.session_volume_scope,
            "labels": {RUN_LOCK_LABEL: str(dirs.lock(run_id)), RUN_MANIFEST_LABEL: str(dirs.manifest(run_id))},
            "retry_config": RetryConfig(
                **_fields(r, "max_attempts", "backoff_base_s", "backoff_factor", "backoff_max_s")
            ),
        },
    )


def _make_runner(prep: Prepared, log_dir: Path, olog: ComponentLog, stop_run=None):
    """One DockerRunner, or with runner.hosts one per engine under a placing runner."""
    config = prep.config
    hardening = Hardening(
        **_fields(config.runner.container_limits, "pids_limit", "nofile"),
        **_fields(config.runner, "secret_scan", "max_workspace_mb"),
    )
    # What every runner of the run is given, whichever engine it drives.
    common: dict[str, Any] = {
        "auth": prep.auth,
        "logs_dir": log_dir,
        "sanitizer": default_sanitizer(),
        "pricing": config.model_pricing(),
        "dry_run": prep.dry_run,
        "known_images": (prep.image,),
        "hardening": hardening,
    }

    def make(host=None) -> DockerRunner:
        return DockerRunner(
            **common,
            host=host,
            object_cache=ObjectCacheSettings(
                **_fields(config.runner, max_mb="object_cache_max_mb", expiry_days="object_cache_expiry_days")
            ),
        )

    kube = config.runner.kubernetes
    if kube is not None:
        from ..runner import ClusterSpec, KubernetesRunner, KubeSettings

        olog.info("kubernetes", kubeconfig=kube.kubeconfig, context=kube.context, namespace=kube.namespace)
        settings = _fields(kube, "pending_timeout_s", "storage_class", "session_size", "session_bind_timeout_s")
        return KubernetesRunner(
            cluster=ClusterSpec.of(kube),
            settings=KubeSettings(pull_policy=kube.image_pull_policy, **settings),
            **common,
        )
    if not prep.hosts:
        return make()
    from ..runner import MultiHostRunner, transport_warnings

    specs = prep.hosts
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
