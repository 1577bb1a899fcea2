"""The --no-tui / --json / --quiet streams: line format (scripts grep for it) and following a live log."""

from __future__ import annotations

import io
import re

import anyio
import orjson
import pytest
from msgspec import to_builtins as to_dict

from orchestrator.log.eventlog import read_events
from orchestrator.naming import display_ids
from tui.console import format_event, stream_console
from tui.synthetic import synthetic_run, write_run

KEY = "run_x/s1/impl/0"
INST = "7a3f2c9e01b2c3d4"
PREFIX = display_ids(KEY, INST) + ": impl/0 "  # the spec's ids, then the readable key the summary uses
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def ev(etype, payload, key=KEY, sid="s1"):
    out = {
        "id": "x",
        "type": etype,
        "ts": "2026-01-01T00:00:00.000Z",
        "run_id": "run_x",
        "strategy_execution_id": sid,
        "start_offset": 0,
        "payload": payload,
    }
    if key is not None:
        out["key"] = key
    return out


def test_prefix_is_the_short_key_hash_and_instance_id_then_the_readable_key():
    line = format_event(
        ev("task.started", {"instance_id": INST, "model": "sonnet", "branch_name": "feat_auth_1"}), color=False
    )
    assert re.match(r"^k[0-9a-f]{8}/inst-[0-9a-f]{5}: impl/0 ", line)
    assert line == PREFIX + "[STARTED] → feat_auth_1 (sonnet)"
    # several strategy executions (--runs N) may share a key: the execution leads
    several = format_event(ev("task.started", {"instance_id": INST, "model": "sonnet"}), color=False, several=True)
    assert several == display_ids(KEY, INST) + ": s1/impl/0 [STARTED] (sonnet)"


def test_a_command_task_shows_no_model_and_a_failure_no_marker_lines():
    started = format_event(
        ev("task.started", {"instance_id": INST, "model": "sonnet", "plugin": "command"}), color=False
    )
    assert started == PREFIX + "[STARTED] (command)"  # an older log: the plugin's name says it
    # a current log records the kind: a command plugin of any name reads as one, an agent's shows its model
    for runs_command, shown in ((True, "(command)"), (False, "(sonnet)")):
        started = format_event(
            ev(
                "task.started",
                {"instance_id": INST, "model": "sonnet", "plugin": "shell", "runs_command": runs_command},
            ),
            color=False,
        )
        assert started == PREFIX + f"[STARTED] {shown}"
    failed = format_event(
        ev(
            "task.failed",
            {"instance_id": INST, "error_type": "command", "message": "@@evolve stderr\nno pytest", "metrics": {}},
        ),
        color=False,
    )
    assert failed == PREFIX + "[FAILED] ✗ command: no pytest • - • N/A"


def test_completed_line_has_duration_cost_tokens_and_branch():
    payload = {
        "instance_id": INST,
        "metrics": {"duration_s": 204.2, "cost_usd": 0.42, "tokens_in": 2000, "tokens_out": 500},
        "artifact": {"branch_final": "feat_auth_1", "has_changes": True, "lines_added": 30, "lines_deleted": 4},
        "final_message": "All done",
    }
    line = format_event(ev("task.completed", payload), color=False)
    assert line == PREFIX + "[COMPLETED] ✓ 3m 24s • $0.42 • 2.5k tokens • → feat_auth_1 • +30/-4"


def test_unknown_cost_is_na_and_no_branch_is_said():
    payload = {
        "instance_id": INST,
        "metrics": {"duration_s": 45, "cost_usd": None, "tokens_in": 800, "tokens_out": 0},
        "artifact": {"branch_final": None, "has_changes": False},
    }
    line = format_event(ev("task.completed", payload), color=False)
    assert line == PREFIX + "[COMPLETED] ✓ 45s • N/A • 800 tokens • no branch"


def test_failed_and_interrupted_lines():
    failed = format_event(
        ev(
            "task.failed",
            {
                "instance_id": INST,
                "error_type": "timeout",
                "message": "Timeout after 60m\ntraceback noise",
                "metrics": {"duration_s": 3600, "cost_usd": 2.41},
            },
        ),
        color=False,
    )
    assert failed == PREFIX + "[FAILED] ✗ timeout: Timeout after 60m • 1h 00m • $2.41"
    interrupted = format_event(ev("task.interrupted", {"instance_id": INST}), color=False)
    assert interrupted == PREFIX + "[INTERRUPTED]"


