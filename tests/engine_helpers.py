"""Shared helpers for engine tests (in-process runner, no Docker)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.engine.engine import Engine, EngineConfig


def make_config(tmp_path: Path, run_id: str = "run_t", **kw) -> EngineConfig:
    return EngineConfig(
        run_id=run_id,
        repo_path=str(tmp_path),
        logs_dir=str(tmp_path / "logs"),
        state_dir=str(tmp_path / "state"),
        results_dir=str(tmp_path / "results"),
        **kw,
    )


async def run_engine(tmp_path, fn, runner, *, params=None, runs=1, **kw):
    engine = Engine(make_config(tmp_path, **kw), runner)
    state = await engine.run(fn, prompt="do it", params=params or {}, runs=runs)
    return engine, state


def strategy_results(state):
    return {sid: (s.status, s.result, s.error) for sid, s in sorted(state.strategies.items())}
