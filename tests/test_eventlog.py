"""The event log contract: exact offsets, torn lines, one writer, live readers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import RunLockedError
from orchestrator.log.eventlog import EventLog, WriterLock, get_events_since, iter_lines, read_events, subscribe
from orchestrator.log.events import TASK_SCHEDULED, decode_line


async def write_events(path, payloads, **kw):
    async with EventLog(path, run_id="run_t", **kw) as log:
        for i, p in enumerate(payloads):
            log.append(TASK_SCHEDULED, strategy_execution_id="s1", key=f"run_t/s1/k{i}", payload=p)


def assert_offsets_exact(path):
    data = path.read_bytes()
    with open(path, "rb") as fh:
        for ev in read_events(path):
            fh.seek(ev.start_offset)
            line = fh.readline()
            assert decode_line(line) == ev
    assert data.count(b"\n") == len(list(read_events(path)))


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.dictionaries(text, st.one_of(text, st.integers(), st.floats(allow_nan=False, allow_infinity=False))),
        min_size=1,
        max_size=30,
    )
)
def test_every_start_offset_seeks_to_its_own_line(tmp_path_factory, payloads):
    path = tmp_path_factory.mktemp("log") / "events.jsonl"
    anyio.run(write_events, path, payloads)
    assert_offsets_exact(path)
    events = list(read_events(path))
    assert [e.payload for e in events] == [json.loads(json.dumps(p)) for p in payloads]


@pytest.mark.parametrize("policy", ["interval", "per_event"])
async def test_envelope_and_flush_policies(tmp_path, policy):
    path = tmp_path / "events.jsonl"
    await write_events(path, [{"n": i} for i in range(300)], flush_policy=policy)
    events = list(read_events(path))
    assert len(events) == 300
    e = orjson.loads(path.read_bytes().splitlines()[0])
    assert set(e) == {"id", "type", "ts", "run_id", "strategy_execution_id", "key", "start_offset", "payload"}
    assert e["ts"].endswith("Z") and len(e["ts"]) == len("2026-01-01T00:00:00.000Z")
    assert len(e["id"]) == 36 and e["id"][14] == "4"  # uuid4


async def test_appending_to_an_existing_log_continues_offsets(tmp_path):
    path = tmp_path / "events.jsonl"
    await write_events(path, [{"a": 1}, {"b": 2}])
    await write_events(path, [{"c": 3}])
    assert [e.payload for e in read_events(path)] == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert_offsets_exact(path)


async def test_log_truncated_at_any_byte_still_reads_and_reopens(tmp_path):
    path = tmp_path / "events.jsonl"
    await write_events(path, [{"i": i, "s": "é" * i} for i in range(12)])
    full = path.read_bytes()
    lines_end = [i + 1 for i, b in enumerate(full) if b == ord("\n")]
    for cut in range(0, len(full) + 1, 7):
        path.write_bytes(full[:cut])
        complete = sum(1 for end in lines_end if end <= cut)
        assert len(list(read_events(path))) == complete
        # a writer reopening the torn log cuts the torn tail and appends cleanly
        await write_events(path, [{"after": cut}])
        events = list(read_events(path))
        assert len(events) == complete + 1 and events[-1].payload == {"after": cut}
        assert_offsets_exact(path)


def test_reader_aligns_offsets_that_land_mid_line(tmp_path):
    path = tmp_path / "events.jsonl"
    anyio.run(write_events, path, [{"i": i} for i in range(5)])
    events = list(read_events(path))
    second = events[1].start_offset
    assert [e.payload["i"] for e in read_events(path, second)] == [1, 2, 3, 4]
    assert [e.payload["i"] for e in read_events(path, second + 3)] == [2, 3, 4]


def test_get_events_since_filters(tmp_path):
    logs = tmp_path / "logs"
    path = logs / "run_t" / "events.jsonl"
    path.parent.mkdir(parents=True)
    anyio.run(write_events, path, [{"i": i} for i in range(10)])
    events = list(read_events(path))
    got = get_events_since("run_t", offset=events[3].start_offset + 2, logs_dir=logs, limit=3)
    assert [e["payload"]["i"] for e in got] == [4, 5, 6]
    assert get_events_since("run_t", types=["task.completed"], logs_dir=logs) == []
    assert len(get_events_since("run_t", since_ts=events[0].ts, logs_dir=logs)) == 10
    assert get_events_since("nope", logs_dir=logs) == []


async def test_second_writer_is_refused_while_first_is_live(tmp_path):
    path = tmp_path / "events.jsonl"
    async with EventLog(path, run_id="r"):
        with pytest.raises(RunLockedError, match="in use by another process"):
            async with EventLog(path, run_id="r"):
                pass
        assert WriterLock.is_held(path.with_name("events.jsonl.lock"))
    assert not WriterLock.is_held(path.with_name("events.jsonl.lock"))


def test_second_writer_in_another_process_is_refused(tmp_path):
    path = tmp_path / "events.jsonl"
    code = textwrap.dedent(f"""
        import anyio, sys
        from orchestrator.log.eventlog import EventLog
        async def main():
            async with EventLog({str(path)!r}, run_id="r"):
                print("locked", flush=True)
                await anyio.sleep(30)
        anyio.run(main)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        meta = WriterLock.read_meta(path.with_name("events.jsonl.lock"))
        assert meta["pid"] == proc.pid and meta["hostname"] and meta["started_at_iso"]
        with pytest.raises(RunLockedError, match=f"pid {proc.pid}"):
            anyio.run(write_events, path, [{}])
    finally:
        proc.kill()
        proc.wait()
    # the holder died: its lock is taken over
    anyio.run(write_events, path, [{"after": "takeover"}])
    assert list(read_events(path))[-1].payload == {"after": "takeover"}


