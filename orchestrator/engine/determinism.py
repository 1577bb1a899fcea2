"""The determinism wall: a strategy calling ``time.time()``, ``random.*`` or ``uuid.uuid4()`` directly takes
another path when replayed after a crash, so its module's globals get proxies that report the call site (or raise
:class:`~orchestrator.errors.NondeterminismError` in strict mode). The real ``time``/``random`` modules are untouched.
"""

from __future__ import annotations

import datetime as _dt
import functools
import random as _random
import sys
import time as _time
import types
import uuid as _uuid
from collections.abc import Callable

from ..errors import NondeterminismError

ADVICE = {
    "time": "use ctx.now()",
    "datetime": "use ctx.now()",
    "random": "use ctx.rand()",
    "uuid": "derive ids from ctx.key(...) or ctx.rand()",
}

_FORBIDDEN = {
    _time: {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "sleep"},
    _random: {
        n
        for n in dir(_random)
        if not n.startswith("_") and callable(getattr(_random, n)) and n not in {"Random", "SystemRandom"}
    },
    _uuid: {"uuid1", "uuid4"},
}


class Reporter:
    """Collects reports; ``mode`` is ``warn`` (default), ``strict`` or ``off``."""

    def __init__(self, mode: str = "warn", sink: Callable[[str], None] | None = None) -> None:
        self.mode = mode
        self.sink = sink or (lambda msg: print(msg, file=sys.stderr))
        self.seen: set[tuple[str, int, str]] = set()

    def report(self, what: str, family: str) -> None:
        if self.mode == "off":
            return
        frame = sys._getframe(2)
        site = (frame.f_code.co_filename, frame.f_lineno, what)
        msg = (
            f"{site[0]}:{site[1]}: strategy code called {what} directly; "
            f"its value is not replayed on resume ({ADVICE[family]})"
        )
        if self.mode == "strict":
            raise NondeterminismError(msg)
        if site not in self.seen:
            self.seen.add(site)
            self.sink(f"warning: {msg}")


def _wrap(fn: Callable, what: str, family: str, reporter: Reporter) -> Callable:
    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        reporter.report(what, family)
        return fn(*args, **kwargs)

    return guarded


class _ModuleProxy(types.ModuleType):
    def __init__(self, module: types.ModuleType, names: set[str], family: str, reporter: Reporter) -> None:
        super().__init__(module.__name__)
        self._module, self._names, self._family, self._reporter = module, names, family, reporter

    def __getattr__(self, name: str):
        value = getattr(self._module, name)
        if name in self._names:
            return _wrap(value, f"{self._module.__name__}.{name}()", self._family, self._reporter)
        if self._module is _dt and name in ("datetime", "date"):
            return _class_proxy(value, self._reporter)
        return value


def _class_proxy(cls: type, reporter: Reporter):
    guarded = {
        meth: staticmethod(_wrap(getattr(cls, meth), f"{cls.__name__}.{meth}()", "datetime", reporter))
        for meth in ("now", "utcnow", "today")
        if hasattr(cls, meth)
    }
    return type(cls.__name__, (cls,), {**guarded, "__qualname__": cls.__qualname__})


def guard_module(module: types.ModuleType, reporter: Reporter) -> None:
    """Replace nondeterministic names in ``module``'s globals with reporting proxies."""
    if reporter.mode == "off":
        return
    families = {_time: "time", _random: "random", _uuid: "uuid", _dt: "datetime"}
    g = module.__dict__
    for name, value in list(g.items()):
        if isinstance(value, types.ModuleType) and value in families:
            g[name] = _ModuleProxy(value, _FORBIDDEN.get(value, set()), families[value], reporter)
        elif value in (_dt.datetime, _dt.date):
            g[name] = _class_proxy(value, reporter)
        else:
            for mod, names in _FORBIDDEN.items():
                for n in names:
                    if value is getattr(mod, n, None) and callable(value):
                        g[name] = _wrap(value, f"{mod.__name__}.{n}()", families[mod], reporter)
