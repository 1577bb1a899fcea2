"""Which branch a strategy execution selected, and whether it is merge advice: docs/results.md,
"Which branch to merge". The console summary, ``summary.json`` and the report all ask these
functions, so they cannot disagree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import GitError

# Run states in which nothing is decided yet: the strategy may still pick another branch.
UNFINISHED = ("interrupted", "running", "live")
# Execution states whose result is a choice: a strategy stopped by the spending cap returns its best so far.
DECIDED = ("success", "budget_reached")


def fmt_duration(seconds: float) -> str:
    """A run's duration as the console summary and the report both write it."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    m, s = divmod(seconds, 60)
    if m < 60:
        return f"{m}m {s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m"


def selected_of(result: Any) -> tuple[str | None, str | None]:
    """``(branch, commit)`` the strategy's return value names as its choice, or ``(None, None)``."""
    if not isinstance(result, dict):
        return None, None
    artifact = result.get("artifact")
    if isinstance(artifact, dict):
        branch = artifact.get("branch_final")
        return (branch, artifact.get("commit")) if isinstance(branch, str) else (None, None)
    branch = _first_text(result, ("selected_branch", "best_branch", "final_branch", "branch"))
    if branch is None:
        return None, None
    return branch, _first_text(result, ("selected_commit", "best_commit", "final_commit"))


def _first_text(result: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((result[k] for k in keys if isinstance(result.get(k), str)), None)


def reviewed(result: Any) -> bool:
    """Whether the strategy judged its pick (False only when its result says ``"reviewed": false``)."""
    return not (isinstance(result, dict) and result.get("reviewed") is False)


def selection(
    *,
    run_status: str,
    status: str,
    error: str | None,
    result: Any,
    base_branch: str,
    unheld: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One execution's choice: ``{"branch", "kept_base", "reviewed", "note"}``.

    ``branch`` is the selected branch (the base branch when the strategy kept
    it), or None with ``note`` saying why nothing was selected. ``reviewed``
    is False for a pick the strategy did not judge: it is named, never merge
    advice. ``unheld`` maps branches to why they no longer hold the run's
    commit (see :func:`unheld_branches`).
    """

    def nothing(note: str) -> dict[str, Any]:
        return {"branch": None, "kept_base": False, "reviewed": True, "note": note}

    if run_status in UNFINISHED:
        return nothing("the run did not finish, so nothing is selected yet")
    if status == "budget_reached" and selected_of(result)[0] is None:
        return nothing("the spending cap stopped it before it had a result")
    if status not in DECIDED or (status != "success" and selected_of(result)[0] is None):
        why = f": {error.splitlines()[0][:160]}" if error else ""
        return nothing(f"the strategy {status}{why}")
    branch, _ = selected_of(result)
    if branch is None:
        return nothing("the strategy selected no branch")
    if branch == base_branch:
        return {"branch": branch, "kept_base": True, "reviewed": True, "note": ""}
    if unheld and branch in unheld:
        return nothing(f"selected {branch}, but {unheld[branch]}")
    if not reviewed(result):
        return {"branch": branch, "kept_base": False, "reviewed": False, "note": "picked without review"}
    return {"branch": branch, "kept_base": False, "reviewed": True, "note": ""}


def verdict(*, run_status: str, status: str, error: str | None, result: Any, base_branch: str) -> str:
    """One line saying what the execution concluded: its own ``verdict`` when it gives one, else what it returned."""
    if run_status in UNFINISHED:
        return "not finished: nothing is decided yet"
    if status == "budget_reached" and result is None:
        return "stopped at the spending cap" + (f": {error.splitlines()[0][:160]}" if error else "")
    if status not in DECIDED or (status != "success" and result is None):
        return f"{status}: {error.splitlines()[0][:160]}" if error else status
    if isinstance(result, dict) and isinstance(result.get("verdict"), str) and result["verdict"].strip():
        return result["verdict"].strip().splitlines()[0][:1000]
    if result is None:
        return "returned nothing"
    branch, _ = selected_of(result)
    if isinstance(result, dict) and isinstance(result.get("artifact"), dict):
        return (
            f"returned one task's result: branch {branch}" if branch else "returned one task's result, with no branch"
        )
    if branch is not None:
        return "kept the base branch" if branch == base_branch else f"returned branch {branch}"
    text = json.dumps(result, sort_keys=True, default=str)
    return "returned " + (text if len(text) <= 160 else text[:159] + "…")


def claims(run_status: str, executions: list[tuple[str, Any]], base_branch: str) -> list[tuple[str, str | None]]:
    """The ``(branch, commit)`` pairs to check for ``[(status, result), ...]`` of a finished run."""
    if run_status in UNFINISHED:
        return []
    out: list[tuple[str, str | None]] = []
    for status, result in executions:
        branch, commit = selected_of(result) if status in DECIDED else (None, None)
        if branch and branch != base_branch and (branch, commit) not in out:
            out.append((branch, commit))
    return out


def unheld_branches(repo_path: str | os.PathLike[str], pairs: list[tuple[str, str | None]]) -> dict[str, str]:
    """For each selected ``(branch, commit)`` that cannot be merged as recorded: why.

    Blocking (runs git): call it from a worker thread in async code. A branch
    that is gone, or no longer contains the commit the run recorded, is no
    advice to merge.
    """
    from ..runner import check_branch_name, run_git

    if not pairs:
        return {}
    repo = Path(repo_path)
    if not repo.is_dir():
        return {b: f"the repository {repo} is not there to check it" for b, _ in pairs}
    out: dict[str, str] = {}
    for branch, commit in pairs:
        try:
            check_branch_name(branch)
            head = run_git(
                ["rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"], cwd=repo, check=False
            )
            if head.returncode != 0:
                out[branch] = f"branch {branch} no longer exists in {repo}"
            elif commit and head.stdout.strip() != commit:
                held = run_git(["merge-base", "--is-ancestor", commit, f"refs/heads/{branch}"], cwd=repo, check=False)
                if held.returncode != 0:
                    out[branch] = f"branch {branch} no longer holds the run's commit {commit[:12]}"
        except (GitError, ValueError) as exc:
            out[branch] = f"branch {branch} could not be checked: {exc}"
    return out


def missing_branches(repo_path: str | os.PathLike[str], names: set[str]) -> frozenset[str]:
    """Those of ``names`` that are no longer branches of the repository (one git call).

    Blocking (runs git). A run's strategy may delete its working branches at the
    end (tree-beam, evolve): what it created is history, what is left is the result.
    """
    from ..runner import run_git

    if not names:
        return frozenset()
    repo = Path(repo_path)
    if not repo.is_dir():
        return frozenset()
    heads = run_git(["for-each-ref", "--format=%(refname:strip=2)", "refs/heads/"], cwd=repo, check=False)
    if heads.returncode != 0:
        return frozenset()
    return frozenset(names - set(heads.stdout.splitlines()))
