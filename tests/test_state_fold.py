"""The state is a pure fold: snapshot at any point + the rest == folding everything."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.state import RunState, apply, encode_snapshot

KEYS = [f"r/s1/k{i}" for i in range(4)]
TYPES = ["task.scheduled", "task.started", "task.completed", "task.failed", "task.interrupted",
         "strategy.started", "strategy.checkpoint", "strategy.completed"]


def payload(etype, key, i):
    if etype == "task.scheduled":
        return {"key": key, "instance_id": f"i{key[-1]}", "task_fingerprint_hash": "f", "container_name": "c"}
    if etype == "task.completed":
        return {"key": key, "metrics": {"cost_usd": 0.5, "tokens_in": 10, "tokens_out": 5, "duration_s": 1.0},
                "artifact": {"branch_final": f"b{i}"}}
    if etype == "task.failed":
        return {"key": key, "error_type": "api", "message": "x", "metrics": {"cost_usd": 0.25}}
    if etype == "strategy.checkpoint":
        return {"seq": i % 3, "kind": "rand", "value": ["rand", i]}
    if etype == "strategy.completed":
        return {"status": "success", "result": i}
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
    snap = msgspec.json.decode(encode_snapshot(fold(evs[:cut])), type=RunState)
    assert encode_snapshot(fold(evs, snap)) == encode_snapshot(full)  # events before the cut are ignored
    again = fold(evs, msgspec.json.decode(encode_snapshot(full), type=RunState))
    assert encode_snapshot(again) == encode_snapshot(full)
    c = full.counters
    terminal = sum(1 for t in full.tasks.values() if t.state in ("COMPLETED", "FAILED"))
    assert c.completed + c.failed == terminal  # counters only move on non-terminal -> terminal
    assert c.scheduled == len(full.tasks)
