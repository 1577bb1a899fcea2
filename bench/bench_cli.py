"""The whole ``orchestrator`` command, timed from process start to exit (issue 4).

    uv run python bench/bench_cli.py [--repeats 5] [--write-doc]

Cases (the agent is the simulated one committing one file):
  1 task; 20 tasks (`--runs 20 --max-parallel 20`); best-of-n n=5 at `--max-parallel 10`
  (scoring included, `--dry-run`). Floors measured in the same script: `docker run --rm
  IMAGE true` once and 20 in parallel, and a plain `git clone`.
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
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import replace_section  # noqa: E402
ORCH = str(Path(sys.executable).parent / "orchestrator")
IMAGE = "orchestrator-test-agent"


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    run = lambda *a: subprocess.run(["git", *a], cwd=path, check=True, capture_output=True)  # noqa: E731
    run("init", "-q", "-b", "main")
    for i in range(50):
        (path / f"f{i}.txt").write_text(f"file {i}\n")
    run("add", "-A")
    run("-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "init")
    return path


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({r.returncode}): {r.stderr[-500:]}")
    return elapsed


def floor_parallel(n: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda _: subprocess.run(["docker", "run", "--rm", IMAGE, "true"], check=True,
                                               capture_output=True), range(n)))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, ANTHROPIC_API_KEY="sk-ant-bench-000000000000000000",
                   ORCHESTRATOR_WORKSPACE_ROOT=str(tmp_path / "ws"), ORCHESTRATOR_LOGS_DIR=str(tmp_path / "logs"),
                   ORCHESTRATOR_STATE_DIR=str(tmp_path / "state"), ORCHESTRATOR_RESULTS_DIR=str(tmp_path / "results"))
        base = [ORCH, "--docker-image", IMAGE, "--quiet"]
        cases = {
            "1 task": base + ["SIM: write a.txt hi\nSIM: commit a"],
            "20 tasks, --max-parallel 20": base + ["SIM: write a.txt hi\nSIM: commit a", "--runs", "20", "--max-parallel", "20"],
            "best-of-n n=5, --max-parallel 10": base + ["add a greeting", "--strategy", "best-of-n", "-S", "n=5",
                                                         "--max-parallel", "10", "--dry-run"],
        }
        for name, cmd in cases.items():
            times = []
            for i in range(args.repeats if "20" not in name else max(2, args.repeats // 2)):
                repo = make_repo(tmp_path / f"repo_{len(results)}_{i}")
                times.append(timed(cmd, repo, env))
            results[name] = statistics.median(times)
            print(f"{name:36s} {results[name]:6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times)})", flush=True)
        one = statistics.median(timed(["docker", "run", "--rm", IMAGE, "true"], tmp_path, env) for _ in range(args.repeats))
        par = statistics.median(floor_parallel(20) for _ in range(3))
        src = make_repo(tmp_path / "clone_src")
        clone = statistics.median(timed(["git", "clone", "-q", "--no-hardlinks", "--single-branch", str(src),
                                         str(tmp_path / f"c{i}")], tmp_path, env) for i in range(args.repeats))
    print(f"floor: docker run --rm true {one:.2f} s; 20 in parallel {par:.2f} s; git clone {clone:.3f} s")
    rows = [("1 task", results["1 task"], "<= 1.5 s", f"{results['1 task'] / one:.1f}x one `docker run --rm true`"),
            ("20 tasks at parallelism 20", results["20 tasks, --max-parallel 20"], f"<= 1.5x floor = {1.5 * par:.1f} s",
             f"{results['20 tasks, --max-parallel 20'] / par:.2f}x the 20-parallel floor"),
            ("best-of-n n=5 (+5 scorings) at parallelism 10", results["best-of-n n=5, --max-parallel 10"], "<= 4 s", "")]
    table = ["| case | median wall time | target | vs floor |", "|---|---|---|---|"]
    table += [f"| {a} | {b:.2f} s | {c} | {d} |" for a, b, c, d in rows]
    table.append(f"| floor: `docker run --rm {IMAGE} true` | {one:.2f} s (1), {par:.2f} s (20 in parallel) | | |")
    table.append(f"| floor: `git clone --no-hardlinks` (50 files) | {clone:.3f} s | | |")
    text = "\n".join(table)
    print(text)
    if args.write_doc:
        load = os.getloadavg()
        section = (f"## End to end (the orchestrator command)\n\nMeasured with `uv run python bench/bench_cli.py "
                   f"--write-doc` on {date.today()}: {platform.machine()}, {os.cpu_count()} CPUs, Linux "
                   f"{platform.release()}; load average at the end {load[0]:.1f}. Wall time from process start to "
                   f"exit, median of {args.repeats} runs (2 for the 20-task case). The peer implementation of the "
                   "same spec took 3.7 s for 1 task, 14.2 s for 20 tasks and 8.7 s for best-of-n n=5 on this kind "
                   f"of machine.\n\n{text}\n")
        replace_section("## End to end (the orchestrator command)", section)


if __name__ == "__main__":
    main()
