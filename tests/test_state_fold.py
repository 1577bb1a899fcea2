"""The state is a pure fold: snapshot at any point + the rest == folding everything."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import SnapshotError
from orchestrator.log.state import SNAPSHOT_SCHEMA, RunState, apply, decode_snapshot, encode_snapshot

# keys a bisect over the snapshot's lines must get right: escapes, non-ASCII, a lookalike separator
KEYS = ["r/s1/k0", "r/s1/k1", 'r/s1/q"uote', "r/s1/back\\slash", "r/s1/é", 'r/s1/x":{"key":', "r/s1/k10", "r/s1/"]
TYPES = [
    "task.scheduled",
    "task.started",
    "task.completed",
    "task.failed",
    "task.interrupted",
    "task.session",
    "strategy.started",
    "strategy.checkpoint",
    "strategy.progress",
    "strategy.completed",
    "run.started",  # a new session: the times of the earlier ones must survive a snapshot
]


def payload(etype, key, i):
    if etype == "task.scheduled":
        return {"key": key, "instance_id": f"i{key[-1]}", "task_fingerprint_hash": "f", "container_name": "c"}
    if etype == "task.completed":
        return {
            "key": key,
            "metrics": {"cost_usd": 0.5, "tokens_in": 10, "tokens_out": 5, "duration_s": 1.0},
            "artifact": {"branch_final": f"b{i}"},
        }
    if etype == "task.failed":
        return {
            "key": key,
            "error_type": "api",
            "message": "x",
            "metrics": {"cost_usd": 0.25, "tokens_in": 7, "tokens_out": 1},
        }
    if etype == "task.session":
        return {
            "key": key,
            "session_id": f"sess{i}" if i % 3 else None,
            "reason": None if i % 3 else "session_corrupted",
        }
    if etype == "strategy.checkpoint":
        return {"seq": i % 3, "kind": "rand", "value": ["rand", i]}
    if etype == "strategy.completed":
        return {"status": "success", "result": i}
    if etype == "run.started":
        return {"dry_run": True, "resumed": i > 0}
    if etype == "strategy.progress":  # every fourth one malformed: the fold keeps the previous record
        return {"phase": "depth", "step": i, "best": i / 2, "text": "é"} if i % 4 else {"step": "x"}
    return {"key": key}


events = st.lists(st.tuples(st.sampled_from(TYPES), st.sampled_from(KEYS)), min_size=1, max_size=40)


def fold(evs, state=None):
    state = state or RunState(run_id="r")
    offset = 0
    for i, (etype, key) in enumerate(evs):
        k = key if etype.startswith("task.") else None
        apply(state, etype, "s1", k, payload(etype, key, i), offset, f"2026-01-01T00:00:{i % 60:02d}.000Z")
        offset += 100
    return state


@settings(max_examples=300, deadline=None)
@given(events, st.integers(min_value=0, max_value=40))
def test_snapshot_then_rest_equals_full_fold_and_reapplying_never_double_counts(evs, cut):
    cut = min(cut, len(evs))
    full = fold(evs)
    snap = decode_snapshot(encode_snapshot(fold(evs[:cut])))
    resumed = fold(evs, snap)
    assert encode_snapshot(resumed) == encode_snapshot(full)  # events before the cut are ignored
    assert [t.key for t in resumed.unfinished()] == [t.key for t in full.unfinished()]
    assert len(resumed.tasks) == len(full.tasks)
    assert list(resumed.tasks.items()) == list(full.tasks.items())  # same tasks, same (scheduling) order
    again = fold(evs, decode_snapshot(encode_snapshot(full)))
    assert encode_snapshot(again) == encode_snapshot(full)
    c = full.counters
    terminal = sum(1 for t in full.tasks.values() if t.state in ("COMPLETED", "FAILED"))
    assert c.completed + c.failed == terminal  # counters only move on non-terminal -> terminal
    assert c.scheduled == len(full.tasks)
    # plain JSON: every task record, sorted by key
    assert msgspec.json.decode(encode_snapshot(full))["tasks"] == msgspec.to_builtins(
        sorted(full.tasks.values(), key=lambda t: msgspec.json.encode(t.key))
    )


@settings(max_examples=200, deadline=None)
@given(events, st.lists(st.sampled_from([*KEYS, "r/s1/none", "a", "\uffff"]), max_size=12))
def test_lookups_in_a_loaded_snapshot_decode_only_what_they_touch(evs, probes):
    full = fold(evs)
    loaded = decode_snapshot(encode_snapshot(full))
    for key in probes:
        assert loaded.tasks.get(key) == full.tasks.get(key)
        assert (key in loaded.tasks) == (key in full.tasks)
    assert [t.key for t in loaded.unfinished()] == [t.key for t in full.unfinished()]
    assert loaded.tasks.lazy == (len(full.tasks) > 0)  # lookups and open tasks decode nothing else
    assert len(loaded.tasks) == len(full.tasks)
    assert encode_snapshot(loaded) == encode_snapshot(full)


@settings(max_examples=150, deadline=None)
@given(events, st.integers(min_value=0, max_value=10_000), st.sampled_from([b"x", b"\n", b'"', b"}", b"\x00"]))
def test_a_torn_or_edited_snapshot_fails_only_with_snapshot_error(evs, cut, byte):
    data = encode_snapshot(fold(evs))
    cut = cut % len(data)
    for bad in (data[:cut], data[:cut] + byte + data[cut + 1 :]):
        if bad == data:
            continue
        # either refused at load, or a record that does not decode is refused when touched;
        # never another exception from the middle of the engine
        try:
            state = decode_snapshot(bad)
            assert len(list(state.tasks)) == len(state.tasks)
        except SnapshotError:
            pass


def test_a_snapshot_torn_inside_a_multibyte_character_fails_with_snapshot_error():
    # Found by the property test above: a cut through "é" in the header left invalid
    # UTF-8, and the decoder's UnicodeDecodeError escaped instead of SnapshotError.
    evs = [("task.scheduled", "r/s1/é"), ("strategy.started", "r/s1/é"), ("task.completed", "r/s1/é")]
    data = encode_snapshot(fold(evs))
    first = data.index("é".encode())
    for bad in (data[: first + 1], data[: first + 1] + b"x" + data[first + 2 :]):
        with pytest.raises(SnapshotError):
            state = decode_snapshot(bad)
            list(state.tasks.values())


def test_the_earlier_whole_document_layout_still_loads():
    full = fold([("task.scheduled", KEYS[1]), ("task.scheduled", KEYS[0]), ("task.completed", KEYS[1])])
    legacy = msgspec.json.encode(
        {
            "run_id": "r",
            "last_event_start_offset": full.last_event_start_offset,
            "tasks": {k: msgspec.structs.asdict(t) for k, t in full.tasks.items()},
            "strategies": {},
            "counters": full.counters,
            "schema": 1,
        }
    )
    loaded = decode_snapshot(legacy)
    assert list(loaded.tasks) == [KEYS[1], KEYS[0]] and loaded.counters == full.counters
    # that layout predates the sessions' times: a load of it knows none
    full.session_started_at = full.last_event_at = None
    assert encode_snapshot(loaded) == encode_snapshot(full)


def test_a_task_recorded_before_runs_command_reads_as_its_plugin_said():
    """Issue 45: an older log's task.scheduled names only the plugin: its kind is upcast from that."""
    state = RunState(run_id="r")
    recorded = [
        ({"plugin": "command"}, True),
        ({"input": {"plugin_name": "command"}}, True),  # older still: the plugin only in the input
        ({"plugin": "codex"}, False),
        ({}, False),
        ({"plugin": "shell", "runs_command": True}, True),  # a current log says it, whatever the name
    ]
    for i, (fields, expected) in enumerate(recorded):
        key = f"r/s1/t{i}"
        apply(state, "task.scheduled", "s1", key, {"key": key, "instance_id": f"i{i}", **fields}, i, "t")
        assert state.tasks[key].runs_command is expected, fields
    # A snapshot from before tasks recorded it would read every task as an agent: it is not read.
    now = f'"schema":{SNAPSHOT_SCHEMA},'.encode()
    older = encode_snapshot(state).replace(now, f'"schema":{SNAPSHOT_SCHEMA - 1},'.encode(), 1)
    assert older != encode_snapshot(state)
    with pytest.raises(SnapshotError, match="another version"):
        decode_snapshot(older)


