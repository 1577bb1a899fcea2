"""The example strategies under examples/strategies/, loaded exactly as ``--strategy path`` loads them."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter

import anyio
import pytest
from conftest import REPO_ROOT, git
from docker_harness import run_with_docker
from engine_helpers import make_config, run_engine

from orchestrator.engine.engine import Engine
from orchestrator.engine.fingerprint import TaskDefaults
from orchestrator.engine.testing import ScriptedRunner, failure, success
from orchestrator.log.eventlog import read_events
from orchestrator.runner.docker_containers import list_containers, remove_containers, remove_run_volumes
from orchestrator.strategy_loader import load_strategy, parse_params

EXAMPLES = REPO_ROOT / "examples" / "strategies"
DOC = REPO_ROOT / "docs" / "strategies.md"


def example(name):
    return load_strategy(str(EXAMPLES / name))


def test_every_example_loads_through_the_cli_loader():
    names = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert names == ["parallel_then_judge.py", "plan_then_fan_out.py", "retry_until_tests_pass.py", "seeded_fan_out.py"]
    for name in names:
        loaded = example(name)
        assert loaded.name == name.removesuffix(".py")
        assert parse_params(loaded, [])  # every parameter has a default


def test_the_tutorial_shows_the_example_file_verbatim():
    doc = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert (EXAMPLES / "parallel_then_judge.py").read_text() in blocks


# ------------------------------------------------------------------ parallel-then-judge


def judge_script(verdict):
    def script(req):
        step = req.task_key.split("/")[2]
        if step == "draft":
            i = int(req.task_key.rsplit("/", 1)[1])
            return failure(req, message="draft crashed") if i == 1 else success(req, final_message=f"draft {i}")
        assert req.import_policy == "never" and "Draft 1 (" in req.prompt  # successful drafts are renumbered
        return success(req, final_message=verdict, has_changes=False)

    return script


async def test_parallel_then_judge_returns_the_judged_draft(tmp_path):
    fn = example("parallel_then_judge.py").fn
    _, state = await run_engine(
        tmp_path / "a", fn, ScriptedRunner(judge_script('{"winner": 1, "reason": "r"}')), params={"drafts": 3}
    )
    assert state.strategies["s1"].result["final_message"] == "draft 2"  # ok = [draft 0, draft 2]
    for verdict in ('{"winner": 5}', "I like the second one", '{"winner": true}'):
        _, state = await run_engine(
            tmp_path / str(uuid.uuid4()), fn, ScriptedRunner(judge_script(verdict)), params={"drafts": 3}
        )
        assert state.strategies["s1"].result["final_message"] == "draft 0"  # unusable verdict: first draft


async def test_parallel_then_judge_resumes_without_redoing_drafts(tmp_path):
    fn = example("parallel_then_judge.py").fn
    reached = anyio.Event()

    async def hang_judge(req):
        if req.task_key.endswith("/judge"):
            reached.set()
            await anyio.sleep_forever()
        return success(req, final_message="d")

    engine = Engine(make_config(tmp_path), ScriptedRunner(hang_judge))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: engine.run(fn, prompt="do it", params={"drafts": 2}))
        with anyio.fail_after(5):
            await reached.wait()
        tg.cancel_scope.cancel()
    runner = ScriptedRunner(lambda req: success(req, final_message='{"winner": 1}'))
    _, state = await run_engine(tmp_path, fn, runner, params={"drafts": 2})
    assert [c.task_key for c in runner.calls] == ["run_t/s1/judge"]
    assert state.strategies["s1"].result["key"] == "run_t/s1/draft/1"


# ------------------------------------------------------------------ retry-until-tests-pass


def check_script(passing_attempt):
    def script(req):
        step, n = req.task_key.split("/")[2:]
        if step == "test":
            assert req.plugin_name == "command" and req.import_policy == "never"
            if int(n) < passing_attempt:
                return failure(req, error_type="command", message=f"exit status 1: 2 failed (run {n})")
            return success(req, final_message="all passed", has_changes=False)
        return success(req, final_message=f"attempt {n}", session_id="sess-1")

    return script


async def test_retry_until_tests_pass_feeds_failures_back_in_one_session(tmp_path):
    fn = example("retry_until_tests_pass.py").fn
    runner = ScriptedRunner(check_script(passing_attempt=2))
    _, state = await run_engine(tmp_path, fn, runner, params={"test_command": "make test"})
    assert [c.task_key.split("/", 2)[2] for c in runner.calls] == ["attempt/1", "test/1", "attempt/2", "test/2"]
    fix = runner.calls[2]
    assert "2 failed (run 1)" in fix.prompt and fix.session_id == "sess-1"
    assert fix.base_branch == runner.calls[0].branch_name and runner.calls[3].base_branch == fix.branch_name
    assert runner.calls[1].command == "make test"
    assert state.strategies["s1"].result["key"] == "run_t/s1/attempt/2"


async def test_retry_until_tests_pass_gives_up_after_max_attempts(tmp_path):
    fn = example("retry_until_tests_pass.py").fn
    runner = ScriptedRunner(check_script(passing_attempt=99))
    _, state = await run_engine(tmp_path, fn, runner, params={"max_attempts": 2})
    s1 = state.strategies["s1"]
    assert s1.status == "failed" and "tests still fail after 2 attempts" in s1.error
    assert len(runner.calls) == 4


# ------------------------------------------------------------------ seeded-fan-out


async def test_seeded_fan_out_draws_with_ctx_rand_and_replays_the_same_draw(tmp_path):
    fn = example("seeded_fan_out.py").fn
    reached = anyio.Event()

    async def slow_second(req):
        if len(calls) >= 1 and req.task_key not in calls:
            calls.append(req.task_key)
            reached.set()
            await anyio.sleep_forever()
        calls.append(req.task_key)
        return success(req)

    calls: list[str] = []
    engine = Engine(make_config(tmp_path, max_parallel=1), ScriptedRunner(slow_second))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: engine.run(fn, prompt="do it", params={"k": 3}))
        with anyio.fail_after(5):
            await reached.wait()
        tg.cancel_scope.cancel()
    first_done = {e.key for e in read_events(engine.paths.events) if e.type == "task.completed"}
    assert len(first_done) == 1
    runner = ScriptedRunner()
    engine2, state = await run_engine(tmp_path, fn, runner, params={"k": 3})
    result = state.strategies["s1"].result
    assert len(result["picked"]) == len(set(result["picked"])) == 3
    assert {f"run_t/s1/approach/{a}" for a in result["picked"]} == set(state.tasks)
    assert not {c.task_key for c in runner.calls} & first_done  # the same draw: nothing finished runs again
    checkpoints = [e for e in read_events(engine2.paths.events) if e.type == "strategy.checkpoint"]
    assert [e.payload["kind"] for e in checkpoints] == ["rand", "rand", "rand"]
    assert Counter(e.key for e in read_events(engine2.paths.events) if e.type == "task.completed") == Counter(
        {k: 1 for k in state.tasks}
    )


# ------------------------------------------------------------------ plan-then-fan-out (output_schema)


async def test_plan_then_fan_out_reads_the_validated_output(tmp_path):
    import jsonschema

    fn = example("plan_then_fan_out.py").fn
    plan = {
        "steps": [
            {"title": "parse", "instructions": "validate flags"},
            {"title": "report", "instructions": "print errors"},
        ]
    }

    def script(req):
        if req.task_key.endswith("/plan"):
            assert req.import_policy == "never" and req.output_schema["properties"]["steps"]["maxItems"] == 2
            jsonschema.validate(plan, req.output_schema)
            return success(req, final_message="{}", has_changes=False, output=plan)
        assert req.output_schema is None
        return success(req)

    engine, state = await run_engine(tmp_path, fn, ScriptedRunner(script), params={"max_steps": 2})
    result = state.strategies["s1"].result
    assert [s["title"] for s in result["steps"]] == ["parse", "report"] and result["failed"] == []
    assert all(s["branch"] for s in result["steps"])
    # the output is recorded in the log: a replay hands the strategy the same object
    (done,) = [e for e in read_events(engine.paths.events) if e.type == "task.completed" and e.key.endswith("/plan")]
    assert done.payload["output"] == plan
    assert "output_schema" in state.tasks["run_t/s1/plan"].input


async def test_plan_then_fan_out_refuses_the_command_plugin(tmp_path):
    fn = example("plan_then_fan_out.py").fn
    engine = Engine(make_config(tmp_path, defaults=TaskDefaults(plugin_name="command")), ScriptedRunner())
    await engine.run(fn, prompt="x", params={})
    s1 = engine.state.strategies["s1"]
    assert s1.status == "failed" and "needs an agent plugin" in s1.error


# ------------------------------------------------------------------ through Docker


@pytest.fixture
async def rid():
    run_id = f"run_{uuid.uuid4().hex[:10]}"
    yield run_id
    await remove_containers([c["name"] for c in await list_containers(run_id)])
    await remove_run_volumes(run_id)


@pytest.mark.docker
async def test_tutorial_example_through_docker(tmp_path, git_repo, workspace_root, rid):
    # Dry-run agents: drafts commit a file; the judge answers a sentence, not {"winner": ...}.
    prompt = "add a file"
    fn = example("parallel_then_judge.py").fn
    engine = await run_with_docker(tmp_path, git_repo, fn, run_id=rid, prompt=prompt, params={"drafts": 2})
    s1 = engine.state.strategies["s1"]
    assert s1.status == "success", s1.error
    # the sim agent's judge answer is not {"winner": ...}: the documented fallback keeps draft 0
    assert s1.result["key"] == f"{rid}/s1/draft/0" and s1.result["artifact"]["has_changes"]
    assert git(git_repo, "rev-parse", "--verify", s1.result["artifact"]["branch_final"])
    judge = [e for e in read_events(engine.paths.events) if e.type == "task.completed" and e.key.endswith("/judge")]
    assert judge[0].payload["artifact"]["branch_final"] is None


@pytest.mark.docker
async def test_retry_until_tests_pass_through_docker(tmp_path, git_repo, workspace_root, rid):
    # The check fails until ok.txt exists and prints SIM lines that the fix prompt carries to the agent.
    check = 'test -f ok.txt || { echo; echo "SIM: write ok.txt fixed"; echo "SIM: commit fix tests"; exit 1; }'
    fn = example("retry_until_tests_pass.py").fn
    engine = await run_with_docker(
        tmp_path,
        git_repo,
        fn,
        run_id=rid,
        prompt="make the tests pass",
        params={"test_command": check, "max_attempts": 3},
    )
    s1 = engine.state.strategies["s1"]
    assert s1.status == "success", s1.error
    assert s1.result["key"] == f"{rid}/s1/attempt/2"
    assert git(git_repo, "show", f"{s1.result['artifact']['branch_final']}:ok.txt") == "fixed"
    events = list(read_events(engine.paths.events))
    failed = [e.key.split("/s1/")[1] for e in events if e.type == "task.failed"]
    assert failed == ["test/1"]
    sessions = {e.key.split("/s1/")[1]: e.payload["session_id"] for e in events if e.type == "task.completed"}
    assert sessions["attempt/1"] == sessions["attempt/2"]  # the fix resumed the agent's session
    assert json.dumps(s1.result)  # recorded as JSON in strategy.completed


@pytest.mark.docker
async def test_plan_then_fan_out_through_docker(tmp_path, git_repo, workspace_root, rid):
    # The sim agent answers the planner's schema with an instance of it: 3 distinct steps.
    fn = example("plan_then_fan_out.py").fn
    engine = await run_with_docker(
        tmp_path, git_repo, fn, run_id=rid, prompt="add input validation", params={"max_steps": 3}
    )
    s1 = engine.state.strategies["s1"]
    assert s1.status == "success", s1.error
    steps = s1.result["steps"]
    assert len(steps) == 3 and len({s["title"] for s in steps}) == 3 and s1.result["failed"] == []
    for s in steps:
        assert git(git_repo, "rev-parse", "--verify", s["branch"])
