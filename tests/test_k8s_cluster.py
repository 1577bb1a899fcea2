"""The Kubernetes test cluster itself: what the backend's tests rely on, and that it keeps to loopback."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import SLIM_TEST_IMAGE, _slim_test_image
from k8s_cluster import BRIDGE, HOME, NAMESPACE, ensure_cluster, ensure_image, kubectl, pids

# on the Kubernetes tests' worker (tests/test_kubernetes.py says why)
pytestmark = [pytest.mark.kubernetes, pytest.mark.docker, pytest.mark.xdist_group("kubernetes")]


@pytest.fixture(scope="module")
def cluster():
    return ensure_cluster()


def _sockets_of(pid: int) -> list[tuple[str, str, str]]:
    """(state, local, peer) of every TCP and UDP socket the process holds."""
    out = subprocess.run(["ss", "-H", "-tuanp"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        if f"pid={pid}," not in line:
            continue
        fields = line.split()
        found.append((fields[1], fields[4], fields[5]))
    return found


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.split("%", 1)[0]


def _loopback_or_unbound(host: str) -> bool:
    if host == "*":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_the_cluster_listens_and_talks_on_loopback_only(cluster):
    """No cluster process listens on, or talks to, an address other than 127.0.0.0/8 or ::1."""
    running = pids()
    assert set(running) >= {"etcd", "kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager"}
    seen = 0
    for name, pid in running.items():
        for state, local, peer in _sockets_of(pid):
            seen += 1
            assert _loopback_or_unbound(_host(local)) or (state == "UNCONN" and _host(local) == "*"), (name, local)
            if state == "LISTEN":
                assert _host(local) in ("127.0.0.1", "::1"), f"{name} listens on {local}"
            elif _host(peer) != "*":
                assert _loopback_or_unbound(_host(peer)), f"{name} talks to {peer}"
    assert seen > 5  # the API server at least holds etcd's and the kubelet's connections


def test_the_kubelet_holds_no_cloud_metadata_client():
    """kubelet 1.20 asks 169.254.169.254 at start through its cloud credential providers and cAdvisor's
    cloud detection; the test cluster's kubelet is built without them."""
    kubelet = (HOME / "bin" / "kubelet").read_bytes() if (HOME / "bin" / "kubelet").exists() else None
    if kubelet is None:
        pytest.skip("no Kubernetes test cluster built")
    assert b"169.254.169.254" not in kubelet
    assert b"metadata.google.internal" not in kubelet


def test_a_hardened_pod_runs_takes_stdin_and_binds_a_claim(cluster):
    """What the backend's Pods need: uid 1000, no capabilities, a read-only root, the runtime's seccomp
    filter, exec with stdin, a bound claim; and a Pod has no route off its bridge and logs into the
    cluster's folder, not the machine's /var/log/pods."""
    ensure_image(_slim_test_image())
    name = f"probe-{int(time.time() * 1000) % 10**9}"
    manifest = f"""
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 10Mi}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true, seccompProfile: {{type: RuntimeDefault}}}}
  containers:
  - name: main
    image: {SLIM_TEST_IMAGE}:latest
    imagePullPolicy: Never
    command: [sleep, "600"]
    resources: {{requests: {{cpu: 50m, memory: 32Mi}}, limits: {{cpu: 50m, memory: 32Mi}}}}
    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}
    volumeMounts: [{{name: home, mountPath: /home}}]
  volumes: [{{name: home, persistentVolumeClaim: {{claimName: {name}}}}}]
"""
    kubectl("apply", "-f", "-", input=manifest)
    try:
        kubectl("-n", NAMESPACE, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")
        assert kubectl("-n", NAMESPACE, "get", "pvc", name, "-o", "jsonpath={.status.phase}").stdout == "Bound"
        status = kubectl("-n", NAMESPACE, "get", "pod", name, "-o", "jsonpath={.status.phase}").stdout
        assert status == "Running"
        probe = (
            "cat; id -u; touch /probe 2>&1; touch /home/made && echo home-writable;"
            " grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; cat /proc/net/route"
        )
        out = kubectl("-n", NAMESPACE, "exec", "-i", name, "--", "sh", "-c", probe, input="through stdin\n").stdout
        lines = out.splitlines()
        assert lines[0] == "through stdin"
        assert lines[1] == "1000"
        assert "Read-only file system" in lines[2]
        assert lines[3] == "home-writable"
        assert re.fullmatch(r"CapEff:\s+0+", lines[4])
        assert re.fullmatch(r"NoNewPrivs:\s+1", lines[5])
        assert re.fullmatch(r"Seccomp:\s+2", lines[6]), "RuntimeDefault is a seccomp filter (mode 2)"
        routes = [line.split() for line in lines[8:]]
        assert routes, out
        # /proc/net/route: Iface Destination Gateway ...; a default route has destination 00000000
        assert all(route[1] != "00000000" and route[2] == "00000000" for route in routes), out
        # and the bridge holds no address of the host's that a Pod could reach
        bridge = subprocess.run(["ip", "-o", "addr", "show", "dev", BRIDGE], capture_output=True, text=True, check=True)
        assert " inet " not in bridge.stdout, bridge.stdout
        uid = kubectl("-n", NAMESPACE, "get", "pod", name, "-o", "jsonpath={.metadata.uid}").stdout
        assert (HOME / "state" / "logs" / "pods" / f"{NAMESPACE}_{name}_{uid}").is_dir()
        assert not list(Path("/var/log/pods").glob(f"*_{uid}"))
    finally:
        kubectl("-n", NAMESPACE, "delete", "pod", name, "--wait=false", check=False)
        kubectl("-n", NAMESPACE, "delete", "pvc", name, "--wait=false", check=False)


def test_the_kubelet_adds_no_iptables_chain(cluster):
    """The kubelet's KUBE-FIREWALL and KUBE-MARK-* chains would go into the machine's iptables."""
    for table in ("filter", "nat", "mangle"):
        r = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True, check=True)
        assert "KUBE-" not in r.stdout, (table, [line for line in r.stdout.splitlines() if "KUBE-" in line])


