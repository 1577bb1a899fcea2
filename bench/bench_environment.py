"""What the project's environment costs a run: setup once, then nothing per task.

    uv run python bench/bench_environment.py [--repeats 3] [--tasks 8] [--write-doc]

A repository whose devcontainer setup takes at least 10 s (``sleep 10``, then
a file git ignores, which every task's workspace must receive). Timed from
process start to exit, ``--dry-run`` with the simulated agent, ``--runs N``
tasks at ``--max-parallel N``:

- first run: the environment is built and the setup runs (once, whatever N is);
- cached: the same base again, so nothing is built and no setup runs (median of repeats);
- no environment: the same repository with ``--no-devcontainer`` (median of repeats).

Targets: cached / no environment <= 1.3, and the first run pays the setup once,
not once per task: first - cached is well under N x 10 s.
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
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import replace_section

ORCH = str(Path(sys.executable).parent / "orchestrator")
SETUP_S = 10


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    devcontainer = {
        "image": "claude-code",
        # a new nonce in a setup input: the first run always sets up
        "onCreateCommand": f"sleep {SETUP_S} && mkdir -p build && echo {uuid.uuid4().hex} > build/seed.txt",
    }
    (path / ".devcontainer.json").write_text(json.dumps(devcontainer))
    (path / ".gitignore").write_text("build/\n")
    for i in range(20):
        (path / f"f{i}.txt").write_text(f"file {i}\n")
    run = lambda *a: subprocess.run(["git", *a], cwd=path, check=True, capture_output=True)  # noqa: E731
    run("init", "-q", "-b", "main")
    run("add", "-A")
    run("-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "init")
    return path


def timed(repo: Path, work: Path, tasks: int, *extra: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    for name in ("logs", "state", "results", "ws"):
        (work / name).mkdir(parents=True, exist_ok=True)
    env.update(
        ORCHESTRATOR_LOGS_DIR=str(work / "logs"),
        ORCHESTRATOR_STATE_DIR=str(work / "state"),
        ORCHESTRATOR_RESULTS_DIR=str(work / "results"),
        ORCHESTRATOR_WORKSPACE_ROOT=str(work / "ws"),
    )
    prompt = "SIM: exec cat build/seed.txt > seen.txt\nSIM: commit seen"
    cmd = [ORCH, prompt, "--repo", str(repo), "--dry-run", "--no-tui", "--runs", str(tasks)]
    cmd += ["--max-parallel", str(tasks), *extra]
    t = time.monotonic()
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    elapsed = time.monotonic() - t
    if r.returncode != 0:
        sys.exit(f"bench run failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-env-") as tmp:
        root = Path(tmp)
        repo = make_repo(root / "repo")
        first = timed(repo, root / "w0", args.tasks)
        cached, plain = [], []
        for i in range(args.repeats):
            cached.append(timed(repo, root / f"c{i}", args.tasks))
            plain.append(timed(repo, root / f"p{i}", args.tasks, "--no-devcontainer"))
    c, p = statistics.median(cached), statistics.median(plain)
    rows = [
        ("first run (builds the environment, setup once)", f"{first:.1f} s", ""),
        ("cached environment", f"{c:.1f} s", f"{c / p:.2f}x"),
        ("no environment (`--no-devcontainer`)", f"{p:.1f} s", "1.00x"),
    ]
    table = "\n".join(f"| {a} | {b} | {r} |" for a, b, r in rows)
    section = f"""## The project's environment (bench/bench_environment.py)

{args.tasks} tasks (`--runs {args.tasks} --max-parallel {args.tasks}`, `--dry-run`), each reading a file
the setup made and git ignores; the devcontainer's setup takes {SETUP_S} s. Medians of
{args.repeats} runs for the last two rows, process start to exit. Measured on {date.today()},
{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.

| run | wall time | ratio to no environment |
|---|---|---|
{table}

The first run pays for the setup once ({first - c:.1f} s over a cached run; {args.tasks} setups
would be at least {args.tasks * SETUP_S} s). With the environment cached, a run costs
{c / p:.2f}x the same run without one (target: at most 1.3x): what remains is each
workspace's copy of the setup's files.

```bash
uv run python bench/bench_environment.py --repeats {args.repeats} --tasks {args.tasks} --write-doc
```
"""
    print(section)
    if args.write_doc:
        replace_section("## The project's environment", section)


if __name__ == "__main__":
    main()
