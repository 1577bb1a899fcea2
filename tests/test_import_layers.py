"""The folder tree is the layering: these tests keep it true.

Read from the source (every import statement, those inside functions
included, but not those under ``if TYPE_CHECKING:``), so an import hidden in a
function to dodge a cycle is caught as surely as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "tui", "runner_plugins", "strategies")
REGISTRY = "orchestrator.runner.registry"


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join(parts)] = (path, is_package)
    return found


MODULES = _modules()


def _known(name: str) -> str | None:
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) if parts else None


def _imports(name: str, source: str | None = None) -> set[str]:
    """The project modules ``name`` imports, resolved (``from .x import y`` -> ``pkg.x`` or ``pkg.x.y``)."""
    path, is_package = MODULES.get(name, (None, False))
    if source is None:
        assert path is not None
        source = path.read_text("utf-8")
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.add(target)
                found.update(f"{target}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(source))
    resolved = {m for m in (_known(f) for f in found) if m is not None and m != name}
    # importing a.b.c runs a/__init__ and a/b/__init__ first
    for module in list(resolved):
        parts = module.split(".")
        resolved.update(
            p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if not name.startswith(p + ".") and p != name
        )
    return resolved


def _registry_modules() -> set[str]:
    from orchestrator.runner.registry import PLUGIN_MODULES

    return set(PLUGIN_MODULES.values())


def _graph() -> dict[str, set[str]]:
    graph = {name: _imports(name) for name in MODULES}
    # The registry loads its plugins by name: that is an import all the same.
    graph[REGISTRY] |= _registry_modules() | {"runner_plugins"}
    return graph


GRAPH = _graph()


def _under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_engine_runner_report_and_log_never_import_the_application_layer_or_the_tui():
    low = ("orchestrator.engine", "orchestrator.runner", "orchestrator.report", "orchestrator.log")
    offending = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if _under(m, *low)
        for t in targets
        if _under(t, "orchestrator.app", "tui")
    )
    assert offending == []


def test_only_the_application_layer_imports_the_tui():
    offending = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if _under(m, "orchestrator") and not _under(m, "orchestrator.app")
        for t in targets
        if _under(t, "tui")
    )
    assert offending == []


def test_configuration_is_on_the_ground_floor():
    """config imports nothing of the project but the ground-floor helpers."""
    ground = {"orchestrator", "orchestrator.errors", "orchestrator.parsing", "orchestrator.sanitize"}
    # errors names the runner's error categories (a plain Literal): that is all it needs
    assert GRAPH["orchestrator.config"] <= ground
    assert GRAPH["orchestrator.errors"] <= {"orchestrator", "orchestrator.runner", "orchestrator.runner.types"}


def test_nothing_but_the_registry_imports_a_plugin():
    importers = sorted(
        m
        for m, targets in GRAPH.items()
        if not _under(m, "runner_plugins") and any(_under(t, "runner_plugins") for t in targets)
    )
    assert importers == [REGISTRY]
    # and the registry's names are the only place a plugin module is named
    named = sorted(
        str(path.relative_to(ROOT))
        for name, (path, _) in MODULES.items()
        if name != REGISTRY
        and not _under(name, "runner_plugins")
        and any(mod in path.read_text("utf-8") for mod in _registry_modules())
    )
    assert named == []


def _package(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "orchestrator" and len(parts) > 1 and parts[1] in SUBPACKAGES:
        return f"orchestrator.{parts[1]}"
    return module if parts[0] == "orchestrator" else parts[0]


SUBPACKAGES = ("app", "log", "engine", "runner", "report", "agent_image")
GROUND = {
    "orchestrator",
    "orchestrator._lazy",
    "orchestrator.errors",
    "orchestrator.sanitize",
    "orchestrator.naming",
    "orchestrator.filelock",
}
# What each package may import, as docs/architecture.md says it in words.
ALLOWED = {
    "orchestrator.config": {"orchestrator.errors", "orchestrator.parsing", "orchestrator.sanitize"},
    "orchestrator.jsonlog": {"orchestrator.sanitize"},
    "orchestrator.log": {"orchestrator.errors", "orchestrator.sanitize"},
    "orchestrator.runner": GROUND | {"orchestrator.jsonlog", "runner_plugins"},
    "runner_plugins": {"orchestrator", "orchestrator.errors", "orchestrator.runner"},
    "orchestrator.engine": GROUND | {"orchestrator.jsonlog", "orchestrator.log", "orchestrator.runner"},
    "orchestrator.strategy": {"orchestrator.errors", "orchestrator.engine"},
    "orchestrator.strategy_loader": {"orchestrator.errors", "orchestrator.parsing", "orchestrator.strategy"},
    "orchestrator.report": GROUND | {"orchestrator.log", "orchestrator.runner", "orchestrator.strategy_loader"},
    "orchestrator.agent_image": {
        "orchestrator.errors",
        "orchestrator.filelock",
        "orchestrator.sanitize",
        "orchestrator.runner",
    },
    "tui": {"orchestrator", "orchestrator.log", "orchestrator.naming"},
    "strategies": {"orchestrator", "orchestrator.strategy"},
}


def test_each_package_imports_only_what_the_architecture_document_allows():
    found: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        package = _package(module)
        found.setdefault(package, set()).update(t for t in map(_package, targets) if t != package)
    extra = {p: sorted(found.get(p, set()) - allowed) for p, allowed in ALLOWED.items()}
    assert {p: e for p, e in extra.items() if e} == {}


def test_there_is_no_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            connect(v)
    assert cycles == []


def test_the_layer_checks_see_imports_inside_functions_but_not_type_only_ones():
    """The reader is what the checks stand on: a function-level import is an edge."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..log.state import RunState\n"
        "def f():\n    from ..app import launch\n"
    )
    found = _imports("orchestrator.engine.probe", source)
    assert "orchestrator.app.launch" in found
    assert "orchestrator.log.state" not in found