def test_stale_lock_file_of_a_dead_process_is_taken_over(tmp_path):
    path = tmp_path / "events.jsonl"
    lock = path.with_name("events.jsonl.lock")
    lock.write_bytes(orjson.dumps({"pid": 999999, "hostname": "elsewhere", "started_at_iso": "2020-01-01"}))
    anyio.run(write_events, path, [{"ok": True}])
    assert len(list(read_events(path))) == 1


async def test_subscribe_follows_a_live_writer_in_another_process(tmp_path):
    path = tmp_path / "events.jsonl"
    code = textwrap.dedent(f"""
        import anyio
        from orchestrator.log.eventlog import EventLog
        async def main():
            async with EventLog({str(path)!r}, run_id="r") as log:
                for i in range(5):
                    log.append("task.scheduled", strategy_execution_id="s1", key=f"k{{i}}", payload={{"i": i}})
                    await anyio.sleep(0.2)
        anyio.run(main)
    """)
    proc = await anyio.open_process([sys.executable, "-c", code])
    seen = []
    try:
        with anyio.fail_after(20):
            async for ev in subscribe(path):
                seen.append(ev.payload["i"])
                if len(seen) == 5:
                    break
    finally:
        await proc.wait()
    assert seen == [0, 1, 2, 3, 4]


def test_iter_lines_skips_torn_tail(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n{"c":')
    assert [line for _, line in iter_lines(path)] == [b'{"a":1}\n', b'{"b":2}\n']
    assert os.path.getsize(path) == 21  # readers never modify the file


async def test_a_corrupt_line_in_the_middle_is_skipped_counted_and_logged_never_silently(tmp_path, caplog):
    from orchestrator.log.eventlog import LogReader, skipped_lines
    from orchestrator.log.state import recover

    path = tmp_path / "events.jsonl"
    await write_events(path, [{"i": i, "key": f"run_t/s1/k{i}", "instance_id": f"i{i}"} for i in range(5)])
    lines = path.read_bytes().splitlines(keepends=True)
    bad_at = sum(len(x) for x in lines[:2])
    lines[2] = b'{"not an event": \n'
    path.write_bytes(b"".join(lines) + b'{"torn tail')  # a cut-short last write is not corruption
    reader = LogReader(path)
    with caplog.at_level("WARNING", logger="orchestrator.log.eventlog"):
        assert [ev.payload["i"] for _, ev in reader.events()] == [0, 1, 3, 4]
    assert [s.offset for s in reader.skipped] == [bad_at]
    assert f"the line at byte {bad_at} is not an event" in caplog.text
    assert [s.offset for s in skipped_lines(path)] == [bad_at]
    # the fold recover() uses reads through the same reader: the other four are folded
    state = recover("run_t", path, [])
    assert sorted(state.tasks) == [f"run_t/s1/k{i}" for i in (0, 1, 3, 4)]
    # the readers of the public API skip it too, and a sound log reports nothing
    assert len(list(read_events(path))) == 4
    sound = tmp_path / "sound.jsonl"
    await write_events(sound, [{"i": 0}])
    assert skipped_lines(sound) == []


async def test_a_lost_notification_delays_an_event_a_second_at_most_and_an_idle_log_is_read_once_a_second(
    tmp_path, monkeypatch
):
    """The follower reads on the file watcher's word, and once a second without it: a
    notification the watcher never delivers (an overflowed inotify queue) holds an
    event back for a second at most, and an idle log costs a read a second, not one
    every poll interval."""
    import time

    import watchfiles

    from orchestrator.log import eventlog

    real_awatch = watchfiles.awatch

    def deaf_awatch(*args, **kwargs):
        async def timeouts_only():
            async for changes in real_awatch(*args, **kwargs):
                if not changes:  # every notification is lost; only the watcher's timeouts come through
                    yield changes

        return timeouts_only()

    monkeypatch.setattr(watchfiles, "awatch", deaf_awatch)
    reads: list[float] = []
    real_iter_lines = eventlog.iter_lines

    def counted_iter_lines(path, offset=0):
        reads.append(time.monotonic())
        return real_iter_lines(path, offset)

    monkeypatch.setattr(eventlog, "iter_lines", counted_iter_lines)
    path = tmp_path / "events.jsonl"
    await write_events(path, [{"i": 0}])
    stop = anyio.Event()
    seen: list[tuple[int, float]] = []
    arrived = [anyio.Event(), anyio.Event()]

    async def follow():
        async for ev in subscribe(path, stop=stop):
            seen.append((ev.payload["i"], time.monotonic()))
            arrived[len(seen) - 1].set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        with anyio.fail_after(10):
            await arrived[0].wait()
        idle_from = time.monotonic()
        await anyio.sleep(3)
        idle_reads = [t for t in reads if t >= idle_from]
        # the default poll interval is 0.05 s: reading on every one would be 60 reads
        assert 2 <= len(idle_reads) <= 5, len(idle_reads)
        written = time.monotonic()
        async with EventLog(path, run_id="run_t") as log:
            log.append(TASK_SCHEDULED, strategy_execution_id="s1", key="run_t/s1/late", payload={"i": 1})
        with anyio.fail_after(10):
            await arrived[1].wait()
        stop.set()
    assert [i for i, _ in seen] == [0, 1]
    assert seen[1][1] - written < 2.5, seen[1][1] - written  # a second, and room for a loaded machine
