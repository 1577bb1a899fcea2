"""Typed event payloads: one struct per event type, the same JSON as ever, and an honest reader."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import anyio
import msgspec
import msgspec.inspect as mi
import pytest
from engine_helpers import make_config
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.engine.budget import BudgetCap
from orchestrator.engine.engine import Engine
from orchestrator.engine.testing import failure, success
from orchestrator.log import events as E
from orchestrator.log.eventlog import EventLog, LogReader, skipped_lines
from orchestrator.log.state import replay
from orchestrator.runner.types import BranchArtifact, Metrics

GOLDEN = Path(__file__).resolve().parent / "golden" / "judge.jsonl"

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
floats = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | ints | floats | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


def values(t: mi.Type) -> st.SearchStrategy:
    """Values of a msgspec type, as the payload structs use them."""
    if isinstance(t, mi.StrType):
        return text
    if isinstance(t, mi.IntType):
        return ints
    if isinstance(t, mi.FloatType):
        return floats
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.AnyType):
        return json_values
    if isinstance(t, mi.UnionType):
        return st.one_of(*(values(u) for u in t.types))
    if isinstance(t, mi.ListType):
        return st.lists(values(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(values(t.key_type), values(t.value_type), max_size=3)
    if isinstance(t, mi.StructType):
        return structs(t.cls)
    raise AssertionError(f"no strategy for {t}")


def structs(cls: type) -> st.SearchStrategy:
    fields = {}
    for f in mi.type_info(cls).fields:
        unset = not f.required and f.default is mi.NODEFAULT and f.default_factory is mi.NODEFAULT
        fields[f.name] = st.one_of(st.just(msgspec.UNSET), values(f.type)) if unset else values(f.type)
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


payloads = st.sampled_from(sorted(E.PAYLOAD_TYPES)).flatmap(lambda t: structs(E.PAYLOAD_TYPES[t]))


def line_of(payload: E.EventPayload, offset: int = 0, key: str | None = "r/s1/k") -> bytes:
    """A payload as the log writer puts it on a line."""
    return E.encode_line(
        E.type_of(payload),
        ts="2026-01-01T00:00:00.000Z",
        run_id="r",
        strategy_execution_id="s1",
        start_offset=offset,
        payload=E.payload_dict(payload),
        key=key,
    )


def _reencoded(ev, payload: dict) -> bytes:
    """``ev``'s log line written again from its envelope fields and ``payload``."""
    return E.encode_line(
        ev.type,
        ts=ev.ts,
        run_id=ev.run_id,
        strategy_execution_id=ev.strategy_execution_id,
        start_offset=ev.start_offset,
        payload=payload,
        key=ev.key,
        event_id=ev.id,
    )


@settings(max_examples=400, deadline=None)
@given(payloads, st.one_of(st.none(), text), st.integers(min_value=0, max_value=2**40))
def test_every_payload_struct_survives_a_trip_through_a_log_line(payload, key, offset):
    line = line_of(payload, offset, key)
    ev = E.decode_line(line)
    assert ev.typed() == payload
    # the envelope too: struct -> line -> struct, and the line it re-encodes to is the same bytes
    assert ev.key == key and ev.start_offset == offset and ev.type == E.type_of(payload)
    again = _reencoded(ev, ev.payload)
    assert again == line and E.decode_line(again) == ev


def test_the_golden_log_decodes_to_structs_that_write_back_the_same_bytes():
    lines = GOLDEN.read_bytes().splitlines(keepends=True)
    kinds = set()
    for line in lines:
        ev = E.decode_line(line)
        payload = ev.typed()
        assert isinstance(payload, E.PAYLOAD_TYPES[ev.type])
        kinds.add(ev.type)
        # an older log (its artifacts predate uncommitted_files): nothing is added, nothing lost
        assert E.payload_dict(payload) == ev.payload
        rewritten = _reencoded(ev, E.payload_dict(payload))
        assert rewritten == line
    assert {E.TASK_COMPLETED, E.TASK_FAILED, E.TASK_SCHEDULED, E.STRATEGY_CHECKPOINT} <= kinds
    assert skipped_lines(GOLDEN) == []


def test_one_struct_per_public_event_type_and_each_is_frozen_and_kw_only():
    assert set(E.PAYLOAD_TYPES) == set(E.EVENT_TYPES)
    for etype, cls in E.PAYLOAD_TYPES.items():
        assert cls.__struct_config__.frozen, cls
        with pytest.raises(TypeError):
            cls("positional")  # kw_only
        assert E.type_of(cls()) == etype  # every field has a default: old and hand-written payloads decode


def test_the_artifact_and_metrics_a_runner_returns_fit_the_event_structs_field_for_field():
    """A field added to the runner's result must be added to the event schema too, not dropped."""
    assert E.Artifact.__struct_fields__ == BranchArtifact.__struct_fields__
    assert E.Metrics.__struct_fields__ == Metrics.__struct_fields__
    art = BranchArtifact(branch_planned="b", branch_final="b", base="main", commit="c" * 40, has_changes=True)
    assert E.payload_dict(E.TaskCompleted(artifact=E.Artifact(**msgspec.structs.asdict(art)))) is not None
    assert msgspec.to_builtins(E.Artifact(**msgspec.structs.asdict(art))) == msgspec.to_builtins(art)


