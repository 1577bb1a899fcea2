"""An in-process runner for testing strategies and the engine without Docker: ``ScriptedRunner`` turns a
function of the :class:`InstanceRequest` into its ``RunnerResult``; a ``delay`` function shuffles completion order.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

from ..naming import short8
from ..runner.types import BranchArtifact, ErrorCategory, InstanceRequest, Metrics, RunnerResult

Script = Callable[[InstanceRequest], Any]


def success(
    request: InstanceRequest,
    *,
    final_message: str = "done",
    has_changes: bool = True,
    tokens: tuple[int, int] = (100, 50),
    cost: float | None = 0.01,
    session_id: str | None = None,
    exit_code: int | None = None,
    output: Any = None,
) -> RunnerResult:
    """A plausible successful result for ``request`` (deterministic in the request).

    ``output``: the answer to the request's ``output_schema`` (the runner validates real ones).
    """
    commit = short8(request.task_key) * 5
    never = request.import_policy == "never"
    changed = has_changes and not never
    return RunnerResult(
        status="success",
        instance_id=request.instance_id,
        artifact=BranchArtifact(
            branch_planned=request.branch_name,
            branch_final=request.branch_name if changed else None,
            base=request.base_branch,
            commit=commit if changed else "0" * 40,
            has_changes=changed,
            commit_count=1 if changed else 0,
        ),
        final_message=final_message,
        metrics=Metrics(tokens_in=tokens[0], tokens_out=tokens[1], cost_usd=cost, duration_s=0.0),
        session_id=session_id or f"sess-{short8(request.task_key)}",
        exit_code=exit_code,
        container_name=request.container_name,
        output=output,
    )


def failure(request: InstanceRequest, *, error_type: ErrorCategory = "api", message: str = "boom") -> RunnerResult:
    return RunnerResult(
        status="failed",
        instance_id=request.instance_id,
        error_type=error_type,
        error=message,
        container_name=request.container_name,
    )


class ScriptedRunner:
    """A :class:`~orchestrator.runner.base.TaskRunner` driven by a function."""

    def __init__(
        self, script: Script | None = None, *, delay: Callable[[InstanceRequest], float] | None = None
    ) -> None:
        self.script = script or (lambda req: success(req))
        self.delay = delay
        self.calls: list[InstanceRequest] = []
        self.per_key: Counter[str] = Counter()
        self.closed = False

    async def run(self, request: InstanceRequest, *, on_event=None) -> RunnerResult:
        self.calls.append(request)
        self.per_key[request.task_key] += 1
        if on_event is not None:
            on_event({"kind": "init", "session_id": f"sess-{short8(request.task_key)}"})
        if self.delay is not None:
            await anyio.sleep(self.delay(request))
        else:
            await anyio.lowlevel.checkpoint()
        out = self.script(request)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, dict):
            out = success(request, **out)
        return out

    async def aclose(self) -> None:
        self.closed = True
