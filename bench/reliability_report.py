"""Run the reliability suites and print the counts table of docs/reliability.md.

    uv run python bench/reliability_report.py                    # everything but the daemon restart
    uv run python bench/reliability_report.py --daemon-restart   # also the engine restart (on a private dockerd)

Each test appends its counts to the file named by RELIABILITY_REPORT
(tests/reliability_helpers.py:record); the bad-input count comes from the
pytest results of tests/test_cli_errors.py. Exit status is pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = [
    "tests/test_reliability_crash.py",
    "tests/test_reliability_faults.py",
    "tests/test_reliability_hostile.py",
    "tests/test_reliability_secrets.py",
    "tests/test_reliability_concurrency.py",
    "tests/test_cli_errors.py",
    "tests/test_reliability_containment.py",
    "tests/test_reliability_runaway.py",
]


def run(daemon_restart: bool) -> tuple[int, list[dict], dict[str, int], float]:
    report = Path(tempfile.mkstemp(prefix="reliability-", suffix=".jsonl")[1])
    marker = "slow or not slow" if daemon_restart else "not daemon_restart"
    env = {**os.environ, "RELIABILITY_REPORT": str(report), "UV_PYTHON_DOWNLOADS": "never"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker, "-rA", *SUITES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    sys.stderr.write(proc.stdout[-3000:])
    rows = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    report.unlink()
    outcomes: dict[str, int] = defaultdict(int)
    for line in proc.stdout.splitlines():
        m = re.match(r"^(PASSED|FAILED|ERROR|SKIPPED) tests/test_cli_errors\.py::test_bad_input", line)
        if m:
            outcomes[m.group(1)] += 1
    return proc.returncode, rows, outcomes, wall


def table(rows: list[dict], bad_inputs: dict[str, int]) -> str:
    crash = [r for r in rows if r["suite"] == "crash"]
    crash_agent = [r for r in rows if r["suite"] == "crash-agent"]
    signals = [r for r in rows if r["suite"] == "signals"]
    faults = [r for r in rows if r["suite"] == "faults"]
    hostile = [r for r in rows if r["suite"] == "hostile"]
    names = [r for r in rows if r["suite"] == "bad input"]
    secrets = [r for r in rows if r["suite"] == "secrets"]
    conc = [r for r in rows if r["suite"] == "concurrency"]
    out = ["| What | Tried | Survived |", "|---|---|---|"]
    for r in crash:
        phases = ", ".join(f"{k}: {v}" for k, v in sorted(r["phases"].items()))
        out.append(
            f"| SIGKILL + resume, {r['case']} ({r['runs']} runs to completion in {r['processes']} processes; "
            f"{r['agent_executions']} agent executions for {r['keys']} task keys, 0 after a durable completion; "
            f"kills landed: {phases}) | {r['kills_tried']} | {r['kills_survived']} |"
        )
    for r in crash_agent:
        out.append(
            f"| SIGKILL while the agents work, then resume ({r['tasks']} tasks, {r['processes']} processes; "
            f"{r['agent_executions']} agent executions: {r['fresh_sessions']} sessions started, "
            f"{r['resumed_executions']} resumed in the kept workspace; no task's session started twice) | "
            f"{r['kills_tried']} | {r['kills_survived']} |"
        )
    for r in signals:
        out.append(f"| SIGTERM, SIGINT, double SIGINT then resume | {r['signals_tried']} | {r['signals_survived']} |")
    for r in faults:
        out.append(f"| fault: {r['fault']} -> {r['outcome']} | 1 | {r['survived']} |")
    for r in hostile:
        what = r.get("what", "hostile agent probes (socket, host repo, workspaces, read-only root, offline network)")
        out.append(f"| {what} | {r['tried']} | {r['contained']} contained |")
    for r in (r for r in rows if r["suite"] == "commit scan"):
        out.append(f"| {r['what']} | {r['tried']} | {r['handled']} |")
    total_bad = sum(bad_inputs.values())
    out.append(
        f"| bad CLI input (tests/test_cli_errors.py: one line, exit 2, nothing written) | {total_bad} | "
        f"{bad_inputs.get('PASSED', 0)} |"
    )
    for r in names:
        out.append(f"| {r['what']} | {r['tried']} | {r['handled']} |")
    for r in conc:
        out.append(f"| concurrency: {r['case']} | 1 | {r['survived']} |")
    leaked = sum(r["leaked"] for r in secrets)
    files = max((r["files_scanned"] for r in secrets), default=0)
    out.append(
        f"| secrets planted (property test, {files} file scans + every event + docker inspect) | "
        f"{len(secrets)} runs | leaked: {leaked} |"
    )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daemon-restart", action="store_true", help="also run the Docker daemon restart test")
    args = ap.parse_args()
    code, rows, bad_inputs, wall = run(args.daemon_restart)
    print(table(rows, bad_inputs))
    print(f"\npytest exit status {code}; wall time {wall:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
