"""evolve's test world: a small model of a git repository (commits with files and parents, branches, three-way
merges with conflicts) that answers the strategy's tasks in process, the scenario's goals, checks and fixes, and
the cycle history read back. test_evolve.py and test_evolve_learning.py run the strategy against it;
test_evolve_docker.py reads its history the same way."""

from __future__ import annotations

import hashlib
import json

from orchestrator.engine.testing import failure, success

# ---------------------------------------------------------------- repository model


class Repo:
    def __init__(self, files: dict[str, str]) -> None:
        self.commits: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {}
        self.branches = {"main": self.commit(files, ())}

    def commit(self, files: dict[str, str], parents: tuple[str, ...]) -> str:
        # Content-derived ids: the same work gives the same id in any order (as git would).
        sha = hashlib.sha1(json.dumps([sorted(files.items()), parents]).encode()).hexdigest()
        self.commits[sha] = (dict(files), parents)
        return sha

    def ancestors(self, sha: str) -> set[str]:
        seen, todo = set(), [sha]
        while todo:
            c = todo.pop()
            if c not in seen:
                seen.add(c)
                todo.extend(self.commits[c][1])
        return seen

    def files(self, branch: str) -> dict[str, str]:
        return self.commits[self.branches[branch]][0]

    def merge(self, head: str, other: str, resolve=None) -> str | None:
        """Three-way merge of commit ``other`` into ``head``; None on a conflict unless ``resolve`` picks."""
        if other in self.ancestors(head):
            return head
        if head in self.ancestors(other):
            return other  # fast-forward
        common = self.ancestors(head) & self.ancestors(other)
        base = max(common, key=lambda c: len(self.ancestors(c)))
        fb, fh, fo = (self.commits[c][0] for c in (base, head, other))
        merged = dict(fh)
        for path in set(fb) | set(fh) | set(fo):
            b, h, o = fb.get(path), fh.get(path), fo.get(path)
            if o in (b, h):
                continue
            if h == b:
                new = o
            elif resolve is None:
                return None
            else:
                new = resolve(path, h, o)
            if new is None:
                merged.pop(path, None)
            else:
                merged[path] = new
        return self.commit(merged, (head, other))


def key_parts(req) -> list[str]:
    return req.task_key.split("/")[2:]