def test_a_payload_that_does_not_match_its_type_is_one_clear_error():
    with pytest.raises(E.PayloadMismatch, match=r"task\.completed event .*\$\.metrics\.tokens_in"):
        E.decode_payload(E.TASK_COMPLETED, {"key": "k", "metrics": {"tokens_in": "many"}})
    with pytest.raises(E.PayloadMismatch, match=r"\$\.hosts\[0\]\.max_parallel"):
        E.decode_payload(E.HOSTS_STATUS, {"hosts": [{"name": "a", "max_parallel": "two"}]})
    # a type this version does not know (a later version's event) is no error: it has no struct
    assert E.decode_payload("task.teleported", {"anything": 1}) is None


def _write(path: Path, lines: list[bytes]) -> None:
    offset, out = 0, []
    for raw in lines:
        obj = json.loads(raw)
        obj["start_offset"] = offset
        line = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        out.append(line)
        offset += len(line)
    path.write_bytes(b"".join(out))


def _event(etype: str, payload: dict, key: str | None = "r/s1/k") -> bytes:
    obj = {"id": "x", "type": etype, "ts": "2026-01-01T00:00:00.000Z", "run_id": "r", "strategy_execution_id": "s1"}
    if key is not None:
        obj["key"] = key
    obj["payload"] = payload
    return json.dumps(obj).encode()


def test_the_reader_counts_a_mismatched_payload_and_keeps_an_unknown_type(tmp_path):
    path = tmp_path / "events.jsonl"
    _write(
        path,
        [
            _event(E.STRATEGY_STARTED, {"name": "simple", "params": {}, "index": 1}, key=None),
            _event(E.TASK_SCHEDULED, {"key": "r/s1/k", "instance_id": "i1", "task_fingerprint_hash": "f"}),
            _event(E.TASK_COMPLETED, {"key": "r/s1/k", "metrics": {"tokens_in": "many"}}),  # hand-edited
            _event("task.teleported", {"to": "mars"}),  # a later version's event
            _event(E.TASK_FAILED, {"key": "r/s1/k", "error_type": "api", "message": "no", "metrics": {}}),
        ],
    )
    reader = LogReader(path)
    records = list(reader.records())
    assert [r.event.type for r in records] == [
        E.STRATEGY_STARTED,
        E.TASK_SCHEDULED,
        "task.teleported",
        E.TASK_FAILED,
    ]
    assert records[2].payload is None and json.loads(bytes(records[2].event.payload)) == {"to": "mars"}
    assert len(reader.skipped) == 1 and "task.completed" in reader.skipped[0].reason
    bad_at = path.read_bytes().splitlines(keepends=True)
    assert reader.skipped[0].offset == len(bad_at[0]) + len(bad_at[1])
    assert skipped_lines(path) == reader.skipped
    # the envelope-level view (read_events, get_events_since) still returns every line
    assert len(list(LogReader(path).events())) == 5
    # the fold never saw the bad completion: the task failed, and the unknown type changed nothing
    state = replay(path, run_id="r")
    assert state.tasks["r/s1/k"].state == "FAILED" and state.counters.completed == 0


