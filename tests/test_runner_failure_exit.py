"""The Docker runner's one failure exit (issue 28, Wanted 4).

``DockerRunner.run`` calls its phases (workspace, agent exec, collect) as a
pipeline; a phase that finds the task failed raises ``TaskFailed``, and one
place stops the container, emits ``runner.instance.failed`` and builds the
failed result. Each phase's failure keeps the event fields it always had: the
parametrized test passes on the code before the change too, which is what it
is for (the event stream did not change).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import RUNNER_SECRET, TEST_IMAGE

from orchestrator.runner import DockerRunner, RetryConfig, run_instance

RUNNER = Path(__file__).resolve().parents[1] / "orchestrator" / "runner"
SECRET = RUNNER_SECRET  # the runner fixture's api key (conftest)
SCHEMA = {"type": "object", "properties": {"score": {"type": "number"}}, "required": ["score"]}


def test_the_docker_runner_is_no_mixin_stack_and_emits_its_failure_in_one_place():
    """Its phases were mixins over one shared state, and the failure exit was written seven times."""
    assert DockerRunner.__bases__ == (object,), DockerRunner.__mro__
    sites = []
    for path in sorted(RUNNER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "runner.instance.failed":
                sites.append(f"{path.name}:{node.lineno}")
    assert len(sites) == 1, sites


# phase -> (prompt, request fields, the failed event's fields beyond the ids,
#           status, error_type, whether the container is stopped first)
CASES = {
    "validate": ("SIM: print hi", {"docker_image": "orchestrator-no-such-image:none"}, {"phase", "error"}),
    "workspace": ("SIM: print hi", {"base_branch": "no-such-branch"}, {"phase", "error"}),
    "execute-timeout": ("SIM: hang", {"timeout_seconds": 3}, {"phase", "error", "error_type", "status"}),
    "execute-agent-error": ("SIM: fail 3 boom", {}, {"phase", "error", "error_type", "exit_code"}),
    "output": (
        "SIM: bad-output",
        {"output_schema": SCHEMA, "import_policy": "never"},
        {"phase", "error", "error_type", "exit_code"},
    ),
    "import": (f"SIM: write leak.txt {SECRET}\nSIM: commit leak", {}, {"phase", "error", "error_type"}),
    "delete_branches": ("", {"delete_branches": ("bad..name",)}, {"phase", "error"}),
}
OUTCOME = {
    "validate": ("failed", "container", False),
    "workspace": ("failed", "git", True),
    "execute-timeout": ("timeout", "timeout", True),
    "execute-agent-error": ("failed", "api", True),
    "output": ("failed", "output_invalid", True),
    "import": ("failed", "secret", True),
    "delete_branches": ("failed", "git", False),
}


@pytest.mark.docker
@pytest.mark.parametrize("case", list(CASES))
async def test_each_phase_fails_through_the_one_exit_with_the_fields_it_always_had(case, git_repo, run_id, runner):
    prompt, extra, event_fields = CASES[case]
    status, error_type, stops = OUTCOME[case]
    seen: list[dict] = []
    kw = {"docker_image": TEST_IMAGE, "retry_config": RetryConfig(max_attempts=1), **extra}
    res = await run_instance(prompt, git_repo, runner=runner, event_callback=seen.append, run_id=run_id, **kw)
    assert (res.status, res.error_type) == (status, error_type), res.error
    assert SECRET not in (res.error or "")
    types = [e["type"] for e in seen]
    assert types.count("runner.instance.failed") == 1, types
    failed = seen[-1]
    assert failed["type"] == "runner.instance.failed", types
    assert set(failed) - {"type", "run_id", "instance_id", "task_key"} == event_fields, failed
    assert failed["phase"] == case.split("-")[0]
    assert "runner.instance.completed" not in types
    if stops:
        assert types[-2] == "runner.container.stopped", types
    else:
        assert "runner.container.stopped" not in types, types
    # What the result carries depends on how far the task got.
    assert (res.workspace_path is not None) == (case not in ("validate", "delete_branches"))
    ran = case in ("execute-timeout", "execute-agent-error", "output", "import")
    assert (res.metrics.duration_s > 0) == ran, res.metrics
    if case == "execute-agent-error":
        assert res.exit_code == 3 and "boom" in res.final_message
