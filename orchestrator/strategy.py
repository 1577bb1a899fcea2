"""Everything a strategy author imports: ``from orchestrator.strategy import ...`` (docs/strategies.md).

``finished_run_branches`` and ``absent_branches`` ask the :class:`PrepareRuntime` the orchestrator supplies while a
``prepare`` hook runs: this module never imports the application, nor loads the Docker runner or the CLI."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from .engine.context import BudgetScope, Context, Handle, parallel_items
from .engine.task_types import (
    Artifact,
    BranchCleanupResult,
    BranchCleanupTask,
    ContainerLimitsInput,
    ErrorType,
    ImportConflictPolicy,
    ImportPolicy,
    KeyedTaskInput,
    NetworkEgress,
    PluginName,
    RetryBackoff,
    RetryCategory,
    RetryPolicy,
    RetryPolicyDict,
    TaskInput,
    TaskMetrics,
    TaskResult,
    UncommittedPolicy,
)
from .errors import (
    AggregateTaskFailed,
    BaseEvaluationFailed,
    BudgetExhausted,
    BudgetReached,
    ConfigError,
    KeyConflictDifferentFingerprint,
    NondeterminismError,
    NoViableCandidates,
    ReplayError,
    StrategyError,
    StrategyErrors,
    TaskFailed,
)

if TYPE_CHECKING:
    from .engine.replay import ReplayOutcome, replay_strategy

F = TypeVar("F", bound=Callable[..., Any])

# prepare(params, repo_path) -> params: runs once before the run starts; what it
# returns is recorded as the run's parameters, so a resume never reads input files again.
Prepare = Callable[[dict[str, Any], str], dict[str, Any]]


class StrategyOptions(msgspec.Struct, frozen=True, kw_only=True):
    prepare: Prepare | None = None
    requires_resume: bool = False


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """What a strategy's after-run hooks see of a run, read-only (docs/strategies.md, "After-run hooks")."""

    run_id: str
    prompt: str
    repo_path: str
    base_branch: str
    events_path: Path
    logs_dir: Path
    output_dir: Path  # results/<run_id>/strategy_output: what the strategy wrote
    executions: dict[str, str]
    task_keys: frozenset[str]


class StrategyHooks(msgspec.Struct, frozen=True, kw_only=True):
    """A strategy module's optional report and after-run hooks, module-level functions of these names found
    once by the loader (docs/strategies.md, "After-run hooks"). Hooks read files and the view, never run git.
    """

    report_sections: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    report_task: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
    branches_to_delete: Callable[[RunView], list[str]] | None = None
    show_run_report: Callable[[RunView], list[str]] | None = None
    claimed_branches: Callable[[RunView], list[tuple[str, str, str]]] | None = None


HOOK_NAMES = tuple(StrategyHooks.__struct_fields__)


def strategy_options(*, prepare: Prepare | None = None, requires_resume: bool = False) -> Callable[[F], F]:
    """Attach loader options to a strategy function.

    ``prepare(params, repo_path)`` validates and loads input before the run
    starts (raise ``ConfigError`` with a one-line message to refuse it);
    ``requires_resume=True`` refuses a plugin that cannot resume agent sessions.
    """

    def deco(fn: F) -> F:
        fn.__orchestrator_options__ = StrategyOptions(  # type: ignore[attr-defined]
            prepare=prepare, requires_resume=requires_resume
        )
        return fn

    return deco


class PrepareRuntime(Protocol):
    """What a ``prepare`` hook may ask of the orchestrator: other runs, and the repository's branches. The
    application implements it (``orchestrator.app.run_branches``) and supplies it with :func:`prepare_runtime`."""

    def finished_run_branches(self, run_id: str, repo_path: str) -> list[str]: ...

    def absent_branches(self, repo_path: str, names: list[str]) -> list[str]: ...


_runtime: ContextVar[PrepareRuntime | None] = ContextVar("orchestrator_prepare_runtime", default=None)


@contextmanager
def prepare_runtime(runtime: PrepareRuntime) -> Iterator[None]:
    """``runtime`` answers :func:`finished_run_branches` and :func:`absent_branches` inside this block."""
    token = _runtime.set(runtime)
    try:
        yield
    finally:
        _runtime.reset(token)


def _current(name: str) -> PrepareRuntime:
    runtime = _runtime.get()
    if runtime is None:
        raise RuntimeError(
            f"{name} answers inside a strategy's prepare hook as the orchestrator runs it; "
            "elsewhere, supply the answers with orchestrator.strategy.prepare_runtime(...)"
        )
    return runtime


def finished_run_branches(run_id: str, repo_path: str) -> list[str]:
    """The branches finished run ``run_id`` made in ``repo_path`` (task-key order); ``ConfigError`` otherwise.

    Blocking (reads the run's summary, runs git): call it from ``prepare``.
    """
    return _current("finished_run_branches").finished_run_branches(run_id, repo_path)


def absent_branches(repo_path: str, names: list[str]) -> list[str]:
    """Those of ``names`` that are not branches of ``repo_path``. Blocking: call it from ``prepare``."""
    return _current("absent_branches").absent_branches(repo_path, names)


def __getattr__(name: str) -> Any:
    # A strategy's report hooks replay recorded runs; loading the replay machinery
    # (state fold, event log) only then keeps a plain strategy import light.
    if name in ("ReplayOutcome", "replay_strategy"):
        from .engine import replay

        return getattr(replay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HOOK_NAMES",
    "AggregateTaskFailed",
    "Artifact",
    "BaseEvaluationFailed",
    "BranchCleanupResult",
    "BranchCleanupTask",
    "BudgetExhausted",
    "BudgetReached",
    "BudgetScope",
    "ConfigError",
    "ContainerLimitsInput",
    "Context",
    "ErrorType",
    "Handle",
    "ImportConflictPolicy",
    "ImportPolicy",
    "KeyConflictDifferentFingerprint",
    "KeyedTaskInput",
    "NetworkEgress",
    "NoViableCandidates",
    "NondeterminismError",
    "PluginName",
    "Prepare",
    "PrepareRuntime",
    "ReplayError",
    "ReplayOutcome",
    "RetryBackoff",
    "RetryCategory",
    "RetryPolicy",
    "RetryPolicyDict",
    "RunView",
    "StrategyError",
    "StrategyErrors",
    "StrategyHooks",
    "StrategyOptions",
    "TaskFailed",
    "TaskInput",
    "TaskMetrics",
    "TaskResult",
    "UncommittedPolicy",
    "absent_branches",
    "finished_run_branches",
    "parallel_items",
    "prepare_runtime",
    "replay_strategy",
    "strategy_options",
]
