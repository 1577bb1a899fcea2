"""The fidelity image and how the tests talk to the scripted API inside it.

The image (docker/Dockerfile.fidelity) is the product image with the real
``claude`` and ``codex`` behind a wrapper that first starts
docker/fidelity/api_server.py on 127.0.0.1:18080 in the container. It is
rebuilt here only when its inputs changed (same label as
scripts/setup-docker.sh), so a stale server never answers a test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from cli_helpers import cli_env, run_cli

REPO_ROOT = Path(__file__).resolve().parent.parent
FIDELITY_IMAGE = os.environ.get("FIDELITY_IMAGE", "orchestrator-fidelity")
FIDELITY_BASE = os.environ.get("FIDELITY_BASE", "claude-code")
LABEL_KEY = "org.orchestrator.inputs-sha256"
INPUTS = ("docker/Dockerfile.fidelity", "docker/fidelity/api_server.py", "docker/fidelity/ensure_server.py")
API = "http://127.0.0.1:18080"
OPENAI_KEY = "sk-openai-fidelity-0123456789abcdef"
MODELS = {"claude-code": "sonnet", "codex": "gpt-5"}


def _inspect(image: str, fmt: str) -> str | None:
    r = subprocess.run(["docker", "image", "inspect", "-f", fmt, image], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def inputs_hash(base_id: str) -> str:
    """The same hash scripts/setup-docker.sh computes for this image."""
    lines = [f"base {base_id}"]
    for rel in INPUTS:
        lines.append(f"file {rel} {hashlib.sha256((REPO_ROOT / rel).read_bytes()).hexdigest()}")
    return hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()


def ensure_image(base: str = FIDELITY_BASE, tag: str = FIDELITY_IMAGE) -> str:
    """The fidelity image on top of ``base`` (by default the agent image), built when its inputs changed."""
    base_id = _inspect(base, "{{.Id}}")
    if base_id is None:
        raise RuntimeError(f"image {base} missing: run scripts/setup-docker.sh")
    want = inputs_hash(base_id)
    if _inspect(tag, f'{{{{ index .Config.Labels "{LABEL_KEY}" }}}}') == want:
        return tag
    with tempfile.TemporaryDirectory() as ctx:  # only the inputs: the repo (with .venv) is no build context
        for rel in INPUTS:
            (Path(ctx) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO_ROOT / rel, Path(ctx) / rel)
        subprocess.run(
            [
                "docker",
                "build",
                "-q",
                "-f",
                "docker/Dockerfile.fidelity",
                "--build-arg",
                f"BASE={base}",
                "--label",
                f"{LABEL_KEY}={want}",
                "-t",
                tag,
                ".",
            ],
            cwd=ctx,
            check=True,
            capture_output=True,
        )
    return tag


def fidelity_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # Both CLIs are pointed at the in-container server the way a user points
    # them at any endpoint: the plugins turn these into the CLI's own settings.
    return cli_env(tmp_path, ANTHROPIC_BASE_URL=API, OPENAI_API_KEY=OPENAI_KEY, OPENAI_BASE_URL=f"{API}/v1", **extra)


def run_orchestrator(tmp_path: Path, repo: Path, plugin: str, prompt: str, *args: str, env=None, timeout=240):
    return run_cli(
        [prompt, "--plugin", plugin, "--model", MODELS[plugin], "--docker-image", FIDELITY_IMAGE, "--no-tui", *args],
        cwd=repo,
        env=env or fidelity_env(tmp_path),
        timeout=timeout,
    )


def runner_events(tmp_path: Path, run_id: str) -> list[dict]:
    path = tmp_path / "logs" / run_id / "runner.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def one(evs: list[dict], kind: str) -> dict:
    found = [e for e in evs if e["type"] == kind]
    assert len(found) == 1, [e["type"] for e in evs]
    return found[0]["payload"]


def server_requests(run_id: str) -> list[dict]:
    """What the scripted API recorded, read from the run's session volume."""
    vols = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"name=orc_home_{run_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    vols = [v for v in vols if v.startswith(f"orc_home_{run_id}_g")]  # not run ids that extend this one
    assert len(vols) == 1, vols
    out = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            f"{vols[0]}:/h:ro",
            "--entrypoint",
            "cat",
            FIDELITY_IMAGE,
            "/h/.fidelity/requests.jsonl",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def scripted(requests: list[dict]) -> list[dict]:
    """The requests that carried a fidelity script (not side requests)."""
    return [r for r in requests if r.get("script")]


def final_facts(message: str) -> dict:
    """The JSON the server appends to its final answer (what it saw in the last request)."""
    assert message.startswith("FIDELITY-DONE "), message
    return json.loads(message.split(" ", 2)[2])


def remove_run_resources(state_dir: Path) -> None:
    """Containers and session volumes of every run under ``state_dir`` (the tests' own runs only)."""
    if not state_dir.exists():
        return
    for run in (p.name for p in state_dir.iterdir() if p.is_dir()):
        ids = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=run_id={run}"], capture_output=True, text=True
        ).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
        vols = subprocess.run(
            ["docker", "volume", "ls", "-q", "--filter", f"name=orc_home_{run}_g"], capture_output=True, text=True
        ).stdout.split()
        vols = [v for v in vols if v.startswith(f"orc_home_{run}_g")]
        if vols:
            subprocess.run(["docker", "volume", "rm", "-f", *vols], capture_output=True)
