"""The Kubernetes backend against a real cluster (scripts/setup-k8s.sh), through the real command.

No mock of the Kubernetes API: every test runs ``orchestrator`` with
``--kubeconfig``/``--namespace`` against the test cluster, in a namespace of
its own, and reads back what the cluster holds with kubectl.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import _slim_test_image

# One worker runs every Kubernetes test, one after another: the slim image is
# loaded into the node once instead of once per worker (other workers waited a
# minute each on the load), and a test that freezes the node's kubelet hits no
# other test's Pods, so it need not wait for the run's exclusive tail.
pytestmark = [pytest.mark.kubernetes, pytest.mark.docker, pytest.mark.xdist_group("kubernetes")]

from k8s_cluster import HOME as K8S_HOME  # noqa: E402
from k8s_cluster import KUBECONFIG  # noqa: E402

SECRET = "sk-ant-api03-k8stestSECRETvalue0123456789abcdefXYZ"


def _kubectl(*args: str, kubeconfig: Path = KUBECONFIG, check: bool = True, input: str | None = None) -> str:
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=120, input=input
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
    return proc.stdout


@pytest.fixture(scope="session")
def k8s():
    """The test cluster, started (idempotent), with this session's slim test image loaded; a namespace of its own."""
    from k8s_cluster import SCRIPT, ensure_cluster

    ensure_cluster()
    script = SCRIPT
    image = _slim_test_image()
    local_id = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True
    ).stdout.strip()
    marker = K8S_HOME / "run" / f"loaded-{image}"
    # Every xdist worker with a Kubernetes test comes here: one loads, the others wait for it.
    with open(K8S_HOME / "run" / "load-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        images = _kubectl("get", "nodes", "-o", "jsonpath={.items[*].status.images[*].names}")
        if f"docker.io/library/{image}:latest" not in images or not marker.exists() or marker.read_text() != local_id:
            load = subprocess.run(
                ["bash", str(script), "load-image", image], capture_output=True, text=True, timeout=900
            )
            if load.returncode != 0:
                pytest.fail(f"load-image {image} failed:\n{load.stdout[-2000:]}{load.stderr[-2000:]}")
            marker.write_text(local_id)
    namespace = f"orc-k8s-test-{os.getpid()}"
    _kubectl("create", "namespace", namespace)
    try:
        yield {"kubeconfig": str(KUBECONFIG), "namespace": namespace, "image": image}
    finally:
        _kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    (repo / "README.md").write_text("hello\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "init"], cwd=repo, check=True, env=env)
    return repo


def _config(tmp_path: Path, k8s: dict, **extra: object) -> Path:
    lines = [
        "runner:",
        f"  docker_image: {k8s['image']}",
        "  container_cpu: 0.25",
        "  container_memory: 256m",
        "  backoff_base_s: 1",
        "  kubernetes:",
        "    image_pull_policy: Never",
        "    pending_timeout_s: 120",
    ]
    lines += [f"    {k}: {v}" for k, v in extra.items()]
    path = tmp_path / "k8s.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cli(tmp_path: Path, k8s: dict, repo: Path, *args: str, config: Path | None = None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "orchestrator.app.cli",
        *args,
        "--no-tui",
        "--kubeconfig",
        k8s["kubeconfig"],
        "--namespace",
        k8s["namespace"],
        "--config",
        str(config or _config(tmp_path, k8s)),
    ]


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ORCHESTRATOR_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "ORCHESTRATOR_ORCHESTRATION__MIN_FREE_DISK_GB": "0",
        "ORCHESTRATOR_ORCHESTRATION__HARD_MIN_FREE_DISK_GB": "0",
        "ANTHROPIC_API_KEY": SECRET,
    }


def _pods(k8s: dict, run_id: str | None = None) -> list[dict]:
    selector = "orchestrator=true" + (f",run_id={run_id}" if run_id else "")
    return json.loads(_kubectl("get", "pods", "-n", k8s["namespace"], "-l", selector, "-o", "json"))["items"]


def _events(repo: Path, run_id: str) -> list[dict]:
    return [json.loads(line) for line in (repo / "logs" / run_id / "events.jsonl").read_text().splitlines()]


def _runner_log(repo: Path, run_id: str) -> list[dict]:
    return [json.loads(line) for line in (repo / "logs" / run_id / "runner.jsonl").read_text().splitlines() if line]


def _run_id(out: str) -> str:
    for line in out.splitlines():
        if "Run Complete:" in line:
            return line.split("Run Complete:")[1].strip(" ═")
    raise AssertionError(f"no run id in:\n{out[-3000:]}")


