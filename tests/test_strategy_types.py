"""The public strategy-author module: a type checker completes and checks what a strategy touches.

A user's strategy file, written with ``orchestrator.strategy``'s types, is run
through mypy exactly as a user would run it, and through the engine exactly as
``--strategy file.py`` runs it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO_ROOT
from engine_helpers import mypy, run_engine

from orchestrator.engine.testing import ScriptedRunner, failure, success
from orchestrator.strategy_loader import load_strategy, parse_params

GOOD = """\
from typing import Annotated, Any

from orchestrator.strategy import (BranchCleanupResult, Context, KeyedTaskInput, RetryPolicy, TaskFailed,
                                   TaskInput, TaskResult, strategy_options)


def prepare(params: dict[str, Any], repo_path: str) -> dict[str, Any]:
    return params


@strategy_options(prepare=prepare)
async def strategy(prompt: str, base_branch: str, ctx: Context, *,
                   n: Annotated[int, "drafts"] = 2) -> dict[str, Any]:
    handles = [ctx.run({"prompt": prompt, "base_branch": base_branch, "import_policy": "auto"},
                       key=ctx.key("draft", i), policy={"max_attempts": 2, "retry_on": ["api"]})
               for i in range(n)]
    ok, failed = await ctx.wait_all(handles, tolerate_failures=True)
    first: TaskResult = ok[0]
    branch: str | None = first["artifact"]["branch_final"]
    commit: str = first["artifact"]["commit"]
    changed: bool = first["artifact"]["has_changes"]
    cost: float | None = first["metrics"]["cost_usd"]
    errors: list[str] = [f.error_type for f in failed]
    review: TaskInput = {"prompt": "review", "import_policy": "never", "include_branches": [branch or base_branch]}
    if ctx.supports_output_schema():
        review["output_schema"] = {"type": "object"}
    checked = await ctx.wait(ctx.run(review, key=ctx.key("review"), policy=RetryPolicy(max_attempts=2)))
    every = await ctx.wait_all(handles)
    both = await ctx.parallel([({"plugin": "command", "command": "true"}, ctx.key("check", i)) for i in range(2)])
    keyed: list[KeyedTaskInput] = [{"prompt": "again", "key": ctx.key("again")}]
    again, lost = await ctx.parallel(keyed, tolerate_failures=True)
    cleanup: BranchCleanupResult = await ctx.wait(ctx.run({"delete_branches": [b for b in [branch] if b]},
                                                          key=ctx.key("cleanup")))
    try:
        await ctx.wait(ctx.run({"plugin": "command", "command": "false"}, key=ctx.key("fails")))
    except ctx.errors.TaskFailed as exc:
        why: str = exc.message
    except TaskFailed:
        raise
    await ctx.sleep(0)
    return {"branch": branch, "commit": commit, "changed": changed, "cost": cost, "errors": errors,
            "review": checked["output"], "every": len(every), "both": [r["exit_code"] for r in both],
            "again": [r["session_id"] for r in again], "lost": len(lost), "cleanup": cleanup["final_message"],
            "why": why, "now": ctx.now() > 0, "rand": 0 <= ctx.rand() < 1, "sid": ctx.strategy_execution_id}
"""

# Each line marked ``# E: text`` must be reported by mypy with that text; no other line may be.
BAD = """\
from orchestrator.strategy import Context, TaskInput


async def strategy(prompt: str, base_branch: str, ctx: Context) -> object:
    result = await ctx.wait(ctx.run({"prompt": prompt}, key=ctx.key("a")))
    branch = result["artifact"]["branch_fnal"]  # E: TypedDict "Artifact" has no key "branch_fnal"
    message = result["final_mesage"]  # E: TypedDict "TaskResult" has no key "final_mesage"
    task: TaskInput = {"promt": prompt}  # E: Extra key "promt" for TypedDict "TaskInput"
    policy: TaskInput = {"prompt": prompt, "import_policy": "nevr"}  # E: has type "Literal['nevr']"
    ok = await ctx.wait_all([ctx.run(task, key="b")], tolerate_failures=True)
    first = ok[0]["key"]  # E: No overload variant of "__getitem__" of "list" matches argument type "str"
    await ctx.wiat(ctx.run(policy, key="c"))  # E: "Context" has no attribute "wiat"
    cleaned = await ctx.wait(ctx.run({"delete_branches": ["x"]}, key="d"))
    gone = cleaned["artifact"]["branch_final"]  # E: Value of type "None" is not indexable
    return branch, message, first, gone
