"""orchestrator: durable, event-sourced orchestration of parallel AI coding agents.

The public surface (everything else is internal):

- the engine: :class:`Engine`, :class:`EngineConfig`, :class:`StrategyContext`, :class:`Handle`
- event log access: :func:`get_events_since`, :func:`subscribe`, :func:`read_events`
- state: :class:`RunState`, :func:`recover`
- the error tree: see :mod:`orchestrator.errors`

Strategy authors import from :mod:`orchestrator.strategy` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._lazy import lazy_attr

# Lazy re-exports: ``import orchestrator.x`` runs this file first, and loading
# the engine (and with it the runner) here would make every submodule import,
# the TUI's and the strategies' included, pay for all of it.
_EXPORTS = {
    "Handle": "engine.context",
    "StrategyContext": "engine.context",
    "Engine": "engine.engine",
    "EngineConfig": "engine.engine",
    "get_events_since": "log.eventlog",
    "read_events": "log.eventlog",
    "subscribe": "log.eventlog",
    "RunState": "log.state",
    "recover": "log.state",
    **{
        name: "errors"
        for name in (
            "AggregateTaskFailed",
            "ConfigError",
            "KeyConflictDifferentFingerprint",
            "NoViableCandidates",
            "OrchestratorError",
            "RunLockedError",
            "RunnerError",
            "StrategyError",
            "TaskFailed",
            "UsageError",
        )
    },
}

if TYPE_CHECKING:
    from .engine.context import Handle, StrategyContext
    from .engine.engine import Engine, EngineConfig
    from .errors import (
        AggregateTaskFailed,
        ConfigError,
        KeyConflictDifferentFingerprint,
        NoViableCandidates,
        OrchestratorError,
        RunLockedError,
        RunnerError,
        StrategyError,
        TaskFailed,
        UsageError,
    )
    from .log.eventlog import get_events_since, read_events, subscribe
    from .log.state import RunState, recover


def __getattr__(name: str) -> Any:
    return lazy_attr(__name__, _EXPORTS, name)


__all__ = [
    "AggregateTaskFailed",
    "ConfigError",
    "Engine",
    "EngineConfig",
    "Handle",
    "KeyConflictDifferentFingerprint",
    "NoViableCandidates",
    "OrchestratorError",
    "RunLockedError",
    "RunState",
    "RunnerError",
    "StrategyContext",
    "StrategyError",
    "TaskFailed",
    "UsageError",
    "get_events_since",
    "read_events",
    "recover",
    "subscribe",
]
