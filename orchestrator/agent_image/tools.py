"""Which agent tools an image has, and their versions: shared by ``--doctor``, the run's pre-flight and ``--build-image``.

An image id names immutable content, so the answer is cached per image id
under the cache directory: only the first run with a new image pays for the
probe container (a second or two while ``claude --version`` starts node).
Blocking (docker-py); async callers use ``anyio.to_thread``.
"""

from __future__ import annotations

import json
import os
from contextlib import closing
from typing import TYPE_CHECKING

from ..errors import PreflightError
from .paths import cache_dir

if TYPE_CHECKING:
    from docker import DockerClient

    from ..runner import RunnerPlugin

TOOLS = ("claude", "codex", "git", "orchestrator-sim-agent")
# The image --build-image builds when --docker-image names no other.
DEFAULT_IMAGE = "claude-code"
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


def build_command(image: str) -> str:
    return "orchestrator --build-image" + ("" if image == DEFAULT_IMAGE else f" --docker-image {image}")


def required_tools(plugin: RunnerPlugin, *, dry_run: bool) -> tuple[str, ...]:
    """The tools a run with this plugin executes inside the image (agents commit with git).

    A ``command`` run executes only its own command line, in any image; a dry
    run's agent is the simulated one.
    """
    caps = plugin.capabilities
    if not caps.image_tools:
        return ()
    if dry_run and caps.simulated_as is not None:
        return ("orchestrator-sim-agent", "git")
    return caps.image_tools


def _run_sh(client: DockerClient, image: str, script: str) -> bytes:
    """The output of ``script`` in a throwaway container of ``image``, without network."""
    # By its path: an image whose PATH lacks /bin still gets probed, and says so.
    return client.containers.run(
        image,
        ["/bin/sh", "-c", script],
        entrypoint=[],
        remove=True,
        network_disabled=True,
        labels={"orchestrator.probe": "true"},
    )


def probe_tools(image: str, *, refresh: bool = False) -> dict[str, str | None]:
    """Tool name -> version line (``"?"`` when it printed none) or ``None`` when missing.

    Raises :class:`PreflightError` when the image does not exist or cannot be run.
    """
    import docker
    import docker.errors

    with closing(docker.from_env(timeout=PROBE_TIMEOUT_S)) as client:
        try:
            image_id: str = client.images.get(image).attrs["Id"]
        except docker.errors.ImageNotFound:
            raise PreflightError(f"Docker image {image!r} not found; build it with: {build_command(image)}") from None
        cache = cache_dir() / "image-tools" / (image_id.replace("sha256:", "") + ".json")
        if not refresh:
            try:
                return json.loads(cache.read_text())
            except (OSError, ValueError):
                pass
        try:
            out = _run_sh(client, image, _PROBE)
        except docker.errors.DockerException as exc:
            raise PreflightError(
                f"cannot run a container from {image!r} to check its tools: {str(exc).splitlines()[0][:200]}"
            ) from None
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


# Where an image keeps programs: a tool found here but not on the image's PATH
# is a PATH problem, not a missing tool.
_LOOK_IN = ("/opt/orchestrator/bin", "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _locate(image: str, tools: list[str]) -> tuple[str, dict[str, str]]:
    """The image's PATH, and the directory of :data:`_LOOK_IN` each of ``tools`` is in (absent: none)."""
    import docker
    import docker.errors

    script = 'echo "$PATH"; for t in ' + " ".join(tools) + "; do for d in " + " ".join(_LOOK_IN)
    script += '; do if [ -x "$d/$t" ]; then echo "$t $d"; break; fi; done; done'
    with closing(docker.from_env(timeout=PROBE_TIMEOUT_S)) as client:
        try:
            out = _run_sh(client, image, script).decode("utf-8", "replace")
        except docker.errors.DockerException:
            return "?", {}
    lines = out.splitlines()
    found = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
    return (lines[0] if lines else "?"), found


def explain_missing(image: str, missing: list[str], *, source: str | None = None) -> tuple[dict[str, str], str]:
    """Why each of ``missing`` is not on ``image``'s PATH, and the fix.

    ``source``: where the environment image's PATH comes from (a devcontainer,
    the configuration); None for an agent image, which ``--build-image`` makes.
    """
    path, found = _locate(image, missing)
    why = {
        t: f"it is in {found[t]}, which the PATH ({path}) does not include"
        if t in found
        else f"it is not on the PATH ({path}) nor in {', '.join(_LOOK_IN)}"
        for t in missing
    }
    off_path = [found[t] for t in missing if t in found]
    if source is None:
        if off_path:
            fix = f"add {', '.join(dict.fromkeys(off_path))} to the image's PATH (ENV PATH) or pick another --docker-image"
        else:
            fix = "rebuild it with orchestrator --build-image or pick another --docker-image"
    elif off_path:
        fix = (
            f"the PATH comes from {source}: keep the image's in it, as in "
            '"remoteEnv": {"PATH": "${containerEnv:PATH}:/your/bin"}'
        )
    else:
        fix = f"did the setup of {source} remove it?"
    return why, fix


def check_tools(image: str, needed: tuple[str, ...], *, source: str | None = None) -> dict[str, str | None]:
    """Pre-flight: raise one line naming the tools ``needed`` that ``image`` lacks, why, and the fix."""
    tools = probe_tools(image)
    missing = [t for t in needed if tools.get(t) is None]
    if missing:
        why, fix = explain_missing(image, missing, source=source)
        raise PreflightError(
            f"Docker image {image!r} has no {', '.join(missing)} on its PATH: "
            + "; ".join(f"{t}: {w}" if len(missing) > 1 else w for t, w in why.items())
            + f"; {fix}"
        )
    return tools
