"""The runner layer: run exactly one task in isolation and return its result.

This package is the only door into the runner: the application imports the
names below from ``orchestrator.runner``. Its modules are private, but for the
contract the engine and the plugins are written against: ``types`` (a task's
request and result), ``plugin`` and ``structured`` (what a plugin is),
``base`` (what a runner is) and ``registry`` (where plugins are found).
tests/test_import_layers.py checks both; the export table is under ``TYPE_CHECKING`` below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_module
from . import docker_py

docker_py.install()

# Lazy re-exports: importing one runner module (say ``runner.types`` from the
# engine, or the TUI through it) must not load docker-py and the Docker runner.
# The imports under TYPE_CHECKING below are the export table (orchestrator/_lazy.py).
__getattr__, __all__ = lazy_module(__name__)

if TYPE_CHECKING:
    from .base import TaskRunner as TaskRunner
    from .docker_containers import DOCKER_START_HINT as DOCKER_START_HINT
    from .docker_containers import WORKSPACE_VOLUME_PREFIX as WORKSPACE_VOLUME_PREFIX
    from .docker_containers import DockerHost as DockerHost
    from .docker_containers import container_exists as container_exists
    from .docker_containers import docker_available as docker_available
    from .docker_containers import image_exists as image_exists
    from .docker_containers import list_containers as list_containers
    from .docker_containers import remove_containers as remove_containers
    from .docker_containers import remove_run_volumes as remove_run_volumes
    from .docker_containers import run_volumes as run_volumes
    from .docker_containers import shared_host as shared_host
    from .docker_containers import stop_run_containers as stop_run_containers
    from .docker_runner import DockerRunner as DockerRunner
    from .docker_runner import run_instance as run_instance
    from .git_cleanup import delete_run_branches as delete_run_branches
    from .git_cleanup import unheld_branch_claims as unheld_branch_claims
    from .git_cmd import check_branch_name as check_branch_name
    from .git_cmd import run_git as run_git
    from .git_ops import exclude_locally as exclude_locally
    from .git_ops import open_repository as open_repository
    from .git_ops import resolve_base_branch as resolve_base_branch
    from .git_ops import validate_repository as validate_repository
    from .git_ops import workspace_path as workspace_path
    from .git_ops import workspace_root as workspace_root
    from .hosts import HostSpec as HostSpec
    from .hosts import MultiHostRunner as MultiHostRunner
    from .hosts import docker_host as docker_host
    from .hosts import parse_host_flag as parse_host_flag
    from .hosts import resolve_hosts as resolve_hosts
    from .images import image_id as image_id
    from .images import preflight_images as preflight_images
    from .kube_client import ClusterSpec as ClusterSpec
    from .kube_doctor import cluster_checks as cluster_checks
    from .kube_host import KubeHost as KubeHost
    from .kube_images import check_cluster_image as check_cluster_image
    from .kube_images import image_to_cluster as image_to_cluster
    from .kube_runner import KubernetesRunner as KubernetesRunner
    from .kube_runner import KubeSettings as KubeSettings
    from .object_cache import ObjectCacheSettings as ObjectCacheSettings
    from .object_cache import list_caches as list_caches
    from .object_cache import remove_caches as remove_caches
    from .plugin import RunnerPlugin as RunnerPlugin
    from .registry import PLUGIN_MODULES as PLUGIN_MODULES
    from .registry import check_model as check_model
    from .registry import get_plugin as get_plugin
    from .registry import register_plugins as register_plugins
    from .run_folder import release_run_folder as release_run_folder
    from .transport import transport_risk as transport_risk
    from .transport import transport_warnings as transport_warnings
    from .types import SEED_LABEL as SEED_LABEL
    from .types import AuthConfig as AuthConfig
    from .types import BranchArtifact as BranchArtifact
    from .types import ContainerLimits as ContainerLimits
    from .types import Hardening as Hardening
    from .types import InstanceRequest as InstanceRequest
    from .types import Metrics as Metrics
    from .types import RetryConfig as RetryConfig
    from .types import RunnerResult as RunnerResult
