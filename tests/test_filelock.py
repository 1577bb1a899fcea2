"""The lock file runs on one machine take turns with: threads and processes, and saying so before waiting."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from orchestrator.errors import GitError
from orchestrator.filelock import file_lock
from orchestrator.runner.git_cmd import dir_lock

HOLD = (
    "import fcntl, sys, time; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); "
    "print('held', flush=True); time.sleep(float(sys.argv[2]))"
)


def test_a_free_lock_is_taken_without_a_word(tmp_path):
    said = []
    with file_lock(tmp_path / "x.lock", on_wait=lambda: said.append("waiting")):
        pass
    assert said == []


def test_a_lock_another_process_holds_is_waited_for_after_saying_so_once(tmp_path):
    path = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), "1.0"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said = []
        t0 = time.monotonic()
        with file_lock(path, on_wait=lambda: said.append(time.monotonic() - t0)):
            waited = time.monotonic() - t0
        assert len(said) == 1 and said[0] < 0.5
        assert waited >= 0.5, "the lock was taken while the other process held it"
    finally:
        holder.wait(30)


def test_threads_of_one_process_take_turns_and_the_waiting_one_says_so(tmp_path):
    path = tmp_path / "x.lock"
    inside, said = [], []
    entered = threading.Event()

    def first():
        with file_lock(path):
            inside.append("first in")
            entered.set()
            time.sleep(0.3)
            inside.append("first out")

    t = threading.Thread(target=first)
    t.start()
    entered.wait(10)
    with file_lock(path, on_wait=lambda: said.append("waiting")):
        inside.append("second in")
    t.join()
    assert inside == ["first in", "first out", "second in"]
    assert said == ["waiting"]


def test_a_lock_file_that_cannot_be_opened_is_a_git_error_naming_it(tmp_path):
    with (
        pytest.raises(GitError, match=r"cannot open lock file .*missing-dir/x\.lock"),
        dir_lock(tmp_path / "missing-dir", "x.lock"),
    ):
        pass


def test_an_error_inside_the_locked_block_is_the_callers_own(tmp_path):
    with pytest.raises(FileNotFoundError), dir_lock(tmp_path, "x.lock"):
        open(tmp_path / "nope")  # noqa: SIM115
    with file_lock(tmp_path / "x.lock"):  # and the lock was released
        pass
