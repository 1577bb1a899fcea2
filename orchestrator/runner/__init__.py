"""The runner layer: run exactly one task in isolation and return its result.

Public surface::

    run_instance(prompt, repo_path, **fields) -> RunnerResult   # spec §3.2
    DockerRunner(auth=..., logs_dir=...)                          # TaskRunner for orchestration
    docker_available / image_exists / container_exists / list_containers /
    stop_run_containers / remove_containers                       # helpers for orchestration
    check_model(plugin_name, model)                               # scheduling-time model check
"""

from .base import RunnerEventCallback, TaskRunner
from .docker_containers import (
    DockerHost,
    container_exists,
    docker_available,
    image_exists,
    list_containers,
    remove_containers,
    stop_run_containers,
)
from .docker_runner import DockerRunner, run_instance
from .plugin import check_model, supports_resume
from .types import (
    AuthConfig,
    BranchArtifact,
    ContainerLimits,
    InstanceRequest,
    Metrics,
    RetryConfig,
    RunnerResult,
)

__all__ = [
    "AuthConfig",
    "BranchArtifact",
    "ContainerLimits",
    "DockerHost",
    "DockerRunner",
    "InstanceRequest",
    "Metrics",
    "RetryConfig",
    "RunnerEventCallback",
    "RunnerResult",
    "TaskRunner",
    "check_model",
    "container_exists",
    "docker_available",
    "image_exists",
    "list_containers",
    "remove_containers",
    "run_instance",
    "stop_run_containers",
    "supports_resume",
]
