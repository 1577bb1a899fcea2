"""The durable engine. Its one service besides running: :func:`replay_strategy` (:mod:`orchestrator.engine.replay`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_module

# Lazy, like the package root: a strategy importing the engine's context loads nothing more.
__getattr__, __all__ = lazy_module(__name__)

if TYPE_CHECKING:
    from .replay import ReplayOutcome as ReplayOutcome
    from .replay import replay_strategy as replay_strategy
