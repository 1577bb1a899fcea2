"""SIGKILL a run of a few hundred tasks at random moments; every resume keeps its promises."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.log.eventlog import iter_lines, read_events
from orchestrator.log.events import decode_line
from orchestrator.log.state import encode_snapshot, load_snapshot, replay

WORKER = str(Path(__file__).parent / "crash_worker.py")


def durable_completed(events: Path) -> set[str]:
    if not events.exists():
        return set()
    return {e.key for e in read_events(events) if e.type in ("task.completed", "task.failed")}


def run_worker(out: Path, calls: Path, *, kill: tuple[str, float] | None):
    """Run the worker to the end (``kill=None``), or SIGKILL it at a moment ``kill`` picks.

    ``("bytes", n)``: once its log has grown by n bytes, a moment measured in the
    run's own progress, so a faster machine or start-up does not let the run
    finish before the test has killed it twenty times. ``("seconds", t)``: t
    seconds after start, which lands in start-up and resume.
    """
    events = out / "logs" / "run_t" / "events.jsonl"
    start = events.stat().st_size if events.exists() else 0
    proc = subprocess.Popen([sys.executable, WORKER, str(out), str(calls)], stderr=subprocess.PIPE)
    if kill is None:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        return True
    how, amount = kill
    t0 = time.monotonic()
    while proc.poll() is None:
        grown = (events.stat().st_size if events.exists() else 0) - start
        if (
            (how == "bytes" and grown >= amount)
            or (how == "seconds" and time.monotonic() - t0 >= amount)
            or time.monotonic() - t0 > 60
        ):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return False
        time.sleep(0.002)
    return proc.returncode == 0


@pytest.mark.slow
def test_sigkill_at_random_moments_never_reruns_durably_completed_tasks(tmp_path):
    reference = tmp_path / "reference"
    run_worker(reference, tmp_path / "ref_calls.log", kill=None)
    ref_state = replay(reference / "logs" / "run_t" / "events.jsonl", run_id="run_t")

    # ctx.rand() differs between two separate runs, so compare what does not depend on it
    def essentials(state):
        return {
            sid: (s.status, s.result["failed"], s.result["top"], len(s.result["refined"]))
            for sid, s in state.strategies.items()
        }

    expected = essentials(ref_state)
    assert len(ref_state.tasks) > 250

    out = tmp_path / "crashy"
    events = out / "logs" / "run_t" / "events.jsonl"
    rng = random.Random(20261122)
    kills = 0
    attempt = 0
    while True:
        attempt += 1
        before = durable_completed(events)
        calls = tmp_path / f"calls_{attempt}.log"
        calls.touch()
        if kills >= 30:
            kill = None
        elif rng.random() < 0.2:
            kill = ("seconds", rng.uniform(0.05, 0.4))
        else:
            kill = ("bytes", rng.uniform(2_000, 30_000))
        finished = run_worker(out, calls, kill=kill)
        started = {line.split(" ", 1)[1] for line in calls.read_text().splitlines() if line.startswith("start ")}
        assert not (started & before), (
            f"process {attempt} re-ran durably finished tasks: {sorted(started & before)[:5]}"
        )
        if finished:
            break
        kills += 1
        # the log is always parseable and every offset seeks to its own line
        with open(events, "rb") as fh:
            for offset, line in iter_lines(events):
                fh.seek(offset)
                assert fh.readline() == line
                decode_line(line)
    assert kills >= 20
    final = replay(events, run_id="run_t")
    assert essentials(final) == expected
    for sid, strat in final.strategies.items():
        # the seed drawn before the first crash is the one every later process replayed
        first = next(
            e for e in read_events(events) if e.type == "strategy.checkpoint" and e.strategy_execution_id == sid
        )
        assert strat.result["seed"] == first.payload["value"][1]
    per_key = {}
    for e in read_events(events):
        if e.type in ("task.completed", "task.failed"):
            per_key[e.key] = per_key.get(e.key, 0) + 1
    assert set(per_key) == set(ref_state.tasks) and set(per_key.values()) == {1}
    snapshot = load_snapshot([out / "state" / "run_t" / "state.json"])
    assert encode_snapshot(snapshot) == encode_snapshot(final)
