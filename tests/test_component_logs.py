"""Component logs rotate by size; --debug streams every component's log to stderr."""

from __future__ import annotations

import io
import json
import sys
import threading
import time

import pytest
from cli_helpers import cli_env, run_cli
from conftest import TEST_IMAGE, make_repo

from orchestrator import jsonlog
from orchestrator.jsonlog import ComponentLog


def test_component_log_rotates_by_size_and_keeps_the_configured_backups(tmp_path):
    path = tmp_path / "runner.jsonl"
    log = ComponentLog(path, "runner", "r1", max_bytes=2000, backups=2)
    for i in range(200):
        log.info("line", n=i, pad="x" * 50)
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["runner.jsonl", "runner.jsonl.1", "runner.jsonl.2"], files
    for name in files:
        text = (tmp_path / name).read_text()
        assert len(text.encode()) < 2000 + 200
        assert all(json.loads(line)["component"] == "runner" for line in text.splitlines())
    # the newest lines are in the live file, the ones before in .1
    last = [json.loads(x)["n"] for x in (tmp_path / "runner.jsonl").read_text().splitlines()]
    prev = [json.loads(x)["n"] for x in (tmp_path / "runner.jsonl.1").read_text().splitlines()]
    assert last[-1] == 199 and prev[-1] + 1 == last[0]


def test_a_reopened_log_counts_what_is_already_there(tmp_path):
    path = tmp_path / "tui.jsonl"
    path.write_bytes(b"x" * 5000 + b"\n")
    log = ComponentLog(path, "tui", "r1", max_bytes=4096, backups=1)
    log.info("one more")
    log.close()
    assert (tmp_path / "tui.jsonl.1").exists() and path.stat().st_size == 0


@pytest.mark.docker
def test_debug_streams_every_component_log_to_stderr(tmp_path):
    repo = make_repo(tmp_path / "repo")
    r = run_cli(
        ["SIM: done", "--dry-run", "--no-tui", "--debug", "--docker-image", TEST_IMAGE],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    components = set()
    for line in r.stderr.splitlines():
        if line.startswith("{"):
            components.add(json.loads(line).get("component"))
    assert {"orchestration", "runner", "tui"} <= components, components


class _SwitchingStream(io.StringIO):
    """stderr that hands the GIL to another thread after every write, as a busy machine does."""

    def write(self, s: str) -> int:
        n = super().write(s)
        time.sleep(0)
        return n


def test_debug_echo_keeps_each_line_whole_when_threads_log_at_once(monkeypatch):
    """The runner's threads and the event loop log at once under --debug: every stderr line is one record.
    (Seen under six test workers' load: two records on one line, a newline each split off.)"""
    err = _SwitchingStream()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(jsonlog, "_settings", dict(jsonlog._settings))
    jsonlog.configure(max_bytes=0, backups=0, echo=True)
    logs = [ComponentLog(None, f"component{i}", "r1") for i in range(8)]

    def work(log: ComponentLog) -> None:
        for n in range(300):
            log.info("line", n=n)

    threads = [threading.Thread(target=work, args=(log,)) for log in logs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jsonlog.echo.drain(30)
    lines = err.getvalue().splitlines()
    assert len(lines) == 8 * 300
    assert sorted((r["component"], r["n"]) for r in map(json.loads, lines)) == sorted(
        (f"component{i}", n) for i in range(8) for n in range(300)
    )


class _UnreadPipe(io.StringIO):
    """stderr whose reader has stopped: every write waits until the reader comes back."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.Event()

    def write(self, s: str) -> int:
        self.reading.wait()
        return super().write(s)


def test_debug_echo_never_blocks_the_logger_when_stderr_is_not_read(monkeypatch, tmp_path):
    """The event loop logs under --debug: a stderr pipe nobody reads must not stop it. The lines
    still reach the log file at once, and stderr gets them (and a count of those it had no room
    for) once it is read again."""
    err = _UnreadPipe()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(jsonlog, "_settings", dict(jsonlog._settings))
    monkeypatch.setattr(jsonlog._Echo, "LIMIT", 50)
    monkeypatch.setattr(jsonlog, "echo", jsonlog._Echo())
    jsonlog.configure(max_bytes=0, backups=0, echo=True)
    log = ComponentLog(tmp_path / "runner.jsonl", "runner", "r1")
    done = threading.Event()

    def work() -> None:
        for n in range(200):
            log.info("line", n=n)
        done.set()

    threading.Thread(target=work, daemon=True).start()
    try:
        assert done.wait(10), "logging waited for a stderr nobody reads"
        assert len((tmp_path / "runner.jsonl").read_text().splitlines()) == 200
    finally:
        err.reading.set()
    jsonlog.echo.drain(10)
    lines = [json.loads(line) for line in err.getvalue().splitlines()]
    echoed = [r["n"] for r in lines if r["component"] == "runner"]
    assert echoed == sorted(echoed) and 50 <= len(echoed) < 200, echoed
    (note,) = [r for r in lines if r["component"] == "debug-echo"]
    assert note["message"] == f"{200 - len(echoed)} lines were not echoed: stderr was not being read"
