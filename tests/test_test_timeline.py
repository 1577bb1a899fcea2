"""scripts/test_timeline.py: where a test run's time and CPU went, from the timeline conftest.py writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "test_timeline.py"


def _report(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=60)


def test_it_names_the_chains_the_busy_workers_and_the_costliest_files_and_tests(tmp_path):
    rows = [
        # a chain of two grouped tests on gw0, 0-90 s
        {"test": "tests/test_a.py::test_one@private_engine_0", "worker": "gw0", "start": 0, "end": 60, "cpu": 5.0},
        {"test": "tests/test_a.py::test_two@private_engine_0", "worker": "gw0", "start": 60, "end": 90, "cpu": 1.5},
        # two short tests on gw1, the second ending last
        {"test": "tests/test_b.py::test_x", "worker": "gw1", "start": 0, "end": 30, "cpu": 9.0},
        {"test": "tests/test_b.py::test_y", "worker": "gw1", "start": 30, "end": 120, "cpu": 0.5},
    ]
    path = tmp_path / "timeline.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _report(path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "4 tests, 120 s from the first start to the last end" in text
    chain = next(line for line in text.splitlines() if "private_engine_0" in line)
    assert chain.split()[:4] == ["90", "s", "2", "tests"], chain
    assert "gw0         90 s busy, done at     90 s, 2 tests" in text
    # minute 0: both workers busy all minute; minute 1: gw0 for 30 s and gw1 all minute
    minutes = text.split("minute by minute:\n")[1].splitlines()[:2]
    assert [line.split()[:2] for line in minutes] == [["0", "2.0"], ["1", "1.5"]], minutes
    costly = text.split("the costliest files:\n")[1].splitlines()[:2]
    assert [line.split() for line in costly] == [["9.5", "tests/test_b.py"], ["6.5", "tests/test_a.py"]]
    assert "CPU of the tests' own processes: 16 CPU-s" in text
    tests = text.split("the costliest tests:\n")[1].splitlines()[0]
    assert tests.split() == ["9.0", "tests/test_b.py::test_x"]
    assert text.rstrip().splitlines()[-1].split()[-1] == "tests/test_b.py::test_y"  # the last to finish


def test_a_timeline_without_cpu_still_reads_and_an_empty_one_says_how_to_make_one(tmp_path):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"test": "tests/test_a.py::test_one", "worker": "gw0", "start": 0, "end": 5}) + "\n")
    out = _report(old)
    assert out.returncode == 0, out.stderr
    assert "1 tests, 5 s" in out.stdout and "CPU of" not in out.stdout
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = _report(empty)
    assert out.returncode != 0
    assert f"ORCHESTRATOR_TEST_TIMELINE={empty}" in out.stderr and "Traceback" not in out.stderr
