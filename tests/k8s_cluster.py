"""The real Kubernetes cluster the Kubernetes tests run against (scripts/setup-k8s.sh).

The cluster is built once into ``ORCHESTRATOR_K8S_HOME`` and started once per
machine: ``scripts/test.sh`` starts it before the tests and stops it after, and a
test session started by hand starts it here if it is built. Where it is not
built, the Kubernetes tests are skipped with that reason, except under the test
command or CI, where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "setup-k8s.sh"
HOME = Path(os.environ.get("ORCHESTRATOR_K8S_HOME", "/var/cache/orchestrator-k8s"))
RUN = HOME / "run"
KUBECONFIG = RUN / "kubeconfig"
NAMESPACE = "orchestrator-test"
# the Pods' bridge on the host (scripts/setup-k8s.sh: orck8s<ORCHESTRATOR_K8S_INSTANCE>)
BRIDGE = f"orck8s{os.environ.get('ORCHESTRATOR_K8S_INSTANCE', '0')}"
PROCESSES = ("etcd", "containerd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")


def required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("ORCHESTRATOR_TESTS_REQUIRE_K8S"))


def ensure_cluster() -> Path:
    """The admin kubeconfig of a running cluster, started here when it is built but stopped."""
    if not (HOME / "bin" / "kubelet").exists():
        reason = f"no Kubernetes test cluster built in {HOME} (run: bash scripts/setup-k8s.sh build)"
        if required():
            pytest.fail(reason)
        pytest.skip(reason)
    r = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"scripts/setup-k8s.sh start failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return KUBECONFIG


def kubectl(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(KUBECONFIG), *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=180,
        check=check,
    )


def pids() -> dict[str, int]:
    return {name: int((RUN / f"{name}.pid").read_text()) for name in PROCESSES if (RUN / f"{name}.pid").exists()}


def ensure_image(image: str) -> None:
    """``image`` of the host engine present in the cluster's containerd (its nodes cannot pull)."""
    ref = image if "/" in image else f"docker.io/library/{image}"
    sock = RUN / "containerd" / "containerd.sock"
    have = subprocess.run(
        ["ctr", "--address", str(sock), "-n", "k8s.io", "images", "ls", "-q"], capture_output=True, text=True
    ).stdout.split()
    if ref in have:
        return
    r = subprocess.run(["bash", str(SCRIPT), "load-image", image], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"loading {image} into the cluster failed:\n{r.stderr[-2000:]}")
