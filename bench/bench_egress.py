"""What a task's network costs: the same task online and offline, in CPU of the whole machine.

    uv run python bench/bench_egress.py [--image orchestrator-test-agent] [--tasks 10] [--rounds 3] [--write-doc]

Each round runs ``--tasks`` tasks one after another through ``run_instance``
(the simulated agent writes and commits one file), once with
``network_egress: online`` (the engine's default bridge) and once ``offline``.
An offline task's container is created with ``network_disabled`` and the run
folder's hosts file, so the engine sets up no network namespace for it.
For comparison, the same container lifecycle through docker-py (create, start,
one exec, stop, remove) with ``network_mode: none``, which offline tasks used
before, and with ``network_disabled``. Machine CPU is the busy time of all CPUs
from /proc/stat, so it includes dockerd, containerd, runc and the kernel.
Medians of the rounds; ``--write-doc`` replaces the section in docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _perfdoc import replace_section
from bench_docker_ops import busy_cpu_s
from bench_runner import make_repo

from orchestrator.runner import AuthConfig, DockerRunner, run_instance

PROMPT = "SIM: write a.txt hi\nSIM: commit x"
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


async def tasks(image: str, repo: Path, logs: Path, egress: str, n: int) -> tuple[float, float]:
    runner = DockerRunner(auth=AuthConfig(api_key="k-bench"), logs_dir=logs)
    run_id = f"bench_{egress}_{uuid.uuid4().hex[:8]}"
    try:
        c0, t0 = busy_cpu_s(), time.perf_counter()
        for i in range(n):
            res = await run_instance(
                PROMPT, repo, runner=runner, run_id=run_id, task_key=f"t{i}", docker_image=image, network_egress=egress
            )
            assert res.status == "success", res.error
        wall = time.perf_counter() - t0
        await anyio.sleep(0.3)  # the daemon's part of the last stop
        return busy_cpu_s() - c0, wall
    finally:
        await runner.aclose()
        await anyio.run_process(
            f"docker rm -f $(docker ps -aq --filter label=run_id={run_id}) >/dev/null 2>&1;"
            f"docker volume rm -f $(docker volume ls -q --filter label=run_id={run_id}) >/dev/null 2>&1",
            check=False,
        )


def lifecycles(image: str, hosts: Path, mode: str, n: int) -> tuple[float, float]:
    import docker

    api = docker.from_env().api
    if mode == "none":
        host_config = api.create_host_config(
            network_mode="none", read_only=True, tmpfs={"/tmp": "rw"}, cap_drop=["ALL"]
        )
        extra = {}
    else:
        host_config = api.create_host_config(
            binds=[f"{hosts}:/etc/hosts:ro"], read_only=True, tmpfs={"/tmp": "rw"}, cap_drop=["ALL"]
        )
        extra = {"network_disabled": True}
    c0, t0 = busy_cpu_s(), time.perf_counter()
    for _ in range(n):
        created = api.create_container(image, ["sleep", "infinity"], user="node", host_config=host_config, **extra)
        api.start(created["Id"])
        exec_id = api.exec_create(created["Id"], ["getent", "hosts", "localhost"])["Id"]
        api.exec_start(exec_id)
        assert api.exec_inspect(exec_id)["ExitCode"] == 0
        api.stop(created["Id"], timeout=0)
        api.remove_container(created["Id"], v=True)
    wall = time.perf_counter() - t0
    time.sleep(0.3)
    return busy_cpu_s() - c0, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=os.environ.get("ORCHESTRATOR_TEST_IMAGE", "orchestrator-test-agent"))
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_egress_"))
    os.environ["ORCHESTRATOR_WORKSPACE_ROOT"] = str(tmp / "ws")
    repo = make_repo(tmp)
    hosts = tmp / "hosts"
    hosts.write_text(HOSTS)
    hosts.chmod(0o644)
    rows: dict[str, list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for egress in ("online", "offline"):
            rows.setdefault(f"task, {egress}", []).append(
                anyio.run(tasks, args.image, repo, tmp / f"logs{r}", egress, args.tasks)
            )
        for mode in ("none", "disabled"):
            label = "container, network_mode none" if mode == "none" else "container, network_disabled"
            rows.setdefault(label, []).append(lifecycles(args.image, hosts, mode, args.tasks))
        print(
            f"round {r + 1}: " + ", ".join(f"{k} {v[-1][0] / args.tasks:.3f} CPU-s" for k, v in rows.items()),
            flush=True,
        )
    n = args.tasks
    table = ["| what | machine CPU each (median) | wall each (median) |", "|---|---|---|"]
    for label, values in rows.items():
        cpu = statistics.median(v[0] for v in values) / n
        wall = statistics.median(v[1] for v in values) / n
        table.append(f"| {label} | {cpu:.3f} s | {wall:.3f} s |")
    base = statistics.median(v[0] for v in rows["task, online"])
    off = statistics.median(v[0] for v in rows["task, offline"])
    docker_version = subprocess.run(["docker", "version", "-f", "{{.Server.Version}}"], capture_output=True, text=True)
    section = "\n".join(
        [
            "## A task's network (bench/bench_egress.py)",
            "",
            f"Measured with `uv run python bench/bench_egress.py --tasks {n} --rounds {args.rounds} --write-doc`"
            f" on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {platform.machine()}, {os.cpu_count()} CPUs,"
            f" Linux {platform.release()}, Docker {docker_version.stdout.strip()}. Tasks run one after another",
            "(the simulated agent writes and commits one file); machine CPU is the busy time of all CPUs",
            "(/proc/stat), dockerd, runc and the kernel included.",
            "",
            *table,
            "",
            f"An offline task costs {off / base:.2f}x the machine CPU of an online one. Offline containers on the",
            "local engine are created with `network_disabled` and a hosts file from the run's folder: with",
            "`network_mode: none` the engine still sets up a network namespace, re-running its own binary",
            "twice per container (`set-ipv6`, and `libnetwork-setkey` as runc's hook), which is most of the",
            "difference between the last two rows. Remote engines keep `network_mode: none` (they cannot",
            "bind a file of this machine).",
            "",
        ]
    )
    print(section)
    if args.write_doc:
        replace_section("## A task's network", section)
    subprocess.run(["rm", "-rf", str(tmp)])


if __name__ == "__main__":
    main()
