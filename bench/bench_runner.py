"""Benchmark: one task through ``run_instance`` versus the Docker/git floor.

    uv run python bench/bench_runner.py [--image orchestrator-test-agent] [--parallel 20] [--repeat 5]

The agent is the simulated one, writing and committing one file
(``SIM: write a.txt hi`` + ``SIM: commit x``), so the numbers are the
runner's own overhead: clone and container create/start (side by side), exec,
import and stop (side by side).
The floor is measured in the same process: ``docker run --rm IMAGE true``
(once and N in parallel) and a plain ``git clone --no-hardlinks``.
Phase timings come from the ``duration_s`` fields of runner.jsonl.
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
import uuid
from collections import defaultdict
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.runner import AuthConfig, DockerRunner, run_instance

PROMPT = "SIM: write a.txt hi\nSIM: commit x"
# The clone and the container create/start run at the same time, and so do the
# import and the stop: those phase durations overlap.
PHASES = {
    "runner.workspace.prepared": "clone",
    "runner.container.ready": "container create/start",
    "runner.exec.finished": "exec (agent)",
    "runner.uncommitted": "uncommitted check",
    "runner.import.finished": "import",
    "runner.container.stopped": "stop",
}


def sh(*args: str) -> None:
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    sh("git", "-C", str(repo), "init", "-q", "-b", "main")
    for i in range(50):
        (repo / f"file{i}.py").write_text(f"x = {i}\n" * 20)
    sh("git", "-C", str(repo), "add", ".")
    sh("git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init")
    return repo


async def timed_process(*argv: str) -> float:
    t = time.perf_counter()
    await anyio.run_process(list(argv))
    return time.perf_counter() - t


async def floor(image: str, repo: Path, tmp: Path, parallel: int, repeat: int) -> dict[str, float]:
    one = [await timed_process("docker", "run", "--rm", image, "true") for _ in range(repeat)]
    t = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(parallel):
            tg.start_soon(timed_process, "docker", "run", "--rm", image, "true")
    par = time.perf_counter() - t
    clones = []
    for i in range(repeat):
        clones.append(
            await timed_process(
                "git", "clone", "-q", "--no-hardlinks", "--single-branch", str(repo), str(tmp / f"clone{i}")
            )
        )
    return {
        "docker_run_true_s": statistics.median(one),
        f"docker_run_true_x{parallel}_s": par,
        "git_clone_s": statistics.median(clones),
    }


def phase_table(log_path: Path, run_ids: set[str]) -> dict[str, float]:
    per: dict[str, list[float]] = defaultdict(list)
    for line in log_path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("run_id") in run_ids and rec["message"] in PHASES and "duration_s" in rec:
            per[PHASES[rec["message"]]].append(rec["duration_s"])
    return {name: round(statistics.median(v), 3) for name, v in per.items()}


async def bench(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench_runner_"))
    os.environ["ORCHESTRATOR_WORKSPACE_ROOT"] = str(tmp / "ws")
    repo = make_repo(tmp)
    results: dict = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.release()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "image": args.image,
    }
    results["floor"] = await floor(args.image, repo, tmp, args.parallel, args.repeat)
    runner = DockerRunner(auth=AuthConfig(api_key="bench-not-a-real-key"), logs_dir=tmp / "logs")
    run_ids: list[str] = []
    cleanup_ids = run_ids  # every run id used, for the cleanup below

    async def one(run_id: str, key: str) -> float:
        t = time.perf_counter()
        res = await run_instance(
            PROMPT,
            repo,
            runner=runner,
            run_id=run_id,
            task_key=key,
            docker_image=args.image,
            branch_name=f"bench_{run_id}_{key}",
        )
        if res.status != "success" or not res.has_changes:
            raise SystemExit(f"bench task failed: {res.status} {res.error}")
        return time.perf_counter() - t

    try:
        warm = "warmup" + uuid.uuid4().hex[:6]
        cleanup_ids.append(warm)
        await one(warm, "w")  # first client connection, image cache
        singles = []
        for _ in range(args.repeat):
            rid = "b1" + uuid.uuid4().hex[:8]
            run_ids.append(rid)
            singles.append(await one(rid, "k"))
        results["one_task_s"] = {"median": round(statistics.median(singles), 3), "all": [round(s, 3) for s in singles]}
        results["one_task_phases_s"] = phase_table(runner.log_path, set(run_ids))

        rid = "bn" + uuid.uuid4().hex[:8]
        run_ids.append(rid)
        t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(args.parallel):
                tg.start_soon(one, rid, f"k{i}")
        results[f"{args.parallel}_tasks_wall_s"] = round(time.perf_counter() - t, 3)
        results[f"{args.parallel}_tasks_phases_s"] = phase_table(runner.log_path, {rid})
    finally:
        await runner.aclose()
        for rid in cleanup_ids:
            await anyio.run_process(
                f"docker rm -f $(docker ps -aq --filter label=run_id={rid}) >/dev/null 2>&1; "
                f"docker volume rm $(docker volume ls -q --filter label=run_id={rid}) >/dev/null 2>&1",
                check=False,
            )
        await anyio.run_process(["rm", "-rf", str(tmp)], check=False)
    fl = results["floor"]
    results["ratio_one_task_to_docker_run"] = round(results["one_task_s"]["median"] / fl["docker_run_true_s"], 2)
    results[f"ratio_{args.parallel}_tasks_to_parallel_floor"] = round(
        results[f"{args.parallel}_tasks_wall_s"] / fl[f"docker_run_true_x{args.parallel}_s"], 2
    )
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", default=os.environ.get("ORCHESTRATOR_TEST_IMAGE", "orchestrator-test-agent"))
    p.add_argument("--parallel", type=int, default=20)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    print(json.dumps(anyio.run(bench, args), indent=2))


if __name__ == "__main__":
    main()
