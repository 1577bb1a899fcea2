"""What one task's container work costs, in CPU of the whole machine (issue 4).

    uv run python bench/bench_docker_ops.py [--n 20] [--image orchestrator-test-agent]

N containers configured like the runner's (bind-mounted clone, session volume,
tmpfs, read-only root, limits), each step done for all N at once through
docker-py, as the runner does: create+start, `docker exec true`, an exec of the
simulated agent writing and committing one file, stop. For comparison, N
parallel `docker run --rm IMAGE true` (the floor of bench_cli.py). Machine CPU
is the busy time of all CPUs from /proc/stat (Linux), so it includes dockerd,
containerd, the shims, runc and the kernel, not only this process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
from docker.types import Mount

AGENT = [
    "claude",
    "-p",
    "SIM: write a.txt hi\nSIM: commit a",
    "--output-format",
    "stream-json",
    "--verbose",
    "--dangerously-skip-permissions",
]
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}


def busy_cpu_s() -> float:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def measure(label: str, fn, n: int) -> None:
    c0, t0 = busy_cpu_s(), time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    time.sleep(0.3)  # let the daemon finish its part (events, cleanup) before reading the CPU
    cpu = busy_cpu_s() - c0
    print(f"| {label} | {wall:.2f} s | {cpu:.2f} s | {cpu / n * 1000:.0f} ms |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--image", default=os.environ.get("ORCHESTRATOR_TEST_IMAGE", "orchestrator-test-agent"))
    args = ap.parse_args()
    n, tag = args.n, "bench_ops_" + uuid.uuid4().hex[:8]
    api = docker.from_env(max_pool_size=32).api
    pool = ThreadPoolExecutor(n)
    tmp = Path(tempfile.mkdtemp(prefix="bench_ops_"))
    src = tmp / "src"
    src.mkdir()
    run = lambda *a, cwd=src: subprocess.run(["git", *a], cwd=cwd, check=True, capture_output=True)  # noqa: E731
    run("init", "-q", "-b", "main")
    for i in range(50):
        (src / f"f{i}.txt").write_text(f"file {i}\n")
    run("add", "-A")
    run("-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "init")
    for i in range(n):
        run("clone", "-q", "--no-hardlinks", str(src), str(tmp / f"w{i}"), cwd=tmp)
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "1000:1000", str(tmp)], check=True)
    names = [f"{tag}_{i}" for i in range(n)]

    def create_start(i: int) -> None:
        host_config = api.create_host_config(
            binds=[f"{tmp / f'w{i}'}:/workspace:rw"],
            mounts=[Mount(target="/home/node", source=f"{tag}_v{i}", type="volume", labels={"bench": tag})],
            tmpfs={"/tmp": "rw,exec,nosuid,nodev,size=256m,mode=1777"},
            read_only=True,
            nano_cpus=2_000_000_000,
            mem_limit="4g",
            security_opt=["no-new-privileges"],
        )
        created = api.create_container(
            image=args.image,
            command=["sleep", "infinity"],
            name=names[i],
            user="node",
            working_dir="/workspace",
            environment=GIT_ENV,
            labels={"bench": tag},
            host_config=host_config,
        )
        api.start(created["Id"])

    def exec_(i: int, argv: list[str]) -> None:
        exec_id = api.exec_create(
            names[i],
            argv,
            user="node",
            workdir="/workspace",
            environment={"ANTHROPIC_API_KEY": "bench-not-a-key", "TASK_KEY": f"k{i}"},
        )["Id"]
        api.exec_start(exec_id)
        code = api.exec_inspect(exec_id)["ExitCode"]
        if code != 0:
            raise SystemExit(f"{argv[0]} exited {code} in {names[i]}")

    def floor() -> None:
        list(
            pool.map(
                lambda _: subprocess.run(
                    ["docker", "run", "--rm", args.image, "true"], check=True, capture_output=True
                ),
                range(n),
            )
        )

    print(f"| {n} at once | wall | machine CPU | CPU per container |\n|---|---|---|---|")
    try:
        measure("create + start", lambda: list(pool.map(create_start, range(n))), n)
        measure("`docker exec true`", lambda: list(pool.map(lambda i: exec_(i, ["true"]), range(n))), n)
        measure(
            "exec of the simulated agent (write + commit)",
            lambda: list(pool.map(lambda i: exec_(i, AGENT), range(n))),
            n,
        )
        measure("stop (1 s grace, tini)", lambda: list(pool.map(lambda i: api.stop(names[i], timeout=1), range(n))), n)
        measure("floor: `docker run --rm IMAGE true`", floor, n)
    finally:
        for name in names:
            with contextlib.suppress(docker.errors.NotFound):
                api.remove_container(name, force=True)
        for i in range(n):
            with contextlib.suppress(docker.errors.NotFound):
                api.remove_volume(f"{tag}_v{i}", force=True)
        subprocess.run(["rm", "-rf", str(tmp)])


if __name__ == "__main__":
    main()
