"""Shared by the bench scripts: replace one ``## `` section of docs/performance.md."""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


def replace_section(heading: str, section: str) -> None:
    """Put ``section`` (which starts with ``heading``) in place of the old one, or append it."""
    current = DOC.read_text() if DOC.exists() else "# Performance\n"
    start = current.find(heading)
    if start == -1:
        current = current.rstrip() + "\n\n" + section
    else:
        end = current.find("\n## ", start + len(heading))
        current = current[:start] + section + (current[end + 1 :] if end != -1 else "")
    DOC.write_text(current)
