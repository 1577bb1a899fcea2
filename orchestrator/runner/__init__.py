"""The runner layer: run exactly one task in isolation and return its result.

Public surface::

    run_instance(prompt, repo_path, **fields) -> RunnerResult   # one task, ad hoc or scripted
    DockerRunner(auth=..., logs_dir=...)                          # TaskRunner for orchestration
    KubernetesRunner(cluster=ClusterSpec(...), ...)               # the same, one Pod per task
    docker_available / image_exists / container_exists / list_containers /
    stop_run_containers / remove_containers                       # helpers for orchestration
    check_model(plugin_name, model)                               # scheduling-time model check
    delete_run_branches(repo, names, run_id=...)                  # a run's own branches, safely
    unheld_branch_claims(repo, [(branch, commit), ...])           # read-only: is each commit on its branch
    release_run_folder(run_id, repo)                              # a finished run's store and indexes, gone
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._lazy import lazy_attr
from . import docker_py

docker_py.install()

# Lazy re-exports: importing one runner module (say ``runner.types`` from the
# engine, or the TUI through it) must not load docker-py and the Docker runner.
_EXPORTS = {
    "RunnerEventCallback": "base",
    "TaskRunner": "base",
    "DockerHost": "docker_containers",
    "container_exists": "docker_containers",
    "docker_available": "docker_containers",
    "image_exists": "docker_containers",
    "list_containers": "docker_containers",
    "remove_containers": "docker_containers",
    "stop_run_containers": "docker_containers",
    "DockerRunner": "docker_runner",
    "ClusterSpec": "kube_client",
    "KubeHost": "kube_host",
    "KubeSettings": "kube_runner",
    "KubernetesRunner": "kube_runner",
    "ObjectCacheSettings": "object_cache",
    "run_instance": "docker_runner",
    "check_model": "registry",
    "supports_resume": "registry",
    "delete_run_branches": "git_cleanup",
    "unheld_branch_claims": "git_cleanup",
    "release_run_folder": "run_folder",
    "AuthConfig": "types",
    "BranchArtifact": "types",
    "ContainerLimits": "types",
    "InstanceRequest": "types",
    "Metrics": "types",
    "Hardening": "types",
    "RetryConfig": "types",
    "RunnerResult": "types",
}

if TYPE_CHECKING:
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
    from .git_cleanup import delete_run_branches, unheld_branch_claims
    from .kube_client import ClusterSpec
    from .kube_host import KubeHost
    from .kube_runner import KubernetesRunner, KubeSettings
    from .object_cache import ObjectCacheSettings
    from .registry import check_model, supports_resume
    from .run_folder import release_run_folder
    from .types import (
        AuthConfig,
        BranchArtifact,
        ContainerLimits,
        Hardening,
        InstanceRequest,
        Metrics,
        RetryConfig,
        RunnerResult,
    )


def __getattr__(name: str) -> Any:
    return lazy_attr(__name__, _EXPORTS, name)


__all__ = [
    "AuthConfig",
    "BranchArtifact",
    "ClusterSpec",
    "ContainerLimits",
    "DockerHost",
    "DockerRunner",
    "Hardening",
    "InstanceRequest",
    "KubeHost",
    "KubeSettings",
    "KubernetesRunner",
    "Metrics",
    "ObjectCacheSettings",
    "RetryConfig",
    "RunnerEventCallback",
    "RunnerResult",
    "TaskRunner",
    "check_model",
    "container_exists",
    "delete_run_branches",
    "docker_available",
    "image_exists",
    "list_containers",
    "release_run_folder",
    "remove_containers",
    "run_instance",
    "stop_run_containers",
    "supports_resume",
    "unheld_branch_claims",
]