"""


@pytest.mark.slow
def test_mypy_completes_result_keys_and_flags_misspelt_ones(tmp_path):
    (tmp_path / "good_strategy.py").write_text(GOOD)
    (tmp_path / "bad_strategy.py").write_text(BAD)
    examples = sorted((REPO_ROOT / "examples" / "strategies").glob("*.py"))
    # the typed snippets of the strategy authors' guide too
    blocks = [
        b
        for b in re.findall(r"```python\n(.*?)```", (REPO_ROOT / "docs" / "strategies.md").read_text(), re.S)
        if "ctx: Context" in b
    ]
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        (tmp_path / f"doc_block_{i}.py").write_text(block)
    out = mypy(
        tmp_path / "good_strategy.py",
        tmp_path / "bad_strategy.py",
        *examples,
        *sorted(tmp_path.glob("doc_block_*.py")),
        cwd=tmp_path,
    )
    reported = {}
    for line in out.splitlines():
        m = re.match(r"(.+?):(\d+): error: (.*)", line)
        if m:
            reported.setdefault((m.group(1).rsplit("/", 1)[-1], int(m.group(2))), []).append(m.group(3))
    expected = {
        ("bad_strategy.py", i): text.split("  # E: ", 1)[1]
        for i, text in enumerate(BAD.splitlines(), 1)
        if "  # E: " in text
    }
    assert len(expected) == 7
    for where, text in expected.items():
        assert any(text in msg for msg in reported.get(where, [])), (where, text, out)
    # the correct file, every example, and the unmarked lines of the wrong one: no finding at all
    assert sorted(reported) == sorted(expected), out


async def test_the_typed_strategy_runs_through_the_loader_and_the_engine(tmp_path):
    path = tmp_path / "good_strategy.py"
    path.write_text(GOOD)
    loaded = load_strategy(str(path))
    assert loaded.options.prepare is not None
    params = parse_params(loaded, ["n=2"])
    assert params == {"n": 2}

    def script(req):
        if req.task_key.endswith("/fails"):
            return failure(req, error_type="command", message="exit 1")
        return success(req, output={"ok": True} if req.output_schema else None)

    _, state = await run_engine(tmp_path / "run", loaded.fn, ScriptedRunner(script), params=params)
    s1 = state.strategies["s1"]
    assert s1.status == "success", s1.error
    assert s1.result == {
        "branch": s1.result["branch"],
        "commit": s1.result["commit"],
        "changed": True,
        "cost": 0.01,
        "errors": [],
        "review": {"ok": True},
        "every": 2,
        "both": [None, None],
        "again": [s1.result["again"][0]],
        "lost": 0,
        "cleanup": "done",
        "why": "exit 1",
        "now": True,
        "rand": True,
        "sid": "s1",
    }
    assert s1.result["branch"].startswith("simple_run_t_")


def test_the_public_module_exports_what_a_strategy_needs():
    code = textwrap.dedent("""
        import sys, orchestrator.strategy as s
        need = {"Context", "Handle", "TaskInput", "TaskResult", "Artifact", "TaskMetrics", "KeyedTaskInput",
                "BranchCleanupTask", "BranchCleanupResult", "RetryPolicy", "RetryPolicyDict", "TaskFailed",
                "AggregateTaskFailed", "NoViableCandidates", "KeyConflictDifferentFingerprint", "StrategyError",
                "StrategyErrors", "ConfigError", "strategy_options", "replay_strategy", "ReplayOutcome", "ReplayError",
                "BudgetReached", "BudgetExhausted", "BudgetScope"}
        # what the import alone loaded, before the lazy replay exports are touched
        print(sorted(m for m in ("docker", "orchestrator.app.cli", "orchestrator.engine.engine") if m in sys.modules))
        print(sorted(need - set(s.__all__)), sorted(n for n in s.__all__ if not hasattr(s, n)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "[] []"]


def orchestrator_imports(path):
    """(line, module) for every import of an orchestrator module in ``path``, nested ones included."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "orchestrator"]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] == "orchestrator"
        ):
            if node.module == "orchestrator":  # from orchestrator import x: x is the module imported
                found += [(node.lineno, f"orchestrator.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def test_strategies_and_examples_import_only_the_public_module():
    files = sorted((REPO_ROOT / "strategies").glob("*.py")) + sorted((REPO_ROOT / "examples").rglob("*.py"))
    assert len(files) > 10
    offending = [
        f"{p.relative_to(REPO_ROOT)}:{line}: {module}"
        for p in files
        for line, module in orchestrator_imports(p)
        if module != "orchestrator.strategy"
    ]
    assert offending == [], "strategies may import from orchestrator.strategy only:\n" + "\n".join(offending)


def test_the_import_scan_sees_every_form(tmp_path):
    src = tmp_path / "s.py"
    src.write_text(
        "import orchestrator.errors\nfrom orchestrator import strategy, engine\n"
        "def f():\n    from orchestrator.engine.context import Handle\n"
        "from .budget import Budget\nimport orchestratorx\n"
    )
    assert orchestrator_imports(src) == [
        (1, "orchestrator.errors"),
        (2, "orchestrator.strategy"),
        (2, "orchestrator.engine"),
        (4, "orchestrator.engine.context"),
    ]
