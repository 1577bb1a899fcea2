"""Where a test run's time went: workers, chains of grouped tests, and the tail.

    ORCHESTRATOR_TEST_TIMELINE=/tmp/timeline.jsonl bash scripts/test.sh
    uv run python scripts/test_timeline.py /tmp/timeline.jsonl

tests/conftest.py writes one line per test (its id, worker, start and end, and
the CPU time of the worker and of the commands the test ran). The
run can end no sooner than its longest chain of tests that must share one
worker (an ``xdist_group``), nor sooner than its CPU work allows; this prints
both, and how many workers were busy minute by minute.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict


def main(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    if not rows:
        sys.exit(f"{path} has no tests: run the suite with ORCHESTRATOR_TEST_TIMELINE={path}")
    t0 = min(r["start"] for r in rows)
    end = max(r["end"] for r in rows)
    print(f"{len(rows)} tests, {end - t0:.0f} s from the first start to the last end")

    groups: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        m = re.search(r"@([\w.-]+)$", r["test"])
        if m:
            groups[m.group(1)] += r["end"] - r["start"]
            counts[m.group(1)] += 1
    print("\nchains (tests of one group run one after another on one worker):")
    for name, total in sorted(groups.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {total:7.0f} s  {counts[name]:4d} tests  {name}")

    workers: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        workers[r["worker"]].append(r)
    print("\nworkers (busy seconds, last end):")
    for w, rs in sorted(workers.items()):
        busy = sum(r["end"] - r["start"] for r in rs)
        print(f"  {w:6s} {busy:7.0f} s busy, done at {max(r['end'] for r in rs) - t0:6.0f} s, {len(rs)} tests")

    print("\nworkers busy, minute by minute:")
    minute = 0
    while t0 + minute * 60 < end:
        a, b = t0 + minute * 60, t0 + (minute + 1) * 60
        busy = sum(max(0.0, min(b, r["end"]) - max(a, r["start"])) for r in rows) / 60
        print(f"  {minute:3d}  {busy:4.1f}  {'#' * round(busy * 4)}")
        minute += 1

    if any("cpu" in r for r in rows):
        # CPU of the test's worker and the commands it ran; the engine's share is not in it
        by_file: dict[str, float] = defaultdict(float)
        for r in rows:
            by_file[r["test"].split("::")[0]] += r.get("cpu", 0.0)
        total = sum(by_file.values())
        print(f"\nCPU of the tests' own processes: {total:.0f} CPU-s; the costliest files:")
        for name, cpu in sorted(by_file.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {cpu:7.1f}  {name}")
        print("\nthe costliest tests:")
        for r in sorted(rows, key=lambda r: -r.get("cpu", 0.0))[:25]:
            print(f"  {r.get('cpu', 0.0):7.1f}  {r['test']}")

    print("\nthe last tests to finish:")
    for r in sorted(rows, key=lambda r: r["end"])[-12:]:
        print(f"  {r['start'] - t0:6.0f} -> {r['end'] - t0:6.0f}  {r['worker']:6s} {r['test']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/timeline.jsonl")
