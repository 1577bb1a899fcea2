"""Event log and resume benchmarks (issue 2), against raw baselines on the same disk.

    uv run python bench/bench_events.py [--quick] [--write-doc]

1. Appends per second through ``EventLog.append`` under ``interval`` (batched
   fsync) and ``per_event`` (fsync per line), next to a raw baseline: orjson
   dumps + buffered write + one fsync per 256-line batch, and one fsync per line.
2. Resume time for logs of 100k and 1M events: full replay (no snapshot) and
   from a fresh snapshot, next to the floor of reading the file and
   ``orjson.loads`` on every line.

Each figure is the median of several runs. ``--write-doc`` replaces the
"Event log and resume" section of docs/performance.md.
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
from datetime import date
from pathlib import Path

import anyio
import anyio.lowlevel
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import replace_section  # noqa: E402

sys.path.insert(0, str(ROOT))

from orchestrator.log.eventlog import EventLog  # noqa: E402
from orchestrator.log.events import encode_line  # noqa: E402
from orchestrator.log.state import RunState, encode_snapshot, recover, replay, write_snapshot_bytes  # noqa: E402

RUN = "run_bench"
NOTE = """
Reading the figures: resume from a fresh snapshot is `recover()` plus finding
the tasks that were running, which is what the engine does before it re-enters
the strategy. It reads the snapshot's first line and the log after
`last_event_start_offset`, so its cost grows with neither the log's length nor
the number of tasks. The task records stay undecoded in a memory map (state.json
keeps one record per line, sorted by key) and a lookup bisects them, decoding
one: the "lookup" row is that cost. The strategy's re-entry then asks for its
keys one by one; past a few thousand lookups the table decodes every record
at once ("decode every task"), the cost that the earlier whole-document layout
paid up front on every resume (1.31 s at 1M events before this layout).

