"""Where each hunk of a synthesized branch came from: pure functions over ``git diff -U0`` text.

The rule is docs/strategies.md's ("synthesize", step 6): what a hunk brings is its added lines, so a hunk that
removes a candidate's line but adds one of its own is the synthesizer's.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

MARK = "@@orch-diff "
NEW = "new"
MAJORITY = 0.5
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def diff_command(base: str, labelled: list[tuple[str, str]]) -> str:
    """A shell command printing ``@@orch-diff LABEL`` then ``git diff -U0 BASE...REF`` for each ``(label, ref)``."""
    parts = []
    for label, ref in labelled:
        parts.append(f"printf '%s\\n' {shlex.quote(MARK + label)}")
        parts.append("git diff --no-color --no-ext-diff --no-renames -U0 " + shlex.quote(f"{base}...{ref}") + " --")
    return "set -e; " + "; ".join(parts)


def split_diffs(text: str) -> dict[str, str]:
    """``{label: diff text}`` from :func:`diff_command`'s output."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (text or "").splitlines():
        if line.startswith(MARK):
            current = out.setdefault(line[len(MARK) :].strip(), [])
        elif current is not None:
            current.append(line)
    return {label: "\n".join(lines) + ("\n" if lines else "") for label, lines in out.items()}


def parse_hunks(diff: str) -> list[dict[str, Any]]:
    """The hunks of a unified diff in order: ``{"file", "header", "removed", "added"}``. A hunk ends when its
    header's counts are used up: a removed ``-- x`` is never the next file's ``--- a/x``."""
    hunks: list[dict[str, Any]] = []
    old_path = new_path = ""
    hunk: dict[str, Any] | None = None
    old_left = new_left = 0
    for line in (diff or "").splitlines():
        if hunk is not None and (old_left > 0 or new_left > 0):
            if line.startswith("-") and old_left > 0:
                hunk["removed"].append(line[1:].rstrip())
                old_left -= 1
            elif line.startswith("+") and new_left > 0:
                hunk["added"].append(line[1:].rstrip())
                new_left -= 1
            elif line.startswith(" "):
                old_left, new_left = old_left - 1, new_left - 1
            # "\ No newline at end of file" and anything else take no count
            continue
        if m := _HUNK.match(line):
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            hunk = {"file": new_path or old_path, "header": line.split(" @@")[0] + " @@", "removed": [], "added": []}
            hunks.append(hunk)
        elif line.startswith("diff --git "):
            hunk, old_path, new_path = None, "", ""
        elif line.startswith("--- "):
            old_path, new_path = _path(line[4:]), ""
        elif line.startswith("+++ "):
            new_path = _path(line[4:])
    return hunks


def _path(raw: str) -> str:
    raw = raw.split("\t")[0].strip()
    if raw == "/dev/null":
        return ""
    return raw[2:] if raw[:2] in ("a/", "b/") else raw


def _changed(hunks: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(h["file"], "-", t) for h in hunks for t in h["removed"]} | {
        (h["file"], "+", t) for h in hunks for t in h["added"]
    }


def _brought(hunk: dict[str, Any]) -> set[tuple[str, str, str]]:
    """The lines a hunk is matched by: what it adds, or what it removes when it only deletes."""
    if hunk["added"]:
        return {(hunk["file"], "+", t) for t in hunk["added"]}
    return {(hunk["file"], "-", t) for t in hunk["removed"]}


def provenance(synthesis_diff: str, candidates: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """For each hunk of ``synthesis_diff``: which of ``[(label, diff)]`` it came from, or ``new``.

    ``match`` is the share of the hunk's brought lines its source holds (for ``new``, the best share any
    candidate holds); ``also_in``, the other candidates holding every one of them.
    """
    changed = [(label, _changed(parse_hunks(diff))) for label, diff in candidates]
    rows = []
    for h in parse_hunks(synthesis_diff):
        lines = _brought(h)
        shares = [(len(lines & theirs) / len(lines) if lines else 0.0, label) for label, theirs in changed]
        best_share, best_label = max(shares, key=lambda s: s[0], default=(0.0, NEW))
        # max() keeps the first of equal shares: the better ranked candidate wins a tie
        source = best_label if best_share >= MAJORITY and best_share > 0 else NEW
        rows.append(
            {
                "file": h["file"],
                "header": h["header"],
                "added": len(h["added"]),
                "removed": len(h["removed"]),
                "source": source,
                "match": round(best_share, 3),
                "also_in": [label for share, label in shares if share == 1.0 and label != source],
            }
        )
    return rows