def _wait_no_pods(k8s: dict, run_id: str, within_s: float = 150) -> None:
    # A deleted Pod is gone once the kubelet has stopped it. Kubernetes 1.20's kubelet
    # that finds the container already gone ("Failed killing the pod ... NotFound", seen
    # under six test workers' load) tries again only at its next sync, up to a minute on.
    t0 = time.monotonic()
    while _pods(k8s, run_id):
        assert time.monotonic() - t0 < within_s, "the run's Pods were not removed"
        time.sleep(0.5)


def _watch_first_pod(k8s: dict, seen: list[dict], stop: threading.Event) -> None:
    while not stop.is_set() and not seen:
        for pod in _pods(k8s):
            if (pod.get("status") or {}).get("phase") == "Running":
                seen.append(pod)
                return
        time.sleep(0.3)


def _best_of_n_watched(tmp_path: Path, k8s: dict, watch, into: list, *args: str):
    """A best-of-n dry run with ``watch(k8s, into, stop)`` sampling the namespace on a thread meanwhile."""
    repo = _repo(tmp_path)
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(k8s, into, stop), daemon=True)
    watcher.start()
    prompt = "SIM: write a.txt hello $TASK\nSIM: commit add a"
    proc = subprocess.run(
        _cli(tmp_path, k8s, repo, prompt, "--strategy", "best-of-n", *args, "--dry-run"),
        cwd=repo,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    stop.set()
    watcher.join(timeout=10)
    return repo, proc


def test_best_of_n_runs_in_pods_with_the_hardening_read_back(tmp_path, k8s):
    """A best-of-n dry run whose tasks run as Pods: the branches come back, each Pod's spec
    carries the hardening (read back from the API), and no credential is in any Pod,
    event or file the run wrote."""
    seen: list[dict] = []
    repo, proc = _best_of_n_watched(tmp_path, k8s, _watch_first_pod, seen, "-S", "n=2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    run_id = _run_id(out)
    assert "NetworkPolicy" in proc.stderr  # the one line saying where offline holds
    branches = subprocess.run(
        ["git", "branch", "--list", f"*{run_id}*"], cwd=repo, capture_output=True, text=True
    ).stdout.split()
    assert len([b for b in branches if b != "*"]) == 2, out[-3000:]
    for name in [b for b in branches if b != "*"]:
        log = subprocess.run(["git", "log", "-1", "--format=%s", name], cwd=repo, capture_output=True, text=True)
        assert log.stdout.strip() == "add a"
    # The hardening, as the API server holds it.
    assert seen, "no Pod of the run was seen running"
    pod = seen[0]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    task = spec["containers"][0]
    sc = task["securityContext"]
    assert sc["runAsUser"] == 1000 and sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert task["resources"]["requests"] == task["resources"]["limits"] == {"cpu": "250m", "memory": "256Mi"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["workspace"] and volumes["tmp"]["emptyDir"]["medium"] == "Memory"
    assert "persistentVolumeClaim" in volumes["home"]
    assert pod["metadata"]["labels"]["orchestrator"] == "true"
    assert pod["metadata"]["labels"]["run_id"] == run_id
    # Credentials: in no Pod spec, event or file of the run.
    assert SECRET not in json.dumps(pod)
    assert SECRET not in _kubectl("get", "events", "-n", k8s["namespace"], "-o", "json")
    for path in [
        *(repo / "logs").rglob("*"),
        *(repo / "orchestrator_state").rglob("*"),
        *(repo / "results").rglob("*"),
    ]:
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    # Finished tasks leave no Pod behind (deleted: gone once the kubelet has stopped them).
    assert all(p["metadata"].get("deletionTimestamp") for p in _pods(k8s, run_id))
    _wait_no_pods(k8s, run_id)
    # --cleanup-run removes the run's session claims.
    claims = _kubectl("get", "pvc", "-n", k8s["namespace"], "-l", f"run_id={run_id}", "-o", "name").split()
    assert claims
    clean = subprocess.run(
        _cli(tmp_path, k8s, repo, "--cleanup-run", run_id), cwd=repo, env=_env(tmp_path), capture_output=True, text=True
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert _kubectl("get", "pvc", "-n", k8s["namespace"], "-l", f"run_id={run_id}", "-o", "name").split() == []


def _count_live_pods(k8s: dict, peak: list[int], stop: threading.Event) -> None:
    """The most Pods of the namespace alive at once (a Pod being deleted no longer counts)."""
    while not stop.is_set():
        live = [p for p in _pods(k8s) if not p["metadata"].get("deletionTimestamp")]
        peak.append(len(live))
        time.sleep(0.2)


def test_max_parallel_caps_the_runs_pods(tmp_path, k8s):
    """--max-parallel 1: the cluster never holds two of the run's Pods at once, though
    best-of-n has three candidates (and their reviews) ready together."""
    peak: list[int] = []
    repo, proc = _best_of_n_watched(tmp_path, k8s, _count_live_pods, peak, "-S", "n=3", "--max-parallel", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    run_id = _run_id(out)
    started = [e for e in _events(repo, run_id) if e["type"] == "task.started"]
    assert len(started) >= 3, out[-3000:]
    assert max(peak) == 1, f"Pods alive at once, sampled: {sorted(set(peak))}"


def _start(tmp_path: Path, k8s: dict, repo: Path, prompt: str) -> subprocess.Popen:
    out = open(tmp_path / "first.out", "w")  # noqa: SIM115
    return subprocess.Popen(
        _cli(tmp_path, k8s, repo, prompt, "--dry-run"),
        cwd=repo,
        env=_env(tmp_path),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_for_agent(repo: Path, deadline_s: float = 180) -> str:
    """The run id once its agent runs in its Pod."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        for log in (repo / "logs").glob("run_*/runner.jsonl"):
            if '"runner.exec.started"' in log.read_text(errors="replace"):
                return log.parent.name
        time.sleep(0.3)
    raise AssertionError("the agent never started")


def test_a_deleted_pod_is_placed_again(tmp_path, k8s):
    """The Pod deleted mid-task: the task runs again in a new Pod and completes; the
    event log records it as a Docker host loss (host_down, error_type docker)."""
    repo = _repo(tmp_path)
    proc = _start(tmp_path, k8s, repo, "SIM: write a.txt hi\nSIM: sleep 6\nSIM: commit add a")
    try:
        run_id = _wait_for_agent(repo)
        pods = _pods(k8s, run_id)
        assert len(pods) == 1
        _kubectl("delete", "pod", "-n", k8s["namespace"], pods[0]["metadata"]["name"], "--wait=false")
        assert proc.wait(timeout=300) == 0, (tmp_path / "first.out").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    runner = _runner_log(repo, run_id)
    replaced = [e for e in runner if e.get("message") == "runner.host.replaced"]
    assert replaced and "was deleted" in replaced[0]["error"] and replaced[0]["error_type"] == "docker"
    sessions = [e["payload"] for e in _events(repo, run_id) if e["type"] == "task.session"]
    assert any(s.get("reason") == "host_down" and s.get("error_type") == "docker" for s in sessions), sessions
    completed = [e for e in _events(repo, run_id) if e["type"] == "task.completed"]
    assert len(completed) == 1


def test_kill9_and_resume_continues_in_the_pod_and_its_session(tmp_path, k8s):
    """kill -9 of the orchestrator mid-task: the Pod keeps running; --resume finds it by
    name, ends the orphaned agent, continues the agent's session from its claim in the
    same workspace, and the task completes once."""
    repo = _repo(tmp_path)
    proc = _start(tmp_path, k8s, repo, "SIM: write a.txt hi\nSIM: commit add a\nSIM: sleep 8\nSIM: print done")
    try:
        run_id = _wait_for_agent(repo)
        time.sleep(2)  # past the commit
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    pods = _pods(k8s, run_id)
    assert len(pods) == 1 and pods[0]["status"]["phase"] == "Running"
    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.app.cli",
            "--resume",
            run_id,
            "--no-tui",
        ],
        cwd=repo,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    events = _events(repo, run_id)
    completed = [e for e in events if e["type"] == "task.completed"]
    assert len(completed) == 1
    runner = _runner_log(repo, run_id)
    ready = [e for e in runner if e.get("message") == "runner.container.ready"]
    assert ready[-1]["action"] == "restarted", ready  # the same Pod, its orphaned agent ended
    starts = [e for e in runner if e.get("message") == "runner.exec.started"]
    assert starts[-1]["resume_session_id"], starts  # the session continued from its claim
    assert not [e for e in runner if e.get("message") in ("runner.session.no_storage", "runner.session.reset")]
    branch = completed[0]["payload"]["artifact"]["branch_final"]
    log = subprocess.run(["git", "log", "--format=%s", branch], cwd=repo, capture_output=True, text=True)
    assert "add a" in log.stdout
    _wait_no_pods(k8s, run_id)


def _service_account_kubeconfig(tmp_path: Path, k8s: dict, verbs_without: str) -> Path:
    ns = k8s["namespace"]
    sa = "doctor-probe"
    _kubectl("create", "serviceaccount", sa, "-n", ns, check=False)
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]},
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["create", "get", "list", "delete"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    ]
    rules[0]["verbs"].remove(verbs_without)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": sa, "namespace": ns},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": sa, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
    }
    manifest = tmp_path / "rbac.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]}))
    _kubectl("apply", "-f", str(manifest))
    token = ""
    for _ in range(50):
        secrets = _kubectl("get", "sa", sa, "-n", ns, "-o", "jsonpath={.secrets[0].name}")
        if secrets:
            token = base64.b64decode(
                _kubectl("get", "secret", secrets, "-n", ns, "-o", "jsonpath={.data.token}")
            ).decode()
            break
        time.sleep(0.2)
    assert token, "the cluster made no token for the service account"
    admin = json.loads(_kubectl("config", "view", "--raw", "-o", "json"))
    cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa, "namespace": ns}}],
        "current-context": sa,
    }
    path = tmp_path / "sa.kubeconfig"
    path.write_text(json.dumps(config))
    return path


def test_doctor_names_the_verb_a_service_account_lacks(tmp_path, k8s):
    """--doctor with a service account whose Role lacks `delete pods` fails and names it."""
    repo = _repo(tmp_path)
    kubeconfig = _service_account_kubeconfig(tmp_path, k8s, "delete")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.app.cli",
            "--doctor",
            "--dry-run",
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            k8s["namespace"],
            "--docker-image",
            k8s["image"],
        ],
        cwd=repo,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "kubernetes permissions" in ln and ln.startswith("fail"))
    assert "delete pods" in line and "create pods" not in line, line


def test_plain_http_to_another_machine_is_refused(tmp_path, k8s):
    """An API server reached over plain http:// on another machine is refused, before any connection."""
    repo = _repo(tmp_path)
    kubeconfig = tmp_path / "plain.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://k8s.example.invalid:8080"}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.app.cli", "hi", "--dry-run", "--no-tui", "--kubeconfig", str(kubeconfig)],
        cwd=repo,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "plain HTTP to another machine" in proc.stderr and "Traceback" not in proc.stderr


BENCH = """import json, os, sys
n = len(os.listdir("sim")) if os.path.isdir("sim") else 0
print("\\033[32mmeasuring\\033[0m")
sys.stderr.write("\\033[2mwarm-up done\\033[0m\\n")
print(json.dumps({"metrics": {"throughput": 100 + 10 * n}}))
"""


def test_tree_beam_measures_in_pods(tmp_path, k8s):
    """tree-beam, its smallest tree (one idea, depth 1, one measurement each), with every
    task in a Pod: the evaluation command ran in a Pod and its metric came back (the
    committed idea measures above the root), and the candidate's branch exists."""
    repo = _repo(tmp_path)
    (repo / "bench.py").write_text(BENCH)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "bench"], cwd=repo, check=True)
    args = ["raise the benchmark score", "--strategy", "tree-beam", "--dry-run"]
    for setting in (
        "eval_command=python3 bench.py",
        "primary_metric=throughput",
        "ideas_per_node=1",
        "max_depth=1",
        "beam_width=1",
        "eval_repeats=1",
    ):
        args += ["-S", setting]
    proc = subprocess.run(
        _cli(tmp_path, k8s, repo, *args), cwd=repo, env=_env(tmp_path), capture_output=True, text=True, timeout=900
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    run_id = _run_id(out)
    tree = json.loads((repo / "results" / run_id / "strategy_output" / "tree.json").read_text())
    assert tree["nodes"][0]["evaluation"]["metrics"]["throughput"] == 100, tree["nodes"][0]  # the root, measured
    (evaluation,) = tree["evaluations"]
    assert evaluation["status"] == "completed", evaluation
    assert evaluation["evaluation"]["metrics"]["throughput"] > 100, evaluation  # measured after the commit
    assert tree["nodes"][1]["branch"] == evaluation["branch"] and tree["stop_reason"] == "max_depth", tree["nodes"]
    branch = evaluation["branch"]
    assert subprocess.run(["git", "rev-parse", "--verify", branch], cwd=repo, capture_output=True).returncode == 0
    # Every task (coder, ideator, measurements) ran as a Pod; none as a local container.
    runner = _runner_log(repo, run_id)
    placed = [e for e in runner if e.get("message") == "runner.container.ready"]
    assert len(placed) >= 3, placed
    local = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
    ).stdout.split()
    assert local == []
    # The benchmark's colours are taken out where its output arrives, as on Docker.
    written = "".join(
        p.read_text(errors="replace") for d in ("logs", "results") for p in (repo / d).rglob("*") if p.is_file()
    )
    assert "measuring" in written and "warm-up done" in written
    assert "\x1b" not in written and "\\u001b" not in written and "[32m" not in written
    _wait_no_pods(k8s, run_id)


def test_a_pod_pending_past_the_bound_fails_its_task_with_the_clusters_reason(tmp_path, k8s):
    """A task whose CPU request no node has stays Pending: past runner.kubernetes.pending_timeout_s
    its task fails with one line naming the scheduler's reason, and its Pod is deleted."""
    repo = _repo(tmp_path)
    config = _config(tmp_path, k8s, pending_timeout_s=3)
    config.write_text(config.read_text().replace("container_cpu: 0.25", "container_cpu: 64"))
    t0 = time.monotonic()
    proc = subprocess.run(
        _cli(tmp_path, k8s, repo, "SIM: print hi", "--dry-run", config=config),
        cwd=repo,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "Traceback" not in out
    run_id = next(p.name for p in (repo / "logs").glob("run_*"))
    failed = [e["payload"] for e in _events(repo, run_id) if e["type"] == "task.failed"]
    assert failed, out[-3000:]
    message = failed[-1]["message"]
    assert "\n" not in message
    assert "stayed Pending for 3 s (runner.kubernetes.pending_timeout_s)" in message, message
    assert "Unschedulable" in message and "Insufficient cpu" in message, message
    # The one line the user reads says it too.
    assert any("Insufficient cpu" in line for line in out.splitlines()), out[-3000:]
    assert time.monotonic() - t0 < 120
    _wait_no_pods(k8s, run_id)


def test_a_pod_name_held_by_a_finalizer_fails_the_create_with_how_to_see_it(k8s, monkeypatch):
    """A new Pod waits for an old one of its name still being deleted; one a finalizer holds past the
    wait fails the task with a line naming the Pod and how to see what holds it, and once the
    finalizer goes the same create succeeds."""
    import anyio

    from orchestrator.errors import ContainerError
    from orchestrator.runner import kube_host
    from orchestrator.runner.kube_client import ClusterSpec

    monkeypatch.setattr(kube_host, "TERMINATING_WAIT_S", 3.0)
    name = f"orc-held-{os.getpid()}"
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "finalizers": ["orchestrator.test/hold"]},
        "spec": {
            "containers": [
                {"name": "c", "image": k8s["image"], "imagePullPolicy": "Never", "command": ["sleep", "600"]}
            ]
        },
    }
    ns = k8s["namespace"]
    _kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(manifest))
    _kubectl("-n", ns, "delete", "pod", name, "--wait=false", "--grace-period=0")
    fresh = {**manifest, "metadata": {"name": name}}
    # One worker thread: the wait must not hold it, or every other call to the cluster waits too.
    host = kube_host.KubeHost(
        ClusterSpec(kubeconfig=k8s["kubeconfig"], context=None, namespace=ns), limiter=anyio.CapacityLimiter(1)
    )
    order: list[str] = []

    async def other_call() -> None:
        await anyio.sleep(0.5)
        await host.read_pod(name)
        order.append("other call answered")

    async def create() -> None:
        error = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(other_call)
            try:
                await host._create(fresh)
            except ContainerError as exc:
                order.append("create gave up")
                error = exc
        await host.aclose()
        if error is not None:
            raise error

    try:
        t0 = time.monotonic()
        with pytest.raises(ContainerError) as held:
            anyio.run(create)
        message = str(held.value)
        assert time.monotonic() - t0 >= 3, message
        assert f"Pod {name} is still being deleted after 3 s" in message, message
        assert f"kubectl get pod {name} -n {ns} -o jsonpath='{{.metadata.finalizers}}'" in message, message
        assert "--resume" in message and "\n" not in message
        assert order == ["other call answered", "create gave up"], order  # during the wait, not after it
        _kubectl("-n", ns, "patch", "pod", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        monkeypatch.setattr(kube_host, "TERMINATING_WAIT_S", 60.0)  # the kubelet still ends its container
        anyio.run(create)
        assert _kubectl("-n", ns, "get", "pod", name, "-o", "jsonpath={.metadata.deletionTimestamp}") == ""
    finally:
        _kubectl("-n", ns, "patch", "pod", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
        _kubectl("-n", ns, "delete", "pod", name, "--wait=false", "--grace-period=0", check=False)


def _build_image(tmp_path: Path, load_command: str | None) -> subprocess.CompletedProcess[str]:
    from conftest import TEST_BASE_IMAGE

    config = tmp_path / "build.yaml"
    config.write_text(
        "runner:\n  kubernetes:\n    image_pull_policy: Never\n"
        + (f"    load_command: {json.dumps(load_command)}\n" if load_command else "")
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.app.cli",
            "--build-image",
            "--docker-image",
            TEST_BASE_IMAGE,
            "--config",
            str(config),
            "--namespace",
            "orc-build-image",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def test_build_image_loads_the_image_with_the_load_command(tmp_path):
    """--build-image on a Kubernetes config with runner.kubernetes.load_command runs it with the
    image built as its last argument (the nodes cannot pull from this engine)."""
    from conftest import TEST_BASE_IMAGE

    record = tmp_path / "loaded"
    proc = _build_image(tmp_path, f"bash -c 'echo \"$0\" >> {record}'")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record.read_text().split() == [TEST_BASE_IMAGE]
    assert f"loading image {TEST_BASE_IMAGE} into the cluster" in proc.stderr


def test_build_image_without_a_load_command_names_the_reference_to_push(tmp_path):
    """Without a load command: one line naming the image reference the cluster's nodes need pushed."""
    from conftest import TEST_BASE_IMAGE

    from orchestrator.runner.kube_images import reference

    proc = _build_image(tmp_path, None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if reference(TEST_BASE_IMAGE) in ln]
    assert len(lines) == 1 and "push" in lines[0] and "runner.kubernetes.load_command" in lines[0], proc.stderr


def _leftover_pod(k8s: dict, like: dict) -> None:
    """A Pod with the labels and annotations the product gave ``like``, its process ended at once:
    what a run leaves behind when it could not delete its Pod (the API or the process went away)."""
    meta = like["metadata"]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": meta["name"], "labels": meta["labels"], "annotations": meta.get("annotations") or {}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsUser": 1000, "runAsNonRoot": True},
            "containers": [{"name": "task", "image": k8s["image"], "imagePullPolicy": "Never", "args": ["true"]}],
        },
    }
    subprocess.run(
        ["kubectl", "--kubeconfig", k8s["kubeconfig"], "-n", k8s["namespace"], "create", "-f", "-"],
        input=json.dumps(body),
        text=True,
        check=True,
        capture_output=True,
    )
    t0 = time.monotonic()
    while _kubectl("get", "pod", "-n", k8s["namespace"], meta["name"], "-o", "jsonpath={.status.phase}") != "Succeeded":
        assert time.monotonic() - t0 < 120, "the leftover Pod did not end"
        time.sleep(0.5)


def test_a_finished_runs_leftover_pod_goes_with_clean_containers_and_the_orphan_scan(tmp_path, k8s):
    """A Pod of a run that finished (labels as the product sets them) is listed and removed by
    --clean-containers, and removed by the orphan scan when the next run starts."""
    repo = _repo(tmp_path)
    env = {**_env(tmp_path), "ORCHESTRATOR_RUNNER__SUCCESS_RETENTION_HOURS": "0"}
    seen: list[dict] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_first_pod, args=(k8s, seen, stop), daemon=True)
    watcher.start()
    first = subprocess.run(
        _cli(tmp_path, k8s, repo, "SIM: print one", "--dry-run"),
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    stop.set()
    watcher.join(timeout=5)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    run_id = _run_id(first.stdout + first.stderr)
    assert seen and seen[0]["metadata"]["labels"]["run_id"] == run_id
    container = seen[0]["metadata"]["annotations"]["orchestrator.io/container"]
    _wait_no_pods(k8s, run_id)

    _leftover_pod(k8s, seen[0])
    dry = subprocess.run(
        _cli(tmp_path, k8s, repo, "--clean-containers", "--dry-run"), cwd=repo, env=env, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"would remove {container} (exited, run {run_id}" in dry.stdout, dry.stdout + dry.stderr
    assert len(_pods(k8s, run_id)) == 1
    clean = subprocess.run(
        _cli(tmp_path, k8s, repo, "--clean-containers", "--force"), cwd=repo, env=env, capture_output=True, text=True
    )
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "removed 1 container(s)" in clean.stdout, clean.stdout
    _wait_no_pods(k8s, run_id)

    _leftover_pod(k8s, seen[0])
    # The scan runs at most every few minutes per state folder: this folder's last one was the first run's.
    from orchestrator.app.after_run import _orphan_scan_marker
    from orchestrator.log.runs import RunDirs

    _orphan_scan_marker(RunDirs.from_env({}, cwd=repo)).unlink(missing_ok=True)
    second = subprocess.run(
        _cli(tmp_path, k8s, repo, "SIM: print two", "--dry-run"),
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]
    second_id = _run_id(second.stdout + second.stderr)
    _wait_no_pods(k8s, run_id, within_s=30)
    log = (repo / "logs" / second_id / "orchestration.jsonl").read_text()
    removed = [json.loads(line) for line in log.splitlines() if "removed orphan containers" in line]
    assert removed and removed[0]["containers"] == [container], log[-3000:]


def _interrupt(proc: subprocess.Popen, tmp_path: Path) -> None:
    """Ctrl+C, as a terminal sends it: SIGINT to the orchestrator's process group."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        assert proc.wait(timeout=90) == 130, (tmp_path / "first.out").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _resume(tmp_path: Path, repo: Path, run_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.app.cli", "--resume", run_id, "--no-tui"],
        cwd=repo,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_ctrl_c_and_resume_continue_in_the_kept_pod_and_its_session(tmp_path, k8s):
    """Ctrl+C mid-task: the agent is ended, its session id recorded, the Pod kept running; --resume
    finds the Pod again by its labels, continues the session there, and the task completes once."""
    repo = _repo(tmp_path)
    proc = _start(tmp_path, k8s, repo, "SIM: write a.txt hi\nSIM: commit add a\nSIM: sleep 8\nSIM: print done")
    try:
        run_id = _wait_for_agent(repo)
        time.sleep(2)  # past the commit
    finally:
        _interrupt(proc, tmp_path)
    interrupted = [e for e in _events(repo, run_id) if e["type"] == "task.interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["payload"].get("session_id"), interrupted
    pods = _pods(k8s, run_id)
    assert (
        len(pods) == 1 and pods[0]["status"]["phase"] == "Running" and not pods[0]["metadata"].get("deletionTimestamp")
    )
    uid = pods[0]["metadata"]["uid"]
    resumed = _resume(tmp_path, repo, run_id)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    events = _events(repo, run_id)
    completed = [e for e in events if e["type"] == "task.completed"]
    assert len(completed) == 1
    runner = _runner_log(repo, run_id)
    ready = [e for e in runner if e.get("message") == "runner.container.ready"]
    # the Pod Ctrl+C kept (its agent, already ended, is looked for once more), not a new one
    assert [e["action"] for e in ready] == ["created", "restarted"], ready
    starts = [e for e in runner if e.get("message") == "runner.exec.started"]
    assert len(starts) == 2 and starts[-1]["resume_session_id"] == interrupted[0]["payload"]["session_id"], starts
    assert not [e for e in runner if e.get("message") in ("runner.session.no_storage", "runner.session.reset")]
    branch = completed[0]["payload"]["artifact"]["branch_final"]
    log = subprocess.run(["git", "log", "--format=%s", branch], cwd=repo, capture_output=True, text=True)
    assert log.stdout.split("\n").count("add a") == 1, log.stdout  # the commit made before Ctrl+C, once
    seen_uids = {p["metadata"]["uid"] for p in _pods(k8s, run_id)}
    assert seen_uids <= {uid}  # no second Pod was made
    _wait_no_pods(k8s, run_id)


def _node_of(k8s: dict, run_id: str) -> str:
    pods = _pods(k8s, run_id)
    assert len(pods) == 1 and pods[0]["spec"].get("nodeName"), pods
    return pods[0]["spec"]["nodeName"]


def _mark_node_unknown(node: str) -> None:
    """The Ready condition the node controller writes once a kubelet has not answered for its grace
    period (40 s by default), written at once: the test need not wait the grace out."""
    from datetime import UTC, datetime

    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(str(KUBECONFIG)))
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastTransitionTime": now,
    }
    try:
        api.patch_node_status(node, {"status": {"conditions": [condition]}})
    finally:
        api.api_client.close()


def _wait_node_ready(node: str, within_s: float = 120) -> None:
    t0 = time.monotonic()
    query = 'jsonpath={.status.conditions[?(@.type=="Ready")].status}'
    while _kubectl("get", "node", node, "-o", query, check=False).strip() != "True":
        assert time.monotonic() - t0 < within_s, f"node {node} did not become Ready again"
        time.sleep(1)


# The node it freezes is every Kubernetes test's: they share one worker (pytestmark), so none runs beside it.
def test_a_node_lost_mid_task_is_placed_again(tmp_path, k8s):
    """The task's node stops answering mid-task (its kubelet frozen, its Ready condition Unknown as
    the node controller writes it): the exec through it would wait forever; the task is placed
    again in a new Pod, recorded as a Docker host that stops answering, and completes once the
    node is back."""
    repo = _repo(tmp_path)
    kubelet = int((K8S_HOME / "run" / "kubelet.pid").read_text())
    proc = _start(tmp_path, k8s, repo, "SIM: write a.txt hi\nSIM: sleep 20\nSIM: commit add a")
    frozen = False
    try:
        run_id = _wait_for_agent(repo)
        node = _node_of(k8s, run_id)
        os.kill(kubelet, signal.SIGSTOP)
        frozen = True
        _mark_node_unknown(node)
        t0 = time.monotonic()
        log = repo / "logs" / run_id / "runner.jsonl"
        while '"runner.host.replaced"' not in log.read_text(errors="replace"):
            assert time.monotonic() - t0 < 60, "the task was not placed again while its node was lost"
            time.sleep(0.5)
        os.kill(kubelet, signal.SIGCONT)
        frozen = False
        _wait_node_ready(node)
        assert proc.wait(timeout=300) == 0, (tmp_path / "first.out").read_text()[-3000:]
    finally:
        if frozen:
            os.kill(kubelet, signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    runner = _runner_log(repo, run_id)
    replaced = [e for e in runner if e.get("message") == "runner.host.replaced"]
    assert len(replaced) == 1 and replaced[0]["error_type"] == "docker", replaced
    assert f"node {node}" in replaced[0]["error"] and "stopped answering" in replaced[0]["error"], replaced
    sessions = [e["payload"] for e in _events(repo, run_id) if e["type"] == "task.session"]
    assert any(s.get("reason") == "host_down" and s.get("error_type") == "docker" for s in sessions), sessions
    completed = [e for e in _events(repo, run_id) if e["type"] == "task.completed"]
    assert len(completed) == 1
    branch = completed[0]["payload"]["artifact"]["branch_final"]
    log_out = subprocess.run(["git", "log", "--format=%s", branch], cwd=repo, capture_output=True, text=True)
    assert log_out.stdout.split("\n").count("add a") == 1, log_out.stdout
    _wait_no_pods(k8s, run_id)


def test_a_resumed_task_whose_session_claim_was_deleted_says_why_it_starts_fresh(tmp_path, k8s):
    """Ctrl+C, then the run's Pod and session claim are deleted (an admin cleaned the namespace):
    --resume cannot continue the agent's session, says so in one line naming the claim, and the
    task starts afresh and completes."""
    repo = _repo(tmp_path)
    proc = _start(tmp_path, k8s, repo, "SIM: write a.txt hi\nSIM: commit add a\nSIM: sleep 8\nSIM: print done")
    try:
        run_id = _wait_for_agent(repo)
        time.sleep(2)
    finally:
        _interrupt(proc, tmp_path)
    interrupted = [e for e in _events(repo, run_id) if e["type"] == "task.interrupted"]
    previous = interrupted[0]["payload"]["session_id"]
    assert previous
    claims = _kubectl("get", "pvc", "-n", k8s["namespace"], "-l", f"run_id={run_id}", "-o", "name").split()
    assert len(claims) == 1
    _kubectl("delete", "pod,pvc", "-n", k8s["namespace"], "-l", f"run_id={run_id}", "--wait=true")
    resumed = _resume(tmp_path, repo, run_id)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    events = _events(repo, run_id)
    sessions = [e["payload"] for e in events if e["type"] == "task.session" and e["payload"].get("session_id") is None]
    assert len(sessions) == 1 and sessions[0]["previous_session_id"] == previous, sessions
    detail = sessions[0]["detail"]
    assert claims[0].split("/")[-1] in detail and "deleted" in detail and "\n" not in detail, detail
    runner = _runner_log(repo, run_id)
    starts = [e for e in runner if e.get("message") == "runner.exec.started"]
    assert not starts[-1]["resume_session_id"], starts  # a fresh session: nothing to resume
    completed = [e for e in events if e["type"] == "task.completed"]
    assert len(completed) == 1
    branch = completed[0]["payload"]["artifact"]["branch_final"]
    log = subprocess.run(["git", "log", "--format=%s", branch], cwd=repo, capture_output=True, text=True)
    assert log.stdout.split("\n").count("add a") == 1, log.stdout
    _wait_no_pods(k8s, run_id)


FORKS = (
    "import resource, subprocess\\n"
    "children, error = [], None\\n"
    "try:\\n"
    "    while len(children) < 2000:\\n"
    "        children.append(subprocess.Popen(['sleep', '60']))\\n"
    "except OSError as exc:\\n"
    "    error = exc.errno\\n"
    "for child in children:\\n"
    "    child.kill()\\n"
    "    child.wait()\\n"
    "print(len(children), error, *resource.getrlimit(resource.RLIMIT_NOFILE))"
)


def test_the_pids_and_open_files_limits_hold_in_the_agents_pod(tmp_path, k8s):
    """The agent, in its Pod, starts processes until one is refused: the kubelet's podPidsLimit
    (512 on the test cluster, the Docker runner's default pids_limit) stops it short of 512, with
    EAGAIN; its open-files limit is runner.container_limits.nofile, set by the product's exec."""
    repo = _repo(tmp_path)
    config = _config(tmp_path, k8s)
    config.write_text(
        config.read_text().replace("  kubernetes:\n", "  container_limits:\n    nofile: 2048\n  kubernetes:\n")
    )
    prompt = f"SIM: write forks.py {FORKS}\nSIM: exec python3 forks.py > limits.txt\nSIM: commit limits"
    proc = subprocess.run(
        _cli(tmp_path, k8s, repo, prompt, "--dry-run", config=config),
        cwd=repo,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    run_id = _run_id(out)
    completed = [e for e in _events(repo, run_id) if e["type"] == "task.completed"]
    branch = completed[0]["payload"]["artifact"]["branch_final"]
    shown = subprocess.run(["git", "show", f"{branch}:limits.txt"], cwd=repo, capture_output=True, text=True)
    started, error, soft, hard = shown.stdout.split()
    assert 400 < int(started) < 512 and error == "11", shown.stdout  # EAGAIN: the Pod's pids cgroup is full
    assert (soft, hard) == ("2048", "2048"), shown.stdout
    _wait_no_pods(k8s, run_id)
