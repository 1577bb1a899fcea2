"""The same dry run on the Kubernetes test cluster and on the local Docker engine.

    uv run python bench/bench_kubernetes.py [--tasks 20] [--rounds 3] [--parallel 4] [--write-doc]

``--tasks`` tasks of the ``simple`` strategy (``--runs N --max-parallel P --dry-run``;
the simulated agent writes a file and commits it) on a one-file repository, once
with ``--kubeconfig``/``--namespace`` against the cluster ``scripts/setup-k8s.sh``
runs here and once on the local Docker engine, ``--rounds`` times each,
alternating. Per run: the wall time of the ``orchestrator`` process, and the time
from its start to the first agent line (the first ``runner.init`` record of
``logs/RUN/runner.jsonl``, whose timestamps are wall-clock). Medians over rounds.
The cluster needs the slim test image (``bash scripts/setup-k8s.sh load-image
orchestrator-test-slim``); the bench uses a namespace of its own and deletes it,
and removes each run's session claims with ``--cleanup-run`` (the cluster's recycler
empties their volumes and makes them Available again within seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import replace_section

ROOT = Path(__file__).resolve().parent.parent
ORCH = str(Path(sys.executable).parent / "orchestrator")
KUBECONFIG = Path(os.environ.get("ORCHESTRATOR_K8S_HOME", "/var/cache/orchestrator-k8s")) / "run" / "kubeconfig"
IMAGE = "orchestrator-test-slim"


def kubectl(*args: str, check: bool = True) -> str:
    r = subprocess.run(["kubectl", "--kubeconfig", str(KUBECONFIG), *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        sys.exit(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("one file\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(
            ["git", "-c", "user.name=b", "-c", "user.email=b@x", *args], cwd=path, check=True, capture_output=True
        )
    return path


def config(work: Path, kube: bool) -> Path:
    lines = ["runner:", f"  docker_image: {IMAGE}", "  container_cpu: 0.25", "  container_memory: 256m"]
    if kube:
        lines += ["  kubernetes:", "    image_pull_policy: Never"]
    path = work / "bench.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def first_agent_line(log: Path) -> float:
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if record.get("message") == "runner.init":
            return datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
    sys.exit(f"no agent line in {log}")


def one_run(work: Path, tasks: int, parallel: int, namespace: str | None) -> tuple[float, float]:
    """(wall time, start to first agent line) of one run, in seconds."""
    repo = make_repo(work / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env.update(
        ORCHESTRATOR_WORKSPACE_ROOT=str(work / "ws"),
        ORCHESTRATOR_ORCHESTRATION__MIN_FREE_DISK_GB="0",
        ORCHESTRATOR_ORCHESTRATION__HARD_MIN_FREE_DISK_GB="0",
    )
    cmd = [ORCH, "SIM: write a.txt $TASK\nSIM: commit add a", "--repo", str(repo), "--dry-run", "--no-tui"]
    cmd += ["--runs", str(tasks), "--max-parallel", str(parallel), "--config", str(config(work, namespace is not None))]
    if namespace:
        cmd += ["--kubeconfig", str(KUBECONFIG), "--namespace", namespace]
    start = time.time()
    t = time.monotonic()
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t
    if r.returncode != 0:
        sys.exit(f"bench run failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    (log,) = (work / "logs").glob("run_*/runner.jsonl")
    first = first_agent_line(log) - start
    branches = subprocess.run(
        ["git", "for-each-ref", "--format=x", "refs/heads/"], cwd=repo, capture_output=True, text=True
    ).stdout.split()
    if len(branches) != tasks + 1:
        sys.exit(f"expected {tasks} branches back, got {len(branches) - 1}")
    # Containers, volumes and session claims of the run (the branches stay).
    subprocess.run(
        [ORCH, "--cleanup-run", log.parent.name, *cmd[cmd.index("--config") :]],
        cwd=work,
        env=env,
        capture_output=True,
        timeout=600,
    )
    return wall, first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args()
    if not KUBECONFIG.exists():
        sys.exit(f"no test cluster ({KUBECONFIG} missing): bash scripts/setup-k8s.sh start")
    namespace = f"orc-bench-{os.getpid()}"
    kubectl("create", "namespace", namespace)
    results: dict[str, list[tuple[float, float]]] = {"docker": [], "kubernetes": []}
    started = datetime.now(UTC)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
            for i in range(args.rounds):
                for backend in ("docker", "kubernetes"):
                    work = Path(tmp) / f"{backend}{i}"
                    work.mkdir()
                    ns = namespace if backend == "kubernetes" else None
                    wall, first = one_run(work, args.tasks, args.parallel, ns)
                    results[backend].append((wall, first))
                    print(f"round {i + 1} {backend}: {wall:.1f} s, first agent line {first:.2f} s", flush=True)
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    load = os.getloadavg()[0]
    med = {b: (statistics.median(w for w, _ in r), statistics.median(f for _, f in r)) for b, r in results.items()}
    rows = "\n".join(
        f"| {b} | {', '.join(f'{w:.1f}' for w, _ in results[b])} | {med[b][0]:.1f} s "
        f"| {', '.join(f'{f:.2f}' for _, f in results[b])} | {med[b][1]:.2f} s |"
        for b in ("docker", "kubernetes")
    )
    section = f"""## Kubernetes against the local Docker engine (bench/bench_kubernetes.py)

{args.tasks} tasks of the `simple` strategy (`--runs {args.tasks} --max-parallel {args.parallel} --dry-run`;
the simulated agent writes a file and commits it; 0.25 CPU and 256 MiB per task) on a one-file
repository, on the one-node test cluster of `scripts/setup-k8s.sh` (Kubernetes 1.20.2 built from
Debian's source, containerd 1.6, on this same machine; session claims on its hostPath volumes)
and on the local Docker engine, {args.rounds} round(s) each, alternating.
"First agent line": from the `orchestrator` process's start to the first `runner.init` record in
`logs/RUN/runner.jsonl`. Measured on {date.today()} (started {started:%H:%M} UTC), {platform.machine()},
{os.cpu_count()} CPUs shared with other work (load average {load:.1f} at the end), Python
{platform.python_version()}.

| backend | wall time per round (s) | median | first agent line per round (s) | median |
|---|---|---:|---|---:|
{rows}

Kubernetes against Docker: wall time {med["kubernetes"][0] / med["docker"][0]:.2f}x, first agent line
{med["kubernetes"][1] / med["docker"][1]:.2f}x. On the cluster each task also creates its session
claim, waits for the scheduler and the kubelet to start its Pod (polled every half second), and
moves its clone in and its bundle out through exec, where Docker reuses the run's object store.

```bash
uv run python bench/bench_kubernetes.py --tasks {args.tasks} --rounds {args.rounds} --parallel {args.parallel} --write-doc
```
"""
    print(section)
    if args.write_doc:
        replace_section("## Kubernetes against the local Docker engine", section)


if __name__ == "__main__":
    main()
