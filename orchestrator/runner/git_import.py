"""Importing a finished workspace into the host repository, idempotently (a resumed task imports once).

Everything happens under the per-repository import lock, in this order:

1. idempotent pre-check: the branch exists and equals the workspace HEAD
2. suffix provenance: a ``<branch>`` or ``<branch>_N`` at the workspace HEAD
   whose ``refs/notes/orchestrator`` note names this task key
3. ``import_policy="never"``: no branch
4. skip-empty: ``auto`` + ``skip_empty_import`` + no commits since BASE_COMMIT
5. conflict policy: fail / overwrite / suffix (``_2``, ``_3``...)
6. provenance note ``task_key=<key>; run_id=<run_id>`` on the workspace HEAD
   (before the branch exists, so a crash never leaves an unowned branch)
7. ``git fetch <workspace> HEAD:refs/heads/<target>``
8. now and then, the loose objects and small packs are rolled up (``git_packs``)

Only refs and objects change in the host repository (objects are added, and
rolled up into packs, never removed); its working tree, index and HEAD are
never touched, and the branch checked out there is never overwritten.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from ..errors import BranchExistsError, GitError, UsageError
from .git_cmd import (
    IMPORT_LOCK,
    QUIET_FETCH,
    WORKSPACE_UPLOAD_PACK,
    check_branch_name,
    dir_lock,
    in_thread,
    run_git,
    ws_git,
    ws_git_dir,
)
from .git_packs import keep_packed
from .types import BranchArtifact, ConflictPolicy, ImportPolicy

logger = logging.getLogger("orchestrator.runner")

NOTES_REF = "orchestrator"
# The notes commit is written by the orchestrator, not by the user; this also
# makes notes work in repositories with no user.name/user.email configured.
_NOTES_IDENTITY = {
    "GIT_AUTHOR_NAME": "orchestrator",
    "GIT_AUTHOR_EMAIL": "orchestrator@localhost",
    "GIT_COMMITTER_NAME": "orchestrator",
    "GIT_COMMITTER_EMAIL": "orchestrator@localhost",
}


_git_dirs: dict[Path, Path] = {}


def _git_dir_of(repo: Path) -> Path:
    # Every task of a run imports into the same repository: ask git once.
    cached = _git_dirs.get(repo)
    if cached is None:
        proc = run_git(["rev-parse", "--absolute-git-dir"], cwd=repo, what=f"resolving the git dir of {repo}")
        cached = _git_dirs[repo] = Path(os.path.realpath(proc.stdout.strip()))
    return cached


def _read_ws_file(workspace: Path, name: str) -> str:
    path = ws_git_dir(workspace) / name
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise GitError(
            f"workspace {workspace} was not prepared by the orchestrator: {path} unreadable ({exc})"
        ) from exc
    if not value:
        raise GitError(f"workspace {workspace}: {path} is empty")
    return value


def _heads(repo: Path) -> dict[str, str]:
    proc = run_git(["for-each-ref", "--format=%(refname)%00%(objectname)", "refs/heads/"], cwd=repo)
    pairs = (line.partition("\0")[::2] for line in proc.stdout.splitlines())
    return {ref.removeprefix("refs/heads/"): sha for ref, sha in pairs if ref.startswith("refs/heads/")}


def _checked_out_branches(repo: Path) -> set[str]:
    """Branches checked out in the repository's worktrees (including unborn ones)."""
    proc = run_git(["worktree", "list", "--porcelain"], cwd=repo, check=False)
    lines = proc.stdout.splitlines()
    names = {ln.removeprefix("branch refs/heads/") for ln in lines if ln.startswith("branch refs/heads/")}
    # The list names the branch of every work tree, unborn ones too; only a bare
    # repository's HEAD (listed as "bare") has to be asked for separately.
    if proc.returncode != 0 or "bare" in lines:
        head = run_git(["symbolic-ref", "-q", "HEAD"], cwd=repo, check=False).stdout.strip()
        if head.startswith("refs/heads/"):
            names.add(head.removeprefix("refs/heads/"))
    return names


def _note_lines(repo: Path, commit: str) -> list[str]:
    proc = run_git(["notes", f"--ref={NOTES_REF}", "show", commit], cwd=repo, check=False)
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def _encode_key(task_key: str) -> str:
    return task_key.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _note_has_key(lines: list[str], task_key: str) -> bool:
    exact = f"task_key={_encode_key(task_key)}"
    return any(ln == exact or ln.startswith(exact + ";") for ln in lines)


