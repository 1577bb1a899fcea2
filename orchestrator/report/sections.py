"""The sections a strategy's ``report_sections(run)`` can add to its run report.

The shapes are documented for strategy authors in docs/strategies.md, "Adding sections to the run
report". A section that does not match its shape is reported in the page in place of the section,
with what was wrong; it never stops the report.
"""

from __future__ import annotations

from typing import Any

import msgspec


class TextSection(msgspec.Struct, frozen=True, kw_only=True, tag="text", tag_field="type"):
    title: str
    text: str


class TableSection(msgspec.Struct, frozen=True, kw_only=True, tag="table", tag_field="type"):
    title: str
    columns: list[str]
    rows: list[list[Any]]
    highlight: list[int] = []
    note: str = ""


class Series(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    points: list[tuple[float, float]]
    line: bool = True  # False: markers only, for points that are not a sequence


class ChartSection(msgspec.Struct, frozen=True, kw_only=True, tag="chart", tag_field="type"):
    title: str
    series: list[Series]
    x_label: str = ""
    y_label: str = ""
    note: str = ""
    x_integer: bool = False


class Openable(msgspec.Struct, frozen=True, kw_only=True):
    """What a tree node and a compared item have in common: the reader opens it to see
    its ``details`` and the diff of its ``commit``, and the strategy may mark it (``highlight``).

    The two stay separate structs because they are different things to the author:
    a node has an ``id`` and a ``parent`` in a tree, an item is one of a row of candidates.
    """

    highlight: bool = False
    details: dict[str, Any] = {}
    commit: str | None = None


class TreeNode(Openable, frozen=True, kw_only=True):
    id: str
    parent: str | None = None
    label: str = ""
    status: str = ""


class TreeSection(msgspec.Struct, frozen=True, kw_only=True, tag="tree", tag_field="type"):
    title: str
    nodes: list[TreeNode]
    note: str = ""


class CompareItem(Openable, frozen=True, kw_only=True):
    label: str
    subtitle: str = ""


class CompareSection(msgspec.Struct, frozen=True, kw_only=True, tag="compare", tag_field="type"):
    title: str
    items: list[CompareItem]
    note: str = ""


Section = TextSection | TableSection | ChartSection | TreeSection | CompareSection


class InvalidSection(msgspec.Struct, frozen=True, kw_only=True, tag="invalid", tag_field="type"):
    title: str
    problem: str


def validate(raw: Any) -> Section | InvalidSection:
    """One section dict -> its typed form, or an :class:`InvalidSection` saying why not."""
    title = raw.get("title", "untitled section") if isinstance(raw, dict) else "untitled section"
    try:
        return msgspec.convert(raw, Section)
    except msgspec.ValidationError as exc:
        return InvalidSection(title=str(title), problem=str(exc))


def commits_of(sections: list[Any]) -> list[str]:
    """The commits whose diffs the sections show (tree nodes and compared items)."""
    out: list[str] = []
    for s in sections:
        if isinstance(s, TreeSection):
            out += [n.commit for n in s.nodes if n.commit]
        elif isinstance(s, CompareSection):
            out += [i.commit for i in s.items if i.commit]
    return out
