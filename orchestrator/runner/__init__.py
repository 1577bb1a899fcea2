"""The runner layer: run exactly one task in isolation and return its result.

Public surface::

    run_instance(prompt, repo_path, **fields) -> RunnerResult   # spec §3.2
    DockerRunner(auth=..., logs_dir=...)                          # TaskRunner for orchestration
    docker_available / image_exists / container_exists / list_containers /
    stop_run_containers / remove_containers                       # helpers for orchestration
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
from .types import (
    AuthConfig,
    BranchArtifact,
    ContainerLimits,
    InstanceRequest,
    Metrics,
    Hardening,
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
    "Hardening",
    "RetryConfig",
    "RunnerEventCallback",
    "RunnerResult",
    "TaskRunner",
    "container_exists",
    "docker_available",
    "image_exists",
    "list_containers",
    "remove_containers",
    "run_instance",
    "stop_run_containers",
]
