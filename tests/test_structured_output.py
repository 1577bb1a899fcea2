"""Structured outputs (task input ``output_schema``): plugins, validation, fingerprints.

The Docker end-to-end cases (the simulated agent answering with an instance of
the schema, the repair turn, ``output_invalid``) are in
tests/test_structured_output_docker.py.
"""

from __future__ import annotations

import json

import pytest
from plugin_helpers import requests_for

from orchestrator.engine.fingerprint import TaskDefaults, fingerprint, normalize_task
from orchestrator.errors import ConfigError
from orchestrator.runner import structured
from runner_plugins.claude_code import PLUGIN as CLAUDE
from runner_plugins.codex import PLUGIN as CODEX
from runner_plugins.command import PLUGIN as COMMAND

SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "number", "minimum": 0, "maximum": 10}, "rationale": {"type": "string"}},
    "required": ["score", "rationale"],
    "additionalProperties": False,
}


request = requests_for(prompt="rate it", repo_path="/r", strategy_execution_id="s")


def test_capabilities() -> None:
    assert CLAUDE.capabilities.supports_output_schema
    assert CODEX.capabilities.supports_output_schema
    assert not COMMAND.capabilities.supports_output_schema


def test_claude_passes_json_schema_and_omits_it_without_one() -> None:
    argv = CLAUDE.build_command(request(output_schema=SCHEMA), resume_session_id=None)
    i = argv.index("--json-schema")
    assert json.loads(argv[i + 1]) == SCHEMA
    assert "--json-schema" not in CLAUDE.build_command(request(), resume_session_id=None)
    # A repair turn resumes the session and keeps the schema.
    argv = CLAUDE.build_command(request(output_schema=SCHEMA), resume_session_id="sess-1")
    assert "--json-schema" in argv and argv[argv.index("--resume") + 1] == "sess-1"


def test_codex_passes_a_schema_file_it_asks_the_runner_to_write() -> None:
    req = request(output_schema=SCHEMA, model="gpt-5-codex")
    argv = CODEX.build_command(req, resume_session_id="thread-1")
    path = argv[argv.index("--output-schema") + 1]
    assert path.startswith("/tmp/") and path.endswith(".json")
    assert argv.index("--output-schema") < argv.index("resume")  # an exec option, before the subcommand
    files = CODEX.container_files(req)
    assert json.loads(files[path]) == SCHEMA
    other = CODEX.container_files(request(output_schema={"type": "object"}, model="m"))
    assert set(other) != set(files)  # content-addressed: a reused container never mixes schemas
    plain = request(model="gpt-5-codex")
    assert "--output-schema" not in CODEX.build_command(plain, resume_session_id=None)
    assert CODEX.container_files(plain) == {}


def test_claude_parser_reads_structured_output() -> None:
    parser = CLAUDE.new_parser()
    answer = {"score": 7, "rationale": "fine"}
    line = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "num_turns": 2,
        "session_id": "s",
        "result": json.dumps(answer),
        "structured_output": answer,
        "total_cost_usd": 0.01,
        "usage": {},
    }
    parser.feed((json.dumps(line) + "\n").encode())
    outcome = parser.finish(0)
    assert outcome.structured_output == answer and not outcome.is_error
    plain = CLAUDE.new_parser()
    plain.feed((json.dumps(dict(line, structured_output=None)) + "\n").encode())
    assert plain.finish(0).structured_output is None


@pytest.mark.parametrize(
    ("structured_value", "text", "ok"),
    [
        ({"score": 3, "rationale": "x"}, "ignored", True),
        (None, '{"score": 3, "rationale": "x"}', True),
        (None, '```json\n{"score": 3, "rationale": "x"}\n```', True),
        (None, "Sure! here it is", False),
        (None, "", False),
        (None, '{"score": 30, "rationale": "x"}', False),
        ({"score": 3}, "", False),
    ],
)
def test_checked_answer(structured_value, text, ok) -> None:
    value, violation = structured.checked_answer(SCHEMA, structured_value, text)
    assert (violation is None) == ok
    if ok:
        assert value == {"score": 3, "rationale": "x"}
    else:
        assert value is None and violation


def test_violation_names_the_place_and_the_rule() -> None:
    violation = structured.violation_of(SCHEMA, {"score": 30, "rationale": "x"})
    assert violation is not None and "score" in violation and "10" in violation
    assert "rationale" in (structured.violation_of(SCHEMA, {"score": 1}) or "")
    prompt = structured.repair_prompt(violation)
    assert violation in prompt and "JSON" in prompt


def test_fingerprint_unchanged_without_schema_and_changed_with_one() -> None:
    defaults = TaskDefaults()
    task = {"prompt": "rate it"}
    plain = normalize_task(task, defaults, default_base_branch="main")
    assert "output_schema" not in plain
    with_schema = normalize_task(dict(task, output_schema=SCHEMA), defaults, default_base_branch="main")
    assert with_schema["output_schema"] == SCHEMA
    assert fingerprint(with_schema) != fingerprint(plain)
    other = normalize_task(dict(task, output_schema={"type": "object"}), defaults, default_base_branch="main")
    assert fingerprint(other) != fingerprint(with_schema)
    # null inside a schema is meaningful and survives normalisation
    const_null = {"type": "object", "properties": {"x": {"const": None}}}
    kept = normalize_task(dict(task, output_schema=const_null), defaults, default_base_branch="main")
    assert kept["output_schema"] == const_null


def test_recorded_fingerprint_of_a_plain_task_is_stable() -> None:
    # Pinned value: adding output_schema must not change fingerprints of tasks without it.
    plain = normalize_task({"prompt": "rate it"}, TaskDefaults(), default_base_branch="main")
    assert fingerprint(plain) == PLAIN_FINGERPRINT


