"""Look for credentials in what an agent committed, before it becomes a branch.

The added lines of the task's commits (one ``git diff`` of the whole range) are
searched for every credential the run passed to an agent, as written and
encoded, and for common token shapes; a finding names the file and the line,
never the value. What is caught and what is not: docs/reliability.md,
"Credentials in commits".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import msgspec

from ..sanitize import encoded_forms
from .git_cmd import ws_git

TOKEN_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Anthropic API key", re.compile(r"sk-ant-[A-Za-z0-9_\-]{20,}")),
    ("OpenAI-style API key", re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_\-]{20,}")),
    ("GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}")),
    ("GitHub fine-grained token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}")),
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")),
)

# Shorter "secrets" would match ordinary text; the sanitizer uses the same floor.
MIN_SECRET_LEN = 8


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    line: int
    what: str  # "the run's ANTHROPIC credential (base64)", "GitHub token", ...

    def describe(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _needles(secrets: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(text to look for, description) for every credential and encoding."""
    out: dict[str, str] = {}
    for label, value in secrets:
        if not value or len(value) < MIN_SECRET_LEN:
            continue
        out.setdefault(value, f"the run's {label}")
        for form, encoding in encoded_forms(value).items():
            if len(form) >= MIN_SECRET_LEN:
                out.setdefault(form, f"the run's {label} ({encoding})")
    return sorted(out.items(), key=lambda kv: -len(kv[0]))


def _what(text: str, needles: list[tuple[str, str]]) -> str | None:
    """What credential ``text`` holds: the run's own first, then a common token shape."""
    for needle, what in needles:
        if needle in text:
            return what
    return next((what for what, pattern in TOKEN_SHAPES if pattern.search(text)), None)


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def scan_diff(diff: str, secrets: Iterable[tuple[str, str]]) -> list[Finding]:
    """Findings in the added lines of a unified diff (``git diff -U0`` output)."""
    needles = _needles(secrets)
    findings: list[Finding] = []
    path = "?"
    lineno = 0
    for line in diff.splitlines():
        if line.startswith("+++ "):
            target = line[4:]
            path = target[2:] if target.startswith("b/") else target
            continue
        m = _HUNK.match(line)
        if m:
            lineno = int(m.group(1))
            continue
        if line.startswith("+"):
            what = _what(line[1:], needles)
            if what is not None:
                findings.append(Finding(path=path, line=lineno, what=what))
            lineno += 1
    return findings


def scan_commits(workspace: Path, base_commit: str, head: str, secrets: Iterable[tuple[str, str]]) -> list[Finding]:
    """Scan what the task's commits added (``base_commit..head``) in the workspace clone. ``--text``: a
    key hidden in a file git would call binary is still read; a symlink's target is a line of its own."""
    if head == base_commit:
        return []
    diff = ws_git(
        workspace,
        ["diff", "--no-ext-diff", "--no-textconv", "--no-color", "--text", "-U0", "--no-renames", base_commit, head],
    ).stdout
    return scan_diff(diff, secrets)
