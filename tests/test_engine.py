"""Engine semantics with an in-process runner: durability, replay, determinism."""

from __future__ import annotations

import random

import anyio
import msgspec
import pytest
from engine_helpers import interrupt_when, make_config, run_engine, strategy_results

from orchestrator.engine import context as engine_context
from orchestrator.engine.engine import Engine
from orchestrator.engine.testing import ScriptedRunner, failure, success
from orchestrator.errors import TaskFailed
from orchestrator.log.eventlog import read_events
from orchestrator.log.state import decode_snapshot, encode_snapshot, recover, replay


async def fan_out(prompt, base_branch, ctx, n: int = 6):
    handles = [ctx.run({"prompt": f"{prompt} #{i}"}, key=ctx.key("gen", i)) for i in range(n)]
    ok, failed = await ctx.wait_all(handles, tolerate_failures=True)
    best = max(ok, key=lambda r: (len(r["final_message"]), r["key"]))
    return {
        "order": [r["key"].rsplit("/", 1)[1] for r in ok],
        "failed": [f.key for f in failed],
        "best": best["key"],
        "messages": [r["final_message"] for r in ok],
    }


def by_prompt(req):
    i = int(req.prompt.rsplit("#", 1)[1])
    if i == 3:
        return failure(req, error_type="api", message="rate limited for good")
    return success(req, final_message="x" * (i % 4 + 1))


async def test_wait_all_keeps_handle_order_whatever_the_completion_order(tmp_path):
    results = set()
    for seed in range(25):
        rng = random.Random(seed)
        delays = {}

        def delay(req, delays=delays, rng=rng):  # bound to this seed's table and generator
            return delays.setdefault(req.task_key, rng.random() / 200)

        _, state = await run_engine(tmp_path / str(seed), fan_out, ScriptedRunner(by_prompt, delay=delay))
        results.add(msgspec.json.encode(strategy_results(state)))
    assert len(results) == 1
    (only,) = results
    decoded = msgspec.json.decode(only)
    assert decoded["s1"][1]["order"] == ["0", "1", "2", "4", "5"]
    assert decoded["s1"][1]["failed"] == ["run_t/s1/gen/3"]


async def test_resuming_a_finished_run_never_calls_the_runner(tmp_path):
    first = ScriptedRunner(by_prompt)
    _, state1 = await run_engine(tmp_path, fan_out, first)
    assert len(first.calls) == 6
    again = ScriptedRunner(by_prompt)
    engine, state2 = await run_engine(tmp_path, fan_out, again)
    assert again.calls == []
    assert strategy_results(state1) == strategy_results(state2)
    assert engine.resumed


async def test_completed_keys_replay_results_inside_a_reentered_strategy(tmp_path):
    """A strategy re-entered from the top gets recorded results for finished keys."""
    seen = []

    async def two_stage(prompt, base_branch, ctx):
        a = await ctx.wait(ctx.run({"prompt": "stage a"}, key=ctx.key("a")))
        seen.append(a)
        b = await ctx.wait(ctx.run({"prompt": "stage b"}, key=ctx.key("b")))
        return [a["final_message"], b["final_message"]]

    gate = anyio.Event()

    async def script(req):
        if req.prompt == "stage b":
            await gate.wait()
        return success(req, final_message=req.prompt.upper())

    runner = ScriptedRunner(script)
    engine = Engine(make_config(tmp_path), runner)
    await interrupt_when(lambda: engine.run(two_stage, prompt="do it", params={}), lambda: len(runner.calls) == 2)
    assert [c.prompt for c in runner.calls] == ["stage a", "stage b"]
    assert engine.state.tasks["run_t/s1/b"].state == "INTERRUPTED"
    gate.set()
    runner2 = ScriptedRunner(lambda req: success(req, final_message=req.prompt.upper()))
    _, state = await run_engine(tmp_path, two_stage, runner2)
    assert [c.prompt for c in runner2.calls] == ["stage b"]
    assert state.strategies["s1"].result == ["STAGE A", "STAGE B"]
    assert seen[0] == seen[1]  # the live result and the replayed one are identical