class _Runner:
    """Every kind of record the engine writes: hosts, live sessions and resets, spend, output, failure, a hang."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang

    async def reserve(self, request):
        return "hostA"

    async def run(self, request, *, on_event=None):
        on_event({"type": "runner.init", "session_id": f"sess-{request.prompt}"})
        on_event({"type": "runner.usage", "data": {"input_tokens": 1000, "output_tokens": 10}})
        if request.prompt == "reset":
            on_event(
                {
                    "type": "runner.session.reset",
                    "reason": "host_down",
                    "detail": "gone",
                    "previous_session_id": "sess-x",
                    "host": "hostB",
                    "error_type": "docker",
                }
            )
            on_event({"type": "runner.session.reset", "reason": "workspace_missing"})
        if self.hang and request.prompt == "slow":
            await anyio.sleep_forever()
        if request.prompt == "fail":
            return failure(request, message="broke it")
        return success(request, output={"score": 3} if request.prompt == "out" else None)

    async def aclose(self):
        pass


async def _every_kind(prompt, base_branch, ctx):
    ctx.rand()
    ctx.progress(phase="depth", step=1, of_total=2, best=0.5, text="go")
    handles = [ctx.run({"prompt": p}, key=ctx.key("t", p)) for p in ("a", "out", "reset", "fail", "slow")]
    for h in handles:
        with contextlib.suppress(ctx.errors.TaskFailed):
            await ctx.wait(h)
    return "done"


# The fields (in order) of each payload the engine wrote before payloads were structs (measured on main),
# and those added since: task.scheduled's runs_command (issue 45: the task's kind, recorded).
WRITTEN_BEFORE = {
    ("budget.cap", ("max_cost_usd", "max_tokens", "on_reached")),
    ("budget.spend", ("task", "tokens", "cost_usd")),
    ("hosts.status", ("hosts",)),
    ("run.started", ("dry_run", "resumed", "warnings")),
    ("strategy.checkpoint", ("seq", "kind", "value")),
    ("strategy.completed", ("status", "result")),
    ("strategy.progress", ("phase", "step", "of_total", "best", "text")),
    ("strategy.started", ("name", "params", "index")),
    ("task.completed", ("key", "instance_id", "artifact", "metrics", "final_message", "final_message_truncated",
                        "final_message_path", "session_id", "exit_code", "retry_attempts")),
    ("task.completed", ("key", "instance_id", "artifact", "metrics", "final_message", "final_message_truncated",
                        "final_message_path", "session_id", "exit_code", "retry_attempts", "output")),
    ("task.failed", ("key", "instance_id", "error_type", "message", "metrics", "session_id", "exit_code", "status",
                     "retry_attempts")),
    ("task.interrupted", ("key", "instance_id", "session_id")),
    ("task.scheduled", ("key", "instance_id", "container_name", "model", "task_fingerprint_hash", "branch_name",
                        "session_group_key", "plugin", "runs_command", "input")),
    ("task.session", ("key", "instance_id", "session_id")),
    ("task.session", ("key", "instance_id", "session_id", "reason", "detail", "previous_session_id")),
    ("task.session", ("key", "instance_id", "session_id", "reason", "detail", "previous_session_id", "host",
                      "error_type")),
    ("task.started", ("key", "instance_id", "container_name", "model", "session_id", "host")),
}  # fmt: skip


async def test_the_engine_writes_every_payload_with_the_fields_it_wrote_before_structs(tmp_path):
    cap = BudgetCap(max_cost_usd=100.0)
    for hang in (True, False):
        engine = Engine(make_config(tmp_path, budget=cap), _Runner(hang))
        engine.note_run_event(E.RUN_STARTED, E.RunStarted(dry_run=True, resumed=not hang, warnings=["w1"]))
        engine.note_run_event(
            E.HOSTS_STATUS,
            E.HostsStatus(hosts=[E.HostStatus(name="hostA", max_parallel=2), E.HostStatus(name="hostB", down=True)]),
        )
        scope = anyio.CancelScope()
        if hang:  # stop once the hanging task's agent reported its session: it is recorded as interrupted
            engine.listeners.append(
                lambda etype, sid, key, payload, *_, scope=scope: (
                    scope.cancel() if etype == E.TASK_SESSION and key.endswith("/slow") else None
                )
            )
        with scope, anyio.fail_after(60):
            await engine.run(_every_kind, prompt="p", params={})
    log = tmp_path / "logs" / "run_t" / "events.jsonl"
    written = {(ev.type, tuple(ev.payload)) for _, ev in LogReader(log).events()}
    assert written == WRITTEN_BEFORE
    # and every line decodes to its struct, which writes back the same object
    for _, ev in LogReader(log).events():
        assert E.payload_dict(ev.typed()) == ev.payload


async def test_a_session_group_key_that_is_not_a_string_is_one_clear_error_before_anything_is_written(tmp_path):
    """task.scheduled records the key as a string: a number would be written but not read back."""

    async def grouped(prompt, base_branch, ctx):
        return await ctx.wait(ctx.run({"prompt": "p", "session_group_key": 7}, key=ctx.key("t")))

    engine = Engine(make_config(tmp_path), _Runner(hang=False))
    state = await engine.run(grouped, prompt="p", params={})
    assert state.strategies["s1"].status == "failed"
    assert "session_group_key must be a string" in state.strategies["s1"].error
    assert not state.tasks


async def test_the_writer_refuses_a_payload_that_would_not_read_back_and_writes_nothing(tmp_path):
    path = tmp_path / "events.jsonl"
    async with EventLog(path, run_id="r") as log:
        offset, _, written = log.write(E.TaskScheduled(key="r/s1/k", instance_id="i"), strategy_execution_id="s1")
        assert offset == 0 and written == E.TaskScheduled(key="r/s1/k", instance_id="i")
        with pytest.raises(ValueError, match=r"task\.scheduled .*session_group_key"):
            log.write(E.TaskScheduled(key="r/s1/k2", session_group_key=7), strategy_execution_id="s1")  # type: ignore[arg-type]
    assert [ev.payload["key"] for _, ev in LogReader(path).events()] == ["r/s1/k"]


def test_a_runner_results_convenience_properties_read_its_metrics_and_artifact():
    # The spec's RunnerResult API: a plugin author's or a custom runner's caller reads these.
    from orchestrator.runner import BranchArtifact, Metrics, RunnerResult

    art = BranchArtifact(branch_planned="b", branch_final="b", base="main", commit="c0ffee", has_changes=True)
    done = RunnerResult(
        status="success", instance_id="i", artifact=art, metrics=Metrics(tokens_in=7, tokens_out=5, cost_usd=0.25)
    )
    assert (done.cost, done.tokens_total, done.has_changes) == (0.25, 12, True)
    bare = RunnerResult(status="failed", instance_id="i")
    assert (bare.cost, bare.tokens_total, bare.has_changes) == (None, 0, False)
