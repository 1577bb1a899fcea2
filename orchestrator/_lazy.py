"""Lazy re-exports for package ``__init__`` modules: a name's submodule loads when the name is first read."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _type_checking_imports(package: str) -> dict[str, str]:
    """``{name: submodule}`` from the package's ``if TYPE_CHECKING:`` block of ``from .sub import Name as Name``: the
    export table the type checker and the linter read as re-exports, so there is no second list to drift apart."""
    source = Path(sys.modules[package].__file__ or "").read_text("utf-8")
    table: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module) or any(
                alias.asname != alias.name for alias in stmt.names
            ):
                raise ImportError(f"{package}: write each export as `from .module import Name as Name`")
            table.update((alias.name, str(stmt.module)) for alias in stmt.names)
    return table


def lazy_module(package: str) -> tuple[Callable[[str], Any], list[str]]:
    """``package``'s module ``__getattr__`` over its ``TYPE_CHECKING`` exports, and its ``__all__``."""
    exports = _type_checking_imports(package)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__, sorted(exports)
