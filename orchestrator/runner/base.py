"""The one protocol between orchestration and any runner.

Shaped like an httpx transport: one async method takes a frozen request and
returns a frozen result, plus ``aclose()``. The Docker runner implements it for
real; engine tests use an in-process runner with scripted outcomes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .types import InstanceRequest, RunnerResult

RunnerEventCallback = Callable[[dict[str, Any]], None]


@runtime_checkable
class TaskRunner(Protocol):
    async def run(self, request: InstanceRequest, *, on_event: RunnerEventCallback | None = None) -> RunnerResult:
        """Execute one task to completion.

        Returns a result with status success/failed/timeout. When the calling
        scope is cancelled (Ctrl+C), the runner stops the container in a shielded
        scope and lets the cancellation propagate: orchestration records the task
        as interrupted, never as failed.
        """

    async def aclose(self) -> None:
        """Release clients and pools. Does not stop containers of finished tasks."""
