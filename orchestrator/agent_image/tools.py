"""Which agent tools an image has, and their versions: shared by ``--doctor``, the run's pre-flight and ``--build-image``.

An image id names immutable content, so the answer is cached per image id
under the cache directory: only the first run with a new image pays for the
probe container (a second or two while ``claude --version`` starts node).
Blocking (docker-py); async callers use ``anyio.to_thread``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import PreflightError
from .paths import cache_dir

TOOLS = ("claude", "codex", "git", "orchestrator-sim-agent")
PROBE_TIMEOUT_S = 120
# Prints "<tool> <first line of --version>" or "<tool> -" when it is not on PATH.
# The simulated agent has no --version (it would answer as an agent), and the
# test image links claude/codex to it: those are reported as "simulated".
_PROBE = (
    'sim=$(readlink -f "$(command -v orchestrator-sim-agent)" 2>/dev/null); '
    "for t in " + " ".join(TOOLS) + "; do "
    'p=$(command -v "$t" 2>/dev/null) || { echo "$t -"; continue; }; '
    'if [ -n "$sim" ] && [ "$(readlink -f "$p")" = "$sim" ]; then '
    '[ "$t" = orchestrator-sim-agent ] && echo "$t present" || echo "$t simulated"; continue; fi; '
    'v=$("$t" --version 2>/dev/null </dev/null | head -n 1); echo "$t ${v:-?}"; done'
)


def required_tools(plugin_name: str, *, dry_run: bool) -> tuple[str, ...]:
    """The tools a run with this plugin executes inside the image (agents commit with git).

    A ``command`` run executes only its own command line, in any image.
    """
    if plugin_name == "command":
        return ()
    if dry_run:
        return ("orchestrator-sim-agent", "git")
    return ({"claude-code": "claude", "codex": "codex"}.get(plugin_name, plugin_name), "git")


def _cache_file(image_id: str) -> Path:
    return cache_dir() / "image-tools" / (image_id.replace("sha256:", "") + ".json")


def probe_tools(image: str, *, refresh: bool = False) -> dict[str, str | None]:
    """Tool name -> version line (``"?"`` when it printed none) or ``None`` when missing.

    Raises :class:`PreflightError` when the image does not exist or cannot be run.
    """
    import docker
    import docker.errors

    client = docker.from_env(timeout=PROBE_TIMEOUT_S)
    try:
        try:
            image_id: str = client.images.get(image).attrs["Id"]
        except docker.errors.ImageNotFound:
            raise PreflightError(
                f"Docker image {image!r} not found; build it with: orchestrator --build-image"
                f"{'' if image == 'claude-code' else f' --docker-image {image}'}"
            ) from None
        cache = _cache_file(image_id)
        if not refresh:
            try:
                return json.loads(cache.read_text())
            except (OSError, ValueError):
                pass
        try:
            out = client.containers.run(
                image,
                ["sh", "-c", _PROBE],
                entrypoint=[],
                remove=True,
                network_disabled=True,
                labels={"orchestrator.probe": "true"},
                stdout=True,
                stderr=False,
            )
        except docker.errors.DockerException as exc:
            raise PreflightError(
                f"cannot run a container from {image!r} to check its tools: {str(exc).splitlines()[0][:200]}"
            ) from None
    finally:
        client.close()
    tools: dict[str, str | None] = {}
    for line in out.decode("utf-8", "replace").splitlines():
        name, _, version = line.partition(" ")
        if name in TOOLS:
            tools[name] = None if version == "-" else version.strip()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(tools))
        tmp.replace(cache)
    except OSError:
        pass  # a read-only cache only costs the next run another probe
    return tools


def check_tools(image: str, needed: tuple[str, ...]) -> dict[str, str | None]:
    """Pre-flight: raise one line naming the tools ``needed`` that ``image`` lacks."""
    tools = probe_tools(image)
    missing = [t for t in needed if tools.get(t) is None]
    if missing:
        raise PreflightError(
            f"Docker image {image!r} has no {', '.join(missing)} on its PATH; rebuild it with "
            "orchestrator --build-image or pick another --docker-image"
        )
    return tools
