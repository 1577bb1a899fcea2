"""One lock file held exclusively, against this process's threads and other processes. A thread lock per path comes
first: msvcrt locks are per process (flock's per open file description); ``filelock`` would need the same one."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator

_thread_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str], *, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the lock file ``path`` (created if missing) until the block ends; ``on_wait`` is called once, before
    blocking, when another thread or process holds it. Raises :class:`OSError` when the file cannot be opened."""
    real = os.path.realpath(path)
    with _thread_locks_guard:
        thread_lock = _thread_locks[os.path.normcase(real)]
    waited = False
    if not thread_lock.acquire(blocking=False):
        waited = True
        if on_wait is not None:
            on_wait()
        thread_lock.acquire()
    try:
        fd = os.open(real, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if not _os_try_lock(fd):
                if on_wait is not None and not waited:
                    on_wait()
                _os_lock(fd)
            try:
                yield
            finally:
                _os_unlock(fd)
        finally:
            os.close(fd)
    finally:
        thread_lock.release()


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt
    import time

    def _os_try_lock(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _os_lock(fd: int) -> None:
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            try:
                msvcrt.locking(fd, msvcrt.LK_LOCK, 1)  # retries ~10 s, then OSError
                return
            except OSError:
                time.sleep(0.1)

    def _os_unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _os_try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _os_lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)

    def _os_unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
