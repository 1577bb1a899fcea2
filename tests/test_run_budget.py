"""The run-wide spending cap (issue 29): the real command, real Docker, the simulated agent's reported usage.

Every simulated agent turn reports its usage (about 12,000 input tokens, so
$0.036 at the Sonnet-like price the simulated agent charges); a one-file task
costs about $0.073 (24,330 tokens), a review about the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser_helpers import load_page, page_requests
from cli_helpers import cli_env, only_run_id, run_cli, run_events, run_summary, strategy_args
from conftest import TEST_IMAGE, make_repo

pytestmark = pytest.mark.docker

IMG = ["--docker-image", TEST_IMAGE]
DRY = ["--dry-run", "--no-tui", *IMG]
TASK_COST = 0.0733  # one simulated one-file task (two turns)
EXIT_BUDGET_REACHED = 3


def _state_budget(tmp_path: Path, run_id: str) -> dict:
    header = (tmp_path / "state" / run_id / "state.json").read_bytes().split(b"\n", 1)[0]
    return json.loads(header.rsplit(b',"tasks":[', 1)[0] + b"}")["budget"]


def _started(events: list[dict], part: str = "") -> list[str]:
    return [e["key"] for e in events if e["type"] == "task.started" and part in e["key"]]


def _capped_run(tmp_path: Path, repo: Path, args: list[str], env: dict[str, str] | None = None) -> str:
    """The command with ``args``, as a dry run that must stop at the cap (exit 3); the run's id."""
    r = run_cli([*args, *DRY], cwd=repo, env=env or cli_env(tmp_path), timeout=300)
    assert r.returncode == EXIT_BUDGET_REACHED, r.stdout + r.stderr
    return only_run_id(tmp_path)


def test_best_of_n_stops_at_the_cap_with_its_exit_code_and_spend(tmp_path):
    """n=6 under a cap of two tasks: fewer than 6 candidates start, exit 3, spend <= cap + what was running."""
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    cap = 0.15
    r = run_cli(
        ["SIM: write f.txt x", *strategy_args("best-of-n", n=6), "--max-cost", str(cap), "--max-parallel", "2", *DRY],
        cwd=repo,
        env=env,
        timeout=300,
    )
    assert r.returncode == EXIT_BUDGET_REACHED, r.stdout + r.stderr
    run_id = only_run_id(tmp_path)
    events = run_events(tmp_path, run_id)
    generated = _started(events, "/gen/")
    assert 0 < len(generated) < 6, generated
    summary = run_summary(tmp_path, run_id)
    assert summary["status"] == "budget_reached"
    budget = summary["budget"]
    assert budget["reached"] is True and budget["max_cost_usd"] == cap
    # What was already running when the cap was reached may finish: at most max-parallel tasks past it.
    assert cap <= budget["spent_cost_usd"] <= cap + 2 * 0.075, budget  # (a review costs $0.0738)
    # The spend equals what the finished tasks reported (nothing counted twice, nothing lost).
    reported = sum(t["cost_usd"] or 0 for s in summary["strategies"] for t in s["tasks"])
    assert budget["spent_cost_usd"] == pytest.approx(reported, abs=1e-4)
    assert summary["strategies"][0]["status"] == "budget_reached"
    assert "Run Budget Reached" in r.stdout and "Spend: $" in r.stdout and "--max-cost" in r.stdout
    # The state (a fold of the events) and the log carry the same spend.
    assert _state_budget(tmp_path, run_id)["spent_cost_usd"] == pytest.approx(budget["spent_cost_usd"])
    reached = [e for e in events if e["type"] == "budget.reached"]
    assert len(reached) == 1 and reached[0]["payload"]["max_cost_usd"] == cap
    listed = run_cli(["--list-runs"], cwd=repo, env=env)
    assert "budget_reached" in listed.stdout and "cap: $" in listed.stdout, listed.stdout
    report = (tmp_path / "results" / run_id / "report.html").read_text()
    spend_card = report[report.index('id="spend"') :]
    assert "the cap was reached" in spend_card and "<svg" in spend_card and "cap (now $0.15)" in spend_card
    assert "(the best so far: the spending cap stopped it)" in report
    # The report's replay of best-of-n takes the run's path: refused tasks raise BudgetReached there too.
    assert "replay of strategy execution" not in (tmp_path / "logs" / run_id / "orchestration.jsonl").read_text()
    # Resumable: its object store stays, and the summary ends with what it keeps for the resume.
    assert list((tmp_path / "ws" / run_id).glob("objects_*.git/objects"))
    left = summary["leftovers"]
    assert left["branches"] == len(summary["branches"]) and left["containers"] and left["volumes"]
    *_, kept, give_up = r.stdout.rstrip().splitlines()
    assert kept == (
        f"Kept for orchestrator --resume {run_id}: {left['branches']} branch{'es' if left['branches'] != 1 else ''}, "
        f"{left['containers']} stopped containers and {left['volumes']} volumes"
    ), r.stdout[-1000:]
    assert give_up == f"To give the run up instead (the branches stay): orchestrator --cleanup-run {run_id}"


