"""The run's image on a cluster's nodes: is it there, and loading it where nodes cannot pull.

A node lists the images it holds in its status (``status.images[].names``);
reading nodes needs a cluster-wide permission, so a cluster that refuses it is
not checked (a Pod whose image is missing then fails its task with the
cluster's own reason, ``ErrImagePull`` or ``ErrImageNeverPull``).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from ..errors import PreflightError, RunnerError

if TYPE_CHECKING:
    from .kube_host import KubeHost


def reference(image: str) -> str:
    """``image`` as a container runtime names it: ``claude-code`` is ``docker.io/library/claude-code:latest``."""
    name, digest = image, ""
    if "@" in name:
        name, digest = name.split("@", 1)
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    if digest:
        return f"{name}@{digest}"
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name


def _ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []) and not (
        node.spec and node.spec.unschedulable
    )


async def nodes_lacking(host: KubeHost, image: str) -> tuple[list[str], int]:
    """(Ready nodes without ``image``, number of Ready nodes). Raises RunnerError when nodes cannot be read."""
    core = await host.core()
    nodes = await host.call("list nodes", core.list_node)
    want = {image, reference(image)}
    ready = [n for n in nodes.items if _ready(n)]
    missing = [
        n.metadata.name for n in ready if not any(want & set(entry.names or []) for entry in n.status.images or [])
    ]
    return missing, len(ready)


async def check_cluster_image(host: KubeHost, image: str, *, load_command: str | None, sync: bool) -> str:
    """Pre-flight: every Ready node holds ``image`` (loaded with ``load_command`` under ``--sync-image``);
    one line for the user or "", or PreflightError naming the nodes that lack it and the fix."""
    try:
        missing, total = await nodes_lacking(host, image)
    except RunnerError as exc:
        return f"note: the cluster's nodes cannot be read ({exc}); a missing image fails its task with the cluster's reason"
    if total == 0:
        raise PreflightError("the Kubernetes cluster has no Ready node to run tasks on")
    if not missing:
        return ""
    if sync and load_command:
        await anyio.to_thread.run_sync(load_image, load_command, image)
        missing, total = await nodes_lacking(host, image)
        if not missing:
            return ""
        raise PreflightError(
            f"image {image} is still missing on node(s) {', '.join(missing)} after `{load_command} {image}`"
        )
    ref = reference(image)
    if load_command:
        fix = f"pass --sync-image to load it with `{load_command} {image}`"
    else:
        fix = (
            f"push it where the nodes pull from (docker tag {image} REGISTRY/{image} && docker push "
            f"REGISTRY/{image}, then --docker-image REGISTRY/{image}), or set runner.kubernetes.load_command "
            "to a command that loads an image into the nodes and pass --sync-image"
        )
    raise PreflightError(f"image {image} ({ref}) is not on node(s) {', '.join(missing)} of the cluster; {fix}")


def image_to_cluster(load_command: str | None, image: str) -> None:
    """After ``--build-image`` on a Kubernetes run: the image into the nodes with the configured
    loader, or one line naming the reference the user must push (the nodes cannot see this engine)."""
    if load_command:
        load_image(load_command, image)
        return
    print(
        f"note: {image} is built on this machine's Docker engine only; the cluster's nodes need "
        f"{reference(image)}: push it where they pull from (docker tag {image} REGISTRY/{image} && "
        f"docker push REGISTRY/{image}, then --docker-image REGISTRY/{image}), or set "
        "runner.kubernetes.load_command to a command that loads an image into the nodes",
        file=sys.stderr,
        flush=True,
    )


def load_image(load_command: str, image: str) -> None:
    """Run the configured loader (``load_command IMAGE``), its output on stderr."""
    argv = [*shlex.split(load_command), image]
    print(f"loading image {image} into the cluster: {shlex.join(argv)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(argv, stdout=sys.stderr, stderr=sys.stderr, check=False)
    except OSError as exc:
        raise PreflightError(f"runner.kubernetes.load_command {load_command!r} cannot run: {exc}") from None
    if proc.returncode != 0:
        raise PreflightError(
            f"loading image {image} into the cluster failed (`{shlex.join(argv)}` exited {proc.returncode})"
        )
