"""Standalone monitor: ``python -m tui --run-id RUN_ID``.

Read-only: it tails ``logs/<run_id>/events.jsonl`` and reads ``state.json``
snapshots, never takes the writer lock, so any number of monitors can watch a
live or finished run from other terminals. ``q``, Esc or Ctrl+C quits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio

from .console import stream_console
from .dashboard import MODES, monitor, watch_signals


async def _amain(args: argparse.Namespace) -> None:
    if not args.stream:
        await monitor(
            args.run_id,
            logs_dir=args.logs_dir,
            state_dir=args.state_dir,
            results_dir=args.results_dir,
            refresh_hz=args.refresh_hz,
            follow=not args.exit_when_done,
            force_mode=args.mode,
            max_parallel=args.max_parallel,
        )
        return
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_signals, stop)
        await stream_console(args.run_id, logs_dir=args.logs_dir, mode=args.stream, stop=stop)
        tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tui", description="Monitor an orchestrator run (read-only).")
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--logs-dir", type=Path, default=Path("logs"))
    ap.add_argument("--state-dir", type=Path, default=Path("orchestrator_state"))
    ap.add_argument("--results-dir", type=Path, default=Path("results"))
    ap.add_argument("--mode", choices=MODES, help="force the display mode (default: by task count)")
    ap.add_argument("--max-parallel", type=int, help="show running tasks against this limit")
    ap.add_argument("--refresh-hz", type=float, default=10.0)
    ap.add_argument("--exit-when-done", action="store_true", help="return once every strategy execution has completed")
    ap.add_argument(
        "--stream",
        choices=("plain", "json"),
        help="print events as lines (like --no-tui / --json) instead of the dashboard",
    )
    args = ap.parse_args(argv)
    run_dir = args.logs_dir / args.run_id
    if not run_dir.is_dir():
        print(
            f"no run {args.run_id!r}: {run_dir} does not exist (use --logs-dir to point at the logs)", file=sys.stderr
        )
        return 2
    try:
        anyio.run(_amain, args)
    except KeyboardInterrupt:  # a second Ctrl+C before the handler was installed
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
