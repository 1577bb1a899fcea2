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

from .._lazy import exports, lazy_attr
from . import docker_py

docker_py.install()

# Lazy re-exports: importing one runner module (say ``runner.types`` from the
# engine, or the TUI through it) must not load docker-py and the Docker runner.
_EXPORTS = exports(
    {
        "base": ("RunnerEventCallback", "TaskRunner"),
        "docker_containers": (
            "DockerHost",
            "container_exists",
            "docker_available",
            "image_exists",
            "list_containers",
            "remove_containers",
            "stop_run_containers",
        ),
        "docker_runner": ("DockerRunner", "run_instance"),
        "kube_client": ("ClusterSpec",),
        "kube_host": ("KubeHost",),
        "kube_runner": ("KubeSettings", "KubernetesRunner"),
        "object_cache": ("ObjectCacheSettings",),
        "registry": ("check_model", "supports_resume"),
        "git_cleanup": ("delete_run_branches", "unheld_branch_claims"),
        "run_folder": ("release_run_folder",),
        "types": (
            "AuthConfig",
            "BranchArtifact",
            "ContainerLimits",
            "InstanceRequest",
            "Metrics",
            "Hardening",
            "RetryConfig",
            "RunnerResult",
        ),
    }
)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .base import RunnerEventCallback as RunnerEventCallback
    from .base import TaskRunner as TaskRunner
    from .docker_containers import DockerHost as DockerHost
    from .docker_containers import container_exists as container_exists
    from .docker_containers import docker_available as docker_available
    from .docker_containers import image_exists as image_exists
    from .docker_containers import list_containers as list_containers
    from .docker_containers import remove_containers as remove_containers
    from .docker_containers import stop_run_containers as stop_run_containers
    from .docker_runner import DockerRunner as DockerRunner
    from .docker_runner import run_instance as run_instance
    from .git_cleanup import delete_run_branches as delete_run_branches
    from .git_cleanup import unheld_branch_claims as unheld_branch_claims
    from .kube_client import ClusterSpec as ClusterSpec
    from .kube_host import KubeHost as KubeHost
    from .kube_runner import KubernetesRunner as KubernetesRunner
    from .kube_runner import KubeSettings as KubeSettings
    from .object_cache import ObjectCacheSettings as ObjectCacheSettings
    from .registry import check_model as check_model
    from .registry import supports_resume as supports_resume
    from .run_folder import release_run_folder as release_run_folder
    from .types import AuthConfig as AuthConfig
    from .types import BranchArtifact as BranchArtifact
    from .types import ContainerLimits as ContainerLimits
    from .types import Hardening as Hardening
    from .types import InstanceRequest as InstanceRequest
    from .types import Metrics as Metrics
    from .types import RetryConfig as RetryConfig
    from .types import RunnerResult as RunnerResult


def __getattr__(name: str) -> Any:
    return lazy_attr(__name__, _EXPORTS, name)
