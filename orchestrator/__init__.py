"""orchestrator: durable, event-sourced orchestration of parallel AI coding agents.

The public surface (everything else is internal):

- the engine: :class:`Engine`, :class:`EngineConfig`, :class:`StrategyContext`, :class:`Handle`
- event log access: :func:`get_events_since`, :func:`subscribe`, :func:`read_events`
- state: :class:`RunState`, :func:`recover`
- the error tree: see :mod:`orchestrator.errors`
"""

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
from .eventlog import get_events_since, read_events, subscribe
from .state import RunState, recover

__all__ = [
    "AggregateTaskFailed", "ConfigError", "Engine", "EngineConfig", "Handle", "KeyConflictDifferentFingerprint",
    "NoViableCandidates", "OrchestratorError", "RunLockedError", "RunState", "RunnerError", "StrategyContext",
    "StrategyError", "TaskFailed", "UsageError", "get_events_since", "read_events", "recover", "subscribe",
]
