"""What a remote Docker engine costs per task, and 20 tasks over two engines (issue 18).

    uv run python bench/bench_hosts.py [--repeats 5] [--files 20000]   # needs root (a private dockerd)

A private second dockerd (tests/private_engine.py: own socket, roots, pid file
and bridge; the test image loaded into it) stands in for a remote machine. The
runner treats it as remote, so its tasks take the archive path: clone locally,
tar into the container's /workspace volume, agent, `git bundle` out, import.
The same task on the local engine takes the bind-mount path.

1. per-task cost: one task (the simulated agent writes and commits one file),
   run one at a time, ``--repeats`` times on each path; median wall time and
   the runner's phase times (clone, copy in, bundle out, import).
2. bytes per task crossing the "network" (copy-in tar, bundle out) for the
   small repository and for one of ``--files`` files.
3. 20 tasks with ``orchestrator --runs 20`` over local:2 + private:2, wall time
   and where they ran.

    uv run python bench/bench_hosts.py --latency 0,10,25 [--repeats 5]

4. instead: the archive-path task of 1. on the small repository, straight to the
   second engine and then through tests/engine_proxy.py holding every chunk
   each given number of milliseconds in each direction (a round trip costs
   twice that): a userspace proxy on loopback standing in for a distant link.
   Also the Docker API requests one task makes, by kind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from engine_proxy import EngineProxy  # noqa: E402
from private_engine import PrivateEngine  # noqa: E402

IMAGE = "orchestrator-test-agent"
PROMPT = "SIM: write a.txt hi\nSIM: commit x"


def make_repo(path: Path, files: int) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    for i in range(files):
        d = path / f"d{i % 100:02d}"
        d.mkdir(exist_ok=True)
        (d / f"f{i}.txt").write_text(f"file {i}\n" + "x" * 200 + "\n")
    (path / "README.md").write_text("# bench\n")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@x",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@x",
    }
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=path, check=True, env=env)
    return path


async def one_task(runner, repo: Path, run_id: str) -> dict:
    from orchestrator.runner import run_instance

    phases: dict = {}

    def on_event(e: dict) -> None:
        t = e["type"]
        if t == "runner.workspace.prepared":
            phases["clone_s"] = e["duration_s"]
        elif t == "runner.archive.copied_in":
            phases["copy_in_s"], phases["copy_in_bytes"] = e["duration_s"], e["bytes"]
        elif t == "runner.archive.bundle_read":
            phases["bundle_out_s"], phases["bundle_bytes"] = e["duration_s"], e["bytes"]
        elif t == "runner.import.finished":
            phases["import_s"] = e["duration_s"]

    t0 = time.perf_counter()
    result = await run_instance(
        PROMPT,
        repo,
        runner=runner,
        run_id=run_id,
        docker_image=IMAGE,
        network_egress="offline",
        event_callback=on_event,
    )
    phases["wall_s"] = time.perf_counter() - t0
    if result.status != "success":
        raise SystemExit(f"task {run_id} failed: {result.error_type}: {result.error}")
    return phases


def cleanup(url: str | None, run_id: str) -> None:
    base = ["docker"] + (["-H", url] if url else [])
    ids = subprocess.run(
        [*base, "ps", "-aq", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
    ).stdout.split()
    if ids:
        subprocess.run([*base, "rm", "-f", *ids], capture_output=True)
    vols = subprocess.run(
        [*base, "volume", "ls", "-q", "--filter", f"label=run_id={run_id}"], capture_output=True, text=True
    ).stdout.split()
    if vols:
        subprocess.run([*base, "volume", "rm", "-f", *vols], capture_output=True)


async def per_task(engine: PrivateEngine, repo: Path, repeats: int, tag: str) -> dict:
    from orchestrator.runner import DockerRunner
    from orchestrator.runner.hosts import HostSpec, docker_host

    out: dict = {}
    for label, spec in (
        ("bind mount (local engine)", HostSpec("local", None, 1)),
        ("archive (second engine)", HostSpec("b", engine.url, 1)),
    ):
        runner = DockerRunner(host=docker_host(spec), dry_run=True)
        rows = []
        try:
            for i in range(repeats + 1):  # the first warms the image check and the client
                run_id = f"benchhosts_{tag}_{spec.name}_{i}"
                rows.append(await one_task(runner, repo, run_id))
                cleanup(spec.url, run_id)
        finally:
            await runner.aclose()
        rows = rows[1:]
        out[label] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return out


def request_kind(line: str) -> str:
    """A Docker API request line, without its ids and version: ``POST /v1.41/exec/<id>/start`` -> ``POST exec start``."""
    method, path = line.split()[:2]
    parts = [p for p in path.split("?")[0].split("/") if p and not p.startswith("v1.")]
    if parts and parts[0] in ("containers", "exec", "images", "volumes") and len(parts) >= 2:
        if parts[1] in ("create", "json"):
            return f"{method} {parts[0]} {parts[1]}"
        parts = [parts[0], *parts[2:]]
    query = "?path=" + path.split("?path=")[1][:40] if "?path=" in path else ""
    return f"{method} {' '.join(parts)}{query}"


async def through_proxy(engine: PrivateEngine, repo: Path, repeats: int, delays: list[float]) -> dict:
    from orchestrator.runner import DockerRunner
    from orchestrator.runner.hosts import HostSpec, docker_host

    out: dict = {}
    for delay in [None, *delays]:
        label = "no proxy" if delay is None else f"proxy {delay:g} ms one way"
        proxy_dir = Path(tempfile.mkdtemp(prefix="bprx-", dir="/tmp"))
        proxy = None
        url = engine.url
        if delay is not None:
            proxy = EngineProxy(engine.socket, proxy_dir / "engine.sock", delay_ms=delay)
            url = proxy.url
        runner = DockerRunner(host=docker_host(HostSpec("b", url, 1)), dry_run=True)
        rows, kinds = [], {}
        try:
            for i in range(repeats + 1):  # the first warms the image check and the client
                run_id = f"benchlat_{i}_{int((delay or 0) * 10)}_{'p' if proxy else 'n'}"
                seen = len(proxy.requests) if proxy else 0
                rows.append(await one_task(runner, repo, run_id))
                if proxy and i == repeats:
                    for line in proxy.requests[seen:]:
                        k = request_kind(line)
                        kinds[k] = kinds.get(k, 0) + 1
                if proxy:
                    rows[-1]["requests"] = len(proxy.requests) - seen
                cleanup(engine.url, run_id)
        finally:
            await runner.aclose()
            if proxy:
                proxy.close()
            shutil.rmtree(proxy_dir, ignore_errors=True)
        rows = rows[1:]
        out[label] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        if kinds:
            out[label]["requests_by_kind"] = kinds
    return out


def twenty_over_two(engine: PrivateEngine, workdir: Path) -> dict:
    repo = make_repo(workdir / "repo20", 10)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env.update(
        ORCHESTRATOR_WORKSPACE_ROOT=str(workdir / "ws"),
        ORCHESTRATOR_LOGS_DIR=str(workdir / "logs"),
        ORCHESTRATOR_STATE_DIR=str(workdir / "state"),
        ORCHESTRATOR_RESULTS_DIR=str(workdir / "results"),
        ORCHESTRATOR_RUNNER__NETWORK_EGRESS="offline",
        ORCHESTRATOR_ORCHESTRATION__MIN_FREE_DISK_GB="0",
    )
    orch = str(Path(sys.executable).parent / "orchestrator")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            orch,
            PROMPT,
            "--runs",
            "20",
            "--dry-run",
            "--no-tui",
            "--docker-image",
            IMAGE,
            "--docker-host",
            "local=local:2",
            "--docker-host",
            f"b={engine.url}:2",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"20-task run failed: {proc.stderr[-2000:]}")
    run_id = next(p.name for p in (workdir / "state").iterdir() if (p / "run.json").exists())
    hosts: dict[str, int] = {}
    for line in (workdir / "logs" / run_id / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("type") == "task.started":
            h = e["payload"].get("host")
            hosts[h] = hosts.get(h, 0) + 1
    branches = subprocess.run(
        ["git", "branch", "--list", "simple_*"], cwd=repo, capture_output=True, text=True
    ).stdout.split()
    cleanup(None, run_id)
    cleanup(engine.url, run_id)
    return {"wall_s": wall, "tasks_per_host": hosts, "branches": len(branches)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument(
        "--latency",
        metavar="MS[,MS...]",
        help="only the archive-path task on the small repository, through a proxy adding MS each way",
    )
    args = ap.parse_args()
    try:
        delays = [float(x) for x in args.latency.split(",")] if args.latency else []
    except ValueError:
        raise SystemExit(f"--latency {args.latency!r}: give milliseconds separated by commas, e.g. 0,10,25") from None
    engine = PrivateEngine("orcB")
    workdir = Path(tempfile.mkdtemp(prefix="bench-hosts-"))
    os.environ["ORCHESTRATOR_WORKSPACE_ROOT"] = str(workdir / "ws")
    try:
        t = time.perf_counter()
        engine.start()
        engine.load_image(IMAGE)
        print(f"private engine up and image loaded in {time.perf_counter() - t:.1f} s", flush=True)
        small = make_repo(workdir / "small", 0)
        if delays:
            print(json.dumps({"latency": anyio.run(through_proxy, engine, small, args.repeats, delays)}, indent=2))
            return
        big = make_repo(workdir / "big", args.files)
        report = {
            "small": anyio.run(per_task, engine, small, args.repeats, "small"),
            "big": anyio.run(per_task, engine, big, max(1, args.repeats // 2), "big"),
            "twenty": twenty_over_two(engine, workdir),
        }
        print(json.dumps(report, indent=2))
    finally:
        engine.close()
        subprocess.run(["rm", "-rf", str(workdir)])


if __name__ == "__main__":
    main()