async def test_interrupted_task_resumes_its_persisted_session(tmp_path):
    async def one(prompt, base_branch, ctx):
        return (await ctx.wait(ctx.run({"prompt": prompt}, key=ctx.key("only"))))["session_id"]

    async def hang(req):
        await anyio.sleep_forever()

    engine = Engine(make_config(tmp_path), ScriptedRunner(hang))
    await interrupt_when(lambda: engine.run(one, prompt="do it", params={}), lambda: bool(engine.runner.calls))
    interrupted = [e for e in read_events(engine.paths.events) if e.type == "task.interrupted"]
    assert len(interrupted) == 1 and interrupted[0].payload["session_id"].startswith("sess-")
    runner = ScriptedRunner()
    await run_engine(tmp_path, one, runner)
    assert runner.calls[0].session_id == interrupted[0].payload["session_id"]
    # --resume-fresh ignores the session
    fresh_dir = tmp_path / "fresh"
    engine = Engine(make_config(fresh_dir), ScriptedRunner(hang))
    await interrupt_when(lambda: engine.run(one, prompt="do it", params={}), lambda: bool(engine.runner.calls))
    runner = ScriptedRunner()
    await run_engine(fresh_dir, one, runner, resume_fresh=True)
    assert runner.calls[0].session_id is None


async def test_failed_task_replays_as_the_same_exception(tmp_path):
    caught = []

    async def strat(prompt, base_branch, ctx):
        try:
            await ctx.wait(ctx.run({"prompt": "will fail"}, key=ctx.key("f")))
        except ctx.errors.TaskFailed as exc:
            caught.append((type(exc), exc.key, exc.error_type, exc.message))
        return "handled"

    await run_engine(tmp_path, strat, ScriptedRunner(lambda r: failure(r, error_type="timeout", message="too slow")))
    # Resume: the strategy is finished, so force re-entry by deleting its completion from state
    engine = Engine(
        make_config(tmp_path / "b"), ScriptedRunner(lambda r: failure(r, error_type="timeout", message="too slow"))
    )
    await engine.run(strat, prompt="p", params={})
    state = engine.state
    state.strategies["s1"].status = "running"
    replayed = ScriptedRunner()
    engine2 = Engine(make_config(tmp_path / "b"), replayed)
    engine2.recover_state = lambda: setattr(engine2, "state", state)  # re-enter with the task recorded as failed
    await engine2.run(strat, prompt="p", params={})
    assert replayed.calls == []
    assert caught[0] == caught[1] == caught[2] == (TaskFailed, "run_t/s1/f", "timeout", "too slow")


async def test_same_key_with_different_input_is_a_conflict_before_anything_runs(tmp_path):
    async def conflicted(prompt, base_branch, ctx):
        ctx.run({"prompt": "one"}, key=ctx.key("k"))
        try:
            ctx.run({"prompt": "two"}, key=ctx.key("k"))
        except ctx.errors.KeyConflictDifferentFingerprint as exc:
            return str(exc)
        return "no conflict"

    runner = ScriptedRunner()
    _, state = await run_engine(tmp_path, conflicted, runner)
    msg = state.strategies["s1"].result
    assert "run_t/s1/k" in msg and msg.count("fingerprint") == 1

    # across a resume: the recorded fingerprint wins
    async def changed(prompt, base_branch, ctx):
        return await ctx.wait(ctx.run({"prompt": "three"}, key=ctx.key("k")))

    state.strategies["s1"].status = "running"
    engine = Engine(make_config(tmp_path), ScriptedRunner())
    engine.recover_state = lambda: setattr(engine, "state", state)
    await engine.run(changed, prompt="p", params={})
    assert engine.state.strategies["s1"].status == "failed"
    assert "KeyConflictDifferentFingerprint" in engine.state.strategies["s1"].error


