"""The simulated agent prints what the real CLIs print: same line types, same keys, same JSON types.

Both CLIs run with the argv and environment the product's plugins build, once
for real (image orchestrator-fidelity, scripted API in the container) and once
as the simulated agent (image orchestrator-test-agent), for the same four
scenarios: success, a resumed session, a persistent 429 and a 401. Each
printed line is reduced to its shape: its line type (``type``, ``subtype``,
an item's ``type``) and the paths and JSON types of its keys, two levels deep.

Any difference fails: a line type or a key (with its JSON type) that only
one side prints. Fix the simulated agent (docker/sim_agent) to print what the
real CLI prints; values may stay simulated.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import TEST_IMAGE
from fidelity_helpers import API, OPENAI_KEY, ensure_image

from orchestrator.runner.plugin import get_plugin
from orchestrator.runner.types import AuthConfig, InstanceRequest

pytestmark = [pytest.mark.docker, pytest.mark.fidelity]
AUTH = AuthConfig(
    api_key="sk-ant-fidelity-0123456789abcdef", base_url=API, openai_api_key=OPENAI_KEY, openai_base_url=f"{API}/v1"
)
MODELS = {"claude-code": "sonnet", "codex": "gpt-5"}
REAL = {
    "success": "FIDELITY: success",
    "resume": "FIDELITY: success",
    "429": "FIDELITY: ratelimit-always",
    "401": "FIDELITY: auth",
}
# The same steps the scripted API asks the real CLIs for: write, commit, edit, commit.
SIM = {
    "success": "SIM: write notes.txt first line\nSIM: commit fidelity: add notes.txt\n"
    "SIM: edit notes.txt first line => edited line\nSIM: commit fidelity: edit notes.txt\nSIM: print done",
    "resume": "SIM: print done again",
    "429": "SIM: ratelimit 1",
    "401": "SIM: authfail",
}


def json_type(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]


def line_type(obj: dict) -> str:
    kind = str(obj.get("type"))
    if isinstance(obj.get("subtype"), str):
        kind += "/" + obj["subtype"]
    if isinstance(obj.get("item"), dict):
        kind += ":" + str(obj["item"].get("type"))
    return kind


# Objects keyed by model id: the id is data, not shape.
MODEL_MAPS = ("modelUsage.", "model_usage_since_last_result.")


def shape(obj: dict, prefix: str = "", depth: int = 2) -> set[str]:
    out = set()
    for key, value in obj.items():
        path = f"{prefix}{'<model>' if prefix in MODEL_MAPS else key}"
        out.add(f"{path}:{json_type(value)}")
        if isinstance(value, dict) and depth > 1:
            out |= shape(value, path + ".", depth - 1)
    return out


def shapes(lines: list[dict]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for obj in lines:
        # keys that only some lines of a type carry (null vs value) are merged
        found.setdefault(line_type(obj), set()).update(shape(obj))
    return found


def capture(image: str, plugin_name: str, prompts: dict[str, str]) -> dict[str, list[dict]]:
    """Run each scenario in one container, the way the runner runs the CLI; the JSON lines it printed."""
    plugin = get_plugin(plugin_name)
    cid = subprocess.run(
        ["docker", "run", "-d", "--rm", "--network", "none", image, "sleep", "infinity"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        subprocess.run(
            [
                "docker",
                "exec",
                "-w",
                "/workspace",
                cid,
                "sh",
                "-c",
                "git init -q && git config user.email d@example.com && git config user.name D && "
                "git commit -q --allow-empty -m init",
            ],
            check=True,
            capture_output=True,
        )
        out: dict[str, list[dict]] = {}
        session = None
        for scenario, prompt in prompts.items():
            req = InstanceRequest(
                prompt=prompt,
                repo_path="/repo",
                branch_name="b",
                run_id="r",
                strategy_execution_id="s",
                instance_id="i",
                task_key=f"shape-{scenario}",
                container_name=cid,
                model=MODELS[plugin_name],
                plugin_name=plugin_name,
            )
            resume = session if scenario == "resume" else None
            if plugin_name == "codex":
                argv = plugin.build_command(req, resume_session_id=resume, auth=AUTH)
            else:
                argv = plugin.build_command(req, resume_session_id=resume)
            env = plugin.prepare_environment(AUTH, req)
            env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
            run = subprocess.run(
                ["docker", "exec", "-w", "/workspace", *env_args, cid, *argv],
                capture_output=True,
                text=True,
                timeout=180,
            )
            lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
            assert lines, f"{image} {plugin_name} {scenario}: no JSON output; stderr: {run.stderr[-2000:]}"
            out[scenario] = lines
            if scenario == "success":
                parser = plugin.new_parser()
                parser.feed(run.stdout.encode())
                session = parser.finish(run.returncode).session_id
                assert session, f"{plugin_name}: no session id in the success output"
        return out
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


def drift(real: dict[str, list[dict]], sim: dict[str, list[dict]]) -> list[str]:
    found = []
    for scenario in REAL:
        r, s = shapes(real[scenario]), shapes(sim[scenario])
        for kind in sorted(set(r) - set(s)):
            found.append(f"{scenario}: line {kind} only from the real CLI")
        for kind in sorted(set(s) - set(r)):
            found.append(f"{scenario}: line {kind} only from the sim agent")
        for kind in sorted(set(r) & set(s)):
            found += [f"{scenario}: {kind} {k} only from the real CLI" for k in sorted(r[kind] - s[kind])]
            found += [f"{scenario}: {kind} {k} only from the sim agent" for k in sorted(s[kind] - r[kind])]
    return found


@pytest.fixture(scope="module")
def fidelity_image():
    return ensure_image()


@pytest.mark.parametrize("plugin", ["claude-code", "codex"])
def test_sim_agent_prints_the_shapes_the_real_cli_prints(fidelity_image, plugin):
    real = capture(fidelity_image, plugin, REAL)
    sim = capture(TEST_IMAGE, plugin, SIM)
    found = drift(real, sim)
    assert not found, "the simulated agent drifted from the real CLI:\n" + "\n".join(found)
