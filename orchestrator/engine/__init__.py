"""The durable engine. Its one service besides running: :func:`replay_strategy`.

``replay_strategy(events_path, strategy_fn, ...)`` re-runs a recorded strategy
execution from its event log alone (for reports of finished and interrupted
runs); see :mod:`orchestrator.engine.replay`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_module

# Lazy, like the package root: a strategy importing the engine's context loads nothing more.
__getattr__, __all__ = lazy_module(__name__)

if TYPE_CHECKING:
    from .replay import ReplayOutcome as ReplayOutcome
    from .replay import replay_strategy as replay_strategy
