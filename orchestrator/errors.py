"""The one exception tree of the orchestrator: callers only ever catch these, each says when it is raised, and library
errors (docker-py, subprocess) are translated into it at the boundary with ``raise ... from``."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (a type only: the runner imports this module, not the other way)
    from .runner.types import ErrorCategory


class OrchestratorError(Exception):
    """Base of every error the orchestrator raises on purpose."""


class UsageError(OrchestratorError, ValueError):
    """The user asked for something that cannot work; the message says how to fix it."""


class ConfigError(UsageError):
    """A configuration value, file or strategy parameter is invalid."""


class StrategyLoadError(UsageError):
    """A strategy name, file or module could not be loaded."""


class PreflightError(UsageError):
    """The environment is not ready to start a run (Docker, repository, auth, disk)."""


class RunLockedError(OrchestratorError):
    """Another live process holds the writer lock of this run's event log."""


class SnapshotError(OrchestratorError, ValueError):
    """A state.json snapshot cannot be trusted (torn, edited, or a layout this version does not know). Loading falls
    back to the duplicate snapshot, then to a full replay: only a caller reading a snapshot without its log meets it."""


class ReplayError(OrchestratorError):
    """Replaying a recorded strategy execution (for a report) raised what the recorded run never did: a bug in the
    strategy or the code it calls, or a log the strategy no longer matches. The report is partial; the traceback is in
    the run's ``orchestration.jsonl``."""


class RunnerError(OrchestratorError):
    """A task could not be executed. ``category`` is one of timeout|api|container|docker|git|secret|resource."""

    category: ErrorCategory = "container"

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class GitError(RunnerError):
    """A git operation (clone, fetch, import) failed."""

    category = "git"


class BranchExistsError(GitError):
    """The target branch exists and import_conflict_policy is "fail"."""


class ContainerError(RunnerError):
    """Docker could not create, start or exec the container, or it died."""


class HostDownError(ContainerError):
    """The Docker host the task ran on (one of ``runner.hosts``) stopped answering: not the container's fault, and the
    same task can run on another host, so the message names the host that went away."""

    category = "docker"