def _ensure_note(repo: Path, commit: str, task_key: str, run_id: str) -> None:
    message = f"task_key={_encode_key(task_key)}; run_id={_encode_key(run_id)}"
    # Usually the commit has no note yet: one `notes add` (without -f, so it
    # refuses to replace a note) does it. Otherwise look at the note first.
    add = ["notes", f"--ref={NOTES_REF}", "add", "-m", message, commit]
    if run_git(add, cwd=repo, env=_NOTES_IDENTITY, check=False).returncode == 0:
        return
    lines = _note_lines(repo, commit)
    if _note_has_key(lines, task_key):
        return
    # Another task may have imported the same commit (e.g. `always` with no
    # commits lands on the base commit): append instead of clobbering.
    verb = ["append"] if lines else ["add", "-f"]
    run_git(
        ["notes", f"--ref={NOTES_REF}", *verb, "-m", message, commit],
        cwd=repo,
        env=_NOTES_IDENTITY,
        what="writing the provenance note",
    )


def _workspace_stats(workspace: Path, base_commit: str, head: str) -> tuple[int, int, int]:
    if head == base_commit:
        return 0, 0, 0
    count = int(ws_git(workspace, ["rev-list", "--count", f"{base_commit}..{head}"]).stdout.strip() or 0)
    diff = ws_git(workspace, ["diff", "--no-ext-diff", "--no-textconv", "--numstat", base_commit, head])
    added = deleted = 0
    for line in diff.stdout.splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3:
            added += int(parts[0]) if parts[0].isdigit() else 0
            deleted += int(parts[1]) if parts[1].isdigit() else 0
    return count, added, deleted


def _dir_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _import_branch_sync(
    repo_path: str | os.PathLike[str],
    workspace: Path,
    *,
    branch_name: str,
    task_key: str,
    run_id: str,
    import_policy: ImportPolicy = "auto",
    import_conflict_policy: ConflictPolicy = "fail",
    skip_empty_import: bool = True,
) -> BranchArtifact:
    if import_policy not in ("auto", "never", "always"):
        raise UsageError(f"unknown import_policy {import_policy!r}; use auto, never or always")
    if import_conflict_policy not in ("fail", "overwrite", "suffix"):
        raise UsageError(f"unknown import_conflict_policy {import_conflict_policy!r}; use fail, overwrite or suffix")
    check_branch_name(branch_name)
    job = _Import(Path(os.path.realpath(repo_path)), Path(os.path.abspath(workspace)), branch_name, task_key, run_id)
    started = time.monotonic()
    try:
        return job.run(import_policy, import_conflict_policy, skip_empty_import)
    finally:
        logger.info(
            "git import %s: %s -> %s",
            job.outcome,
            job.workspace,
            job.target,
            extra={
                "workspace": str(job.workspace),
                "branch": job.target,
                "commit_count": job.commit_count,
                "size": _dir_size(job.workspace / ".git") if os.path.isdir(job.workspace / ".git") else 0,
                "duration_s": round(time.monotonic() - started, 4),
                "outcome": job.outcome,
            },
        )


