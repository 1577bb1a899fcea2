"""A start reads top to bottom: pre-flight makes one immutable plan, and the plugin is looked up once."""

from __future__ import annotations

import dataclasses
import sys
import threading

import pytest
from conftest import TEST_IMAGE, make_repo

from orchestrator.runner import registry

pytestmark = pytest.mark.docker


class _Calls:
    """Counts calls of one function in every thread, however a module imported it."""

    def __init__(self, fn) -> None:
        self.code = fn.__code__
        self.count = 0

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code is self.code:
            self.count += 1

    def __enter__(self):
        sys.setprofile(self)
        threading.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


async def test_the_plugin_is_looked_up_once_before_the_first_task(tmp_path, monkeypatch):
    from orchestrator.app.cli import build_parser
    from orchestrator.app.preflight import prepare
    from orchestrator.app.wiring import _engine_config
    from orchestrator.log.runs import RunDirs

    repo = make_repo(tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    for name in ("LOGS", "STATE", "RESULTS"):
        monkeypatch.setenv(f"ORCHESTRATOR_{name}_DIR", str(tmp_path / name.lower()))
    monkeypatch.setenv("ORCHESTRATOR_WORKSPACE_ROOT", str(tmp_path / "ws"))
    args = build_parser().parse_args(
        ["do it", "--dry-run", "--repo", str(repo), "--docker-image", TEST_IMAGE, "--max-cost", "5"]
    )
    with _Calls(registry.get_plugin) as calls:
        prep = await prepare(args)
        config = _engine_config(prep, RunDirs.from_env(), "r1", resume_fresh=False)
    assert calls.count == 1
    assert prep.plugin.name == prep.plugin_name == "claude-code"
    assert config.supports_resume and config.budget_rates.get("*")
    with pytest.raises(dataclasses.FrozenInstanceError):
        prep.image = "other"  # type: ignore[misc]
