"""The shapes a strategy exchanges with ``ctx`` (strategy authors import them from :mod:`orchestrator.strategy`).

``TypedDict``s rather than classes: strategies hand ``ctx.run`` plain dicts and get plain dicts back, as the event
log records and replays them byte for byte; the types only let an editor complete the keys and a type checker flag a
misspelt one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict

import msgspec

from ..runner.types import (
    ConflictPolicy,
    ErrorCategory,
    ImportPolicy,
    NetworkEgress,
    UncommittedPolicy,
)

PluginName = Literal["claude-code", "codex", "command"]
# The values a task input and a result may hold are the runner's own: one
# definition, so a new error category or policy reaches the strategy's types too.
ImportConflictPolicy = ConflictPolicy
ErrorType = ErrorCategory
RetryCategory = ErrorType | Literal["network"]


class ContainerLimitsInput(TypedDict, total=False):
    cpus: float
    memory: str  # docker's notation: "4g", "512m"


class TaskInput(TypedDict, total=False):
    """What ``ctx.run`` accepts for an agent or command task (docs/strategies.md, "Task input").

    Every key may be left out; ``None`` means the same (the run's default). An
    agent task needs ``prompt``, a ``command`` task needs ``command``.
    """

    prompt: str | None
    base_branch: str | None
    model: str | None
    import_policy: ImportPolicy | None
    import_conflict_policy: ImportConflictPolicy | None
    skip_empty_import: bool | None
    session_group_key: str | None
    resume_session_id: str | None
    plugin: PluginName | None
    plugin_name: PluginName | None
    system_prompt: str | None
    append_system_prompt: str | None
    max_turns: int | None
    command: str | None
    include_branches: Sequence[str] | None
    timeout_seconds: float | None
    network_egress: NetworkEgress | None
    container_limits: ContainerLimitsInput | None
    output_schema: dict[str, Any] | None
    uncommitted: UncommittedPolicy | None
    metadata: Any


class KeyedTaskInput(TaskInput):
    """A ``ctx.parallel`` item: a task input that carries its own ``key``."""

    key: str


class BranchCleanupTask(TypedDict):
    """A housekeeping task: delete branches this run created, run nothing else."""

    delete_branches: Sequence[str]
    prompt: NotRequired[str]
    metadata: NotRequired[Any]


class Artifact(TypedDict):
    """Where a task's work is: its branch, or the base it started from when nothing was imported."""

    type: Literal["branch"]
    branch_planned: str
    # None when no branch was created: import_policy "never", or the task changed nothing.
    branch_final: str | None
    base: str
    commit: str
    has_changes: bool
    commit_count: int
    lines_added: int
    lines_deleted: int
    # Absent from results recorded before the orchestrator counted leftover files.
    uncommitted_files: NotRequired[int]
    auto_committed: NotRequired[bool]


class TaskMetrics(TypedDict):
    tokens_in: int
    tokens_out: int
    cost_usd: float | None  # None: the tool reported no cost and none could be estimated
    duration_s: float


class _ResultBase(TypedDict):
    key: str
    instance_id: str
    status: Literal["success"]
    final_message: str
    metrics: TaskMetrics
    session_id: str | None
    exit_code: int | None
    # The answer validated against the task's output_schema; None without one.
    output: Any


class TaskResult(_ResultBase):
    """What ``await ctx.wait(handle)`` returns for an agent or command task."""

    artifact: Artifact


class BranchCleanupResult(_ResultBase):
    """The result of a :class:`BranchCleanupTask`: one ``@@branch STATE: NAME`` line per branch in ``final_message``."""

    artifact: None


class RetryBackoff(TypedDict, total=False):
    base_s: float
    factor: float
    max_s: float


class RetryPolicyDict(TypedDict, total=False):
    """The dict form of :class:`RetryPolicy`, as ``ctx.run(..., policy={...})`` accepts it."""

    max_attempts: int
    backoff: RetryBackoff
    retry_on: Sequence[RetryCategory]


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Orchestration-level retry of a task that failed in one of the ``retry_on`` categories.

    Runner-level retries (rate limits, API errors, with session resume) happen
    inside the runner; this policy re-dispatches the whole task under the same
    key, waiting ``base_s * factor ** (attempt - 1)`` seconds (at most ``max_s``)
    between attempts.
    """

    max_attempts: int = 3
    base_s: float = 10.0
    factor: float = 6.0
    max_s: float = 360.0
    retry_on: tuple[str, ...] = ("docker", "api", "network")

    @classmethod
    def coerce(cls, policy: RetryPolicy | RetryPolicyDict | None) -> RetryPolicy | None:
        if policy is None or isinstance(policy, RetryPolicy):
            return policy
        if isinstance(policy, dict):
            backoff = policy.get("backoff") or {}
            return cls(
                max_attempts=int(policy.get("max_attempts", 3)),
                base_s=float(backoff.get("base_s", 10)),
                factor=float(backoff.get("factor", 6)),
                max_s=float(backoff.get("max_s", 360)),
                retry_on=tuple(policy.get("retry_on", ("docker", "api", "network"))),
            )
        raise TypeError(f"policy must be a RetryPolicy or a dict, not {type(policy).__name__}")

    def retries(self, error_type: str | None) -> bool:
        if error_type == "internal":
            return False  # the orchestrator's own bug: running it again pays for it again
        # "docker" and "network" name Docker trouble in general: a failed container
        # ("container") as well as a host of runner.hosts that stopped answering ("docker").
        wanted = set(self.retry_on)
        if wanted & {"docker", "network"}:
            wanted |= {"container", "docker"}
        return error_type in wanted

    def delay(self, attempt: int) -> float:
        return min(self.max_s, self.base_s * self.factor ** (attempt - 1))
