"""Keeping the user's repository packed while runs import into it.

Every import adds a few objects to the user's repository: the agent's commits,
trees and blobs (a small fetch is unpacked into loose object files) and the
provenance note (``git notes`` writes loose objects). ``git gc --auto`` only
collects them at 6,700 loose objects, so after a few hundred tasks every clone,
fetch and object lookup in that repository paid for a thousand loose files
(issue 32: the same 50 tasks took 2.4x as long after 250 had run).

After an import, under the import lock, :func:`keep_packed` looks at the
repository's loose objects and packs; past a small limit it runs
``git repack -d --geometric=2``: the loose objects become one pack, and small
packs are rolled up so that each pack holds at least twice the objects of the
next smaller one. The repository then holds a few packs whose number grows with
the logarithm of what was imported, and the user's own large pack is left as it
is (a roll-up never rewrites it while the small packs together are under half
its size). Objects are only moved from loose files into packs, never dropped:
nothing is pruned, so unreachable objects stay, as they would without us.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .git_cmd import run_git

logger = logging.getLogger("orchestrator.runner")

# Loose objects (about six per import) or packs before a roll-up: a repack of a
# few dozen objects takes tens of milliseconds, and the lock is held meanwhile.
LOOSE_LIMIT = 64
PACK_LIMIT = 16


def object_counts(repo: Path) -> tuple[int, int]:
    """``(loose objects, packs)`` of ``repo`` (``git count-objects -v``; (0, 0) if git cannot tell)."""
    proc = run_git(["count-objects", "-v"], cwd=repo, check=False)
    fields = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    try:
        return int(fields.get("count", 0)), int(fields.get("packs", 0))
    except ValueError:
        return 0, 0


def keep_packed(repo: Path) -> bool:
    """Roll loose objects and small packs of ``repo`` up when there are too many.

    Called with the import lock held (so two imports never repack at once).
    Returns whether a repack ran. A failed repack is logged, never raised: the
    import it follows has already succeeded, and git keeps every object either way.
    """
    loose, packs = object_counts(repo)
    if loose < LOOSE_LIMIT and packs < PACK_LIMIT:
        return False
    started = time.monotonic()
    # No bitmaps: writing one needs a full repack, and it would be a change to the
    # user's repository beyond moving objects into packs.
    proc = run_git(
        ["-c", "repack.writeBitmaps=false", "repack", "-d", "-q", "--geometric=2", "--no-write-bitmap-index"],
        cwd=repo,
        check=False,
    )
    after = object_counts(repo)
    extra = {
        "loose_before": loose,
        "packs_before": packs,
        "loose_after": after[0],
        "packs_after": after[1],
        "duration_s": round(time.monotonic() - started, 4),
    }
    if proc.returncode != 0:
        logger.warning(
            "could not repack %s after an import (its objects are all still there): %s",
            repo,
            proc.stderr.strip()[-300:],
            extra=extra,
        )
        return False
    logger.info("packed %d loose objects and %d packs of %s", loose, packs, repo, extra=extra)
    return True
