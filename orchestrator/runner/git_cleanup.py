"""Deleting a run's own working branches from the host repository.

The git layer decides what is safe, whatever it was asked: a branch whose tip
carries this run's provenance note, with the name the run gives that task's
branch, checked out nowhere, and not moved since it was checked (docs/evolve.md,
"Working branches"). The provenance notes stay: they keep the audit trail.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..naming import safe_component, short8
from .git_cmd import IMPORT_LOCK, check_branch_name, dir_lock, in_thread, run_git
from .git_import import _checked_out_branches, _git_dir_of, _heads, _note_lines

logger = logging.getLogger(__name__)

DELETED = "deleted"
MISSING = "missing"
CHECKED_OUT = "checked out"
NOT_OURS = "not created by this run"
MOVED = "moved meanwhile"


def _owned_by(name: str, lines: list[str], run_id: str) -> bool:
    # Each line is "task_key=<key>; run_id=<run>" (keys are namespaced by run id too).
    for line in lines:
        fields = dict(part.strip().split("=", 1) for part in line.split(";") if "=" in part)
        key = fields.get("task_key", "")
        if fields.get("run_id") != run_id or not key.startswith(f"{run_id}/"):
            continue
        suffix = f"_{safe_component(run_id)}_k{short8(key)}"
        if re.fullmatch(rf".+{re.escape(suffix)}(_[0-9]+)?", name):
            return True
    return False


def _delete_run_branches_sync(
    repo_path: str | os.PathLike[str], names: Sequence[str], *, run_id: str
) -> dict[str, str]:
    """Delete those of ``names`` that this run created and nobody uses; returns each name's outcome."""
    repo = Path(os.path.realpath(repo_path))
    git_dir = _git_dir_of(repo)
    outcome: dict[str, str] = {}
    with dir_lock(git_dir, IMPORT_LOCK):  # the same lock imports take: no branch appears or moves under us
        heads = _heads(repo)
        checked_out = _checked_out_branches(repo)
        for name in dict.fromkeys(names):
            check_branch_name(name)
            sha = heads.get(name)
            if sha is None:
                outcome[name] = MISSING
            elif name in checked_out:
                outcome[name] = CHECKED_OUT
            elif not _owned_by(name, _note_lines(repo, sha), run_id):
                outcome[name] = NOT_OURS
            else:
                proc = run_git(["update-ref", "-d", f"refs/heads/{name}", sha], cwd=repo, check=False)
                outcome[name] = DELETED if proc.returncode == 0 else MOVED
    logger.info(
        "git branch cleanup for run %s: %s",
        run_id,
        ", ".join(f"{n} {o}" for n, o in outcome.items()) or "nothing asked",
        extra={"run_id": run_id, "outcome": outcome},
    )
    return outcome


delete_run_branches = in_thread(_delete_run_branches_sync)


def _unheld_sync(repo_path: str | os.PathLike[str], claims: Sequence[tuple[str, str]]) -> list[str | None]:
    """For each ``(branch, commit)``: None if the commit is reachable from the branch, else why not
    (``--show-run`` checks that the commits a run says it kept are still there)."""
    repo = Path(os.path.realpath(repo_path))
    heads = _heads(repo)
    out: list[str | None] = []
    for branch, commit in claims:
        if branch not in heads:
            out.append(f"branch {branch} does not exist")
        elif (
            run_git(["merge-base", "--is-ancestor", commit, f"refs/heads/{branch}"], cwd=repo, check=False).returncode
            != 0
        ):
            out.append(f"commit {commit[:12]} is not reachable from {branch}")
        else:
            out.append(None)
    return out


unheld_branch_claims = in_thread(_unheld_sync)