def test_fingerprint_ignores_metadata_nulls_and_explicit_defaults():
    from orchestrator.engine.fingerprint import TaskDefaults, fingerprint, normalize_task

    d = TaskDefaults()
    base = normalize_task({"prompt": "p"}, d, default_base_branch="main")
    same = normalize_task(
        {
            "prompt": "p",
            "model": "sonnet",
            "import_policy": "auto",
            "metadata": {"x": 1},
            "session_group_key": None,
            "base_branch": "main",
        },
        d,
        default_base_branch="main",
    )
    assert fingerprint(base) == fingerprint(same)
    assert base["schema_version"] == "1" and "metadata" not in base
    assert fingerprint(base) != fingerprint(
        normalize_task({"prompt": "p", "model": "opus"}, d, default_base_branch="main")
    )
    with pytest.raises(Exception, match="unknown task field"):
        normalize_task({"prompt": "p", "promt": "typo"}, d, default_base_branch="main")


async def test_now_rand_and_sleep_are_recorded_and_replayed(tmp_path, monkeypatch):
    async def clocky(prompt, base_branch, ctx):
        t0 = ctx.now()
        r = ctx.rand()
        await ctx.sleep(0.3)
        r2 = ctx.rand()
        await ctx.wait(ctx.run({"prompt": f"r={r:.6f}"}, key=ctx.key("t")))
        return [t0, r, r2]

    gate = anyio.Event()

    async def blocked(req):
        await gate.wait()
        return success(req)

    engine = Engine(make_config(tmp_path), ScriptedRunner(blocked))
    with anyio.move_on_after(1.0):
        await engine.run(clocky, prompt="do it", params={})
    recorded = list(engine.state.strategies["s1"].checkpoints)
    assert [k for k, _ in recorded] == ["now", "rand", "sleep", "rand"]
    slept: list[float] = []

    class SleepSpy:  # the context's anyio, its sleeps noted (not a wall-clock bound: a loaded machine is slow)
        def __getattr__(self, name):
            return getattr(anyio, name)

        async def sleep(self, delay):
            slept.append(delay)
            await anyio.sleep(delay)

    monkeypatch.setattr(engine_context, "anyio", SleepSpy())
    _, state = await run_engine(tmp_path, clocky, ScriptedRunner())
    assert slept == []  # the sleep's recorded deadline had already passed: nothing left to sleep
    assert state.strategies["s1"].result == [recorded[0][1], recorded[1][1], recorded[3][1]]


async def test_max_parallel_pool_bounds_concurrency_and_is_fifo(tmp_path):
    running = 0
    peak = 0
    order = []

    async def script(req):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        order.append(req.prompt)
        await anyio.sleep(0.01)
        running -= 1
        return success(req)

    await run_engine(tmp_path, fan_out, ScriptedRunner(script), params={"n": 12}, max_parallel=3)
    assert peak == 3
    assert order == [f"do it #{i}" for i in range(12)]


