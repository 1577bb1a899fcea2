"""The :class:`~orchestrator.strategy.PrepareRuntime` pre-flight supplies to a strategy's ``prepare``
(``synthesize -S from_run=RUN_ID``): what ``prepare`` returns is recorded, so a resume never reads that run again."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..errors import ConfigError, GitError, UsageError
from ..log.state import FINISHED_OUTCOMES

_GEN = re.compile(r"(\d+)")


def _natural(key: str) -> list[object]:
    # gen/2 before gen/10: a user reads the list in the order the run made them
    return [int(p) if p.isdigit() else p for p in _GEN.split(key)]


def finished_run_branches(run_id: str, repo_path: str) -> list[str]:
    """The branches finished run ``run_id`` created in ``repo_path``, by task key; a one-line :class:`ConfigError`
    when the run is not found, not finished, on another repository, or a branch of it is gone."""
    from .locate import locate_run

    what = f"-S from_run={run_id}"
    try:
        found = locate_run(run_id, repo=repo_path)
    except UsageError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    manifest = found.manifest
    if manifest.status not in FINISHED_OUTCOMES:  # failed too: its candidates' branches are still there to take
        raise ConfigError(
            f"{what}: the run is {manifest.status}, not finished; resume it first (orchestrator --resume {run_id})"
        )
    if os.path.realpath(manifest.repo_path) != os.path.realpath(repo_path):
        raise ConfigError(f"{what}: the run worked on {manifest.repo_path}, not {repo_path}; run from that repository")
    summary_path = found.dirs.results / run_id / "summary.json"
    try:
        summary = json.loads(summary_path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what}: cannot read {summary_path} ({exc}); pass -S branches=[...] instead") from None
    keyed = [
        (t.get("key") or "", t["branch"])
        for s in summary.get("strategies") or []
        for t in s.get("tasks") or []
        if isinstance(t.get("branch"), str) and t.get("state") == "COMPLETED"
    ]
    branches = list(
        dict.fromkeys(b for _, b in sorted(keyed, key=lambda kb: _natural(kb[0])) if b != manifest.base_branch)
    )
    if not branches:
        raise ConfigError(f"{what}: the run created no branches to take")
    gone = absent_branches(repo_path, branches)
    if gone:
        raise ConfigError(
            f"{what}: branch {gone[0]} of that run no longer exists in {repo_path}; pass -S branches=[...] instead"
        )
    return branches


def absent_branches(repo_path: str, names: list[str]) -> list[str]:
    """Those of ``names`` that are not branches of ``repo_path`` (or not valid branch names)."""
    from ..runner import check_branch_name, run_git

    out = []
    for name in names:
        try:
            check_branch_name(name)
            args = ["rev-parse", "--verify", "--quiet", f"refs/heads/{name}^{{commit}}"]
            found = run_git(args, cwd=Path(repo_path), check=False).returncode == 0
        except (GitError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out