def _wait(what: str, seconds: float, check) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(1)


def test_a_pod_gets_its_service_account_and_is_collected_with_its_owner(cluster):
    """The controller manager gives the namespace a default ServiceAccount with a token, and its
    garbage collector deletes a Pod whose owner is deleted."""
    ensure_image(_slim_test_image())
    name = f"owned-{int(time.time() * 1000) % 10**9}"
    kubectl("-n", NAMESPACE, "create", "configmap", name)
    owner_uid = kubectl("-n", NAMESPACE, "get", "configmap", name, "-o", "jsonpath={.metadata.uid}").stdout
    manifest = f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NAMESPACE}
  ownerReferences: [{{apiVersion: v1, kind: ConfigMap, name: {name}, uid: {owner_uid}}}]
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}}
  containers:
  - name: main
    image: {SLIM_TEST_IMAGE}:latest
    imagePullPolicy: Never
    command: [sleep, "600"]
"""
    try:
        kubectl("apply", "-f", "-", input=manifest)
        kubectl("-n", NAMESPACE, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s")
        secrets = "/var/run/secrets/kubernetes.io/serviceaccount"
        out = kubectl(
            "-n", NAMESPACE, "exec", name, "--", "sh", "-c", f"cat {secrets}/namespace; echo; wc -c <{secrets}/token"
        )
        namespace, token_bytes = out.stdout.split()
        assert namespace == NAMESPACE
        assert int(token_bytes) > 100
        kubectl("-n", NAMESPACE, "delete", "configmap", name)
        _wait(
            "the garbage collector deletes the Pod",
            90,
            lambda: kubectl("-n", NAMESPACE, "get", "pod", name, check=False).returncode != 0,
        )
    finally:
        kubectl("-n", NAMESPACE, "delete", "pod", name, "--wait=false", "--ignore-not-found", check=False)
        kubectl("-n", NAMESPACE, "delete", "configmap", name, "--ignore-not-found", check=False)


def test_a_deleted_claims_volume_is_emptied_and_available_again(cluster):
    """The test cluster has a fixed set of hostPath volumes: the controller manager's recycler empties
    the volume of a deleted claim (keeping the folder and its owner, uid 1000) so it can bind again."""
    name = f"recycled-{int(time.time() * 1000) % 10**9}"
    claim = f"""
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 10Mi}}}}}}
"""
    kubectl("apply", "-f", "-", input=claim)
    try:
        _wait(
            "the claim binds",
            60,
            lambda: kubectl("-n", NAMESPACE, "get", "pvc", name, "-o", "jsonpath={.status.phase}").stdout == "Bound",
        )
        volume = kubectl("-n", NAMESPACE, "get", "pvc", name, "-o", "jsonpath={.spec.volumeName}").stdout
        folder = Path(kubectl("get", "pv", volume, "-o", "jsonpath={.spec.hostPath.path}").stdout)
        (folder / "session" / "deep").mkdir(parents=True)
        (folder / "session" / "deep" / "state.json").write_text("{}")
        (folder / ".hidden").write_text("x")
        os.symlink("/etc/hostname", folder / "link")
    finally:
        kubectl("-n", NAMESPACE, "delete", "pvc", name, "--wait=false", check=False)
    _wait(
        f"volume {volume} is Available again",
        150,
        lambda: kubectl("get", "pv", volume, "-o", "jsonpath={.status.phase}").stdout == "Available",
    )
    assert list(folder.iterdir()) == []
    assert folder.stat().st_uid == 1000
    assert Path("/etc/hostname").exists()
