"""Finding strategies (--strategy) and typing their -S parameters: every error is one clear line."""

from __future__ import annotations

import sys
import textwrap

import pytest

from orchestrator.errors import ConfigError, StrategyLoadError
from orchestrator.strategy_loader import BUILTINS, load_strategy, parse_params


def write(path, source: str):
    path.write_text(textwrap.dedent(source))
    return path


SHAPED = """
from typing import Annotated, Literal

async def strategy(prompt, base_branch, ctx, *, n: Annotated[int, "how many"] = 2,
                   mode: Literal["fast", "slow"] = "fast", ratio: float = 0.5, flag: bool = False,
                   tags: list = [], extra: dict = {}, model: str | None = None, name: str = "x"):
    return n
"""


@pytest.mark.parametrize("name", ["simple", "best-of-n", "iterative", "plan-score-implement", "synthesize"])
def test_builtin_names_load_with_their_display_name(name):
    loaded = load_strategy(name)
    assert loaded.name == name and loaded.spec == name
    assert loaded.module.__name__ == BUILTINS[name].split(":")[0]


def test_builtin_parameters_and_help():
    bon = load_strategy("best-of-n")
    assert bon.params["n"].default == 5 and bon.params["n"].type is int
    assert "-S n=<int>  number of candidates generated in parallel (default 5)" in bon.describe()
    assert load_strategy("iterative").params["iterations"].default == 3
    assert load_strategy("plan-score-implement").params["angles"].default == [
        "performance",
        "simplicity",
        "extensibility",
    ]


def test_file_file_func_and_module_func(tmp_path, monkeypatch):
    f = write(tmp_path / "mine.py", SHAPED + "\nasync def other(prompt, base_branch, ctx):\n    return 1\n")
    assert load_strategy(str(f)).fn.__name__ == "strategy"  # 'strategy' wins over other candidates
    other = load_strategy(f"{f}:other")
    assert other.name == "other" and other.params == {}
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg / "strategies.py", "async def go(prompt, base_branch, ctx, *, k: int = 1):\n    return k\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        loaded = load_strategy("mypkg.strategies:go")
        assert loaded.name == "go" and loaded.params["k"].default == 1
        with pytest.raises(StrategyLoadError, match="has no function 'nope'"):
            load_strategy("mypkg.strategies:nope")
    finally:
        for mod in ("mypkg", "mypkg.strategies"):
            sys.modules.pop(mod, None)


def test_single_public_async_function_is_picked_without_a_name(tmp_path):
    f = write(
        tmp_path / "one.py",
        "async def explore(prompt, base_branch, ctx):\n    return 1\nasync def _helper(a, b, c):\n    return 2\n",
    )
    assert load_strategy(str(f)).fn.__name__ == "explore"


def test_load_errors_are_one_line_naming_the_problem(tmp_path):
    with pytest.raises(StrategyLoadError, match=r"strategy file .*missing\.py does not exist"):
        load_strategy(str(tmp_path / "missing.py"))
    bad = write(tmp_path / "bad.py", "async def strategy(prompt, base_branch, ctx):\n    return (\n\nx = 1\n")
    with pytest.raises(StrategyLoadError) as err:
        load_strategy(str(bad))
    assert f"{bad}:2: syntax error" in str(err.value) and "\n" not in str(err.value)
    boom = write(tmp_path / "boom.py", "import json\nraise RuntimeError('nope')\n")
    with pytest.raises(StrategyLoadError, match=r"boom\.py:2: loading the strategy file failed: RuntimeError: nope"):
        load_strategy(str(boom))
    none = write(tmp_path / "none.py", "def helper():\n    return 1\n")
    with pytest.raises(StrategyLoadError, match="has no strategy function; define 'async def strategy"):
        load_strategy(str(none))
    several = write(tmp_path / "several.py", "async def a(p, b, ctx):\n    pass\nasync def b(p, b2, ctx):\n    pass\n")
    with pytest.raises(
        StrategyLoadError, match=r"several strategy functions \(a, b\); pick one with .*several\.py:NAME"
    ):
        load_strategy(str(several))
    sync = write(tmp_path / "sync.py", "def strategy(prompt, base_branch, ctx):\n    return 1\n")
    with pytest.raises(StrategyLoadError) as err:
        load_strategy(str(sync))
    assert str(err.value) == f"strategy 'strategy' in {sync.resolve()} must be an 'async def' function"
    short = write(tmp_path / "short.py", "async def strategy(prompt, ctx):\n    return 1\n")
    with pytest.raises(StrategyLoadError, match=r"must take \(prompt, base_branch, ctx\)"):
        load_strategy(str(short))
    with pytest.raises(
        StrategyLoadError, match=r"unknown strategy 'best-of-three' \(did you mean best-of-n\?\); use one of simple, "
    ):
        load_strategy("best-of-three")
    with pytest.raises(StrategyLoadError, match="unknown strategy 'zzz'; use one of simple, best-of-n"):
        load_strategy("zzz")  # nothing close: no guess
    with pytest.raises(StrategyLoadError, match=r"cannot import strategy module 'no_such_pkg\.x'"):
        load_strategy("no_such_pkg.x:f")


