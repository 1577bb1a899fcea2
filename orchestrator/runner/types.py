"""Frozen records at the runner boundary.

The runner layer knows nothing of strategies: it receives an
:class:`InstanceRequest` whose names (container, branch, instance id, run id)
are opaque strings chosen by orchestration, and returns a :class:`RunnerResult`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec

if TYPE_CHECKING:
    from .plugin import RunnerPlugin

ImportPolicy = Literal["auto", "never", "always"]
ConflictPolicy = Literal["fail", "overwrite", "suffix"]
Status = Literal["success", "failed", "timeout", "interrupted"]
# internal: the orchestrator's own bug (never retried); session_corrupted: the
# agent could not resume its recorded session (the next attempt starts a new one);
# docker: the Docker host of runner.hosts the task ran on stopped answering.
ErrorCategory = Literal[
    "timeout",
    "api",
    "container",
    "docker",
    "git",
    "command",
    "secret",
    "resource",
    "output_invalid",
    "internal",
    "session_corrupted",
]
UncommittedPolicy = Literal["commit", "discard"]
NetworkEgress = Literal["online", "offline", "proxy"]
IsolationMode = Literal["full_copy", "shared_objects"]


class ContainerLimits(msgspec.Struct, frozen=True, kw_only=True):
    cpus: float = 2
    memory: str = "4g"


class Hardening(msgspec.Struct, frozen=True, kw_only=True):
    """Limits every task container gets: they contain a runaway or hostile agent and change nothing a
    well-behaved one produces, so they are runner settings, not task input (nor its fingerprint)."""

    # a fork bomb stops at this many processes instead of exhausting the host's table
    pids_limit: int = 512
    # open files per process (soft = hard): enough for node and git, bounded for a leak
    nofile: int = 4096
    # block: a branch whose commits hold a credential is not imported; warn: imported, reported; off
    secret_scan: Literal["block", "warn", "off"] = "block"
    # how much the agent may add to its workspace; a task past it is stopped (0: no limit)
    max_workspace_mb: int = 2048


class AuthConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Credentials. Never logged: ``__repr__`` hides the values."""

    oauth_token: str | None = None
    api_key: str | None = None
    base_url: str | None = None
    openai_api_key: str | None = None
    openai_base_url: str | None = None

    def __repr__(self) -> str:
        present = [f for f in self.__struct_fields__ if getattr(self, f)]
        return f"AuthConfig(<set: {', '.join(present) or 'none'}>)"

    def secret_values(self) -> list[str]:
        return [v for v in (self.oauth_token, self.api_key, self.openai_api_key) if v]

    def labelled_secrets(self) -> list[tuple[str, str]]:
        """(what it is, value) for each credential given; the label is safe to print."""
        pairs = (
            ("CLAUDE_CODE_OAUTH_TOKEN", self.oauth_token),
            ("ANTHROPIC_API_KEY", self.api_key),
            ("OPENAI_API_KEY", self.openai_api_key),
        )
        return [(label, value) for label, value in pairs if value]


class RetryConfig(msgspec.Struct, frozen=True, kw_only=True):
    max_attempts: int = 3
    backoff_base_s: float = 10.0
    backoff_factor: float = 6.0
    backoff_max_s: float = 360.0


# An image label naming a directory in the image whose contents are copied into
# each task's workspace before its first exec (files git ignores that setup
# made once, such as node_modules/ or .venv/).
SEED_LABEL = "org.orchestrator.workspace-seed"
# Where every task's container (or Pod) has the task's clone.
WORKSPACE_MOUNT = "/workspace"


class InstanceRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``run_instance()`` needs to run exactly one task."""

    prompt: str
    repo_path: str
    base_branch: str = "main"
    branch_name: str
    run_id: str
    strategy_execution_id: str
    strategy_index: int = 1
    instance_id: str
    task_key: str
    container_name: str
    model: str = "sonnet"
    session_id: str | None = None
    # The task ran before and session_id is its session: continue in the
    # workspace it left (a fresh clone and session if that workspace is gone).
    resume_workspace: bool = False
    # On success the workspace is left in place (its path returned) for the caller
    # to remove with ``discard_workspace(request)`` once it has recorded the result
    # durably: a crash in between must not leave a resumed task without it.
    keep_workspace_on_success: bool = False
    session_group_key: str | None = None
    timeout_seconds: float = 3600.0
    container_limits: ContainerLimits = ContainerLimits()
    reuse_container: bool = True
    finalize: bool = True
    retry_config: RetryConfig = RetryConfig()
    docker_image: str = "claude-code"
    plugin_name: str = "claude-code"
    # The plugin itself, resolved once when orchestration scheduled the task (None: look it up by name).
    plugin: RunnerPlugin | None = None
    system_prompt: str | None = None
    append_system_prompt: str | None = None
    max_turns: int | None = None
    import_policy: ImportPolicy = "auto"
    import_conflict_policy: ConflictPolicy = "fail"
    skip_empty_import: bool = True
    # What happens to changes the agent left uncommitted when it exits.
    uncommitted: UncommittedPolicy = "commit"
    # Shell command for the ``command`` plugin (evaluations, checks, merges).
    command: str | None = None
    # Further host branches made present in the isolated clone as read-only refs.
    include_branches: tuple[str, ...] = ()
    # Housekeeping: delete these host branches (only those this run created and
    # nobody has checked out) and run nothing else.
    delete_branches: tuple[str, ...] = ()
    network_egress: NetworkEgress = "online"
    review_workspace_mode: Literal["ro", "rw"] = "ro"
    # shared_objects: the clone borrows the run's read-only object store (one copy of
    # the history per run); full_copy: a clone with objects of its own.
    isolation_mode: IsolationMode = "shared_objects"
    session_volume_scope: Literal["run", "global"] = "run"
    # Extra environment for the agent process (non-secret).
    env: dict[str, str] = msgspec.field(default_factory=dict)
    # Extra container labels from the caller (orchestration labels where its run's lock is).
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    # JSON Schema the agent's final answer must match (passed to the CLI's native
    # structured-output option); the parsed answer comes back as ``RunnerResult.output``.
    output_schema: dict[str, Any] | None = None


class BranchArtifact(msgspec.Struct, frozen=True, kw_only=True):
    type: str = "branch"
    branch_planned: str
    branch_final: str | None
    base: str
    commit: str
    has_changes: bool
    commit_count: int = 0
    lines_added: int = 0
    lines_deleted: int = 0
    # Files the agent left uncommitted, and whether the runner committed them.
    uncommitted_files: int = 0
    auto_committed: bool = False


class Metrics(msgspec.Struct, frozen=True, kw_only=True):
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None  # None: the tool reported no cost and none could be estimated
    duration_s: float = 0.0


class RunnerResult(msgspec.Struct, frozen=True, kw_only=True):
    status: Status
    instance_id: str
    artifact: BranchArtifact | None = None
    final_message: str = ""
    metrics: Metrics = Metrics()
    session_id: str | None = None
    error_type: ErrorCategory | None = None
    error: str | None = None
    exit_code: int | None = None
    retry_attempts: int = 0
    started_at: str | None = None
    completed_at: str | None = None
    container_name: str | None = None
    log_path: str | None = None
    workspace_path: str | None = None
    # The agent's answer parsed and validated against ``request.output_schema``.
    output: Any = None

    @property
    def cost(self) -> float | None:
        return self.metrics.cost_usd

    @property
    def tokens_total(self) -> int:
        return self.metrics.tokens_in + self.metrics.tokens_out

    @property
    def has_changes(self) -> bool:
        return bool(self.artifact and self.artifact.has_changes)
