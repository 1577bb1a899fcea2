"""The agent CLIs are pinned: one file names exact versions, and the image, the docs and the simulated agent follow it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, TEST_BASE_IMAGE
from shape_drift import version_diff

from orchestrator.agent_image.pins import PINS_FILE, installed_version, mismatches, read_pins
from orchestrator.errors import PreflightError

PINS = read_pins(REPO_ROOT / PINS_FILE)


def test_the_pins_are_exact_versions():
    assert set(PINS) == {"claude", "codex"}
    for version in PINS.values():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version


@pytest.mark.parametrize(
    "text, message",
    [
        ("CODEX_VERSION=0.169.0\n", "must set CLAUDE_CODE_VERSION"),
        ("CLAUDE_CODE_VERSION=latest\nCODEX_VERSION=0.169.0\n", "must set CLAUDE_CODE_VERSION"),
        ("CLAUDE_CODE_VERSION=2.1.330\nCODEX_VERSION=^0.169\n", "must set CODEX_VERSION"),
    ],
)
def test_a_pin_that_is_not_an_exact_version_is_refused(tmp_path, text, message):
    path = tmp_path / "cli-versions.env"
    path.write_text(text)
    with pytest.raises(PreflightError, match=message):
        read_pins(path)


def test_the_dockerfile_installs_only_the_pinned_versions():
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if "npm install -g" in line]
    assert installs, "the Dockerfile no longer installs the CLIs with npm"
    for line in installs:
        # every package is installed at a version: an unpinned install takes whatever the registry serves
        packages = re.findall(r'"(@[^"]+)"', line)
        assert packages and all(re.search(r"@[^@]*\$", pkg[1:]) for pkg in packages), line
    assert "cli-versions.env" in dockerfile


def test_the_docs_and_the_simulated_agent_name_the_pinned_versions():
    sys.path.insert(0, str(REPO_ROOT / "docker"))
    try:
        from sim_agent.claude import CLAUDE_VERSION
        from sim_agent.codex import CODEX_VERSION
    finally:
        sys.path.pop(0)
    # the simulated agent prints the shapes of one release: the pinned one
    assert f"{PINS['claude']}-sim" == CLAUDE_VERSION
    assert f"{PINS['codex']}-sim" == CODEX_VERSION
    docs = (REPO_ROOT / "docs" / "docker.md").read_text()
    assert f"Claude Code {PINS['claude']}" in docs and f"Codex {PINS['codex']}" in docs


def test_version_lines_are_compared_with_the_pins():
    assert installed_version("2.1.330 (Claude Code)") == "2.1.330"
    assert installed_version("codex-cli 0.169.0") == "0.169.0"
    tools = {"claude": "2.1.332 (Claude Code)", "codex": "codex-cli 0.169.0", "git": "git version 2.39.5"}
    assert mismatches(tools, PINS | {"claude": "2.1.330"}) == {"claude": ("2.1.332", "2.1.330")}
    # the test image's simulated CLIs and a missing CLI are reported elsewhere, not as a wrong version
    assert mismatches({"claude": "simulated", "codex": None}, PINS) == {}


def test_the_drift_report_names_keys_added_gone_and_retyped_per_line_type():
    old = {"success": [{"type": "system", "subtype": "init", "model": "m", "tools": []}, {"type": "result", "a": 1}]}
    new = {
        "success": [
            {"type": "system", "subtype": "init", "model": "m", "tools": {}, "sandbox_enabled": False},
            {"type": "rate_limit_event"},
        ]
    }
    assert version_diff(old, new) == [
        "+ line rate_limit_event (new line type)",
        "- line result (no longer printed)",
        "  line system/init",
        "    + sandbox_enabled: bool",
        "    ~ tools: array -> object",
    ]
    assert version_diff(old, old) == []


@pytest.mark.docker
@pytest.mark.parametrize("tool", ["claude", "codex"])
def test_the_image_runs_the_pinned_cli(tool):
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", TEST_BASE_IMAGE, tool, "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert installed_version(out.stdout) == PINS[tool], f"{TEST_BASE_IMAGE}: {out.stdout.strip()}; pinned {PINS[tool]}"