async def test_snapshot_equals_full_replay_and_corrupt_snapshot_falls_back(tmp_path):
    engine, _state = await run_engine(tmp_path, fan_out, ScriptedRunner(by_prompt), runs=3)
    full = replay(engine.paths.events, run_id="run_t")
    assert encode_snapshot(full) == engine.paths.state_primary.read_bytes()
    assert encode_snapshot(full) == engine.paths.state_duplicate.read_bytes()
    assert full.counters.completed == 15 and full.counters.failed == 3
    # re-applying the log over the snapshot never double counts
    again = replay(engine.paths.events, decode_snapshot(engine.paths.state_primary.read_bytes()))
    assert again.counters == full.counters
    mid = list(read_events(engine.paths.events))[10]
    partial = replay(engine.paths.events, run_id="run_t")
    partial.last_event_start_offset = -1
    assert replay(engine.paths.events, partial).counters == full.counters  # guarded transitions
    # an edited task record that passes the load-time check: the checksum sends it to the log
    data = engine.paths.state_primary.read_bytes()
    lines = data.split(b"\n")
    middle = len(lines) // 2
    lines[middle] = lines[middle].replace(b'"state":"COMPLETED"', b'"state":"COMPLETEX"', 1)
    lines[middle] = lines[middle].replace(b'"state":"FAILED"', b'"state":"FAILEX"', 1)
    assert b"\n".join(lines) != data and len(b"\n".join(lines)) == len(data)
    engine.paths.state_primary.write_bytes(b"\n".join(lines))
    edited = recover("run_t", engine.paths.events, engine.paths.snapshots)
    assert edited.tasks.lazy
    assert encode_snapshot(edited) == encode_snapshot(full) and edited == full
    edited = recover("run_t", engine.paths.events, engine.paths.snapshots)
    assert list(edited.tasks.items()) == list(full.tasks.items())
    # primary corrupt -> duplicate; both corrupt -> full replay
    engine.paths.state_primary.write_bytes(b"{not json")
    assert encode_snapshot(recover("run_t", engine.paths.events, engine.paths.snapshots)) == encode_snapshot(full)
    engine.paths.state_duplicate.write_bytes(b"")
    assert encode_snapshot(recover("run_t", engine.paths.events, engine.paths.snapshots)) == encode_snapshot(full)
    assert mid.start_offset > 0


async def test_runs_n_gives_independent_strategy_executions(tmp_path):
    runner = ScriptedRunner(by_prompt)
    _, state = await run_engine(tmp_path, fan_out, runner, runs=3)
    assert sorted(state.strategies) == ["s1", "s2", "s3"]
    assert len(runner.calls) == 18
    assert {c.container_name.split("_")[-2] for c in runner.calls} == {"s1", "s2", "s3"}
    assert len({c.branch_name for c in runner.calls}) == 18


async def test_derived_names_are_stable(tmp_path):
    runner = ScriptedRunner()
    await run_engine(tmp_path, fan_out, runner, params={"n": 1})
    req = runner.calls[0]
    from orchestrator.naming import instance_id, short8

    assert req.branch_name == f"simple_run_t_k{short8('run_t/s1/gen/0')}"
    assert req.container_name == f"orchestrator_run_t_s1_k{short8('run_t/s1/gen/0')}"
    assert req.instance_id == instance_id("run_t", "s1", "run_t/s1/gen/0") and len(req.instance_id) == 16


async def test_long_final_message_is_truncated_with_full_text_on_disk(tmp_path):
    big = "ü" * 40000  # 80,000 bytes

    async def strat(prompt, base_branch, ctx):
        return len((await ctx.wait(ctx.run({"prompt": "p"}, key=ctx.key("big"))))["final_message"])

    engine, state = await run_engine(tmp_path, strat, ScriptedRunner(lambda r: success(r, final_message=big)))
    ev = next(e for e in read_events(engine.paths.events) if e.type == "task.completed")
    assert ev.payload["final_message_truncated"] is True
    assert len(ev.payload["final_message"].encode()) <= 65536
    assert await anyio.Path(ev.payload["final_message_path"]).read_text(encoding="utf-8") == big
    assert state.strategies["s1"].result == 40000


async def test_changed_strategy_reports_recorded_keys_it_no_longer_asks_for(tmp_path):
    await run_engine(tmp_path, fan_out, ScriptedRunner(by_prompt), params={"n": 3})
    engine = Engine(make_config(tmp_path), ScriptedRunner())
    engine.recover_state = lambda: (
        setattr(engine, "state", recover("run_t", engine.paths.events, [])),
        setattr(engine, "resumed", True),
        setattr(engine.state.strategies["s1"], "status", "running"),
    )
    await engine.run(fan_out, prompt="do it", params={"n": 1})
    assert engine.state.strategies["s1"].status == "success"
    completed = [e for e in read_events(engine.paths.events) if e.type == "strategy.completed"][-1]
    assert completed.payload["unvisited_keys"] == ["run_t/s1/gen/1", "run_t/s1/gen/2"]