def test_strategy_lines_and_hidden_events():
    started = format_event(
        ev("strategy.started", {"name": "best-of-n", "params": {"n": 3}, "index": 0}, key=None), color=False
    )
    assert started == "s1: [STRATEGY] best-of-n started (n=3)"
    failed = format_event(
        ev("strategy.completed", {"status": "failed", "error": "NoViableCandidates: none"}, key=None), color=False
    )
    assert failed == "s1: [FAILED] failed: NoViableCandidates: none"
    assert format_event(ev("task.scheduled", {"instance_id": INST}), color=False) is None
    assert format_event(ev("strategy.checkpoint", {"seq": 0, "kind": "now", "value": 1}, key=None), color=False) is None


def test_color_wraps_only_the_tag():
    line = format_event(
        ev("task.failed", {"instance_id": INST, "error_type": "auth", "message": "bad key", "metrics": {}}), color=True
    )
    assert "\x1b[1;31m[FAILED]\x1b[0m" in line
    assert line.startswith(PREFIX)  # the correlation prefix is never coloured
    assert ANSI.sub("", line) == format_event(
        ev("task.failed", {"instance_id": INST, "error_type": "auth", "message": "bad key", "metrics": {}}), color=False
    )


async def follow(tmp_path, mode, run_id, n, *, duration=0.6):
    """Stream a run while a writer produces it; stop once the writer is done."""
    out = io.StringIO()
    stop = anyio.Event()
    events = synthetic_run(run_id, n, max_parallel=3)

    async def writer():
        await anyio.sleep(0.2)  # the stream starts before the log exists
        await write_run(
            events, run_id=run_id, logs_dir=tmp_path / "logs", state_dir=tmp_path / "state", duration=duration
        )
        stop.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            await stream_console(run_id, logs_dir=tmp_path / "logs", mode=mode, stop=stop, file=out)
    return out.getvalue(), list(read_events(tmp_path / "logs" / run_id / "events.jsonl"))


async def test_plain_stream_follows_a_live_run_to_the_end(tmp_path):
    text, events = await follow(tmp_path, "plain", "run_live", 6)
    lines = text.splitlines()
    assert "\x1b[" not in text  # not a tty: no colour codes
    assert lines[0] == "s1: [STRATEGY] best-of-n started (n=6)"
    assert lines[-1] == "s1: [STRATEGY] success"
    started = [ln for ln in lines if "[STARTED]" in ln]
    finished = [ln for ln in lines if "[COMPLETED]" in ln or "[FAILED]" in ln]
    assert len(started) == len(finished) == 6
    scheduled = {e.key: e.payload for e in events if e.type == "task.scheduled"}
    for key, payload in scheduled.items():
        prefix = f"{display_ids(key, payload['instance_id'])}: {key.split('/', 2)[2]}"
        assert f"{prefix} [STARTED] → {payload['branch_name']} (sonnet)" in lines
    assert len(lines) == 2 + 12  # no line for scheduling events


async def test_json_stream_is_every_event_once_in_order(tmp_path):
    text, events = await follow(tmp_path, "json", "run_json", 5)
    decoded = [orjson.loads(line) for line in text.splitlines()]
    assert decoded == [to_dict(e) for e in events]


async def test_quiet_prints_nothing_and_still_returns(tmp_path):
    text, events = await follow(tmp_path, "quiet", "run_q", 3, duration=0.2)
    assert text == "" and len(events) == 2 + 3 * 3


async def test_stop_set_early_still_drains_the_whole_log(tmp_path):
    events = synthetic_run("run_done", 4)
    await write_run(events, run_id="run_done", logs_dir=tmp_path / "logs", state_dir=tmp_path / "state")
    stop = anyio.Event()
    stop.set()
    out = io.StringIO()
    with anyio.fail_after(5):
        await stream_console("run_done", logs_dir=tmp_path / "logs", mode="json", stop=stop, file=out)
    assert len(out.getvalue().splitlines()) == len(events)


# ---------------------------------------------------------------- through the real CLI (Docker + sim agent)