class AgentStreamLostError(ContainerError):
    """The connection carrying the agent's output broke while the agent ran, though the engine still answers (a
    dropped link to a remote engine). The agent may go on in its container, so it must be ended before a retry starts
    another one in the same workspace. Transient: the retry resumes the session."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class SecretLeakError(RunnerError):
    """The task's commits contain a credential, so its branch was not imported. The message names each file and line,
    never the value; the workspace is kept for inspection, and a retry would only commit the same thing again."""

    category = "secret"


class ResourceLimitError(RunnerError):
    """The agent hit a limit (processes, /tmp, workspace size) and the task was stopped. Never retried: the same agent
    on the same prompt would most likely do it again."""

    category = "resource"


class TaskTimeoutError(RunnerError):
    """The task ran past its container-level timeout."""

    category = "timeout"


class StrategyError(OrchestratorError):
    """Base of the errors strategies see through ``ctx.errors``."""


class TaskFailed(StrategyError):
    """Raised by ``ctx.wait()`` when the task failed."""

    def __init__(self, key: str, error_type: str, message: str) -> None:
        super().__init__(f"task {key} failed ({error_type}): {message}")
        self.key = key
        self.error_type = error_type
        self.message = message

    def __reduce__(self):  # keep the three fields through pickling/copying
        return (type(self), (self.key, self.error_type, self.message))


class BudgetReached(TaskFailed):
    """The run's spending cap (``--max-cost`` / ``--max-tokens``) is reached: this agent task does not start.

    Raised by ``ctx.run`` of a new agent task once the cap is reached, and by ``ctx.wait`` on one still waiting for a
    slot then. A :class:`TaskFailed`, so a strategy that tolerates failed tasks goes on with what it has; catch it to
    return the best result so far. Nothing is recorded as failed: ``--resume RUN_ID --max-cost HIGHER`` runs it.
    """

    def __init__(self, key: str, message: str = "the run's spending cap is reached") -> None:
        super().__init__(key, "budget_reached", message)
        self.args = (f"task {key} not started: {message}",)  # it did not fail: it never ran

    def __reduce__(self):  # keep the fields through pickling/copying
        return (type(self), (self.key, self.message))


class BudgetExhausted(StrategyError):
    """A strategy's own budget (``ctx.open_budget``) is spent: ``ctx.run`` starts no new task.

    Not a :class:`TaskFailed`: a helper that tolerates failed tasks does not swallow it, so the strategy reaches the
    point where it ends with the best it has. While a budget is open, the run's spending cap refusing a task raises
    this too (with the cap's message). A task the run already recorded is never refused: it costs nothing again.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AggregateTaskFailed(StrategyError):
    """Raised by ``ctx.wait_all()`` when any task failed and failures are not tolerated."""

    def __init__(self, keys: list[str], failures: list[TaskFailed] | None = None) -> None:
        super().__init__(f"{len(keys)} task(s) failed: {', '.join(keys)}")
        self.keys = list(keys)
        self.failures = list(failures or [])


class NoViableCandidates(StrategyError):
    """A selection strategy ended with no valid candidate to choose."""

    def __init__(self, message: str = "no viable candidates") -> None:
        super().__init__(message)


OUTPUT_TAIL_LINES = 20


class BaseEvaluationFailed(StrategyError):
    """A strategy's evaluation of the base branch cannot be used, so the run stops before any agent task.

    Raised by a strategy (tree-beam, evolve, review-loop) when the command that measures the base could not run,
    reports ``valid: false``, or lacks a metric the run needs: every candidate would be measured against nothing,
    so going on would only spend money. ``keys``: the tasks that measured the base, completed but no success.
    """

    def __init__(
        self,
        reason: str,
        *,
        command: str,
        output: str = "",
        headline: str = "the evaluation of the base cannot be used",
        keys: tuple[str, ...] = (),
    ) -> None:
        lines = [ln.rstrip() for ln in (output or "").rstrip().lstrip("\n").splitlines()][-OUTPUT_TAIL_LINES:]
        text = f"{headline}: {reason}\n  command: {command}"
        if lines:
            count = "line" if len(lines) == 1 else f"{len(lines)} lines"
            text += f"\n  its output (last {count}):\n" + "\n".join(f"  | {ln}" for ln in lines)
        else:
            text += "\n  it printed nothing"
        super().__init__(text)
        self.reason = reason
        self.command = command
        self.output = "\n".join(lines)
        self.headline = headline
        self.keys = tuple(keys)

    def __reduce__(self):  # keep the fields through pickling/copying
        fields: dict[str, Any] = {"command": self.command, "output": self.output, "headline": self.headline}
        return (functools.partial(BaseEvaluationFailed, self.reason, keys=self.keys, **fields), ())


class KeyConflictDifferentFingerprint(StrategyError):
    """The same durable key was scheduled with a different task input."""

    def __init__(self, key: str, recorded: str, new: str) -> None:
        super().__init__(
            f"key {key!r} was already scheduled with fingerprint {recorded} "
            f"but is now scheduled with {new}; use a different key for a different task"
        )
        self.key = key
        self.recorded = recorded
        self.new = new


class NondeterminismError(StrategyError):
    """Strict determinism mode: strategy code called a non-replayable API directly."""


class StrategyErrors:
    """The namespace exposed as ``ctx.errors``."""

    TaskFailed = TaskFailed
    BudgetReached = BudgetReached
    BudgetExhausted = BudgetExhausted
    AggregateTaskFailed = AggregateTaskFailed
    NoViableCandidates = NoViableCandidates
    BaseEvaluationFailed = BaseEvaluationFailed
    KeyConflictDifferentFingerprint = KeyConflictDifferentFingerprint
    NondeterminismError = NondeterminismError
