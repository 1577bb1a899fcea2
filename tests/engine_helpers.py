"""Shared helpers for engine tests (in-process runner, no Docker)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from orchestrator.engine.engine import Engine, EngineConfig
from orchestrator.log.runs import RunManifest


def make_config(tmp_path: Path, run_id: str = "run_t", **kw) -> EngineConfig:
    return EngineConfig(
        run_id=run_id,
        repo_path=str(tmp_path),
        logs_dir=str(tmp_path / "logs"),
        state_dir=str(tmp_path / "state"),
        results_dir=str(tmp_path / "results"),
        **kw,
    )


def run_manifest(**kw) -> RunManifest:
    """A finished run's manifest; the fields a test cares about are passed, the rest are any valid values."""
    spec = kw.pop("strategy_spec", "simple")
    fields = dict(
        run_id="run_x",
        created_at="2026-01-01T00:00:00Z",
        prompt="p",
        strategy_spec=spec,
        strategy_name=spec,
        params={},
        runs=1,
        repo_path="/r",
        base_branch="main",
        model="sonnet",
        plugin="claude-code",
        docker_image="claude-code",
        max_parallel=1,
        status="completed",
    )
    return RunManifest(**{**fields, **kw})


async def run_engine(tmp_path, fn, runner, *, params=None, runs=1, **kw):
    engine = Engine(make_config(tmp_path, **kw), runner)
    state = await engine.run(fn, prompt="do it", params=params or {}, runs=runs)
    return engine, state


def strategy_results(state):
    return {sid: (s.status, s.result, s.error) for sid, s in sorted(state.strategies.items())}


async def interrupt_when(
    run: Callable[[], Awaitable[object]], condition: Callable[[], bool], *, settle: float = 0.0
) -> None:
    """Run ``run()`` and cancel it (an interrupt) once ``condition()`` holds, ``settle`` seconds later.

    Interrupt tests depend on a moment (a task started, another finished), and a
    fixed wall-clock guess at that moment fails on a loaded machine. A condition
    that never comes fails the test after a minute.
    """
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while True:  # polled: nothing signals these conditions
                    if condition():
                        await anyio.sleep(settle)
                        tg.cancel_scope.cancel()
                        return
                    await anyio.sleep(0.02)

            tg.start_soon(watch)
            await run()
            tg.cancel_scope.cancel()


def mypy(*paths, cwd):
    """mypy --strict's findings on ``paths``, as a strategy author would run it."""
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--follow-imports=silent",
        "--no-error-summary",
        "--show-error-codes",
        "--cache-dir",
        str(cwd / ".mypy_cache"),
        *map(str, paths),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    assert proc.returncode in (0, 1), proc.stderr  # 2: mypy itself failed
    return proc.stdout
