"""Stress: a task's clone (``_prepare_workspace_sync``) while another thread
commits and runs ``git repack -a -d`` / ``git gc --prune=now`` in the source.

Each clone is checked with ``git fsck --full --no-dangling``. Counts clones
that failed (``clone_error``) and clones that succeeded with damage
(``silent_broken``). ``SMALL_TREE=1`` removes each commit's files again, so the
checkout stays small and the object-store copy is most of a clone.

    SMALL_TREE=1 uv run python bench/stress_clone_repack.py [seconds] [full_copy|shared_objects]
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from orchestrator.errors import GitError
from orchestrator.runner.git_ops import _prepare_workspace_sync


def git(*a, cwd, inp=None, check=True):
    return subprocess.run(["git", *a], cwd=cwd, input=inp, capture_output=True, text=True, check=check)


def make_loose(repo, n, tag):
    # n new blobs + a tree + a commit on main, all loose
    d = repo / "d"
    d.mkdir(exist_ok=True)
    paths = []
    for i in range(n):
        p = d / f"{tag}_{i}.txt"
        p.write_text(f"{tag} {i} {time.time_ns()}\n")
        paths.append(str(p))
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", tag, cwd=repo)
    if os.environ.get("SMALL_TREE"):
        shutil.rmtree(d)
        git("add", "-A", cwd=repo)
        git("commit", "-q", "-m", tag + "-rm", cwd=repo)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30
    mode = sys.argv[2] if len(sys.argv) > 2 else "full_copy"
    root = Path(tempfile.mkdtemp(prefix="h18gc-"))
    repo = root / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    git("config", "user.email", "a@b", cwd=repo)
    git("config", "user.name", "a", cwd=repo)
    git("config", "gc.auto", "0", cwd=repo)
    make_loose(repo, 3000, "init")
    stop = threading.Event()
    gen = [0]

    def churn():
        k = 0
        while not stop.is_set():
            k += 1
            make_loose(repo, 300, f"c{k}")
            git("repack", "-a", "-d", "-q", cwd=repo, check=False) if k % 2 else git(
                "gc", "-q", "--prune=now", cwd=repo, check=False
            )
            gen[0] = k

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    counts = {"ok": 0, "clone_error": 0, "silent_broken": 0}
    errs = {}
    end = time.time() + seconds
    i = 0
    while time.time() < end:
        i += 1
        ws = root / f"ws{i}"
        try:
            _prepare_workspace_sync(repo, "main", ws, isolation_mode=mode)
        except GitError as e:
            counts["clone_error"] += 1
            line = str(e).splitlines()[-1][:160] if str(e) else repr(e)
            errs[line] = errs.get(line, 0) + 1
            shutil.rmtree(ws, ignore_errors=True)
            continue
        git("-c", "safe.directory=*", "update-ref", "-d", "--no-deref", "refs/remotes/origin/HEAD", cwd=ws, check=False)
        r = git("-c", "safe.directory=*", "fsck", "--full", "--no-dangling", "--no-progress", cwd=ws, check=False)
        if r.returncode != 0:
            counts["silent_broken"] += 1
            line = (r.stderr or r.stdout).strip().splitlines()[0][:160]
            errs["fsck: " + line] = errs.get("fsck: " + line, 0) + 1
        else:
            counts["ok"] += 1
        shutil.rmtree(ws, ignore_errors=True)
    stop.set()
    t.join()
    print(mode, "clones", i, counts, "churn rounds", gen[0])
    for k, v in sorted(errs.items(), key=lambda x: -x[1])[:8]:
        print(f"  {v:4} {k}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