"""


def payload(i: int) -> dict:
    key = f"{RUN}/s1/gen/{i}"
    return {
        "key": key,
        "instance_id": f"{i:016x}",
        "artifact": {
            "type": "branch",
            "branch_planned": f"b_{i}",
            "branch_final": f"b_{i}",
            "base": "main",
            "commit": f"{i:040x}",
            "has_changes": True,
        },
        "metrics": {"tokens_in": 1200, "tokens_out": 300, "cost_usd": 0.012, "duration_s": 12.5},
        "final_message": "Implemented the change and added tests.",
        "final_message_truncated": False,
        "final_message_path": "",
    }


async def appends(n: int, policy: str, directory: Path) -> float:
    path = directory / f"append_{policy}_{time.time_ns()}.jsonl"
    payloads = [payload(i) for i in range(n)]
    t0 = time.perf_counter()
    async with EventLog(path, run_id=RUN, flush_policy=policy) as log:
        for i, p in enumerate(payloads):
            log.append("task.completed", strategy_execution_id="s1", payload=p, key=p["key"])
            if i % 256 == 255:
                await anyio.lowlevel.checkpoint()  # a real engine yields between events
    elapsed = time.perf_counter() - t0
    path.unlink()
    return n / elapsed


def raw_appends(n: int, per_line: bool, directory: Path) -> float:
    path = directory / f"raw_{time.time_ns()}.jsonl"
    payloads = [payload(i) for i in range(n)]
    t0 = time.perf_counter()
    with open(path, "ab") as fh:
        offset = 0
        batch = []
        for p in payloads:
            line = orjson.dumps(
                {"type": "task.completed", "start_offset": offset, "payload": p}, option=orjson.OPT_APPEND_NEWLINE
            )
            offset += len(line)
            if per_line:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
            else:
                batch.append(line)
                if len(batch) == 256:
                    fh.write(b"".join(batch))
                    fh.flush()
                    os.fsync(fh.fileno())
                    batch = []
        if batch:
            fh.write(b"".join(batch))
            fh.flush()
            os.fsync(fh.fileno())
    elapsed = time.perf_counter() - t0
    path.unlink()
    return n / elapsed


def make_log(path: Path, n_events: int) -> None:
    """A realistic mix: each task scheduled, started, completed (+ a checkpoint every 50 tasks)."""
    offset = 0
    with open(path, "wb") as fh:
        i = 0
        written = 0
        buf = []
        while written < n_events:
            key = f"{RUN}/s1/gen/{i}"
            for etype, p in (
                (
                    "task.scheduled",
                    {
                        "key": key,
                        "instance_id": f"{i:016x}",
                        "container_name": f"c{i}",
                        "model": "sonnet",
                        "task_fingerprint_hash": f"{i:064x}",
                        "branch_name": f"b_{i}",
                        # as the engine writes it (an older log's, without these, is upcast on reading)
                        "plugin": "claude-code",
                        "runs_command": False,
                    },
                ),
                (
                    "task.started",
                    {"key": key, "instance_id": f"{i:016x}", "container_name": f"c{i}", "model": "sonnet"},
                ),
                ("task.completed", payload(i)),
            ):
                line = encode_line(
                    etype,
                    ts="2026-11-22T00:00:00.000Z",
                    run_id=RUN,
                    strategy_execution_id="s1",
                    start_offset=offset,
                    payload=p,
                    key=key,
                )
                buf.append(line)
                offset += len(line)
                written += 1
            if i == 0:
                line = encode_line(
                    "strategy.started",
                    ts="2026-11-22T00:00:00.000Z",
                    run_id=RUN,
                    strategy_execution_id="s1",
                    start_offset=offset,
                    payload={"name": "b", "params": {}},
                )
                buf.append(line)
                offset += len(line)
                written += 1
            i += 1
            if len(buf) > 10000:
                fh.write(b"".join(buf))
                buf = []
        fh.write(b"".join(buf))


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def lookups(state: RunState, keys: list[str]) -> float:
    """Seconds per first lookup of a key in a freshly recovered state."""
    t0 = time.perf_counter()
    for key in keys:
        state.tasks.get(key)
    return (time.perf_counter() - t0) / len(keys)


def read_and_parse(path: Path) -> int:
    n = 0
    with open(path, "rb") as fh:
        for line in fh:
            orjson.loads(line)
            n += 1
    return n


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    fs = (
        subprocess.run(["df", "-T", tempfile.gettempdir()], capture_output=True, text=True)
        .stdout.splitlines()[-1]
        .split()[1]
    )
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, Linux {platform.release()}, "
        f"Python {platform.python_version()}, {fs} at {tempfile.gettempdir()}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args()
    repeats = 3 if args.quick else 5
    n_interval = 50_000 if args.quick else 200_000
    n_per_event = 2_000 if args.quick else 5_000
    sizes = [100_000] if args.quick else [100_000, 1_000_000]
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        d = Path(tmp)
        interval = statistics.median(anyio.run(appends, n_interval, "interval", d) for _ in range(repeats))
        raw_batch = statistics.median(raw_appends(n_interval, False, d) for _ in range(repeats))
        per_event = statistics.median(anyio.run(appends, n_per_event, "per_event", d) for _ in range(repeats))
        raw_line = statistics.median(raw_appends(n_per_event, True, d) for _ in range(repeats))
        rows.append(
            (
                "appends, `interval`",
                f"{interval:,.0f} events/s",
                f"{raw_batch:,.0f} events/s (batch fsync)",
                f"{raw_batch / interval:.2f}x slower than raw",
            )
        )
        rows.append(
            (
                "appends, `per_event`",
                f"{per_event:,.0f} events/s",
                f"{raw_line:,.0f} events/s (fsync per line)",
                f"{raw_line / per_event:.2f}x slower than raw",
            )
        )
        for n in sizes:
            path = d / f"events_{n}.jsonl"
            make_log(path, n)
            # (the default arguments bind this iteration's path and snapshots)
            floor = median_time(lambda path=path: read_and_parse(path), repeats)
            full = median_time(lambda path=path: replay(path, RunState(run_id=RUN)), repeats)
            state = replay(path, RunState(run_id=RUN))
            snaps = [d / f"state_{n}.json"]
            write_snapshot_bytes(encode_snapshot(state), snaps)
            fresh = median_time(lambda path=path, snaps=snaps: recover(RUN, path, snaps).running(), repeats)
            keys = [f"{RUN}/s1/gen/{i}" for i in range(0, len(state.tasks), max(1, len(state.tasks) // 500))]
            lookup = statistics.median(lookups(recover(RUN, path, snaps), keys) for _ in range(repeats))
            decode_all = median_time(lambda path=path, snaps=snaps: recover(RUN, path, snaps).tasks.load_all(), repeats)
            rows.append(
                (
                    f"full replay, {n:,} events ({len(state.tasks):,} tasks)",
                    f"{full:.2f} s = {n / full:,.0f} events/s",
                    f"{floor:.2f} s (read + orjson.loads)",
                    f"{full / floor:.2f}x the floor",
                )
            )
            rows.append(
                (
                    f"resume from fresh snapshot, {n:,} events",
                    f"{fresh * 1000:.2f} ms",
                    f"{snaps[0].stat().st_size / 1e6:.0f} MB snapshot",
                    f"{full / fresh:,.0f}x faster than full replay",
                )
            )
            rows.append((f"then: lookup of one task, {n:,} events", f"{lookup * 1e6:.0f} us", "", ""))
            rows.append((f"then: decode every task, {n:,} events", f"{decode_all:.2f} s", "", ""))
            path.unlink()
    table = ["| measurement | orchestrator | baseline | ratio |", "|---|---|---|---|"]
    table += [f"| {a} | {b} | {c} | {e} |" for a, b, c, e in rows]
    text = "\n".join(table)
    print(text)
    if args.write_doc:
        section = (
            f"## Event log and resume\n\nMeasured with `uv run python bench/bench_events.py --write-doc` "
            f"on {date.today()}: {machine()}; load average {os.getloadavg()[0]:.1f} at the end. "
            f"Medians of {repeats} runs.\n\n{text}\n\n"
            "Targets (issue 2): `interval` appends >= 100,000 events/s and within 3x of the raw baseline; "
            "full replay >= 200,000 events/s; resume from a fresh snapshot under 100 ms.\n" + NOTE
        )
        replace_section("## Event log and resume", section)


if __name__ == "__main__":
    main()
