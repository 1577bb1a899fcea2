"""Finding a strategy (``--strategy``) and typing its ``-S`` parameters from its keyword-only arguments
(docs/strategies.md: what a strategy looks like, its parameters and ``@strategy_options``)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
import traceback
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import msgspec

from .errors import ConfigError, StrategyLoadError
from .parsing import did_you_mean, parse_value

# Defined in the strategy authors' module; strategies used to import it from here, which keeps working.
from .strategy import HOOK_NAMES, StrategyHooks, StrategyOptions
from .strategy import strategy_options as strategy_options

BUILTINS: dict[str, str] = {
    "simple": "strategies.simple:simple",
    "best-of-n": "strategies.best_of_n:best_of_n",
    "iterative": "strategies.iterative:iterative",
    "plan-score-implement": "strategies.plan_score_implement:plan_score_implement",
    "tree-beam": "strategies.tree_beam:tree_beam",
    "evolve": "strategies.evolve:evolve",
    "review-loop": "strategies.review_loop:review_loop",
    "synthesize": "strategies.synthesize:synthesize",
}


class ParamSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    type: Any
    default: Any = None
    required: bool = False
    help: str = ""

    def type_name(self) -> str:
        return _type_name(self.type)


class LoadedStrategy(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    spec: str
    fn: Callable[..., Any]
    module: types.ModuleType
    params: dict[str, ParamSpec]
    options: StrategyOptions
    source: str  # file path or module name, for messages
    hooks: StrategyHooks = StrategyHooks()

    def describe(self) -> str:
        lines = [f"{self.name}: {(inspect.getdoc(self.fn) or '').splitlines()[0] if inspect.getdoc(self.fn) else ''}"]
        for p in self.params.values():
            default = "required" if p.required else f"default {json.dumps(p.default)}"
            lines.append(f"  -S {p.name}=<{p.type_name()}>  {p.help} ({default})")
        return "\n".join(lines)


def load_strategy(spec: str) -> LoadedStrategy:
    """Load a built-in, a file or a module function; errors are one clear line."""
    if not spec or not spec.strip():
        raise StrategyLoadError("--strategy is empty; use a built-in name (" + ", ".join(BUILTINS) + ") or a file")
    name = spec
    target = BUILTINS.get(spec)
    if target is not None:
        module_name, func_name = target.split(":")
        module = _import_module(module_name, spec)
        fn = getattr(module, func_name)
    else:
        windows_path = len(spec) > 2 and spec[1] == ":" and spec[2] in "\\/"  # C:\x.py is no module:function
        path_part, _, func_name = (spec, "", "") if windows_path else spec.partition(":")
        if path_part.endswith(".py") or "/" in path_part or Path(path_part).exists():
            module = _import_file(Path(path_part))
            fn = _pick_function(module, func_name or None, path_part)
            name = func_name or fn.__name__
        elif func_name:
            module = _import_module(path_part, spec)
            fn = getattr(module, func_name, None)
            if fn is None:
                raise StrategyLoadError(f"module {path_part} has no function {func_name!r}")
            name = func_name
        else:
            guess = did_you_mean(spec.strip().lower().replace("_", "-"), list(BUILTINS))
            raise StrategyLoadError(
                f"unknown strategy {spec!r}{guess}; use one of {', '.join(BUILTINS)}, a file like ./my_strategy.py "
                "or package.module:function"
            )
    source = getattr(module, "__file__", None) or module.__name__  # a file, not its synthetic module name
    if not inspect.iscoroutinefunction(fn):
        raise StrategyLoadError(f"strategy {name!r} in {source} must be an 'async def' function")
    if not _is_strategy_shape(fn):
        raise StrategyLoadError(f"strategy {name!r} must take (prompt, base_branch, ctx) positionally")
    return LoadedStrategy(
        name=name.replace("_", "-") if name in {v.split(":")[1] for v in BUILTINS.values()} else name,
        spec=spec,
        fn=fn,
        module=module,
        params=_params_of(fn),
        options=getattr(fn, "__orchestrator_options__", StrategyOptions()),
        source=source,
        hooks=_hooks_of(module, name, source),
    )


def _hooks_of(module: types.ModuleType, name: str, where: str) -> StrategyHooks:
    """The module's after-run hooks (see :class:`~orchestrator.strategy.StrategyHooks`), found once here."""
    found = {}
    for hook in HOOK_NAMES:
        value = getattr(module, hook, None)
        if value is None:
            continue
        if not callable(value):
            raise StrategyLoadError(f"{hook} in {where} (strategy {name!r}) must be a function; rename it or define it")
        found[hook] = value
    return StrategyHooks(**found)


