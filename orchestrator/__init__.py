"""orchestrator: durable, event-sourced orchestration of parallel AI coding agents. The public surface is the export
table below; strategy authors import from :mod:`orchestrator.strategy` only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_module

# Lazy re-exports: ``import orchestrator.x`` runs this file first, and loading
# the engine (and with it the runner) here would make every submodule import,
# the TUI's and the strategies' included, pay for all of it. The imports under
# TYPE_CHECKING below are the export table (orchestrator/_lazy.py).
__getattr__, __all__ = lazy_module(__name__)

if TYPE_CHECKING:
    from .engine.context import Handle as Handle
    from .engine.context import StrategyContext as StrategyContext
    from .engine.engine import Engine as Engine
    from .engine.engine import EngineConfig as EngineConfig
    from .errors import AggregateTaskFailed as AggregateTaskFailed
    from .errors import ConfigError as ConfigError
    from .errors import KeyConflictDifferentFingerprint as KeyConflictDifferentFingerprint
    from .errors import NoViableCandidates as NoViableCandidates
    from .errors import OrchestratorError as OrchestratorError
    from .errors import RunLockedError as RunLockedError
    from .errors import RunnerError as RunnerError
    from .errors import StrategyError as StrategyError
    from .errors import TaskFailed as TaskFailed
    from .errors import UsageError as UsageError
    from .log.eventlog import get_events_since as get_events_since
    from .log.eventlog import read_events as read_events
    from .log.eventlog import subscribe as subscribe
    from .log.state import RunState as RunState
    from .log.state import recover as recover