# A task's kind is its plugin's capabilities (``runs_command``, ``supports_cost``)
# or what its task.scheduled recorded, never its plugin's name. The one place a
# name stands for a kind: the upcast of logs from before the kind was recorded.
NAME_UPCASTS = {("orchestrator.log.events", "ran_command")}


def _plugin_name_comparisons(module: str, source: str, names: set[str]) -> list[str]:
    """``module:line: comparison`` for each comparison with a string among ``names`` (``x == "a"``, ``x in ("a",)``)."""
    tree = ast.parse(source)
    skipped = {
        id(node)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef) and (module, fn.name) in NAME_UPCASTS
        for node in ast.walk(fn)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or id(node) in skipped:
            continue
        for operand in (node.left, *node.comparators):
            items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            if any(isinstance(i, ast.Constant) and i.value in names for i in items):
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
                break
    return found


def test_no_module_but_the_plugins_and_the_registry_compares_a_plugin_name():
    from orchestrator.runner.registry import PLUGIN_MODULES

    names = set(PLUGIN_MODULES)
    found = [
        hit
        for name, (path, _) in sorted(MODULES.items())
        if name != REGISTRY and not _under(name, "runner_plugins")
        for hit in _plugin_name_comparisons(name, path.read_text("utf-8"), names)
    ]
    # the report's templates are code too
    for path in sorted((ROOT / "orchestrator").rglob("*.j2")):
        text = path.read_text("utf-8")
        found += [f"{path.relative_to(ROOT)}: == {n!r}" for n in names if f'== "{n}"' in text or f"== '{n}'" in text]
    assert found == []


def test_the_plugin_name_check_sees_equality_and_membership_but_not_the_upcast():
    """What the check stands on: it finds each form of comparison, and spares only the named upcast."""
    source = (
        'def f(p):\n    return p.plugin != "command" or p in ("x", "codex") or "claude-code" == p\n'
        'def ran_command(plugin):\n    return plugin == "command"\n'
    )
    names = {"command", "codex", "claude-code"}
    assert len(_plugin_name_comparisons("orchestrator.tui_probe", source, names)) == 4
    assert len(_plugin_name_comparisons("orchestrator.log.events", source, names)) == 3  # f, not the upcast


def test_the_application_report_and_image_enter_the_runner_only_through_its_package():
    """They import ``orchestrator.runner`` names (its deliberate export list), never a runner module."""
    offending = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if _under(m, "orchestrator.app", "orchestrator.report", "orchestrator.agent_image")
        for t in targets
        if _under(t, "orchestrator.runner") and t != "orchestrator.runner"
    )
    assert offending == []


# The runner's contract with the engine and the plugins: what a task is (types), what a
# plugin is (plugin, structured), what a runner is (base) and where plugins are found
# (registry). Every other runner module is private to the runner.
RUNNER_CONTRACT = {f"orchestrator.runner.{m}" for m in ("types", "plugin", "structured", "base", "registry")}


def test_outside_the_runner_only_its_package_and_its_contract_modules_are_imported():
    """The runner's other modules are private: no module outside the runner imports one."""
    offending = sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if not _under(m, "orchestrator.runner")
        for t in targets
        if _under(t, "orchestrator.runner") and t != "orchestrator.runner" and t not in RUNNER_CONTRACT
    )
    assert offending == []


