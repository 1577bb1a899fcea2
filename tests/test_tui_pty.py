"""``python -m tui --run-id`` in a real terminal (tmux) on a live synthetic run.

A background process writes the run with the real event-log writer while two
monitors watch it from their own terminals; pressing ``q`` in one and Ctrl+C
in the other must end each with exit status 0 and give the shell back clean.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from tmux_helpers import tmux, wait_for_screen

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


def done_count(screen: str) -> int:
    m = re.search(r"(\d+)/12 done", screen)
    return int(m.group(1)) if m else -1


def test_monitor_shows_a_live_run_and_leaves_the_terminal_clean(tmp_path, sessions):
    run_id = "run_pty"
    logs, state = tmp_path / "logs", tmp_path / "state"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tui.synthetic",
            "--run-id",
            run_id,
            "--tasks",
            "12",
            "--max-parallel",
            "4",
            "--duration",
            "8",
            "--logs-dir",
            str(logs),
            "--state-dir",
            str(state),
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while not (logs / run_id / "events.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        monitor = (
            f"{sys.executable} -m tui --run-id {run_id} --logs-dir {logs} --state-dir {state} "
            f"--results-dir {tmp_path / 'results'} --max-parallel 4"
        )
        for _key in ("q", "C-c"):  # one monitor for each exit key sent below
            name = f"tui-{uuid.uuid4().hex[:8]}"
            sessions.append(name)
            tmux("new-session", "-d", "-s", name, "-x", "120", "-y", "40", "bash --norc --noprofile")
            tmux("send-keys", "-t", name, f"cd {tmp_path} && echo BEFORE-$((40+2)) && {monitor}; echo EXIT=$?", "Enter")
        first = wait_for_screen(
            sessions[0],
            lambda s: "[compact]" in s and re.search(r"running [1-4]/4", s) is not None and done_count(s) >= 0,
        )
        assert f"🚀 {run_id}" in first and "best-of-n" in first
        assert re.search(r"running [1-4]/4", first)
        assert len(re.findall(r"\btask/\d+", first)) == 12  # each task by its readable key
        assert "BEFORE-42" not in first and "EXIT=" not in first  # the alternate screen hides the shell
        # The display keeps up with the writer: more tasks finish while we watch.
        later = wait_for_screen(sessions[0], lambda s: done_count(s) > done_count(first), timeout=20)
        second = wait_for_screen(sessions[1], lambda s: "[compact]" in s)  # a second monitor on the same run
        assert f"🚀 {run_id}" in later and f"🚀 {run_id}" in second
        for name, key in zip(sessions, ("q", "C-c"), strict=True):
            tmux("send-keys", "-t", name, key)
            # (the echoed command contains "EXIT=$?" and "BEFORE-$((40+2))"; their outputs do not)
            after = wait_for_screen(name, lambda s: re.search(r"EXIT=\d", s), timeout=10)
            assert "EXIT=0" in after
            assert "BEFORE-42" in after  # the shell's earlier output is back
            assert "health" not in after and "🚀" not in after  # nothing of the dashboard left behind
            # The terminal is back in cooked mode with echo: typed text shows up at the prompt.
            tmux("send-keys", "-t", name, "echo typed-$((6*7))", "Enter")
            wait_for_screen(name, lambda s: "typed-42" in s and "echo typed-$((6*7))" in s, timeout=5)
        assert writer.wait(timeout=30) == 0  # monitors never touched the writer's lock
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