def test_task_session_is_durable_while_the_task_runs_and_ignored_once_it_finished():
    state = fold([("task.scheduled", KEYS[0]), ("task.started", KEYS[0])])
    apply(state, "task.session", "s1", KEYS[0], {"key": KEYS[0], "session_id": "abc"}, 1000, "t")
    assert state.tasks[KEYS[0]].session_id == "abc"  # known before any terminal or interrupted event
    apply(
        state,
        "task.session",
        "s1",
        KEYS[0],
        {"key": KEYS[0], "session_id": None, "reason": "workspace_missing"},
        1100,
        "t",
    )
    assert state.tasks[KEYS[0]].session_id is None  # a fresh start forgets the old session
    apply(state, "task.session", "s1", KEYS[0], {"key": KEYS[0], "session_id": "def"}, 1200, "t")
    apply(state, "task.completed", "s1", KEYS[0], {"key": KEYS[0], "session_id": "def"}, 1300, "t")
    apply(state, "task.session", "s1", KEYS[0], {"key": KEYS[0], "session_id": "late"}, 1400, "t")
    assert state.tasks[KEYS[0]].session_id == "def"


def test_the_latest_well_formed_progress_record_is_kept_per_execution():
    state = RunState(run_id="r")
    apply(state, "strategy.started", "s1", None, {"name": "tree-beam"}, 0, "t")
    apply(state, "strategy.started", "s2", None, {"name": "tree-beam"}, 1, "t")
    apply(state, "strategy.progress", "s1", None, {"phase": "depth", "step": 1, "frontier": 2}, 2, "t")
    apply(state, "strategy.progress", "s2", None, {"phase": "depth", "step": 3}, 3, "t")
    apply(state, "strategy.progress", "s1", None, {"phase": "depth", "step": "two"}, 4, "t")  # malformed
    apply(state, "strategy.progress", "s9", None, {"phase": "depth", "step": 1}, 5, "t")  # unknown execution
    assert (state.strategies["s1"].progress.step, state.strategies["s1"].progress.frontier) == (1, 2)
    assert state.strategies["s2"].progress.step == 3 and "s9" not in state.strategies
    again = decode_snapshot(encode_snapshot(state))
    assert again.strategies["s1"].progress == state.strategies["s1"].progress


