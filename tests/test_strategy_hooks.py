"""One typed contract for a strategy's after-run hooks: found once by the loader,
called with a public RunView (built-ins and strategy files alike)."""

from __future__ import annotations

import textwrap

import pytest
from cli_helpers import cli_env, only_run_id, run_cli
from conftest import git, make_repo

from orchestrator.errors import StrategyLoadError
from orchestrator.strategy import HOOK_NAMES, RunView, StrategyHooks
from orchestrator.strategy_loader import load_strategy

HOOKED = textwrap.dedent(
    """
    from orchestrator.strategy import Context, RunView


    async def hooked(prompt, base_branch, ctx: Context):
        a = await ctx.wait(ctx.run({"prompt": "SIM: write keep.txt k", "base_branch": base_branch}, key=ctx.key("keep")))
        b = await ctx.wait(ctx.run({"prompt": "SIM: write drop.txt d", "base_branch": base_branch}, key=ctx.key("drop")))
        (ctx.output_dir() / "drop.txt").write_text(b["artifact"]["branch_final"])
        return {"kept": a["artifact"]["branch_final"]}


    def branches_to_delete(run: RunView) -> list[str]:
        return [(run.output_dir / "drop.txt").read_text()]


    def show_run_report(run: RunView) -> list[str]:
        print(f"hook saw {run.run_id}: executions {run.executions}, {len(run.task_keys)} task(s)")
        return ["a problem the strategy's own report found"]
    """
)


def test_the_loader_finds_the_hooks_once_and_refuses_a_hook_that_is_not_a_function(tmp_path):
    path = tmp_path / "hooked.py"
    path.write_text(HOOKED)
    loaded = load_strategy(str(path))
    assert loaded.hooks.branches_to_delete is not None and loaded.hooks.show_run_report is not None
    assert loaded.hooks.claimed_branches is None and loaded.hooks.report_sections is None
    assert set(HOOK_NAMES) == {"report_sections", "branches_to_delete", "show_run_report", "claimed_branches"}
    tree = load_strategy("tree-beam").hooks
    assert all(getattr(tree, name) is not None for name in HOOK_NAMES)
    assert load_strategy("simple").hooks == StrategyHooks()
    bad = tmp_path / "bad.py"
    bad.write_text(HOOKED + "\nclaimed_branches = ['not', 'a', 'function']\n")
    with pytest.raises(
        StrategyLoadError, match=r"^claimed_branches in .*bad\.py \(strategy 'hooked'\) must be a function"
    ):
        load_strategy(str(bad))
    assert RunView.__struct_fields__ == (
        "run_id",
        "prompt",
        "repo_path",
        "base_branch",
        "events_path",
        "logs_dir",
        "output_dir",
        "executions",
        "task_keys",
    )


@pytest.mark.docker
def test_a_strategy_files_hooks_run_after_the_run_and_in_show_run(tmp_path):
    """--show-run called show_run_report of built-in strategies only; a strategy file's was never called."""
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    strategy = tmp_path / "hooked.py"
    strategy.write_text(HOOKED)
    env = cli_env(tmp_path)
    done = run_cli(
        ["go", "--strategy", str(strategy), "--repo", str(repo), "--dry-run", "--no-tui"], cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run_id = only_run_id(tmp_path)
    heads = git(repo, "branch", "--format=%(refname:short)").split()
    dropped = (tmp_path / "results" / run_id / "strategy_output" / "drop.txt").read_text()
    assert dropped not in heads and len(heads) == 2  # main and the kept branch
    assert "hooked: deleted 1 branch(es) it no longer needs" in done.stderr

    shown = run_cli(["--show-run", run_id], cwd=tmp_path, env=env)
    assert shown.returncode == 1, shown.stdout[-2000:] + shown.stderr[-2000:]
    assert f"hook saw {run_id}: executions {{'s1': 'success'}}, 2 task(s)" in shown.stdout
    assert "✗ a problem the strategy's own report found" in shown.stdout