def test_s_values_are_typed_and_defaults_filled(tmp_path):
    loaded = load_strategy(str(write(tmp_path / "typed.py", SHAPED)))
    params = parse_params(
        loaded,
        ["n=7", "mode=slow", "ratio=2", "flag=true", 'tags=["a","b"]', 'extra={"k": 1}', "model=opus", "name=42"],
    )
    assert params == {
        "n": 7,
        "mode": "slow",
        "ratio": 2.0,
        "flag": True,
        "tags": ["a", "b"],
        "extra": {"k": 1},
        "model": "opus",
        "name": "42",
    }
    assert parse_params(loaded, ["model=none"])["model"] is None
    defaults = parse_params(loaded, [])
    assert defaults == {
        "n": 2,
        "mode": "fast",
        "ratio": 0.5,
        "flag": False,
        "tags": [],
        "extra": {},
        "model": None,
        "name": "x",
    }
    assert parse_params(loaded, [], base={"n": 3})["n"] == 3  # config-file values, overridden by -S
    assert parse_params(loaded, ["n=4"], base={"n": 3})["n"] == 4


@pytest.mark.parametrize(
    "pair, message",
    [
        ("n=abc", "strategy parameter n expects int, got 'abc'"),
        ("n=1.5", "strategy parameter n expects int, got 1.5"),
        ("flag=yes", "strategy parameter flag expects bool, got 'yes'"),
        ("mode=medium", "strategy parameter mode expects fast|slow, got 'medium'"),
        ("tags=notalist", "strategy parameter tags expects list, got 'notalist'"),
        ("extra=[1]", "strategy parameter extra expects dict, got [1]"),
        ("ratio=x", "strategy parameter ratio expects float, got 'x'"),
    ],
)
def test_bad_s_values_name_the_parameter_and_type(tmp_path, pair, message):
    loaded = load_strategy(str(write(tmp_path / "typed.py", SHAPED)))
    with pytest.raises(ConfigError) as err:
        parse_params(loaded, [pair])
    assert str(err.value) == message


def test_unknown_key_lists_accepted_ones_and_missing_equals_is_explained(tmp_path):
    loaded = load_strategy(str(write(tmp_path / "typed.py", SHAPED)))
    with pytest.raises(ConfigError) as err:
        parse_params(loaded, ["count=3"])
    assert str(err.value) == (
        "strategy strategy has no parameter 'count'; accepted: n, mode, ratio, flag, tags, extra, model, name"
    )
    with pytest.raises(ConfigError, match=r"-S 'n' is missing '='; write -S key=value \(accepted keys: n, mode"):
        parse_params(loaded, ["n"])
    # dashes in keys are accepted for underscores
    f = write(
        tmp_path / "dash.py", "async def strategy(prompt, base_branch, ctx, *, max_rounds: int = 1):\n    return 1\n"
    )
    assert parse_params(load_strategy(str(f)), ["max-rounds=2"]) == {"max_rounds": 2}


def test_required_parameters_must_be_given(tmp_path):
    f = write(
        tmp_path / "req.py",
        """
        from typing import Annotated
        async def strategy(prompt, base_branch, ctx, *, target: Annotated[str, "file to fix"], n: int = 1):
            return target
    """,
    )
    loaded = load_strategy(str(f))
    assert loaded.params["target"].required
    with pytest.raises(ConfigError) as err:
        parse_params(loaded, ["n=2"])
    assert str(err.value) == "strategy strategy needs -S target=<str> (file to fix)"
    assert parse_params(loaded, ["target=a.py"]) == {"target": "a.py", "n": 1}


def test_string_parameters_get_the_typed_text_verbatim(tmp_path):
    from orchestrator.strategy_loader import load_strategy, parse_params

    path = tmp_path / "s.py"
    path.write_text(
        "async def strategy(prompt, base_branch, ctx, *, cmd: str = 'x', n: int = 1, "
        "opt: str | None = None):\n    return cmd\n"
    )
    loaded = load_strategy(str(path))
    params = parse_params(loaded, ["cmd=true", "n=3", "opt=007"])
    assert params == {"cmd": "true", "n": 3, "opt": "007"}
    assert parse_params(loaded, ['cmd=["a", "b"]'])["cmd"] == '["a", "b"]'


def test_ctx_typed_through_a_type_checking_import_keeps_the_parameters_typed(tmp_path):
    # Importing the types for the type checker alone is the idiomatic form; the
    # unresolvable ``ctx: Context`` used to make every -S parameter an untyped string.
    f = write(
        tmp_path / "typed.py",
        """
        from __future__ import annotations

        import functools
        from typing import TYPE_CHECKING, Annotated

        if TYPE_CHECKING:
            from orchestrator.strategy import Context, TaskResult

        def logged(fn):
            @functools.wraps(fn)
            async def wrapper(*args, **kwargs):
                return await fn(*args, **kwargs)
            return wrapper

        async def strategy(prompt: str, base_branch: str, ctx: Context, *,
                           n: Annotated[int, "how many drafts"] = 2) -> TaskResult:
            raise NotImplementedError

        @logged
        async def wrapped(prompt: str, base_branch: str, ctx: Context, *, ratio: float = 0.5) -> TaskResult:
            raise NotImplementedError
    """,
    )
    loaded = load_strategy(str(f))
    assert loaded.params["n"].type is int and loaded.params["n"].help == "how many drafts"
    assert "-S n=<int>  how many drafts (default 2)" in loaded.describe()
    with pytest.raises(ConfigError, match="strategy parameter n expects int, got 'abc'"):
        parse_params(loaded, ["n=abc"])
    assert load_strategy(f"{f}:wrapped").params["ratio"].type is float


def test_a_parameter_annotation_that_cannot_be_evaluated_is_one_line(tmp_path):
    f = write(
        tmp_path / "unresolved.py",
        """
        from __future__ import annotations

        async def strategy(prompt, base_branch, ctx, *, n: Count = 2):
            return n
    """,
    )
    with pytest.raises(StrategyLoadError) as err:
        load_strategy(str(f))
    assert str(err.value) == (
        "strategy 'strategy': a parameter's annotation cannot be evaluated "
        "(NameError: name 'Count' is not defined); import the names it uses at module level"
    )
