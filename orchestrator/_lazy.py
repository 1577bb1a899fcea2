"""Lazy re-exports for package ``__init__`` modules: a name's submodule loads when the name is first read."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def exports(table: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """A package's export table: ``{submodule: (names, ...)}`` read as ``{name: submodule}``.

    The package writes the same names again under ``if TYPE_CHECKING:`` as
    ``from .submodule import Name as Name`` (for the type checker and the
    linter); tests/test_lazy_imports.py fails when the two differ.
    """
    return {name: module for module, names in table.items() for name in names}


def lazy_attr(package: str, exports: dict[str, str], name: str) -> Any:
    """The value of ``name`` from ``package.<exports[name]>``, for a package's module ``__getattr__``."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{package}.{module}"), name)
    setattr(sys.modules[package], name, value)
    return value


def lazy_module(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """``package``'s module ``__getattr__`` over its export table, and its ``__all__``."""

    def __getattr__(name: str) -> Any:
        return lazy_attr(package, exports, name)

    return __getattr__, sorted(exports)
