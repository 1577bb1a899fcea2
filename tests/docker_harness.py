"""Run a strategy through the real engine and the real Docker runner with the sim agent.

Used by strategy tests below the CLI; CLI tests run the ``orchestrator`` command itself.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from conftest import TEST_IMAGE

from orchestrator.engine.engine import Engine, EngineConfig
from orchestrator.engine.fingerprint import TaskDefaults
from orchestrator.runner import AuthConfig, DockerRunner, RetryConfig


def new_run_id() -> str:
    return f"run_d{uuid.uuid4().hex[:8]}"


def harness_defaults(plugin: str = "claude-code") -> TaskDefaults:
    """The harness's task defaults; a test that drives an Engine of its own for the same run uses them too
    (a resume under other defaults would schedule its tasks with other fingerprints).

    Offline, as the command's tests run (tests/cli_helpers.py): the sim agent needs no network.
    """
    return TaskDefaults(
        plugin_name=plugin, container_cpus=1, container_memory="1g", timeout_seconds=120, network_egress="offline"
    )


async def run_with_docker(
    tmp_path: Path,
    repo: Path,
    fn,
    *,
    params=None,
    prompt="do it",
    run_id: str | None = None,
    strategy_name="test",
    runs=1,
    max_parallel=4,
    cancel_after: float | None = None,
    cancel_when=None,
    cancel_on: tuple[str, str] | None = None,
    plugin="claude-code",
):
    """``cancel_after``: seconds, then the run is cancelled (an interrupt).
    ``cancel_when``: a test of the engine, polled every 0.1 s; the run is
    cancelled once it holds (at most ``cancel_after`` or 300 s later): the
    moment a test depends on, not a wall-clock guess that a loaded machine misses.
    ``cancel_on``: (event type, key suffix): the run is cancelled the moment such an event is logged.
    """
    import anyio

    # A run id of its own: container and volume names come from it, and tests run side by side.
    run_id = run_id or new_run_id()
    cfg = EngineConfig(
        run_id=run_id,
        repo_path=str(repo),
        strategy_name=strategy_name,
        logs_dir=str(tmp_path / "logs"),
        state_dir=str(tmp_path / "state"),
        results_dir=str(tmp_path / "results"),
        max_parallel=max_parallel,
        defaults=harness_defaults(plugin),
        runner_options={
            "docker_image": TEST_IMAGE,
            "retry_config": RetryConfig(max_attempts=3, backoff_base_s=0.2, backoff_factor=2, backoff_max_s=1),
        },
    )
    runner = DockerRunner(auth=AuthConfig(api_key="sk-test-not-a-real-key-000000"), logs_dir=tmp_path / "logs" / run_id)
    engine = Engine(cfg, runner)
    stop = anyio.CancelScope()
    if cancel_on is not None:
        wanted, suffix = cancel_on
        engine.listeners.append(
            lambda etype, sid, key, *_: stop.cancel() if etype == wanted and key and key.endswith(suffix) else None
        )
    try:
        with stop:
            await _run_engine(engine, fn, prompt, params or {}, runs, cancel_after, cancel_when)
    finally:
        await runner.aclose()
    return engine


async def _run_engine(engine, fn, prompt, params, runs, cancel_after, cancel_when) -> None:
    import anyio

    if cancel_when is not None:
        with anyio.move_on_after(cancel_after or 300):
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    # polled: the engine's state has no event to wait on
                    while True:
                        if cancel_when(engine):
                            tg.cancel_scope.cancel()
                            return
                        await anyio.sleep(0.1)

                tg.start_soon(watch)
                await engine.run(fn, prompt=prompt, params=params, runs=runs)
                tg.cancel_scope.cancel()
    elif cancel_after is not None:
        with anyio.move_on_after(cancel_after):
            await engine.run(fn, prompt=prompt, params=params, runs=runs)
    else:
        await engine.run(fn, prompt=prompt, params=params, runs=runs)
