"""Importing the TUI, a strategy, the strategy authors' module or the strategy-facing engine does not load the Docker runner."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("orchestrator.runner.docker_runner", "orchestrator.runner.docker_containers", "docker")


@pytest.mark.parametrize(
    "module",
    [
        "tui",
        "tui.dashboard",
        "tui.model",
        "strategies.simple",
        "strategies.tree_beam",
        "strategies.evolve",
        "strategies.best_of_n",
        "strategies.review_loop",
        "strategies.iterative",
        "strategies.plan_score_implement",
        "orchestrator",
        "orchestrator.engine.context",
        "orchestrator.strategy",
    ],
)
def test_import_does_not_load_the_docker_runner(module):
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", (module, out)


def test_lazy_re_exports_still_resolve():
    code = (
        "from orchestrator import Engine, RunState, TaskFailed; from orchestrator.runner import DockerRunner, "
        "AuthConfig; import orchestrator, orchestrator.runner as r; "
        "print([n for p in (orchestrator, r) for n in p.__all__ if getattr(p, n, None) is None])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    with pytest.raises(AttributeError):
        __import__("orchestrator").no_such_name  # noqa: B018


@pytest.mark.parametrize(("package", "name"), [("orchestrator", "RunState"), ("orchestrator.runner", "AuthConfig")])
def test_lazy_re_export_is_cached_on_the_package(package, name):
    """The first read imports the submodule; the value then sits in the package's namespace."""
    code = (
        f"import importlib; p = importlib.import_module({package!r}); before = {name!r} in vars(p); "
        f"v = getattr(p, {name!r}); print(before, vars(p).get({name!r}) is v, v.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", name]


@pytest.mark.parametrize("package", ["orchestrator", "orchestrator.runner", "orchestrator.engine"])
def test_the_type_checkers_imports_are_the_export_table(package):
    """A package's ``if TYPE_CHECKING:`` imports are what runs: each name resolves to its submodule's object."""
    import ast
    import importlib

    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__).read_text("utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    seen = {alias.name: node.module for node in block.body for alias in node.names}
    assert module.__all__ == sorted(seen)
    for name, submodule in seen.items():
        assert getattr(module, name) is getattr(importlib.import_module(f"{package}.{submodule}"), name), name


def test_an_export_not_written_as_itself_stops_the_import(tmp_path):
    """``from .m import A as B`` under TYPE_CHECKING would tell the type checker a name that does not run."""
    pkg = tmp_path / "pkg_bad_export"
    pkg.mkdir()
    (pkg / "m.py").write_text("A = 1\n")
    (pkg / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nfrom orchestrator._lazy import lazy_module\n"
        "__getattr__, __all__ = lazy_module(__name__)\nif TYPE_CHECKING:\n    from .m import A as B\n"
    )
    code = "import pkg_bad_export"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1
    assert "pkg_bad_export: write each export as `from .module import Name as Name`" in proc.stderr


def test_unknown_name_names_the_package():
    with pytest.raises(AttributeError, match=re.escape("module 'orchestrator.runner' has no attribute 'no_such_name'")):
        __import__("orchestrator.runner").runner.no_such_name  # noqa: B018


def test_docker_py_starts_without_paramiko_and_an_ssh_engine_gets_it_back():
    """paramiko (0.2 CPU-s of every command) loads only once an ssh:// engine needs docker-py's ssh module."""
    code = (
        "import sys; import orchestrator.runner.docker_containers as d; d.default_client_factory; import docker; "
        "print('paramiko' in sys.modules, hasattr(docker.api.client, 'SSHHTTPAdapter')); "
        "import paramiko; print(paramiko.__name__); "
        "from orchestrator.runner import ssh_transport; "
        "c = docker.DockerClient(base_url='ssh://nobody@127.0.0.1:1', use_ssh_client=True, version='1.41'); "
        "print(type(c.api._custom_adapter).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # anyone else's `import paramiko` is not refused, and the ssh engine's client is built
    assert out.split() == ["False", "False", "paramiko", "SSHHTTPAdapter"], out


def test_configuration_without_a_yaml_file_does_not_load_pyyaml(tmp_path):
    """Every command loads the configuration; PyYAML (about 30 ms) only when there is a YAML file to read."""
    code = (
        "import sys; from orchestrator.config import load_config; "
        "load_config(config_file=None, cli_overrides={}); print('yaml' in sys.modules)"
    )
    run = lambda: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert run() == "False"
    (tmp_path / "orchestrator.yaml").write_text("runner:\n  max_turns: 3\n")
    assert run() == "True"
