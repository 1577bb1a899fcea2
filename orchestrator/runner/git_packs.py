"""Keeping the user's repository packed while runs import into it (issue 32).

Past a few dozen loose objects or packs, :func:`keep_packed` rolls them up with
``git repack -d --geometric=2``: the user's own large pack is left as it is, and
nothing is pruned. Measured in docs/performance.md.
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
    """Roll loose objects and small packs of ``repo`` up when there are too many (under the import
    lock); whether a repack ran. A failure is logged, not raised: the import has succeeded."""
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