def test_no_test_module_imports_another_test_modules_private_names():
    """Helpers tests share live in helper modules (or are public); a ``_name`` stays in its own test file."""
    tests = ROOT / "tests"
    test_modules = {p.stem for p in tests.glob("test_*.py")}
    found = sorted(
        f"{path.name}: from {node.module} import {alias.name}"
        for path in tests.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in test_modules
        for alias in node.names
        if alias.name.startswith("_")
    )
    assert found == []


# The run's log is folded once: orchestrator/log/state.py (RunState, one apply function per
# payload type). The dashboard, the console, the report and the spend chart read that fold.
def _payload_type_tests(module: str, source: str) -> list[str]:
    """``module:line: code`` for each isinstance test against an event payload type (outside an assert),
    and each walk over a log's typed records: the makings of another fold."""
    from orchestrator.log.events import PAYLOAD_TYPES

    payloads = {cls.__name__ for cls in PAYLOAD_TYPES.values()}
    tree = ast.parse(source)
    modules, names = set(), set()  # what the events module and its payload types are called here
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("log.events"):
            names.update(a.asname or a.name for a in node.names if a.name in payloads)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith("log"):
            modules.update(a.asname or a.name for a in node.names if a.name == "events")
    asserted = {id(n) for a in ast.walk(tree) if isinstance(a, ast.Assert) for n in ast.walk(a)}

    def is_payload(c: ast.expr) -> bool:
        if isinstance(c, ast.Attribute):
            return isinstance(c.value, ast.Name) and c.value.id in modules and c.attr in payloads
        return isinstance(c, ast.Name) and c.id in names

    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in asserted:
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(is_payload(k) for k in kinds):
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(func, ast.Attribute) and func.attr == "records":
            found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_run_is_folded_once_by_the_log_and_read_by_everyone_else():
    """Issue 45: no module outside orchestrator/log tests payload types or walks typed records (a second fold)."""
    found = [
        hit
        for name, (path, _) in sorted(MODULES.items())
        if not _under(name, "orchestrator.log")
        for hit in _payload_type_tests(name, path.read_text("utf-8"))
    ]
    assert found == []


def test_the_fold_check_sees_type_tests_and_record_walks_but_not_asserts_or_other_classes():
    """What the check stands on: each form of a second fold is found; a result's assert and an exception are not."""
    source = (
        "from ..log import events as E\n"
        "from ..log.events import TaskStarted as Started, Progress\n"
        "from ..errors import BudgetReached\n"
        "def fold(path, p, exc):\n"
        "    for _, ev, q in LogReader(path).records():\n"
        "        if isinstance(q, (E.BudgetCap, E.BudgetSpend)) or isinstance(q, Started) or isinstance(q, Progress):\n"
        "            pass\n"
        "    assert isinstance(p, E.TaskCompleted)\n"
        "    return isinstance(exc, BudgetReached) or isinstance(p, dict)\n"
    )
    assert len(_payload_type_tests("orchestrator.report.probe", source)) == 4


# Tests share their helpers through helper modules (tests/*_helpers.py, shared_runs.py, scenarios.py, conftest.py's
# fixtures), never by importing another test module: that module's tests would be collected twice under two names,
# and its private helpers would become an interface nobody declared.
TESTS = Path(__file__).resolve().parent


def _test_module_imports(source: str, test_modules: set[str]) -> list[tuple[int, str, str]]:
    """(line, test module, name) for each name imported from a test module, in functions too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module in test_modules:
            found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, "") for a in node.names if a.name in test_modules]
    return found


def _imports_from_test_modules() -> list[str]:
    test_modules = {p.stem for p in TESTS.glob("test_*.py")}
    return [
        f"{path.name}:{line}: {module} {name}".rstrip()
        for path in sorted(TESTS.glob("*.py"))
        for line, module, name in _test_module_imports(path.read_text("utf-8"), test_modules)
    ]


def test_no_test_imports_a_private_name_from_another_test_module():
    assert [hit for hit in _imports_from_test_modules() if hit.rsplit(" ", 1)[-1].startswith("_")] == []


def test_tests_share_helpers_through_helper_modules_not_test_modules():
    assert _imports_from_test_modules() == []


def test_the_test_import_check_sees_every_form():
    source = (
        "from test_a import _helper, PUBLIC\n"
        "import test_b\n"
        "from test_helpers_like import x\n"
        "from orchestrator.agent_image.build import test_image_is_current\n"
        "def f():\n"
        "    from test_a import run\n"
    )
    found = _test_module_imports(source, {"test_a", "test_b"})
    assert found == [(1, "test_a", "_helper"), (1, "test_a", "PUBLIC"), (2, "test_b", ""), (6, "test_a", "run")]
