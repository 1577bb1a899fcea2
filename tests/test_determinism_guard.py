"""The determinism guard around loaded strategy modules: report wall-clock/random calls by file:line."""

from __future__ import annotations

import textwrap

import pytest
from engine_helpers import run_engine

from orchestrator.engine.determinism import Reporter, guard_module
from orchestrator.engine.testing import ScriptedRunner
from orchestrator.errors import NondeterminismError
from orchestrator.strategy_loader import load_strategy

SOURCE = """
import time, random, uuid
import datetime
from datetime import datetime as dt
from random import random as rnd
from time import time as now

def via_module():
    return time.time()                 # line 9

def via_datetime():
    return datetime.datetime.now()     # line 12

def via_random():
    return random.random()             # line 15

def via_uuid():
    return uuid.uuid4()                # line 18

def via_from_imports():
    return dt.now(), rnd(), now()      # line 21

def allowed():
    return time.strftime("%Y"), random.Random(3).random(), datetime.timedelta(1), json_ok()

def json_ok():
    return uuid.UUID("12345678123456781234567812345678")

async def strategy(prompt, base_branch, ctx):
    return [ctx.now() > 0, 0 <= ctx.rand() < 1]
"""


def guarded(tmp_path, mode):
    path = tmp_path / "strat.py"
    path.write_text(textwrap.dedent(SOURCE))
    loaded = load_strategy(str(path))
    messages: list[str] = []
    guard_module(loaded.module, Reporter(mode, messages.append))
    return loaded.module, messages, str(path.resolve())


def test_warn_mode_reports_each_call_site_once_with_file_and_line(tmp_path):
    mod, messages, path = guarded(tmp_path, "warn")
    assert isinstance(mod.via_module(), float)  # still behaves as the original
    mod.via_module()
    mod.via_datetime()
    assert 0 <= mod.via_random() < 1
    assert mod.via_uuid().version == 4
    assert len(mod.via_from_imports()) == 3
    sites = [(m.split(": strategy code")[0], m.split("called ")[1].split(" directly")[0]) for m in messages]
    assert sites == [
        (f"warning: {path}:9", "time.time()"),
        (f"warning: {path}:12", "datetime.now()"),
        (f"warning: {path}:15", "random.random()"),
        (f"warning: {path}:18", "uuid.uuid4()"),
        (f"warning: {path}:21", "datetime.now()"),
        (f"warning: {path}:21", "random.random()"),
        (f"warning: {path}:21", "time.time()"),
    ]
    assert "use ctx.now()" in messages[0] and "use ctx.rand()" in messages[2]
    assert "derive ids from ctx.key" in messages[3]


def test_allowed_calls_are_not_reported(tmp_path):
    mod, messages, _ = guarded(tmp_path, "warn")
    mod.allowed()
    assert messages == []


@pytest.mark.parametrize("call", ["via_module", "via_datetime", "via_random", "via_uuid"])
def test_strict_mode_raises_naming_the_site(tmp_path, call):
    mod, messages, path = guarded(tmp_path, "strict")
    with pytest.raises(NondeterminismError, match=rf"{path}:\d+: strategy code called .* directly"):
        getattr(mod, call)()
    assert messages == []


def test_off_mode_leaves_the_module_alone(tmp_path):
    mod, messages, _ = guarded(tmp_path, "off")
    import time

    assert mod.time is time
    mod.via_module()
    assert messages == []


async def test_ctx_now_and_rand_are_never_reported_in_a_guarded_strategy(tmp_path):
    mod, messages, _ = guarded(tmp_path, "strict")
    _, state = await run_engine(tmp_path / "run", mod.strategy, ScriptedRunner())
    assert state.strategies["s1"].status == "success" and state.strategies["s1"].result == [True, True]
    assert messages == []
