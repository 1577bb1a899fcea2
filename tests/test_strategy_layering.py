"""Strategies see only ``ctx`` and the public surface: no git, no runner, no engine internals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STRATEGIES = sorted((Path(__file__).parent.parent / "strategies").glob("*.py"))
# The runner and git belong to the orchestrator; the log, the state fold and the engine's
# machinery are reached through ctx (or, for reports, orchestrator.engine.replay_strategy).
FORBIDDEN = (
    "subprocess",
    "orchestrator.runner",
    "orchestrator.log.state",
    "orchestrator.log.eventlog",
    "orchestrator.engine.engine",
    "orchestrator.engine.replay",
    "orchestrator.app",
    "orchestrator.app.launch",
    "orchestrator.app.preflight",
    "orchestrator.app.manage",
)


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", STRATEGIES, ids=lambda p: p.name)
def test_a_strategy_module_imports_nothing_below_the_public_surface(path):
    bad = sorted(n for n in imported(path) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))
    assert not bad, f"{path.name} imports {bad}"