@pytest.mark.docker
def test_cli_no_tui_streams_one_clean_line_per_task_event(tmp_path):
    from cli_helpers import cli_env, only_run_id, run_cli
    from conftest import TEST_IMAGE, make_repo

    repo = make_repo(tmp_path / "repo")
    result = run_cli(
        ["SIM: write a.txt hi\nSIM: commit add a\nSIM: print done", "--no-tui", "--docker-image", TEST_IMAGE],
        cwd=repo,
        env=cli_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    run_id = only_run_id(tmp_path)
    events = list(read_events(tmp_path / "logs" / run_id / "events.jsonl"))
    scheduled = next(e for e in events if e.type == "task.scheduled")
    completed = next(e for e in events if e.type == "task.completed")
    # the spec's ids, then the simple strategy's one task named as in summary.json
    prefix = display_ids(scheduled.key, scheduled.payload["instance_id"]) + ": task"
    lines = result.stdout.splitlines()
    assert "\x1b[" not in result.stdout  # piped: no colour
    assert lines[0] == "Base branch: main (the default; choose another with --base-branch NAME)"
    assert lines[1:5] == [
        "s1: [STRATEGY] simple started (import_policy=auto)",
        f"{prefix} [STARTED] → {scheduled.payload['branch_name']} ({scheduled.payload['model']})",
        format_event(to_dict(completed), color=False),
        "s1: [STRATEGY] success",
    ]
    assert f"→ {completed.payload['artifact']['branch_final']} • +1/-0" in lines[3]


@pytest.mark.docker
def test_cli_json_streams_the_event_log_then_the_summary(tmp_path):
    from cli_helpers import cli_env, only_run_id, run_cli
    from conftest import TEST_IMAGE, make_repo

    repo = make_repo(tmp_path / "repo")
    result = run_cli(["SIM: print done", "--json", "--docker-image", TEST_IMAGE], cwd=repo, env=cli_env(tmp_path))
    assert result.returncode == 0, result.stderr
    run_id = only_run_id(tmp_path)
    decoded = [orjson.loads(line) for line in result.stdout.splitlines()]
    events = [to_dict(e) for e in read_events(tmp_path / "logs" / run_id / "events.jsonl")]
    assert decoded[:-1] == events
    assert decoded[-1]["type"] == "run.summary"


def test_sub_ten_second_durations_keep_a_decimal():
    from tui.console import format_event

    event = {
        "type": "task.completed",
        "key": "r/s1/k",
        "payload": {
            "key": "r/s1/k",
            "instance_id": "abcdef0123456789",
            "metrics": {"duration_s": 0.42, "cost_usd": None, "tokens_in": 1, "tokens_out": 1},
            "artifact": None,
        },
    }
    line = format_event(event, color=False)
    assert "0.4s" in line and "N/A" in line
    event["payload"]["metrics"]["duration_s"] = 204
    assert "3m 24s" in format_event(event, color=False)


def test_a_start_line_leaves_out_unset_parameters_and_never_cuts_a_name():
    from tui.console import MESSAGE_LIMIT

    def start_line(name: str, params: dict) -> str:
        event = {"type": "strategy.started", "strategy_execution_id": "s1", "key": None}
        return format_event({**event, "payload": {"name": name, "params": params}}, color=False)

    line = start_line("best-of-n", {"model": None, "scorer_model": None, "n": 3})
    assert line == "s1: [STRATEGY] best-of-n started (n=3)"
    many = {f"parameter_number_{i}": i for i in range(30)}
    line = start_line("x", many)
    shown = line.split(" started (", 1)[1].rstrip(")")
    assert len(shown) <= MESSAGE_LIMIT and shown.endswith("…")
    assert all(re.fullmatch(r"parameter_number_\d+=\d+", part) for part in shown.rstrip("…").split(", ")), shown


def test_the_final_summary_leaves_out_unset_parameters(tmp_path):
    from orchestrator.app.results import render_summary

    summary = {
        "run_id": "run_x",
        "status": "completed",
        "strategy": "best-of-n",
        "params": {"model": None, "n": 3, "goals": ["a", "b"]},
        "runs": 1,
        "strategies": [],
        "totals": {
            "completed": 0,
            "failed": 0,
            "duration_s": 0,
            "cost_usd": 0,
            "tokens_in": 0,
            "tokens_out": 0,
            "success_rate": None,
        },
        "base_branch": "main",
        "branches": [],
        "final_branches": [],
    }
    text = render_summary(summary, results_path=tmp_path)
    assert "model:" not in text and "  n: 3" in text and '  goals: ["a", "b"]' in text