async def test_retry_policy_redispatches_only_the_listed_failure_categories(tmp_path):
    attempts = {}

    def flaky(req):
        attempts[req.prompt] = attempts.get(req.prompt, 0) + 1
        if req.prompt == "docker-blip" and attempts[req.prompt] < 3:
            return failure(req, error_type="container", message="Cannot connect to the Docker daemon")
        if req.prompt == "bad-git":
            return failure(req, error_type="git", message="ref lock")
        return success(req)

    async def strat(prompt, base_branch, ctx):
        policy = {"max_attempts": 3, "backoff": {"base_s": 0.01, "factor": 1}, "retry_on": ["docker"]}
        ok, failed = await ctx.wait_all(
            [
                ctx.run({"prompt": "docker-blip"}, key=ctx.key("a"), policy=policy),
                ctx.run({"prompt": "bad-git"}, key=ctx.key("b"), policy=policy),
            ],
            tolerate_failures=True,
        )
        return [len(ok), [f.error_type for f in failed]]

    engine, state = await run_engine(tmp_path, strat, ScriptedRunner(flaky))
    assert state.strategies["s1"].result == [1, ["git"]]
    assert attempts == {"docker-blip": 3, "bad-git": 1}
    started = [e for e in read_events(engine.paths.events) if e.type == "task.started" and e.key.endswith("/a")]
    assert len(started) == 3 and state.tasks["run_t/s1/a"].attempts == 3


async def test_a_task_the_strategy_never_waits_for_is_interrupted_when_the_run_ends(tmp_path):
    async def fire_and_forget(prompt, base_branch, ctx):
        ctx.run({"prompt": "slow"}, key=ctx.key("forgotten"))
        return await ctx.wait(ctx.run({"prompt": "fast"}, key=ctx.key("awaited")))

    runner = ScriptedRunner(lambda req: success(req), delay=lambda req: 30 if req.prompt == "slow" else 0.05)
    with anyio.fail_after(10):  # the run does not wait 30 s for the forgotten task
        _engine, state = await run_engine(tmp_path, fire_and_forget, runner)
    assert state.strategies["s1"].status == "success"
    assert state.tasks["run_t/s1/awaited"].state == "COMPLETED"
    assert state.tasks["run_t/s1/forgotten"].state == "INTERRUPTED"
    # resuming runs nothing: the strategy is finished, so the forgotten task stays interrupted
    again = Engine(make_config(tmp_path), runner)
    calls = len(runner.calls)
    await again.run(fire_and_forget, prompt="do it", params={})
    assert again.runner_calls == 0 and len(runner.calls) == calls


async def test_a_snapshot_pointing_past_the_log_is_not_trusted(tmp_path):
    engine, _ = await run_engine(tmp_path, fan_out, ScriptedRunner(by_prompt))
    data = engine.paths.events.read_bytes()
    cut = data.index(b"\n", len(data) // 2) + 1  # a log that lost its tail (restored from a backup, say)
    engine.paths.events.write_bytes(data[:cut])
    recovered = recover("run_t", engine.paths.events, engine.paths.snapshots)
    shorter = replay(engine.paths.events, run_id="run_t")
    assert recovered.last_event_start_offset < cut
    assert encode_snapshot(recovered) == encode_snapshot(shorter)


def test_every_context_reads_parallel_items_the_same_way():
    """The engine's ctx, a replay's and a strategy's budget wrapper share one reading of ctx.parallel's items."""
    from orchestrator.strategy import parallel_items

    item = {"key": "b", "prompt": "two"}
    assert parallel_items([({"prompt": "one"}, "a"), item]) == [({"prompt": "one"}, "a"), ({"prompt": "two"}, "b")]
    assert item == {"key": "b", "prompt": "two"}  # the strategy's own dict is left as it was
