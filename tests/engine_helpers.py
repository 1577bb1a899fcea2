"""Shared helpers for engine tests (in-process runner, no Docker)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from orchestrator.engine.engine import Engine, EngineConfig
from orchestrator.engine.testing import ScriptedRunner
from orchestrator.log.eventlog import read_events
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


def completed_keys(engine) -> Counter:
    return Counter(e.key for e in read_events(engine.paths.events) if e.type == "task.completed")


def output(engine, name):
    return (engine.paths.results / "strategy_output" / name).read_text()


async def interrupt_when_blocked(tmp_path, fn, script, *, params, blocked, count):
    """Run until ``count`` tasks matching ``blocked`` are running, then cancel (like Ctrl+C)."""
    reached: list[str] = []
    ready = anyio.Event()

    async def gated(req):
        if blocked(req):
            reached.append(req.task_key)
            if len(reached) >= count:
                ready.set()
            await anyio.sleep_forever()
        return script(req)

    runner = ScriptedRunner(gated)
    engine = Engine(make_config(tmp_path, max_parallel=8), runner)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: engine.run(fn, prompt="do it", params=params))
        with anyio.fail_after(5):
            await ready.wait()
        tg.cancel_scope.cancel()
    return engine


async def assert_resume_matches_uninterrupted(tmp_path, fn, script, *, params, blocked, count, outputs=()):
    """Interrupted as ``interrupt_when_blocked`` says, then resumed: no finished task runs again, and the result and
    ``outputs`` are those of an uninterrupted run."""
    first = await interrupt_when_blocked(tmp_path / "a", fn, script, params=params, blocked=blocked, count=count)
    done_before = set(completed_keys(first))
    assert done_before, "the interruption came before anything finished"
    runner2 = ScriptedRunner(script)
    engine2, state = await run_engine(tmp_path / "a", fn, runner2, params=params)
    rerun = {c.task_key for c in runner2.calls}
    assert not rerun & done_before, f"finished keys ran again: {rerun & done_before}"
    assert set(completed_keys(engine2).values()) == {1}  # each key completed exactly once overall
    ref_engine, ref = await run_engine(tmp_path / "b", fn, ScriptedRunner(script), params=params)
    assert state.strategies["s1"].status == ref.strategies["s1"].status == "success"
    assert state.strategies["s1"].result == ref.strategies["s1"].result
    assert set(completed_keys(engine2)) == set(completed_keys(ref_engine))
    for name in outputs:
        assert output(engine2, name) == output(ref_engine, name)
    return runner2


async def run_until_hung(coro, runner, marker):
    """Run until a task matching ``marker`` has started (and hangs), let the rest settle, then interrupt."""
    finished = anyio.Event()

    async def go():
        await coro
        finished.set()  # ended without ever reaching the marker: the caller's checks will say so

    async with anyio.create_task_group() as tg:
        tg.start_soon(go)
        # Polls: nothing signals the runner's first call for the marked task.
        while not any(marker in k for k in runner.per_key) and not finished.is_set():  # noqa: ASYNC110
            await anyio.sleep(0.02)
        await anyio.sleep(0.3)
        tg.cancel_scope.cancel()
