"""The durable engine. Its one service besides running: :func:`replay_strategy`.

``replay_strategy(events_path, strategy_fn, ...)`` re-runs a recorded strategy
execution from its event log alone (for reports of finished and interrupted
runs); see :mod:`orchestrator.engine.replay`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Lazy, like the package root: a strategy importing the engine's context loads nothing more.
_EXPORTS = {"ReplayOutcome": "replay", "replay_strategy": "replay"}

if TYPE_CHECKING:
    from .replay import ReplayOutcome, replay_strategy


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = ["ReplayOutcome", "replay_strategy"]
