"""The report of a large run stays small, and a strategy's own sections render (engine, scripted runner, real git)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from conftest import git, make_repo
from engine_helpers import run_engine, run_manifest

from orchestrator.engine.testing import ScriptedRunner, success
from orchestrator.log.runs import RunDirs, RunManifest
from orchestrator.report import write_report

TASKS = 200
LINES = 2_500  # per branch: ~40 KB of diff each, ~8 MB for the run before any cut


def _branches(repo: Path, count: int) -> list[str]:
    """``count`` real commits on their own branches, each adding one long file; returns their shas."""
    shas = []
    for i in range(count):
        blob = "".join(f"line {n} of candidate {i}: some generated content here\n" for n in range(LINES))
        (repo / "gen.txt").write_text(blob)
        git(repo, "switch", "-q", "-c", f"cand{i}", "main")
        git(repo, "add", "gen.txt")
        git(repo, "commit", "-q", "-m", f"candidate {i}")
        shas.append(git(repo, "rev-parse", "HEAD"))
        git(repo, "switch", "-q", "main")
    return shas


def _manifest(tmp_path: Path, repo: Path, strategy_spec: str, name: str) -> RunManifest:
    return run_manifest(
        run_id="run_t",
        created_at="2026-11-23T00:00:00.000Z",
        prompt="make it so",
        strategy_spec=strategy_spec,
        strategy_name=name,
        repo_path=str(repo),
        docker_image="img",
        max_parallel=4,
    )


def _dirs(tmp_path: Path) -> RunDirs:
    return RunDirs(logs=tmp_path / "logs", state=tmp_path / "state", results=tmp_path / "results")


@pytest.mark.slow
async def test_a_200_task_run_report_stays_under_5_mb_with_long_diffs_cut(tmp_path):
    repo = make_repo(tmp_path / "repo")
    shas = _branches(repo, TASKS)

    def script(req):
        i = int(req.task_key.rsplit("/", 1)[1])
        result = success(req, final_message=f"candidate {i} done " + "x" * 5000)
        artifact = result.artifact
        import msgspec

        return msgspec.structs.replace(
            result,
            artifact=msgspec.structs.replace(artifact, branch_final=f"cand{i}", commit=shas[i], lines_added=LINES),
        )

    async def many(prompt, base_branch, ctx):
        return await ctx.wait_all([ctx.run({"prompt": f"candidate {i}"}, key=ctx.key("c", i)) for i in range(TASKS)])

    await run_engine(tmp_path, many, ScriptedRunner(script), max_parallel=8)
    path = write_report(_dirs(tmp_path), _manifest(tmp_path, repo, "best-of-n", "custom"))
    page = path.read_text("utf-8")
    assert len(page.encode()) < 5_000_000
    assert all(f'data-key="run_t/s1/c/{i}"' in page for i in range(TASKS))
    assert "This diff is long and was cut here" in page
    assert "left out: the report&#39;s size budget for diffs is spent" in page
    assert f"git diff main...{shas[-1]}" in page


MODULE = """
async def two(prompt, base_branch, ctx):
    a = await ctx.wait(ctx.run({"prompt": "one"}, key=ctx.key("one")))
    return {"picked": a["artifact"]["branch_final"]}


def report_sections(run):
    tasks = run["tasks"]
    return [
        {"type": "table", "title": "My tasks", "columns": ["key", "state"],
         "rows": [[t["short_key"], t["state"]] for t in tasks], "highlight": [0]},
        {"type": "chart", "title": "My chart", "x_label": "step", "y_label": "value",
         "series": [{"name": "progress", "points": [[1, 2.5], [2, 3.5]]}]},
        {"type": "text", "title": "Picked", "text": "picked " + str(run["execution"]["result"]["picked"])},
        {"type": "table", "title": "Broken", "columns": "not a list"},
    ]
"""


async def test_a_custom_strategy_adds_sections_and_a_broken_one_is_named(tmp_path):
    repo = make_repo(tmp_path / "repo")
    (sha,) = _branches(repo, 1)
    spec = tmp_path / "mine.py"
    spec.write_text(MODULE)
    import importlib.util

    loaded = importlib.util.spec_from_file_location("mine", spec)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)

    def script(req):
        import msgspec

        r = success(req)
        return msgspec.structs.replace(
            r, artifact=msgspec.structs.replace(r.artifact, branch_final="cand0", commit=sha)
        )

    await run_engine(tmp_path, module.two, ScriptedRunner(script))
    dirs = _dirs(tmp_path)
    manifest = _manifest(tmp_path, repo, str(spec), "mine")
    page = write_report(dirs, manifest).read_text("utf-8")
    assert "My tasks" in page and '<tr class="hi"><td>one</td><td>COMPLETED</td></tr>' in page
    assert "My chart" in page and ">progress</text>" in page
    assert "picked cand0" in page
    assert "This section could not be shown" in page and "Broken" in page
    # rebuilt by loading the strategy file from the manifest: the same bytes
    again = write_report(dirs, manifest).read_text("utf-8")
    assert again == page
    await anyio.run_process(["git", "branch", "-D", "cand0"], cwd=repo)
    assert write_report(dirs, manifest).read_text("utf-8") == page  # the commit is still there, by sha
