"""Secrets never reach disk: a property test over real runs of the command.

Random secret values are planted where users keep them (the environment or a
``.env`` file next to the repository) and where agents leak them (an agent
that echoes ``$ANTHROPIC_API_KEY``, prints the key, or a prompt that quotes
it). Afterwards every file under logs/, state/ and results/, every event and
every container's configuration (``docker inspect``) is scanned for the
values: they must not appear, while the run itself still worked.
"""

from __future__ import annotations

import shutil
import string
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import make_repo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_helpers import (
    IMG,
    all_containers,
    check_log,
    cli_env,
    events_path,
    record,
    remove_run_docker,
    run_cli,
    run_ids,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

secret_values = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=24, max_size=48).map(
    lambda s: "sk-ant-" + s
)
LEAKS = {
    "agent echoes the env var": "SIM: exec echo $ANTHROPIC_API_KEY\nSIM: exec env\n",
    "agent prints the key": "SIM: print the key is {secret}\n",
    "prompt quotes the key": "use key {secret} and {other} for testing\n",
}
SCANNED = {"files": 0, "examples": 0, "leaks": 0}


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    secret=secret_values,
    other=secret_values,
    where=st.sampled_from(["environment", ".env file"]),
    leak=st.sampled_from(sorted(LEAKS)),
)
def test_configured_secrets_never_appear_in_any_output(secret, other, where, leak):
    tmp_path = Path(tempfile.mkdtemp(prefix="secrets-"))
    try:
        repo = make_repo(tmp_path / "repo")
        extra = {"OPENAI_API_KEY": other}
        if where == "environment":
            extra["ANTHROPIC_API_KEY"] = secret
        else:
            extra["ANTHROPIC_API_KEY"] = ""
            (repo / ".env").write_text(f"ANTHROPIC_API_KEY={secret}\n")
        env = cli_env(tmp_path, **extra)
        if where != "environment":
            del env["ANTHROPIC_API_KEY"]
        prompt = LEAKS[leak].format(secret=secret, other=other) + "SIM: write a.txt x\nSIM: commit a\nSIM: print ok"
        result = run_cli([prompt, "--no-tui", *IMG], cwd=repo, env=env)
        (run_id,) = run_ids(tmp_path)
        try:
            assert result.returncode == 0, result.stderr
            check_log(events_path(tmp_path, run_id))
            for value in (secret, other):
                assert value not in result.stdout + result.stderr
                for d in ("logs", "state", "results"):
                    for path in (tmp_path / d).rglob("*"):
                        if path.is_file():
                            SCANNED["files"] += 1
                            assert value.encode() not in path.read_bytes(), f"{leak}/{where}: secret in {path}"
                for name in all_containers(run_id):
                    inspect = subprocess.run(["docker", "inspect", name], capture_output=True, text=True).stdout
                    assert value not in inspect, f"secret in docker inspect {name}"
            # the value did reach the agent or the records, and was scrubbed there
            runner_log = (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
            assert "[REDACTED]" in runner_log + (tmp_path / "logs" / run_id / "events.jsonl").read_text()
            SCANNED["examples"] += 1
            record(
                "secrets", example=SCANNED["examples"], where=where, leak=leak, leaked=0, files_scanned=SCANNED["files"]
            )
        finally:
            remove_run_docker(run_id)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