class _Import:
    """One import of a workspace into a branch; ``outcome``, ``target`` and ``commit_count`` are what is logged."""

    def __init__(self, repo: Path, workspace: Path, branch_name: str, task_key: str, run_id: str) -> None:
        self.repo, self.workspace, self.branch_name = repo, workspace, branch_name
        self.task_key, self.run_id = task_key, run_id
        self.outcome = "failed"
        self.target: str | None = branch_name
        self.commit_count = 0
        self.base = self.ws_head = ""
        self.added = self.deleted = 0

    def artifact(self, final: str | None, commit: str) -> BranchArtifact:
        return BranchArtifact(
            branch_planned=self.branch_name,
            branch_final=final,
            base=self.base,
            commit=commit,
            has_changes=final is not None and self.commit_count > 0,
            commit_count=self.commit_count if final is not None else 0,
            lines_added=self.added if final is not None else 0,
            lines_deleted=self.deleted if final is not None else 0,
        )

    def run(self, import_policy: ImportPolicy, conflict: ConflictPolicy, skip_empty_import: bool) -> BranchArtifact:
        repo, workspace = self.repo, self.workspace
        git_dir = _git_dir_of(repo)
        # The workspace and the checked-out branches are read before taking the
        # lock, which every task of the run queues for: only the host's refs
        # need it. The agent has finished, and no other task uses this workspace.
        self.base = _read_ws_file(workspace, "BASE_BRANCH")
        base_commit = _read_ws_file(workspace, "BASE_COMMIT")
        ws_head = ws_git(workspace, ["rev-parse", "--verify", "HEAD^{commit}"]).stdout.strip()
        self.commit_count, self.added, self.deleted = _workspace_stats(workspace, base_commit, ws_head)
        # 3. never: no branch, nothing of the host repository to read
        if import_policy == "never":
            self.target, self.outcome = None, "skipped_never"
            return self.artifact(None, base_commit)
        skips_empty = import_policy == "auto" and skip_empty_import and self.commit_count == 0
        checked_out = set() if skips_empty else _checked_out_branches(repo)

        with dir_lock(git_dir, IMPORT_LOCK):
            heads = _heads(repo)
            done = self._already_imported(heads, ws_head, conflict)
            if done is not None:
                return done
            # 4. skip empty
            if skips_empty:
                self.target, self.outcome = None, "skipped_empty"
                return self.artifact(None, base_commit)
            target, force = self._choose_target(heads, conflict)
            self.target = target
            if target in checked_out:
                raise GitError(
                    f"refusing to import into branch {target!r}: it is checked out in {repo}; "
                    "check out another branch or choose another branch name"
                )
            # 7 before 6: the provenance note goes on the commit *before* the branch
            # exists (git notes accept a commit id the repository does not hold yet).
            # A process killed between the two then leaves a branch that step 5
            # recognizes as this task's own attempt, never an unowned conflict.
            _ensure_note(repo, ws_head, self.task_key, self.run_id)
            imported = self._fetch(target, force, ws_head)
            # The fetch and the note left loose objects: roll them up now and then.
            keep_packed(repo)
            self.outcome = "replaced_own_attempt" if self.outcome == "replaced_own_attempt" else "imported"
            return self.artifact(target, imported)

    def _already_imported(self, heads: dict[str, str], ws_head: str, conflict: ConflictPolicy) -> BranchArtifact | None:
        # 1. idempotent pre-check (crash between fetch and reporting)
        if heads.get(self.branch_name) == ws_head:
            _ensure_note(self.repo, ws_head, self.task_key, self.run_id)
            self.outcome = "already_imported"
            return self.artifact(self.branch_name, ws_head)
        # 2. suffix idempotency: an earlier attempt of this task got a suffix
        if conflict == "suffix":
            candidates = _branch_or_suffixed(self.branch_name, (n for n, sha in heads.items() if sha == ws_head))
            if candidates and _note_has_key(_note_lines(self.repo, ws_head), self.task_key):
                self.target = candidates[0]
                self.outcome = "already_imported"
                return self.artifact(self.target, ws_head)
        return None

    def _choose_target(self, heads: dict[str, str], conflict: ConflictPolicy) -> tuple[str, bool]:
        """5. conflict policy: the branch to write, and whether it is overwritten. A branch whose tip
        carries this task's own note (keys are namespaced by run id) is an earlier attempt of this
        task, which died before its completion was logged: ours to replace, under any policy."""
        target = self.branch_name
        own = [
            n
            for n in _branch_or_suffixed(target, heads)
            if _note_has_key(_note_lines(self.repo, heads[n]), self.task_key)
        ]
        if own:
            self.outcome = "replaced_own_attempt"
            return own[0], True
        if target not in heads:
            return target, False
        if conflict == "fail":
            raise BranchExistsError(
                f"branch {target!r} already exists in {self.repo}; set import_conflict_policy to "
                f"'overwrite' or 'suffix', or delete it with: git branch -D {target}"
            )
        if conflict == "overwrite":
            return target, True
        i = 2
        while f"{target}_{i}" in heads:
            i += 1
        check_branch_name(f"{target}_{i}")
        return f"{target}_{i}", False

    def _fetch(self, target: str, force: bool, ws_head: str) -> str:
        """6. fetch the workspace HEAD into the branch (atomic ref creation / forced update)."""
        refspec = f"{'+' if force else ''}HEAD:refs/heads/{target}"
        fetch = [*QUIET_FETCH, "--no-recurse-submodules", f"--upload-pack={WORKSPACE_UPLOAD_PACK}"]
        run_git(
            [*fetch, "--", str(self.workspace), refspec],
            cwd=self.repo,
            what=f"importing {self.workspace} into branch {target}",
        )
        imported = run_git(["rev-parse", "--verify", f"refs/heads/{target}^{{commit}}"], cwd=self.repo).stdout.strip()
        if imported != ws_head:
            raise GitError(
                f"branch {target} is at {imported[:12]} after import but the workspace HEAD is {ws_head[:12]}"
            )
        return imported


def _branch_or_suffixed(branch_name: str, names: Iterable[str]) -> list[str]:
    """Those of ``names`` that are ``branch_name`` or ``branch_name_N``, the shortest first."""
    pattern = re.compile(rf"^{re.escape(branch_name)}(_[0-9]+)?$")
    return sorted((n for n in names if pattern.match(n)), key=lambda n: (len(n), n))


# Import the workspace HEAD into ``repo_path`` as ``branch_name`` (see module doc).
import_branch = in_thread(_import_branch_sync)
