"""``output_schema`` end to end through the DockerRunner, the real plugins and the simulated agent.

The sim agent answers a schema with an instance of it (claude: ``--json-schema``
and ``structured_output``; codex: ``--output-schema FILE``, which the runner
writes into the container). ``SIM: print`` lines override the answer, and
``SIM: bad-output`` keeps answering in prose in every resume of the session.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from conftest import TEST_IMAGE, make_repo, runner_log

from orchestrator.runner import AuthConfig, DockerRunner, RetryConfig, run_instance
from orchestrator.sanitize import Sanitizer

pytestmark = pytest.mark.docker

SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "number", "minimum": 0, "maximum": 10}, "rationale": {"type": "string"}},
    "required": ["score", "rationale"],
    "additionalProperties": False,
}


@pytest.fixture
async def runner(tmp_path: Path):
    r = DockerRunner(
        auth=AuthConfig(api_key="sk-ant-test-0000", openai_api_key="sk-test-0000"),
        logs_dir=tmp_path / "logs",
        sanitizer=Sanitizer(),
    )
    yield r
    await r.aclose()


def fields(run_id: str, key: str = "task", **kw):
    base = dict(
        run_id=run_id,
        task_key=key,
        docker_image=TEST_IMAGE,
        import_policy="never",
        output_schema=SCHEMA,
        retry_config=RetryConfig(max_attempts=1),
    )
    base.update(kw)
    return base


@pytest.mark.parametrize("plugin", ["claude-code", "codex"])
async def test_answer_is_validated_and_returned_as_output(tmp_path, run_id, runner, plugin):
    repo = make_repo(tmp_path / "repo")
    model = "sonnet" if plugin == "claude-code" else "gpt-5-codex"
    res = await run_instance("Rate the README.", repo, runner=runner, **fields(run_id, plugin_name=plugin, model=model))
    assert res.status == "success", res.error
    jsonschema.validate(res.output, SCHEMA)
    assert json.loads(res.final_message) == res.output
    assert not [e for e in runner_log(runner) if e["message"] == "runner.output.invalid"]


async def test_invalid_answer_gets_one_repair_turn_in_the_same_session(tmp_path, run_id, runner):
    repo = make_repo(tmp_path / "repo")
    res = await run_instance(
        'SIM: print-json {"score": 42, "rationale": "too high"}', repo, runner=runner, **fields(run_id)
    )
    assert res.status == "success", res.error
    jsonschema.validate(res.output, SCHEMA)  # the repair turn's answer
    log = runner_log(runner)
    (invalid,) = [e for e in log if e["message"] == "runner.output.invalid"]
    assert "score" in invalid["violation"] and "10" in invalid["violation"]
    starts = [e for e in log if e["message"] == "runner.exec.started"]
    assert len(starts) == 2 and starts[0]["resume_session_id"] is None
    assert starts[1]["resume_session_id"] == res.session_id  # same session, not a fresh agent
    assert [e for e in log if e["message"] == "runner.output.repaired"]


async def test_answer_still_invalid_after_repair_fails_with_output_invalid(tmp_path, run_id, runner):
    repo = make_repo(tmp_path / "repo")
    res = await run_instance("SIM: bad-output", repo, runner=runner, **fields(run_id))
    assert res.status == "failed" and res.error_type == "output_invalid"
    assert "output_schema" in res.error and "not JSON" in res.error
    assert res.output is None
    assert len([e for e in runner_log(runner) if e["message"] == "runner.exec.started"]) == 2


async def test_command_plugin_refuses_output_schema(tmp_path, run_id, runner):
    from orchestrator.errors import ConfigError

    repo = make_repo(tmp_path / "repo")
    with pytest.raises(ConfigError, match="cannot enforce output_schema"):
        await run_instance("x", repo, runner=runner, **fields(run_id, plugin_name="command", command="true"))
