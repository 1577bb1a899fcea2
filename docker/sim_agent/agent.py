"""The agent's actions (write, append, run, commit, probes) and its default answer."""

from __future__ import annotations

import os
import subprocess

from .answers import default_answer
from .common import Args, answer_seed, commit_summary, git, git_env, is_git_worktree, shell_quote, task_name

# What `git commit` says when there is nothing to commit: not a failure.
NOTHING_TO_COMMIT = ("nothing to commit", "nothing added to commit", "no changes added to commit")


class Agent:
    def __init__(self, a: Args, em, cwd: str, prompt_hash: str) -> None:
        self.a = a
        self.em = em
        self.cwd = cwd
        self.h = prompt_hash
        self.prints: list[str] = []
        self.reports: list[str] = []
        self.tool_turns = 0
        # Why a commit failed (None: none did). A commit that finds nothing to
        # commit is not a failure; one git refuses is, and the agent reports it
        # as its result, as an agent that checks its work would.
        self.commit_failure: str | None = None

    def _abs(self, path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(self.cwd, path)

    def check_turns(self) -> bool:
        """True when --max-turns is exhausted (the caller then stops)."""
        self.tool_turns += 1
        return self.a.max_turns is not None and self.tool_turns >= self.a.max_turns

    def write(self, path: str, content: str, append: bool = False) -> tuple[str, bool]:
        full = self._abs(path)

        def run():
            existed = os.path.exists(full)
            try:
                os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
                with open(full, "a" if append else "w", encoding="utf-8") as f:
                    f.write(content)
            except OSError as e:
                return f"Error writing {full}: {e.strerror or e}", True, {}
            verb = "appended to" if append else ("updated" if existed else "created")
            msg = (
                f"File {verb} successfully at: {full}"
                if not append or not existed
                else f"The file {full} has been updated successfully."
            )
            return msg, False, {"write_kind": "update" if existed else "create"}

        if append:
            return self.em.tool(
                "Bash",
                {
                    "command": f"printf %s {shell_quote(content)} >> {shell_quote(full)}",
                    "description": f"append to {path}",
                },
                run,
            )
        return self.em.tool("Write", {"file_path": full, "content": content}, run)

    def edit(self, path: str, old: str, new: str) -> tuple[str, bool]:
        """Replace the first ``old`` with ``new`` in a file (claude: the Edit tool; codex: a sed command)."""
        full = self._abs(path)

        def run():
            try:
                with open(full, encoding="utf-8") as f:
                    original = f.read()
            except OSError as e:
                return f"<tool_use_error>File does not exist: {full} ({e.strerror or e})</tool_use_error>", True, {}
            if old not in original:
                return f"<tool_use_error>String to replace not found in file.\nString: {old}</tool_use_error>", True, {}
            updated = original.replace(old, new, 1)
            try:
                with open(full, "w", encoding="utf-8") as f:
                    f.write(updated)
            except OSError as e:
                return f"Error writing {full}: {e.strerror or e}", True, {}
            line = next(i for i, ln in enumerate(original.splitlines(), 1) if old in ln) if "\n" not in old else 1
            patch = [
                {
                    "oldStart": line,
                    "oldLines": 1,
                    "newStart": line,
                    "newLines": 1,
                    "lines": [f"-{ln}" for ln in old.splitlines()] + [f"+{ln}" for ln in new.splitlines()],
                }
            ]
            return (f"The file {full} has been updated successfully.", False, {"original": original, "patch": patch})

        if self.a.persona == "codex":
            sed = "s/" + old.replace("/", "\\/") + "/" + new.replace("/", "\\/") + "/"
            return self.em.tool("Bash", {"command": f"sed -i {shell_quote(sed)} {shell_quote(path)}"}, run)
        return self.em.tool(
            "Edit", {"file_path": full, "old_string": old, "new_string": new, "replace_all": False}, run
        )

    def bash(self, command: str, description: str, env: dict | None = None) -> tuple[str, bool]:
        def run():
            try:
                p = subprocess.run(["/bin/sh", "-c", command], cwd=self.cwd, capture_output=True, env=env)
            except OSError as e:
                return f"failed to run command: {e}", True, {"exit_code": 127}
            out = (p.stdout + p.stderr).decode("utf-8", "replace").rstrip("\n")
            extra: dict = {"exit_code": p.returncode}
            if p.returncode != 0:
                out = f"Exit code {p.returncode}\n{out}" if self.a.persona == "claude" else out
            return out, p.returncode != 0, extra

        return self.em.tool("Bash", {"command": command, "description": description}, run)

    def commit(self, message: str) -> tuple[str, bool]:
        def run():
            # `git add -A && git commit -m MESSAGE`, without the shell; outside a
            # work tree `git add` fails just the same.
            env = git_env(self.cwd)
            stdout, stderr, code = b"", b"", 0
            for argv in (["git", "add", "-A"], ["git", "commit", "-m", message]):
                try:
                    p = subprocess.run(argv, cwd=self.cwd, capture_output=True, env=env)
                except OSError as e:
                    return f"failed to run git: {e}", True, {"exit_code": 127}
                stdout, stderr, code = stdout + p.stdout, stderr + p.stderr, p.returncode
                if code != 0:
                    break
            out = (stdout + stderr).decode("utf-8", "replace").rstrip("\n")
            extra: dict = {"exit_code": code}
            if code == 0:
                extra.update(commit_summary(self.cwd, stdout.decode("utf-8", "replace")))
            else:
                # A read-only workspace (a review task's) refuses every write: the
                # agent sees the error and goes on with its review, as a real one
                # would. Any other refusal means the work is lost: a failure.
                if not any(s in out for s in NOTHING_TO_COMMIT) and "Read-only file system" not in out:
                    self.commit_failure = " ".join(out.split())[-500:] or f"git exited with {code}"
                if self.a.persona == "claude":
                    out = f"Exit code {p.returncode}\n{out}"
            return out, code != 0, extra

        return self.em.tool(
            "Bash",
            {"command": f"git add -A && git commit -m {shell_quote(message)}", "description": "commit changes"},
            run,
        )

    def write_outside(self, path: str) -> None:
        content = f"sim-agent write-outside probe {self.h[:8]}\n"

        def run():
            if not os.path.isabs(path):
                return f"write-outside: {path} is not an absolute path", True, {}
            try:
                os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(content)
            except OSError as e:
                return f"write-outside {path}: failed: {type(e).__name__}: {e.strerror or e}", True, {}
            return f"write-outside {path}: succeeded", False, {}

        out, _ = self.em.tool("Write", {"file_path": path, "content": content}, run)
        self.reports.append(out)
        self.em.text(out)

    def spam(self, megabytes: float) -> None:
        total = int(megabytes * 1024 * 1024)
        chunk = 64 * 1024
        sent = 0
        n = 0
        while sent < total:
            size = min(chunk, total - sent)
            seed = f"spam {n} {self.h[:16]} "
            body = (seed * (size // len(seed) + 1))[:size]
            self.em.text(body)
            sent += size
            n += 1
        self.reports.append(f"spammed {sent} bytes in {n} messages")

    def _after_one_execution(self, rel: str, first: str) -> str | None:
        """The file as one default execution leaves it, from the task's base commit (None: unknown)."""
        try:
            with open(os.path.join(self.cwd, ".git", "BASE_COMMIT"), encoding="utf-8") as f:
                base = f.read().strip()
        except OSError:
            return None  # not a task workspace: nothing to tell this task's work from earlier work
        shown = git(self.cwd, "show", f"{base}:{rel}")
        if shown.returncode != 0:
            return self._first_text(first)
        n = len(shown.stdout.splitlines())
        return shown.stdout + f"revision {n + 1}: {self.h[:16]}\n"

    def _first_text(self, first: str) -> str:
        """The file a task's first default execution writes.

        It names the task (its key without the run id): tasks with one prompt
        (best-of-n's candidates) make different work, as real agents do, so
        their reviewers score different content.
        """
        name = task_name()
        return f"sim-agent output for prompt {self.h}\ntask: {first}\n" + (f"by: {name}\n" if name else "")

    # -------------------------------------------------------------- default
    def default_behaviour(self) -> str:
        prompt = self.a.prompt or ""
        writable = os.access(self.cwd, os.W_OK) and is_git_worktree(self.cwd)
        did = ""
        if writable:
            rel = f"sim/{self.h[:8]}.txt"
            full = self._abs(rel)
            first = next((ln.strip() for ln in prompt.splitlines() if ln.strip()), "(empty prompt)")[:72]
            try:
                with open(full, encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                text = None
            # An agent that finds its own finished work in the workspace (it was
            # interrupted, and the task continues where it stopped) does not do it
            # again, as a real agent would not. Its work is what one execution adds
            # to the file as it was at the task's base commit.
            if text is not None and text == self._after_one_execution(rel, first):
                # (still to commit when the interruption came between the write and the commit)
                dirty = bool(git(self.cwd, "status", "--porcelain", "--", rel).stdout.strip())
                write_failed = False
            elif text is not None:
                revision = f"revision {len(text.splitlines()) + 1}: {self.h[:16]}\n"
                _out, write_failed = self.write(rel, revision, append=True)
                dirty = True
            else:
                self.em.text(f"I'll record the task in {rel}.")
                _out, write_failed = self.write(rel, self._first_text(first))
                dirty = True
            if write_failed:
                did = f" Could not write {rel}."
            else:
                _out, err = self.commit(f"sim: {first}") if dirty else ("", False)
                did = f" Wrote {rel} and committed it." if not err else f" Wrote {rel} (commit failed)."
        return default_answer(prompt, self.h, did, answer_seed(self.cwd, self.h))