def test_runs_share_one_cap(tmp_path):
    """--runs 3 under one cap that a single execution alone would never reach."""
    repo = make_repo(tmp_path / "repo")
    run_id = _capped_run(
        tmp_path, repo, ["SIM: write f.txt x", "--runs", "3", "--max-parallel", "1", "--max-cost", "0.1"]
    )
    started = _started(run_events(tmp_path, run_id))
    # Each execution runs one task of $0.073, under $0.10; together the second one crosses the cap.
    assert len(started) == 2, started
    summary = run_summary(tmp_path, run_id)
    statuses = sorted(s["status"] for s in summary["strategies"])
    assert statuses == ["budget_reached", "success", "success"], statuses


def test_resume_with_a_higher_cap_finishes_and_runs_no_task_twice(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    run_id = _capped_run(
        tmp_path,
        repo,
        ["SIM: write f.txt x", *strategy_args("best-of-n", n=3), "--max-cost", "0.1", "--max-parallel", "1"],
        env,
    )
    before = _started(run_events(tmp_path, run_id))

    same = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env)
    assert same.returncode == 2
    assert same.stderr.strip().count("\n") == 0 and "still at its spending cap" in same.stderr, same.stderr

    done = run_cli(["--resume", run_id, "--no-tui", "--max-cost", "5"], cwd=repo, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    events = run_events(tmp_path, run_id)
    started = _started(events)
    assert len(started) == len(set(started)), started  # no task ran twice
    assert set(before) <= set(started) and len(started) == 6  # 3 candidates + 3 reviews
    summary = run_summary(tmp_path, run_id)
    assert summary["status"] == "completed" and summary["strategies"][0]["status"] == "success"
    assert summary["budget"]["max_cost_usd"] == 5 and summary["budget"]["reached"] is False
    assert summary["budget"]["spent_cost_usd"] == pytest.approx(6 * TASK_COST, rel=0.05)
    # The report's spend chart steps the cap up where the resume raised it.
    report = (tmp_path / "results" / run_id / "report.html").read_text()
    assert "cap (now $5.00)" in report and "$0.10" not in report.split('id="spend"')[1].split("</p>")[0]


def test_max_tokens_caps_subscription_mode_where_max_cost_is_refused(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    refused = run_cli(["SIM: write f.txt x", "--mode", "subscription", "--max-cost", "1", *DRY], cwd=repo, env=env)
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and "--max-tokens" in refused.stderr, refused.stderr
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())  # nothing half-written

    run_id = _capped_run(
        tmp_path,
        repo,
        ["SIM: write f.txt x", "--mode", "subscription", "--runs", "3", "--max-parallel", "1", "--max-tokens", "30000"],
        env,
    )
    assert len(_started(run_events(tmp_path, run_id))) == 2
    budget = run_summary(tmp_path, run_id)["budget"]
    assert budget["max_tokens"] == 30000 and budget["spent_tokens"] >= 30000 and budget["reached"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # the flag's words, not the configuration validator's ("budget.max_cost_usd: Expected `float` > 0.0")
        (["--max-cost", "-1"], "error: --max-cost must be a positive amount in US dollars, got -1"),
        (["--max-cost", "lots"], "error: --max-cost must be a positive amount in US dollars, got lots"),
        (["--max-tokens", "0"], "error: --max-tokens must be a whole number of tokens, at least 1, got 0"),
    ],
)
def test_bad_cap_values_are_one_line_and_exit_2(tmp_path, flags, expected):
    repo = make_repo(tmp_path / "repo")
    r = run_cli(["SIM: write f.txt x", *flags, *DRY], cwd=repo, env=cli_env(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().count("\n") == 0 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_bad_on_reached_in_the_config_file(tmp_path):
    repo = make_repo(tmp_path / "repo")
    (repo / "orchestrator.yaml").write_text("budget:\n  on_reached: later\n")
    r = run_cli(["SIM: write f.txt x", *DRY], cwd=repo, env=cli_env(tmp_path))
    assert r.returncode == 2 and "budget.on_reached" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


STOP_PROMPT = "SIM: exec echo one\nSIM: exec echo two\nSIM: sleep 6\nSIM: write f.txt x\nSIM: commit c"


def test_on_reached_stop_interrupts_with_sessions_and_resume_continues_them(tmp_path):
    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path, ORCHESTRATOR_BUDGET__ON_REACHED="stop")
    # Two turns ($0.07) cross $0.05 while the agent sleeps: it is stopped, not left to finish.
    run_id = _capped_run(tmp_path, repo, [STOP_PROMPT, "--max-cost", "0.05"], env)
    events = run_events(tmp_path, run_id)
    interrupted = [e for e in events if e["type"] == "task.interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["payload"].get("session_id"), interrupted
    session = interrupted[0]["payload"]["session_id"]
    assert not [e for e in events if e["type"] == "task.completed"]
    assert run_summary(tmp_path, run_id)["budget"]["on_reached"] == "stop"

    done = run_cli(["--resume", run_id, "--no-tui", "--max-cost", "5"], cwd=repo, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumes its agent session" in done.stderr, done.stderr
    events = run_events(tmp_path, run_id)
    restarted = [e for e in events if e["type"] == "task.started"][-1]
    assert restarted["payload"]["session_id"] == session
    completed = [e for e in events if e["type"] == "task.completed"]
    assert len(completed) == 1 and completed[0]["payload"]["session_id"] == session


CUSTOM = """
from orchestrator.strategy import BudgetReached, Context


async def capped(prompt: str, base_branch: str, ctx: Context):
    branches = []
    for i in range(5):
        try:
            result = await ctx.wait(ctx.run({"prompt": prompt}, key=ctx.key("t", i)))
        except BudgetReached as exc:
            # Command tasks are not agent spend: they still run at the cap.
            check = await ctx.wait(ctx.run({"plugin": "command", "command": "echo still-runs"}, key=ctx.key("check")))
            return {"done": len(branches), "stopped_at": exc.key.rsplit("/", 1)[-1],
                    "check": check["final_message"].strip(), "branch": branches[-1]}
        branches.append(result["artifact"]["branch_final"])
    return {"done": len(branches)}
"""


def test_a_custom_strategy_catches_budget_reached_and_returns_its_best(tmp_path):
    repo = make_repo(tmp_path / "repo")
    strategy = tmp_path / "capped.py"
    strategy.write_text(CUSTOM)
    run_id = _capped_run(
        tmp_path, repo, ["SIM: write f.txt x", "--strategy", f"{strategy}:capped", "--max-cost", "0.1"]
    )
    strat = run_summary(tmp_path, run_id)["strategies"][0]
    assert strat["status"] == "budget_reached"
    assert strat["result"]["done"] == 2 and strat["result"]["stopped_at"] == "2", strat["result"]
    assert "still-runs" in strat["result"]["check"]
    assert strat["selected_branch"] == strat["result"]["branch"]  # the best so far is the selection


LIVE = """
from orchestrator.strategy import BudgetReached, Context


async def live(prompt: str, base_branch: str, ctx: Context):
    long = ctx.run({"prompt": prompt}, key=ctx.key("long"))
    # Long enough for the container to start on a loaded machine and the three turns to stream;
    # the long task still sleeps then: only its usage lines have been counted.
    await ctx.sleep(12)
    try:
        ctx.run({"prompt": "SIM: write g.txt y"}, key=ctx.key("next"))
        refused = False
    except BudgetReached:
        refused = True
    first_done = long.done
    await ctx.wait(long)
    return {"refused": refused, "long_done_when_refused": first_done}
"""

LIVE_PROMPT = "SIM: exec echo one\nSIM: exec echo two\nSIM: exec echo three\nSIM: sleep 25\nSIM: write f.txt x"


def test_live_usage_stops_new_tasks_before_the_running_one_completes(tmp_path):
    repo = make_repo(tmp_path / "repo")
    strategy = tmp_path / "live.py"
    strategy.write_text(LIVE)
    run_id = _capped_run(tmp_path, repo, [LIVE_PROMPT, "--strategy", f"{strategy}:live", "--max-cost", "0.08"])
    result = run_summary(tmp_path, run_id)["strategies"][0]["result"]
    assert result == {"refused": True, "long_done_when_refused": False}
    events = run_events(tmp_path, run_id)
    order = [e["type"] for e in events]
    assert order.index("budget.reached") < order.index("task.completed")
    assert _started(events) == [f"{run_id}/s1/long"]


def test_a_built_in_strategy_returns_its_best_so_far_at_the_cap(tmp_path):
    """iterative: the cap refuses the first improvement; the generated candidate is returned and selected."""
    repo = make_repo(tmp_path / "repo")
    run_id = _capped_run(
        tmp_path, repo, ["SIM: write f.txt x", *strategy_args("iterative", iterations=3), "--max-cost", "0.1"]
    )
    started = [k.removeprefix(f"{run_id}/s1/") for k in _started(run_events(tmp_path, run_id))]
    assert started == ["gen", "review/iter-1/attempt-1"], started
    strat = run_summary(tmp_path, run_id)["strategies"][0]
    assert strat["status"] == "budget_reached"
    gen_branch = next(t["branch"] for t in strat["tasks"] if t["key"].endswith("/gen"))
    assert strat["selected_branch"] == gen_branch and gen_branch


def test_the_spend_chart_renders_in_a_real_browser_offline(tmp_path, browser):
    """The report of a capped run, in headless Chromium with the network off: the spend card and its chart."""
    from selenium.webdriver.common.by import By

    repo = make_repo(tmp_path / "repo")
    run_id = _capped_run(
        tmp_path, repo, ["SIM: write f.txt x", "--runs", "3", "--max-parallel", "1", "--max-cost", "0.1"]
    )
    load_page(browser, tmp_path / "results" / run_id / "report.html")
    card = browser.find_element(By.ID, "spend")
    assert card.is_displayed() and "the cap was reached" in card.text and "$0.10 cap" in card.text
    chart = card.find_element(By.CSS_SELECTOR, "svg.chart")
    assert chart.size["width"] > 300 and chart.size["height"] > 200
    assert len(chart.find_elements(By.CSS_SELECTOR, "path")) == 2  # the spend and the cap
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    assert [u for u in page_requests(browser) if not u.startswith("file://")] == []