def test_a_failed_task_counts_the_tokens_it_was_paid_for():
    """A run whose tasks all failed shows the tokens behind its cost, not a cost with 0 tokens."""
    state = fold([("task.scheduled", KEYS[0]), ("task.started", KEYS[0]), ("task.failed", KEYS[0])])
    task = state.tasks[KEYS[0]]
    assert (task.state, task.cost_usd, task.tokens_in, task.tokens_out) == ("FAILED", 0.25, 7, 1)
    c = state.counters
    assert (c.failed, c.cost_usd, c.tokens_in, c.tokens_out) == (1, 0.25, 7, 1)


def test_the_duration_sums_each_sessions_time_and_not_the_time_between():
    state = RunState(run_id="r")
    timeline = [
        ("run.started", "2026-01-01T10:00:00.000Z"),
        ("strategy.started", "2026-01-01T10:00:01.000Z"),
        ("strategy.progress", "2026-01-01T10:00:04.000Z"),  # the first session's last event: 4 s in
        ("run.started", "2026-01-02T09:00:00.000Z"),  # resumed the next day
        ("strategy.completed", "2026-01-02T09:00:06.500Z"),
    ]
    for offset, (etype, ts) in enumerate(timeline):
        payload = {"resumed": offset > 0} if etype == "run.started" else {"step": 1} if "progress" in etype else {}
        apply(state, etype, "s1", None, payload, offset, ts)
        if offset == 2:
            assert state.duration_s() == 4.0
            snap = encode_snapshot(state)
    assert state.duration_s() == 10.5
    loaded = decode_snapshot(snap)  # a resume from the snapshot carries the earlier session on
    for offset, (etype, ts) in list(enumerate(timeline))[3:]:
        apply(loaded, etype, "s1", None, {"resumed": True} if etype == "run.started" else {}, offset, ts)
    assert loaded.duration_s() == 10.5


def test_a_log_from_before_run_started_is_one_session_from_its_first_event():
    state = RunState(run_id="r")
    apply(state, "strategy.started", "s1", None, {}, 0, "2026-01-01T10:00:00.000Z")
    apply(state, "strategy.completed", "s1", None, {}, 1, "2026-01-01T10:00:02.250Z")
    assert state.duration_s() == 2.25
