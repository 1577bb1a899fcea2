"""CPU used by the dashboard following a synthetic 500-task run (target: < 10% of one core at 10 Hz).

A separate process writes the run with the real event-log writer (500 tasks,
20 in parallel, ~1,500 events spread over ``--seconds``, plus state.json
snapshots every second); this process runs the real dashboard loops (event
tail, 3 s reconciliation, 10 Hz render loop) into a 120x40 terminal console
whose output goes to /dev/null. CPU is this process's time.process_time()
(all threads: the watchfiles notifier and the worker threads count) over the
wall time of the window. Also measured: the same dashboard on the finished run
(nothing changes; the render loop still ticks).

    uv run python bench/bench_tui.py [--seconds 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from rich.console import Console
from rich.live import Live

from orchestrator.log.eventlog import read_events
from tui.dashboard import Dashboard, render
from tui.model import RunModel

TASKS = 500


def terminal() -> Console:
    return Console(file=open(os.devnull, "w"), force_terminal=True, width=120, height=40, color_system="256")


async def measure(root: Path, run_id: str, seconds: float) -> dict[str, float]:
    dash = Dashboard(
        run_id,
        logs_dir=root / "logs",
        state_dir=root / "state",
        results_dir=root / "results",
        console=terminal(),
        refresh_hz=10,
    )
    stop = anyio.Event()
    out: dict[str, float] = {}

    async def window() -> None:
        await anyio.sleep(0.2)  # let the loops start; the first read of a finished log is not steady state
        cpu0, wall0, ticks0, frames0 = time.process_time(), time.monotonic(), dash.ticks, dash.frames
        await anyio.sleep(seconds)
        out["cpu_s"] = time.process_time() - cpu0
        out["wall_s"] = time.monotonic() - wall0
        out["ticks"] = dash.ticks - ticks0
        out["frames"] = dash.frames - frames0
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(window)
        await dash.run(stop)
    out["events"] = dash.model.events
    out["cpu_pct"] = 100 * out["cpu_s"] / out["wall_s"]
    return out


def live_once(seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        writer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tui.synthetic",
                "--run-id",
                "bench",
                "--tasks",
                str(TASKS),
                "--max-parallel",
                "20",
                "--duration",
                str(seconds),
                "--logs-dir",
                str(root / "logs"),
                "--state-dir",
                str(root / "state"),
            ]
        )
        try:
            while not (root / "logs" / "bench" / "events.jsonl").exists():
                time.sleep(0.02)
            result = anyio.run(measure, root, "bench", seconds)
        finally:
            writer.wait(timeout=seconds + 30)
        return result


def idle_once(seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tui.synthetic",
                "--run-id",
                "bench",
                "--tasks",
                str(TASKS),
                "--duration",
                "0",
                "--logs-dir",
                str(root / "logs"),
                "--state-dir",
                str(root / "state"),
            ],
            check=True,
        )
        result = anyio.run(measure, root, "bench", seconds)
        result["frame_ms"] = frame_cost_ms(root / "logs" / "bench" / "events.jsonl")
        return result


def frame_cost_ms(events_path: Path, frames: int = 50) -> float:
    """Median CPU time to build and draw one full frame of the finished 500-task run."""
    model = RunModel("bench")
    for ev in read_events(events_path):
        model.feed(ev)
    console = terminal()
    times = []
    with Live(
        console=console, screen=True, auto_refresh=False, transient=True, redirect_stdout=False, redirect_stderr=False
    ) as live:
        for i in range(frames):
            t0 = time.process_time()  # CPU, not wall: the machine may be busy
            live.update(render(model, width=120, height=40, now=model.last_ts + i), refresh=True)
            times.append(time.process_time() - t0)
    return 1000 * statistics.median(times)


def row(label: str, r: dict[str, float]) -> str:
    return (
        f"| {label} | {r['cpu_pct']:.1f}% | {r['cpu_s']:.2f} s / {r['wall_s']:.1f} s | "
        f"{r['ticks'] / r['wall_s']:.1f} Hz | {r['frames'] / r['wall_s']:.1f}/s | {int(r['events'])} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"load average before: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print("| case | CPU (one core) | CPU / wall | render ticks | frames drawn | events |")
    print("|---|---:|---:|---:|---:|---:|")
    live = []
    for i in range(args.repeats):
        r = live_once(args.seconds)
        live.append(r)
        print(row(f"live 500-task run, repeat {i + 1}", r), flush=True)
    idle = idle_once(args.seconds / 2)
    print(row("finished 500-task run (idle)", idle))
    print(f"one full 500-task frame (build + draw, 120x40): CPU {idle['frame_ms']:.1f} ms (median of 50)")
    print(
        f"median CPU following the live run: {statistics.median(r['cpu_pct'] for r in live):.1f}% of one core; "
        f"load average after: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
