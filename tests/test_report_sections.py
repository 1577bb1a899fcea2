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


# ---------------------------------------------------------------- task cards and charts (issue 30)


def test_a_card_reads_a_json_answer_as_fields_and_keeps_a_diff_hunk():
    from orchestrator.report.cards import task_card

    review = task_card(
        {
            "plugin": "claude-code",
            "final_message": 'Looks fine.\n{"verdict": "APPROVE", "issues": ["a", "b"]}',
            "result": {},
        }
    )
    assert review["fields"] == {"verdict": "APPROVE", "issues": ["a", "b"]} and review["output"] == "Looks fine."
    prose = 'I set {"debug": true} in config.json, then ran the tests.'
    coder = task_card({"plugin": "claude-code", "final_message": prose, "result": {}})
    assert coder["fields"] == {} and coder["output"] == prose  # JSON quoted in prose stays where it was written
    diff = "diff --git a/x b/x\n@@ -1 +1 @@\n-a\n+b"
    shown = task_card(
        {"plugin": "command", "runs_command": True, "command": "git diff", "final_message": diff, "result": {}}
    )
    assert shown["output"] == diff and shown["command"] == "git diff" and not shown["script"]


def test_a_card_hides_a_wrapper_script_and_its_marker_lines_whatever_the_strategy_says():
    from orchestrator.report.cards import task_card

    task = {
        "plugin": "command",
        "runs_command": True,
        "command": 'sh -c "make"; printf "@@orch-base exit=%s" "$rc"',
        "final_message": "built\n@@orch-base stderr\n@@orch-base exit=0\n",
        "result": {},
    }
    generic = task_card(task)
    assert generic["command"] is None and generic["script"] and generic["output"] == "built"
    refined = task_card(task, lambda t: {"command": "make", "output": "built\n@@leak 1", "fields": {"exit status": 0}})
    assert refined["command"] == "make" and refined["output"] == "built" and refined["fields"] == {"exit status": 0}
    assert task_card(task, lambda t: 1 / 0) == generic  # a broken hook keeps the generic card


def test_the_built_in_cards_read_each_wrapper_into_fields():
    from strategies._report_tasks import report_task
    from strategies.base_check import base_command
    from strategies.evolve_commands import measure_command
    from strategies.evolve_goals import Goal
    from strategies.tree_beam_measure import measure_command as measure_runs

    base = report_task(
        {
            "plugin": "command",
            "runs_command": True,
            "command": base_command("python3 -m pytest -q 'tests/a b.py'"),
            "final_message": "1 failed\n\n@@orch-base stderr\nNo module named pytest\n\n@@orch-base exit=1\n",
        }
    )
    assert base == {
        "command": "python3 -m pytest -q 'tests/a b.py'",
        "fields": {"exit status": 1},
        "output": "1 failed",
        "stderr": "No module named pytest",
    }
    goal = Goal(id="g", description="d", check="test -f it's.txt", weight=1)
    evolve = report_task(
        {
            "plugin": "command",
            "runs_command": True,
            "command": measure_command(goal),
            "final_message": "\n@@evolve stderr\n\n@@evolve end exit=1 head=" + "a" * 40 + "\n",
        }
    )
    assert evolve is not None and evolve["command"] == "test -f it's.txt"
    assert evolve["fields"] == {"exit status": 1, "measured on commit": "a" * 12}
    runs = report_task(
        {
            "plugin": "command",
            "runs_command": True,
            "command": measure_runs("python3 bench.py", [("c", "HEAD")]),
            "final_message": '@@orch-run 0 c 0 1 {"metrics": {"t": 5}}\n| {"metrics": {"t": 5}}\n@@orch-done 1\n',
        }
    )
    assert runs is not None and runs["command"] == "python3 bench.py"
    assert runs["fields"]["runs"] == [
        {"run": "0", "commit": "c", "exit status": "0", "attempts": "1", "last line": {"metrics": {"t": 5}}}
    ]


def test_chart_series_with_the_same_values_are_drawn_apart():
    import re

    from orchestrator.report.charts import line_chart_svg
    from orchestrator.report.sections import Series

    same = [(0.0, 0.0), (1.0, 1.0)]
    svg = line_chart_svg(
        [Series(name="a", points=same), Series(name="b", points=same), Series(name="c", points=[(0, 5)])]
    )
    paths = re.findall(r'<path d="([^"]+)" fill="none" stroke="[^"]+" stroke-width="2"([^/]*)/>', svg)
    assert len(paths) == 2 and paths[0][0] != paths[1][0] and paths[0][1] != paths[1][1], paths
    assert svg.count("<circle") == 3 and svg.count("<rect") == 3  # each series its own marker (points, legend)
    alone = line_chart_svg([Series(name="a", points=same)])
    assert '<path d="M64,236 L624,16"' in alone  # a series that shares nothing is not moved


def test_a_card_shows_the_command_of_a_command_task_whatever_its_plugin_is_named(tmp_path):
    """Issue 45: the report reads the kind task.scheduled recorded (an older log: upcast from the plugin)."""
    from orchestrator.log import events as E
    from orchestrator.log.state import replay
    from orchestrator.report.cards import task_card
    from orchestrator.report.data import task_rows

    scheduled = {
        "r/s1/new": {"plugin": "shell", "runs_command": True},
        "r/s1/old": {"plugin": "command"},  # a log from before runs_command was recorded
        "r/s1/agent": {"plugin": "shell", "runs_command": False},
    }
    lines = []
    for key, fields in scheduled.items():
        for etype, payload in (
            (E.TASK_SCHEDULED, {"key": key, "instance_id": "i", **fields, "input": {"command": "make check"}}),
            (E.TASK_COMPLETED, {"key": key, "instance_id": "i", "final_message": "ok"}),
        ):
            lines.append(
                E.encode_line(
                    etype, ts="2026-01-01T00:00:00.000Z", run_id="r", strategy_execution_id="s1",
                    start_offset=sum(map(len, lines)), payload=payload, key=key,
                )
            )  # fmt: skip
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"".join(lines))
    shown = {row["key"]: task_card(row)["command"] for row in task_rows(replay(log), log, None)}
    assert shown == {"r/s1/new": "make check", "r/s1/old": "make check", "r/s1/agent": None}