class World:
    """The runner's behaviour: checks, fixes and resolutions per goal, over a :class:`Repo`."""

    def __init__(self, repo: Repo, checks, fixes, resolve=None) -> None:
        self.repo, self.checks, self.fixes = repo, checks, fixes
        self.resolve = resolve or {}
        self.fix_runs: list[str] = []

    def __call__(self, req):
        parts = key_parts(req)
        if req.delete_branches:
            return self.delete(req)
        if req.plugin_name == "command" and req.import_policy == "never":
            return self.measure(req, parts[-1])
        if req.plugin_name == "command":
            return self.merge(req)
        if "fix" in parts:
            return self.fix(req, parts[1], parts[-1])
        if "resolve" in parts:
            return self.resolve_conflict(req, parts[-1])
        raise AssertionError(f"unexpected task {req.task_key}")

    def delete(self, req):
        """The git layer's branch cleanup: only branches this world's tasks created."""
        self.deleted = list(req.delete_branches)
        lines = []
        for name in req.delete_branches:
            state = "deleted" if self.repo.branches.pop(name, None) else "missing"
            lines.append(f"@@branch {state}: {name}\n")
        return success(req, final_message="".join(lines), has_changes=False)

    def measure(self, req, gid):
        files = self.repo.files(req.base_branch)
        ok = self.checks[gid](files)
        out = (
            f"checked {gid}\n@@evolve stderr\n\n@@evolve end exit={0 if ok else 1} "
            f"head={self.repo.branches[req.base_branch]}\n"
        )
        return success(req, final_message=out, has_changes=False)

    def fix(self, req, cycle, gid):
        self.fix_runs.append(req.task_key)
        files = dict(self.repo.files(req.base_branch))
        change = self.fixes[gid](files, int(cycle))
        if change is None:
            return success(req, final_message="nothing to do", has_changes=False)
        for path, text in change.items():
            if text is None:
                files.pop(path, None)
            else:
                files[path] = text
        self.repo.branches[req.branch_name] = self.repo.commit(files, (self.repo.branches[req.base_branch],))
        return success(req, final_message=f"fixed {gid}")

    def merge(self, req):
        start = head = self.repo.branches[req.base_branch]
        lines = []
        for branch in req.include_branches:  # the merge order is the include order
            other = self.repo.branches[branch]
            if other in self.repo.ancestors(head):
                lines.append(f"@@evolve already {branch}")
                continue
            merged = self.repo.merge(head, other)
            if merged is None:
                lines.append(f"CONFLICT (add/add)\n@@evolve conflict {branch}")
                break
            head = merged
            lines.append(f"@@evolve merged {branch}")
        changed = head != start
        if changed:
            self.repo.branches[req.branch_name] = head
        return success(req, final_message="\n".join(lines) + "\n", has_changes=changed)

    def resolve_conflict(self, req, gid):
        how = self.resolve.get(gid, "theirs")
        if how == "fail":
            return failure(req, error_type="api", message="could not resolve")
        head = self.repo.branches[req.base_branch]
        if how == "noop":  # an agent that commits something but never merges (like the dry-run sim agent)
            files = dict(self.repo.commits[head][0], **{"notes.txt": gid})
            self.repo.branches[req.branch_name] = self.repo.commit(files, (head,))
            return success(req)
        (branch,) = req.include_branches
        merged = self.repo.merge(head, self.repo.branches[branch], resolve=lambda p, h, o: h + "+" + o)
        self.repo.branches[req.branch_name] = merged
        return success(req, final_message="merged")


# ---------------------------------------------------------------- the scenario


def goal(gid, weight, check, **kw):
    return {"id": gid, "description": f"goal {gid}", "check": check, "weight": weight, **kw}


GOALS = [
    goal("keep", 1, "test -f keep.txt"),
    goal("c1", 9, "test -f c1.txt"),
    goal("c2", 8, "test -f c2.txt"),
    goal("a", 7, "test -f done_a.txt"),
    goal("b", 6, "test -f done_b.txt"),
    goal("d", 5, "test -f done_d.txt"),
]
CHECKS = {
    "keep": lambda f: "keep.txt" in f,
    "c1": lambda f: "c1.txt" in f,
    "c2": lambda f: "c2.txt" in f,
    "a": lambda f: "done_a.txt" in f,
    "b": lambda f: "done_b.txt" in f,
    "d": lambda f: "done_d.txt" in f,
}
FIXES = {
    "c1": lambda f, n: {"c1.txt": "ok", "shared.txt": "one"},  # c1 and c2 conflict on shared.txt
    "c2": lambda f, n: {"c2.txt": "ok", "shared.txt": "two"},
    "a": lambda f, n: {"done_a.txt": "ok"},
    "b": lambda f, n: {"done_b.txt": "ok"},
    "d": lambda f, n: {"done_d.txt": "ok", "keep.txt": None},  # fixes d, breaks keep: every time
}


def world(resolve=None) -> World:
    return World(Repo({"keep.txt": "k", "README.md": "# r"}), CHECKS, FIXES, resolve)


def history(tmp_path, run_id: str = "run_t") -> list[dict]:
    """The run's cycle-history.jsonl, one dict a cycle."""
    text = (tmp_path / "results" / run_id / "strategy_output" / "cycle-history.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


FIELDS = (
    "cycle",
    "goal_ids",
    "result",
    "goals_passing",
    "fixed",
    "regressed",
    "conflicts",
    "resolved",
    "blamed",
    "quarantined",
)


def project(entries):
    """Each cycle's entry as a tuple of FIELDS, to compare with a history written out by hand."""
    return [tuple(e[f] for f in FIELDS) for e in entries]
