"""The exact agent CLI versions the image installs, read from ``docker/cli-versions.env``.

The Dockerfile sources that file too, so an image and the product that checks it never disagree on a pin.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import PreflightError
from .paths import source_dir

PINS_FILE = "docker/cli-versions.env"
# tool on the image's PATH -> (variable in the pins file, npm package)
CLIS = {
    "claude": ("CLAUDE_CODE_VERSION", "@anthropic-ai/claude-code"),
    "codex": ("CODEX_VERSION", "@openai/codex"),
}
_VERSION = re.compile(r"\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]+)?")


def read_pins(path: Path) -> dict[str, str]:
    """Tool -> pinned version from a pins file; one clear error when it is missing or incomplete."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise PreflightError(f"cannot read the agent CLI pins {path}: {exc.strerror}") from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    pins = {}
    for tool, (var, _) in CLIS.items():
        if not _VERSION.fullmatch(values.get(var, "")):
            raise PreflightError(f"{path} must set {var} to an exact version such as 1.2.3")
        pins[tool] = values[var]
    return pins


def pinned_versions() -> dict[str, str]:
    """Tool -> the version this orchestrator's image sources pin (``{"claude": "2.1.330", ...}``)."""
    return read_pins(source_dir() / PINS_FILE)


def installed_version(version_line: str | None) -> str | None:
    """The bare version in a tool's ``--version`` line (``2.1.330 (Claude Code)``, ``codex-cli 0.169.0``)."""
    if not version_line:
        return None
    found = _VERSION.search(version_line)
    return found.group(0) if found else None


def mismatches(tools: dict[str, str | None], pins: dict[str, str]) -> dict[str, tuple[str | None, str]]:
    """Tool -> (installed, pinned) for each real CLI in ``tools`` whose version is not its pin.

    A tool that is missing or simulated (the test image) is not a mismatch:
    those are reported as what they are elsewhere.
    """
    out: dict[str, tuple[str | None, str]] = {}
    for tool, pinned in pins.items():
        line = tools.get(tool)
        if line is None or line == "simulated":
            continue
        got = installed_version(line)
        if got != pinned:
            out[tool] = (got, pinned)
    return out