def _import_module(module_name: str, spec: str) -> types.ModuleType:
    try:
        return importlib.import_module(module_name)
    except SyntaxError as exc:
        raise StrategyLoadError(f"{exc.filename}:{exc.lineno}: syntax error in strategy: {exc.msg}") from None
    except ModuleNotFoundError as exc:
        raise StrategyLoadError(
            f"cannot import strategy module {module_name!r} ({exc}); check --strategy {spec}"
        ) from None
    except Exception as exc:
        raise StrategyLoadError(
            f"importing strategy module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None


def _import_file(path: Path) -> types.ModuleType:
    if not path.is_file():
        raise StrategyLoadError(f"strategy file {path} does not exist")
    resolved = path.resolve()
    mod_name = f"orchestrator_user_strategy_{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    try:
        source = resolved.read_text("utf-8")
        code = compile(source, str(resolved), "exec")
    except SyntaxError as exc:
        raise StrategyLoadError(f"{path}:{exc.lineno}: syntax error in strategy file: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StrategyLoadError(f"cannot read strategy file {path}: {exc}") from None
    module = types.ModuleType(mod_name)
    module.__file__ = str(resolved)
    sys.modules[mod_name] = module
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        del sys.modules[mod_name]
        frames = traceback.extract_tb(exc.__traceback__)
        line = next((f.lineno for f in reversed(frames) if f.filename == str(resolved)), None)
        where = f"{path}:{line}" if line else str(path)
        raise StrategyLoadError(f"{where}: loading the strategy file failed: {type(exc).__name__}: {exc}") from None
    return module


def _is_strategy_shape(fn: Any) -> bool:
    if not inspect.iscoroutinefunction(fn):
        return False
    positional = [
        p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(positional) >= 3


def _pick_function(module: types.ModuleType, func_name: str | None, path: str) -> Callable[..., Any]:
    if func_name:
        fn = getattr(module, func_name, None)
        if fn is None:
            raise StrategyLoadError(f"strategy file {path} has no function {func_name!r}")
        return fn
    fn = getattr(module, "strategy", None)
    if fn is not None and callable(fn):
        return fn
    candidates = [
        v
        for k, v in vars(module).items()
        if not k.startswith("_") and getattr(v, "__module__", None) == module.__name__ and _is_strategy_shape(v)
    ]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise StrategyLoadError(
            f"strategy file {path} has no strategy function; define 'async def strategy(prompt, base_branch, ctx)'"
        )
    names = ", ".join(sorted(c.__name__ for c in candidates))
    raise StrategyLoadError(f"strategy file {path} has several strategy functions ({names}); pick one with {path}:NAME")


def _parameter_hints(fn: Callable[..., Any], names: list[str]) -> dict[str, Any]:
    """The evaluated annotations of the parameters ``names`` only: under ``from __future__ import annotations``,
    ``ctx: Context`` and the return may name what a strategy imports for its type checker alone."""
    inner = inspect.unwrap(fn)  # a decorator's wrapper: the names resolve where the function was written
    raw = getattr(inner, "__annotations__", {})
    wanted = types.SimpleNamespace(__annotations__={n: raw[n] for n in names if n in raw})
    try:
        return typing.get_type_hints(wanted, globalns=getattr(inner, "__globals__", {}), include_extras=True)
    except Exception as exc:
        name = getattr(fn, "__name__", "strategy")
        raise StrategyLoadError(
            f"strategy {name!r}: a parameter's annotation cannot be evaluated "
            f"({type(exc).__name__}: {exc}); import the names it uses at module level"
        ) from None


def _params_of(fn: Callable[..., Any]) -> dict[str, ParamSpec]:
    wanted = []
    positional = 0
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and positional < 3:
            positional += 1
        elif p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            wanted.append(p)
    hints = _parameter_hints(fn, [p.name for p in wanted])
    params: dict[str, ParamSpec] = {}
    for p in wanted:
        ann = hints.get(p.name, p.annotation)
        help_text = ""
        if get_origin(ann) is typing.Annotated:
            ann, *extras = get_args(ann)
            help_text = next((e for e in extras if isinstance(e, str)), "")
        if ann is inspect.Parameter.empty:
            ann = type(p.default) if p.default is not inspect.Parameter.empty and p.default is not None else str
        required = p.default is inspect.Parameter.empty
        params[p.name] = ParamSpec(
            name=p.name, type=ann, default=None if required else p.default, required=required, help=help_text
        )
    return params


def _type_name(t: Any) -> str:
    if get_origin(t) is Literal:
        return "|".join(str(a) for a in get_args(t))
    args = [a for a in get_args(t) if a is not type(None)]
    if get_origin(t) in (typing.Union, types.UnionType) and len(args) == 1:
        return _type_name(args[0])
    return getattr(t, "__name__", str(t))


def coerce(spec: ParamSpec, value: Any) -> Any:
    """Check ``value`` against the declared type; convert where it is lossless."""
    t = spec.type
    args = [a for a in get_args(t) if a is not type(None)]
    if get_origin(t) in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        if len(args) == 1:
            t = args[0]
    origin = get_origin(t) or t
    ok = True
    if origin is Literal:
        ok = value in get_args(t)
    elif t is Any:
        pass
    elif origin is bool:
        ok = isinstance(value, bool)
    elif origin is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif origin is float:
        if isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok = isinstance(value, float)
    elif origin is str:
        if not isinstance(value, str):
            value = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    elif origin in (list, tuple):
        ok = isinstance(value, list)
    elif origin is dict:
        ok = isinstance(value, dict)
    if not ok:
        raise ConfigError(f"strategy parameter {spec.name} expects {spec.type_name()}, got {value!r}")
    return value


def _accepts_text(t: Any) -> bool:
    if t is str:
        return True
    if get_origin(t) is Literal:
        return any(isinstance(a, str) for a in get_args(t))
    if get_origin(t) in (typing.Union, types.UnionType):
        return any(_accepts_text(a) for a in get_args(t) if a is not type(None))
    return False


def parse_params(loaded: LoadedStrategy, pairs: list[str], *, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Turn ``-S key=value`` pairs (plus config-file values in ``base``) into typed parameters."""
    accepted = ", ".join(loaded.params) or "(none)"
    values: dict[str, Any] = dict(base or {})
    raw_text: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"-S {pair!r} is missing '='; write -S key=value (accepted keys: {accepted})")
        key, _, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        values[key] = parse_value(raw)
        raw_text[key] = raw
    out: dict[str, Any] = {}
    for key, value in values.items():
        spec = loaded.params.get(key)
        if spec is None:
            guess = did_you_mean(key, list(loaded.params))
            raise ConfigError(f"strategy {loaded.name} has no parameter {key!r}{guess}; accepted: {accepted}")
        if key in raw_text and _accepts_text(spec.type):
            # A string parameter gets exactly what was typed: -S test_command=true is the shell
            # command `true`, not the boolean True.
            try:
                out[key] = coerce(spec, raw_text[key])
                continue
            except ConfigError:
                pass
        out[key] = coerce(spec, value)
    for spec in loaded.params.values():
        if spec.required and spec.name not in out:
            raise ConfigError(f"strategy {loaded.name} needs -S {spec.name}=<{spec.type_name()}> ({spec.help})")
        if spec.name not in out:
            out[spec.name] = spec.default
    return out
