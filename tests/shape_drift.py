"""Line shapes of the agent CLIs' JSON output, and the drift between two sets of them.

Used by tests/test_fidelity_shapes.py (the simulated agent against the pinned
real CLIs) and by scripts/cli-drift.sh (the pinned CLIs against the newest
releases). A printed line is reduced to its shape: its line type (``type``,
``subtype``, an item's ``type``) and the paths and JSON types of its keys, two
levels deep; values are data, not shape.
"""

from __future__ import annotations

import json
import subprocess

from fidelity_helpers import API, OPENAI_KEY

from orchestrator.runner.registry import get_plugin
from orchestrator.runner.types import AuthConfig, InstanceRequest

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


def _by_path(keys: set[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for key in keys:
        path, _, kind = key.rpartition(":")
        out.setdefault(path, set()).add(kind)
    return out


def version_diff(old: dict[str, list[dict]], new: dict[str, list[dict]]) -> list[str]:
    """What changed from ``old`` to ``new`` output, per line type: lines and keys added or gone, types changed.

    Scenarios are merged: a key is new when no scenario of ``old`` printed it
    on that line type. Returns readable lines, empty when nothing changed.
    """
    before: dict[str, set[str]] = {}
    after: dict[str, set[str]] = {}
    for lines in old.values():
        for kind, keys in shapes(lines).items():
            before.setdefault(kind, set()).update(keys)
    for lines in new.values():
        for kind, keys in shapes(lines).items():
            after.setdefault(kind, set()).update(keys)
    out = []
    for kind in sorted(set(before) | set(after)):
        if kind not in before:
            out.append(f"+ line {kind} (new line type)")
            continue
        if kind not in after:
            out.append(f"- line {kind} (no longer printed)")
            continue
        old_paths, new_paths = _by_path(before[kind]), _by_path(after[kind])
        changes = []
        for path in sorted(set(old_paths) | set(new_paths)):
            was, now = old_paths.get(path), new_paths.get(path)
            if was is None and now is not None:
                changes.append(f"    + {path}: {'|'.join(sorted(now))}")
            elif now is None and was is not None:
                changes.append(f"    - {path}: {'|'.join(sorted(was))}")
            elif was != now and was is not None and now is not None:
                changes.append(f"    ~ {path}: {'|'.join(sorted(was))} -> {'|'.join(sorted(now))}")
        if changes:
            out.append(f"  line {kind}")
            out.extend(changes)
    return out


def cli_version(image: str, tool: str) -> str:
    """The first line ``tool --version`` prints in ``image``."""
    run = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, tool, "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return (run.stdout.strip().splitlines() or ["?"])[0]


def main(argv: list[str] | None = None) -> int:
    """Print, per CLI, what the newest release prints differently from the pinned one.

    Both images are fidelity images (the real CLIs behind the scripted API).
    Always exits 0 once both ran: drift is news to act on, not a failure.
    """
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("pinned", help="fidelity image of the pinned CLIs")
    parser.add_argument("newest", help="fidelity image of the newest CLIs")
    args = parser.parse_args(argv)
    drifted = []
    for plugin, tool in (("claude-code", "claude"), ("codex", "codex")):
        old_v, new_v = cli_version(args.pinned, tool), cli_version(args.newest, tool)
        old = capture(args.pinned, plugin, REAL)
        new = capture(args.newest, plugin, REAL)
        diff = version_diff(old, new)
        print(f"== {plugin}: {old_v} -> {new_v}")
        if diff:
            drifted.append(plugin)
            print("\n".join(diff))
        else:
            print("  the printed lines have the same shapes")
    print()
    if drifted:
        print(
            f"drift in {', '.join(drifted)}: teach docker/sim_agent the new shapes "
            "(tests/test_fidelity_shapes.py shows them), then move the pins in docker/cli-versions.env"
        )
    else:
        print("no drift: the pins in docker/cli-versions.env can move with nothing else to change")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
