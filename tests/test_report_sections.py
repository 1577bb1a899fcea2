"""Section shapes a strategy's report_sections returns: tree nodes and compared items open the same way."""

from __future__ import annotations

import pytest

from orchestrator.report.sections import (
    CompareSection,
    InvalidSection,
    TreeSection,
    commits_of,
    validate,
)

SHA_A, SHA_B, SHA_C = "a" * 40, "b" * 40, "c" * 40


def test_tree_nodes_and_compared_items_carry_details_commit_and_highlight():
    tree = validate(
        {
            "type": "tree",
            "title": "t",
            "nodes": [
                {"id": "root", "details": {"score": 1}, "commit": SHA_A, "highlight": True},
                {"id": "kid", "parent": "root", "label": "child", "status": "done"},
            ],
        }
    )
    compare = validate(
        {
            "type": "compare",
            "title": "c",
            "items": [
                {"label": "x", "subtitle": "s", "details": {"score": 2}, "commit": SHA_B, "highlight": True},
                {"label": "y"},
            ],
        }
    )
    assert isinstance(tree, TreeSection) and isinstance(compare, CompareSection)
    root, kid = tree.nodes
    assert (root.details, root.commit, root.highlight) == ({"score": 1}, SHA_A, True)
    assert (kid.parent, kid.label, kid.status, kid.details, kid.commit, kid.highlight) == (
        "root",
        "child",
        "done",
        {},
        None,
        False,
    )
    first, second = compare.items
    assert (first.label, first.subtitle, first.details, first.commit, first.highlight) == (
        "x",
        "s",
        {"score": 2},
        SHA_B,
        True,
    )
    assert (second.details, second.commit, second.highlight) == ({}, None, False)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (
            {"type": "tree", "title": "t", "nodes": [{"label": "no id"}]},
            "missing required field `id` - at `$.nodes[0]`",
        ),
        (
            {"type": "compare", "title": "c", "items": [{"subtitle": "no label"}]},
            "missing required field `label` - at `$.items[0]`",
        ),
        (
            {"type": "compare", "title": "c", "items": [{"label": "x", "details": "not a dict"}]},
            "Expected `object`, got `str` - at `$.items[0].details`",
        ),
    ],
)
def test_a_malformed_node_or_item_becomes_an_invalid_section_saying_where(raw, problem):
    section = validate(raw)
    assert isinstance(section, InvalidSection) and problem in section.problem


def test_commits_of_lists_tree_then_compare_commits_in_order():
    sections = [
        validate({"type": "text", "title": "x", "text": "y"}),
        validate({"type": "tree", "title": "t", "nodes": [{"id": "a", "commit": SHA_A}, {"id": "b"}]}),
        validate(
            {
                "type": "compare",
                "title": "c",
                "items": [{"label": "x", "commit": SHA_B}, {"label": "y", "commit": SHA_C}],
            }
        ),
        InvalidSection(title="bad", problem="p"),
    ]
    assert commits_of(sections) == [SHA_A, SHA_B, SHA_C]