@pytest.mark.parametrize(
    ("schema", "plugin", "needle"),
    [
        ("not a schema", None, "JSON Schema object"),
        ({"type": "no-such-type"}, None, "not a valid JSON Schema"),
        ({"type": "object"}, "command", "cannot enforce output_schema"),
    ],
)
def test_bad_output_schema_is_one_clear_config_error(schema, plugin, needle) -> None:
    task = {"prompt": "x", "output_schema": schema}
    if plugin:
        task.update(plugin=plugin, command="true")
    with pytest.raises(ConfigError, match=needle):
        normalize_task(task, TaskDefaults(), default_base_branch="main")


PLAIN_FINGERPRINT = (
    "8ee8f6e70486e900afa396828d4c1c09be365896dc9223268bfefdfae707de13"  # computed before output_schema existed
)


# ------------------------------------------------------------------ strategies: ask_twice and scoring


async def _ask(tmp_path, script):
    from engine_helpers import run_engine

    from orchestrator.engine.testing import ScriptedRunner
    from strategies import schemas
    from strategies._json import ask_twice
    from strategies._scoring import score_with_repair

    async def strategy(prompt, base_branch, ctx):
        ideas, _, _ = await ask_twice(
            ctx,
            {"prompt": "ideas please", "import_policy": "never"},
            ("ideas",),
            lambda d: d.get("ideas") if isinstance(d, dict) else None,
            schemas.ideas(2),
        )
        score = await score_with_repair(ctx, {"prompt": "score it", "import_policy": "never"}, ("score",))
        return {"ideas": ideas, "score": score}

    runner = ScriptedRunner(script)
    _, state = await run_engine(tmp_path, strategy, runner)
    return state, runner


async def test_asking_for_json_sends_the_schema_and_reads_output(tmp_path):
    from orchestrator.engine.testing import success
    from strategies import schemas

    ideas = {"ideas": [{"title": "a", "description": "x"}, {"title": "b", "description": "y"}]}

    def script(req):
        # the answer is only in output: final_message is prose
        if "/ideas/" in req.task_key:
            assert req.output_schema == schemas.ideas(2)
            return success(req, final_message="Here you go!", has_changes=False, output=ideas)
        assert req.output_schema == schemas.SCORE
        return success(req, final_message="Done.", has_changes=False, output={"score": 6, "rationale": "ok"})

    state, runner = await _ask(tmp_path, script)
    result = state.strategies["s1"].result
    assert result["ideas"] == ideas["ideas"]
    assert result["score"] == {"score": 6.0, "rationale": "ok", "attempts": 1}
    assert len(runner.calls) == 2  # no strategy-level repair: the answers were valid


async def test_asking_for_json_falls_back_to_free_text_where_the_plugin_cannot_enforce_a_schema(tmp_path, monkeypatch):
    from orchestrator.engine.context import StrategyContext
    from orchestrator.engine.testing import success

    # A run whose plugin cannot enforce schemas (as the command plugin cannot).
    monkeypatch.setattr(StrategyContext, "supports_output_schema", lambda self, plugin=None: False)

    def script(req):
        assert req.output_schema is None
        if "/ideas/" in req.task_key:
            return success(
                req,
                has_changes=False,
                final_message='Sure: ```json\n{"ideas": [{"title": "a", "description": "x"}]}\n```',
            )
        return success(req, has_changes=False, final_message='{"score": 3, "rationale": "meh"}')

    state, _ = await _ask(tmp_path, script)
    result = state.strategies["s1"].result
    assert result["ideas"] == [{"title": "a", "description": "x"}]
    assert result["score"]["score"] == 3.0


async def test_a_run_recorded_before_structured_answers_resumes_with_free_text_tasks(tmp_path):
    """Its run.json has no structured_outputs: the strategy must ask as it did then, or every key conflicts."""
    import json

    from engine_helpers import run_engine

    from orchestrator.engine.testing import ScriptedRunner, success
    from orchestrator.log.runs import RunDirs, RunManifest, read_manifest, write_manifest
    from strategies._scoring import score_with_repair

    dirs = RunDirs(logs=tmp_path / "logs", state=tmp_path / "state", results=tmp_path / "results")
    old = {
        "run_id": "run_old",
        "created_at": "2026-01-01T00:00:00.000Z",
        "prompt": "p",
        "strategy_spec": "simple",
        "strategy_name": "simple",
        "params": {},
        "runs": 1,
        "repo_path": str(tmp_path),
        "base_branch": "main",
        "model": "sonnet",
        "plugin": "claude-code",
        "docker_image": "img",
        "max_parallel": 2,
    }
    (dirs.state / "run_old").mkdir(parents=True)
    dirs.manifest("run_old").write_text(json.dumps(old))
    assert read_manifest(dirs, "run_old").structured_outputs is False
    write_manifest(dirs, RunManifest(**{**old, "run_id": "run_new"}, structured_outputs=True))
    assert read_manifest(dirs, "run_new").structured_outputs is True

    async def strategy(prompt, base_branch, ctx):
        return await score_with_repair(ctx, {"prompt": "score it", "import_policy": "never"}, ("score",))

    def script(req):
        assert req.output_schema is None
        return success(req, final_message='{"score": 5, "rationale": "fine"}', has_changes=False)

    _, state = await run_engine(tmp_path / "engine", strategy, ScriptedRunner(script), structured_outputs=False)
    assert state.strategies["s1"].result["score"] == 5.0
    assert "output_schema" not in state.tasks["run_t/s1/score/attempt-1"].input
