"""Engine side of issue 15: durable sessions, kept workspaces, error categories (in-process runners)."""

from __future__ import annotations

import anyio
from engine_helpers import interrupt_when, make_config, run_engine

from orchestrator.engine.engine import Engine
from orchestrator.engine.testing import ScriptedRunner, success
from orchestrator.log.eventlog import read_events
from orchestrator.runner.types import RunnerResult


async def one(prompt, base_branch, ctx, **_):
    return await ctx.wait(ctx.run({"prompt": prompt}, key=ctx.key("only")))


class InitThenHang:
    """Reports its session the way the Docker runner does (the agent's init line), then works forever."""

    def __init__(self) -> None:
        self.calls = []

    async def run(self, request, *, on_event=None):
        self.calls.append(request)
        on_event({"type": "runner.init", "data": {"session_id": "sess-live", "model": "m"}})
        await anyio.sleep_forever()

    async def aclose(self):
        pass


async def run_until_logged(engine: Engine, event_type: str = "task.session") -> None:
    """Run until an event of ``event_type`` is in the log, then interrupt."""

    def logged() -> bool:
        return engine.paths.events.exists() and f'"{event_type}"'.encode() in engine.paths.events.read_bytes()

    await interrupt_when(lambda: engine.run(one, prompt="do it", params={}), logged)


async def test_the_session_is_in_the_log_while_the_task_runs_and_a_crash_resume_continues_it(tmp_path):
    engine = Engine(make_config(tmp_path), InitThenHang())
    await run_until_logged(engine)
    events = list(read_events(engine.paths.events))
    types = [e.type for e in events]
    assert types.index("task.session") < types.index("task.interrupted")
    assert events[types.index("task.session")].payload["session_id"] == "sess-live"
    # a crash: the log ends while the task runs (no task.interrupted, no snapshot)
    cut = next(e.start_offset for e in events if e.type == "task.interrupted")
    async with await anyio.open_file(engine.paths.events, "r+b") as fh:
        await fh.truncate(cut)
    for snap in engine.paths.snapshots:
        snap.unlink(missing_ok=True)
    runner = ScriptedRunner()
    await run_engine(tmp_path, one, runner)
    (request,) = runner.calls
    assert (request.session_id, request.resume_workspace) == ("sess-live", True)
    # --resume-fresh: neither the session nor the workspace
    fresh = tmp_path / "fresh"
    engine = Engine(make_config(fresh), InitThenHang())
    await run_until_logged(engine)
    runner = ScriptedRunner()
    await run_engine(fresh, one, runner, resume_fresh=True)
    assert (runner.calls[0].session_id, runner.calls[0].resume_workspace) == (None, False)


async def test_a_task_never_started_gets_a_fresh_workspace(tmp_path):
    runner = ScriptedRunner()
    await run_engine(tmp_path, one, runner)
    assert runner.calls[0].resume_workspace is False


async def test_a_runner_bug_is_internal_and_never_retried_by_a_policy(tmp_path):
    calls = []

    def broken(req):
        calls.append(req)
        raise KeyError("a bug in the runner")

    async def with_policy(prompt, base_branch, ctx):
        policy = {
            "max_attempts": 3,
            "backoff": {"base_s": 0.01, "factor": 1, "max_s": 0.01},
            "retry_on": ["container", "internal"],
        }
        try:
            await ctx.wait(ctx.run({"prompt": prompt}, key=ctx.key("t"), policy=policy))
        except ctx.errors.TaskFailed as exc:
            return exc.error_type

    _, state = await run_engine(tmp_path, with_policy, ScriptedRunner(broken))
    assert state.strategies["s1"].result == "internal"
    assert len(calls) == 1


async def test_a_container_failure_is_still_retried_by_a_policy(tmp_path):
    def flaky(req):
        return RunnerResult(status="failed", instance_id=req.instance_id, error_type="container", error="boom")

    async def with_policy(prompt, base_branch, ctx):
        policy = {"max_attempts": 3, "backoff": {"base_s": 0.01, "factor": 1, "max_s": 0.01}, "retry_on": ["container"]}
        try:
            await ctx.wait(ctx.run({"prompt": prompt}, key=ctx.key("t"), policy=policy))
        except ctx.errors.TaskFailed as exc:
            return exc.error_type

    runner = ScriptedRunner(flaky)
    _, state = await run_engine(tmp_path, with_policy, runner)
    assert state.strategies["s1"].result == "container" and len(runner.calls) == 3


async def test_an_unknown_task_model_fails_the_strategy_at_scheduling_without_a_runner_call(tmp_path):
    async def typo(prompt, base_branch, ctx):
        return await ctx.wait(ctx.run({"prompt": prompt, "model": "sonet"}, key=ctx.key("t")))

    runner = ScriptedRunner(lambda req: success(req))
    engine, state = await run_engine(tmp_path, typo, runner)
    assert runner.calls == []
    assert (
        "unknown model 'sonet' for plugin claude-code; use one of: haiku, opus, sonnet" in state.strategies["s1"].error
    )
    assert not [e for e in read_events(engine.paths.events) if e.type.startswith("task.")]


async def test_a_task_that_started_without_reporting_a_session_keeps_its_workspace_with_a_fresh_session(tmp_path):
    class Silent:  # the agent was started but never printed its init line
        async def run(self, request, *, on_event=None):
            await anyio.sleep_forever()

        async def aclose(self):
            pass

    engine = Engine(make_config(tmp_path), Silent())
    await run_until_logged(engine, "task.started")
    assert [
        e.payload.get("session_id")
        for e in read_events(engine.paths.events)
        if e.type in ("task.session", "task.interrupted")
    ] == [None]
    runner = ScriptedRunner()
    await run_engine(tmp_path, one, runner)
    assert (runner.calls[0].session_id, runner.calls[0].resume_workspace) == (None, True)


async def test_a_command_task_never_continues_a_workspace(tmp_path):
    async def cmd(prompt, base_branch, ctx):
        return await ctx.wait(ctx.run({"plugin": "command", "command": "true"}, key=ctx.key("c")))

    async def hang(req):
        await anyio.sleep_forever()

    engine = Engine(make_config(tmp_path), ScriptedRunner(hang))
    await interrupt_when(lambda: engine.run(cmd, prompt="do it", params={}), lambda: bool(engine.runner.calls))
    runner = ScriptedRunner()
    await run_engine(tmp_path, cmd, runner)
    assert runner.calls[0].resume_workspace is False
