"""Real terminals for the dashboard tests: tmux sessions, their screens, and the ``sessions`` fixture (offered by
conftest.py) that kills every session a test started."""

from __future__ import annotations

import subprocess
import time

import pytest


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def capture(session: str) -> str:
    return tmux("capture-pane", "-t", session, "-p")


def wait_for_screen(session: str, predicate, timeout: float = 15.0) -> str:
    """The session's screen once ``predicate`` holds for it."""
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = capture(session)
        if predicate(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"timed out; the screen was:\n{screen}")


@pytest.fixture
def sessions():
    """The names of the tmux sessions a test starts; each is killed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
