"""The run report from real runs: the real command, real Docker, the sim agent, real git.

One run per built-in search strategy (module-scoped: the browser test reads the
same reports). Each report must name every task and branch, carry the
strategy's own facts (scores, the tree, the waves, the review rounds), keep
secrets out, and be rebuilt byte for byte by ``--show-run RUN_ID --html``
from the event log once the strategy's output files are gone.

The same reports are then loaded in a real browser, Debian's headless
Chromium with the network off: the page runs without console errors, nothing
is requested from outside the file, and clicking a tree node shows its detail.
Set REPORT_SCREENSHOTS_DIR to keep a desktop-width screenshot per strategy
(docs/img/ holds the ones the docs show).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from browser_helpers import load_page, page_requests
from cli_helpers import TEST_KEY, cli_env, run_cli, strategy_args
from conftest import TEST_IMAGE, make_repo
from scenarios import APPROACHES, BENCH, CALC, CANDIDATES, GOAL, GOALS_YAML, GOOD_SYNTH, STUCK_YAML, TESTS
from screen_checks import protocol_lines
from shared_runs import LazyRuns

pytestmark = pytest.mark.docker

IMG = ["--no-tui", "--docker-image", TEST_IMAGE]
SCORED = (
    "SIM: write a.txt from candidate zero\nSIM: commit add a\n"
    'SIM: print SIM: print-json {"score": 7, "rationale": "small and clear"}\n'
)


def _run(base: Path, name: str, repo_files: dict[str, str], args: list[str]) -> dict:
    root = base / name
    repo = make_repo(root / "repo", repo_files)
    env = cli_env(root)
    done = run_cli(args + IMG, cwd=repo, env=env, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in (root / "state").iterdir() if (p / "run.json").exists()]
    run_id = run_dir.name
    report = root / "results" / run_id / "report.html"
    assert f"Report: {root / 'results' / run_id}/report.html" in done.stdout
    return {
        "root": root,
        "repo": repo,
        "env": env,
        "run_id": run_id,
        "report": report,
        "html": report.read_text("utf-8"),
        "events": root / "logs" / run_id / "events.jsonl",
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("reports")
    ideas = base / "ideas"
    ideas.mkdir()
    (ideas / "fast.md").write_text("use a fast path\nSIM[coder]: write fast.txt 1\nSIM[coder]: commit fast path\n")
    (ideas / "slow.md").write_text("use a slow path\nSIM[coder]: write slow.txt 1\nSIM[coder]: commit slow path\n")
    return LazyRuns(
        {
            # the key in the prompt is shown in every task's prompt: the report must not show it
            "best-of-n": lambda: _run(
                base,
                "bon",
                {"README.md": "# demo\n"},
                [SCORED + f"the key is {TEST_KEY}\n", *strategy_args("best-of-n", n=3)],
            ),
            "tree-beam": lambda: _run(
                base,
                "tb",
                {"bench.py": BENCH},
                [
                    GOAL,
                    *strategy_args(
                        "tree-beam",
                        eval_command="python3 bench.py",
                        primary_metric="throughput",
                        ideas_per_node=2,
                        max_depth=2,
                        beam_width=1,
                    ),
                ],
            ),
            "evolve": lambda: _run(
                base,
                "ev",
                {"README.md": "# demo\n", "keep.txt": "keep\n", "GOALS.yaml": GOALS_YAML},
                [
                    "keep the project healthy",
                    *strategy_args("evolve", goals="GOALS.yaml", max_parallel=2, max_cycles=4),
                ],
            ),
            "review-loop": lambda: _run(
                base,
                "rl",
                {"bench.py": BENCH},
                [
                    "make the solver faster",
                    *strategy_args(
                        "review-loop",
                        ideas=ideas,
                        max_review_rounds=1,
                        eval_command="python3 bench.py",
                        primary_metric="throughput",
                    ),
                ],
            ),
            # a goal no fix can move, then one that moves (issue 30: the report must say which could not move)
            "evolve-stuck": lambda: _run(
                base,
                "evs",
                {"README.md": "# demo\n", "GOALS.yaml": STUCK_YAML},
                [
                    "keep the project healthy",
                    *strategy_args("evolve", goals="GOALS.yaml", max_parallel=1, max_cycles=6),
                ],
            ),
            # tests but no evaluation: nothing is scored (issue 30: the report said "score None")
            "review-loop-tests": lambda: _run(
                base,
                "rlt",
                {"README.md": "# demo\n"},
                [
                    "make the solver faster",
                    *strategy_args("review-loop", ideas=ideas, max_review_rounds=1, test_command="test -f fast.txt"),
                ],
            ),
            "synthesize": lambda: _run(
                base,
                "syn",
                {"calc.py": CALC},
                [
                    CANDIDATES + GOOD_SYNTH,
                    *strategy_args("synthesize", n=2),
                    *APPROACHES,
                    "-S",
                    f"test_command={TESTS}",
                ],
            ),
        }
    )


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _strategy_result(run: dict) -> dict:
    (done,) = [e for e in _events(run["events"]) if e["type"] == "strategy.completed"]
    return done["payload"]["result"]


@pytest.mark.parametrize("strategy", ["best-of-n", "tree-beam", "evolve", "review-loop", "synthesize"])
def test_report_names_every_task_and_branch_and_is_self_contained(runs, strategy):
    run = runs[strategy]
    page = run["html"]
    events = _events(run["events"])
    keys = {e["key"] for e in events if e["type"] == "task.scheduled"}
    assert keys and all(f'data-key="{k}"' in page for k in keys)
    branches = {
        e["payload"]["artifact"]["branch_final"]
        for e in events
        if e["type"] == "task.completed" and (e["payload"].get("artifact") or {}).get("branch_final")
    }
    assert branches and all(b in page for b in branches)
    # self-contained: no external reference of any kind
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page)
    assert "default-src 'none'" in page
    assert len(page.encode()) < 5_000_000


def test_best_of_n_report_shows_scores_side_by_side_and_marks_the_winner(runs):
    run = runs["best-of-n"]
    page = run["html"]
    assert page.count('class="item') == 3 and page.count('badge win">winner') == 1
    scores = [e["payload"] for e in _events(run["events"]) if e["type"] == "task.completed" and "/score/" in e["key"]]
    assert len(scores) >= 3
    for answer in scores:  # each reviewer's structured answer (or its JSON text) is on the page
        output = answer.get("output") or json.loads(answer["final_message"].split("print-json", 1)[-1])
        assert f"score {output['score']}: {html.escape(output['rationale'])}" in page
    winner = _strategy_result(run)["artifact"]["branch_final"]
    winning_item = page.split('class="item hi"')[1].split('class="item')[0]
    assert winner in winning_item


def test_report_keeps_the_run_secrets_out(runs):
    run = runs["best-of-n"]
    assert TEST_KEY not in run["html"]
    assert "the key is [REDACTED]" in run["html"]  # the prompt is shown, its secret removed


def test_tree_beam_report_tree_matches_tree_json(runs):
    run = runs["tree-beam"]
    page = run["html"]
    tree = json.loads((run["root"] / "results" / run["run_id"] / "strategy_output" / "tree.json").read_text())
    result = _strategy_result(run)
    for node in tree["nodes"]:
        assert f'data-node="{node["id"]}"' in page
    for ev in tree["evaluations"]:
        assert f'data-node="{ev["id"]}"' in page or any(n.get("eval_id") == ev["id"] for n in tree["nodes"])
        assert html.escape(ev["idea"]["title"]) in page
    highlighted = set(re.findall(r'class="node hi"[^>]*data-node="([^"]+)"', page))
    assert highlighted == set(result["best_path"])
    assert "throughput by depth" in page and "<svg" in page
    assert f"Best branch: {result['best_branch']}" in page


def test_evolve_report_charts_goals_and_lists_the_waves(runs):
    run = runs["evolve"]
    page = run["html"]
    result = _strategy_result(run)
    assert "Goals passing by cycle" in page and "Waves" in page
    for goal in result["goals"]:
        assert f">{goal}</text>" in page  # a legend entry per goal
    assert "advanced the branch" in page


def test_review_loop_report_shows_rounds_verdicts_and_scores(runs):
    run = runs["review-loop"]
    page = run["html"]
    for idea in _strategy_result(run)["ideas"]:
        assert html.escape(idea["title"]) in page
        for r in idea["rounds"]:
            assert r["verdict"] in page
    assert "Ideas ranked" in page


def test_synthesize_report_shows_the_synthesis_beside_the_candidates_with_provenance(runs):
    run = runs["synthesize"]
    page = run["html"]
    result = _strategy_result(run)
    synthesis = result["synthesis"]
    assert "The synthesis beside the candidates" in page and "Where each hunk of the synthesis came from" in page
    assert page.count('class="item') == 3 and page.count('badge win">winner') == 1  # synthesis + 2 candidates
    winning_item = page.split('class="item hi"')[1].split('class="item')[0]
    assert winning_item.startswith("><h3>synthesis") and synthesis["branch"] in winning_item
    assert "tests passed" in winning_item and "<summary>diff</summary>" in winning_item
    table = page.split("Where each hunk of the synthesis came from")[1].split("</table>")[0]
    cells = re.findall(r"<tr[^>]*><td>([^<]*)</td><td>([^<]*)</td><td>[^<]*</td><td>([^<]*)</td>", table)
    assert [(f, src) for f, _, src in cells] == [(h["file"], h["source"]) for h in result["provenance"]]
    assert {src for _, _, src in cells} == {"gen/0", "gen/1", "new"}
    assert f"Verdict:</strong> {result['verdict']}" in html.unescape(page)


def _outputs(page: str) -> list[str]:
    """What each task card shows but its prompt and its diff, tags stripped."""
    texts = []
    for chunk in page.split('<tr class="task-detail">')[1:]:
        card = chunk.split("</details>", 1)[0]
        card = re.sub(r'<h3>Prompt</h3><pre class="msg">.*?</pre>', "", card, flags=re.S)
        card = re.sub(r'<div class="diff">.*?</pre></div>\s*</div>', "", card, flags=re.S)
        texts.append(html.unescape(re.sub(r"<[^>]+>", " ", card)))
    return texts


def _strategy_part(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page.split('class="card strategy"', 1)[1].split('id="timeline"')[0]))


@pytest.mark.parametrize(
    "strategy", ["best-of-n", "tree-beam", "evolve", "review-loop", "review-loop-tests", "synthesize"]
)
def test_task_cards_show_fields_not_protocol_lines_or_raw_json(runs, strategy):
    # issue 30: cards showed a reviewer's raw JSON answer and the @@orch-base / @@orch-run /
    # @@evolve lines of the strategies' wrapper scripts, and their scripts as the command
    run = runs[strategy]
    page = run["html"]
    events = _events(run["events"])
    tasks = [e for e in events if e["type"] == "task.scheduled"]
    outputs = _outputs(page)
    assert len(outputs) == len(tasks), (len(outputs), len(tasks))
    for text in outputs:
        assert protocol_lines(text) == [], text
        assert '{"' not in text, text
    commands = [html.unescape(c) for c in re.findall(r'<pre class="msg command">(.*?)</pre>', page, re.S)]
    for text in commands:
        assert protocol_lines(text) == [] and "orch-" not in text, text
    assert protocol_lines(_strategy_part(page)) == []


def test_review_loop_report_shows_tests_and_no_score_none(runs):
    run = runs["review-loop-tests"]
    part = _strategy_part(run["html"])
    assert "None" not in part and '{"' not in part, part
    result = _strategy_result(run)
    rows = {r["idea_id"]: r for r in result["ranking"]}
    assert rows["01-fast"]["status"] == "completed" and rows["02-slow"]["status"] == "tests_failed", rows
    table = run["html"].split("<h3>Ideas ranked</h3>")[1].split("</table>")[0]
    cells = [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)[1:]]
    by_idea = {c[1]: c for c in cells}
    assert by_idea["01-fast"][3:6] == ["completed", "passed", "not scored"], by_idea
    assert by_idea["02-slow"][3] == "tests failed" and by_idea["02-slow"][4].startswith("failed"), by_idea
    assert "completed · tests passed · not scored" in run["html"]


def test_evolve_report_lists_the_goals_that_could_not_move(runs):
    run = runs["evolve-stuck"]
    result = _strategy_result(run)
    why = result["could_not_move"]["stuck"]
    assert "attempts in a row reverted" in why, result
    part = _strategy_part(run["html"])
    assert "Goals that could not move" in part
    table = run["html"].split("<h3>Goals that could not move</h3>")[1].split("</table>")[0]
    reverted = sum(1 for h in result["history"] if "stuck" in h["goal_ids"] and h["result"] == "reverted")
    assert reverted >= 2
    assert f"<td>stuck</td><td>{reverted}</td><td>{html.escape(why)}</td>" in table, table


@pytest.mark.parametrize("strategy", ["best-of-n", "tree-beam", "evolve", "review-loop", "synthesize"])
def test_show_run_html_rebuilds_the_same_report_from_the_event_log(runs, strategy):
    run = runs[strategy]
    results = run["root"] / "results" / run["run_id"]
    shutil.rmtree(results / "strategy_output")
    run["report"].unlink()
    done = run_cli(["--show-run", run["run_id"], "--html"], cwd=run["repo"], env=run["env"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(run["report"])
    assert run["report"].read_text("utf-8") == run["html"]


def test_html_flags_need_show_run(runs):
    run = runs["best-of-n"]
    for args in (["--list-runs", "--html"], ["--show-run", run["run_id"], "--open"]):
        done = run_cli(args, cwd=run["repo"], env=run["env"])
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


# ---------------------------------------------------------------- in a real browser


def test_request_log_sees_a_page_that_reaches_out(browser, tmp_path):
    """The check below is only worth something if it notices a request: a page without the report's policy."""
    page = tmp_path / "leaky.html"
    page.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png"></body></html>')
    load_page(browser, page)
    assert any(u.startswith("http://127.0.0.1:9/") for u in page_requests(browser))


@pytest.mark.parametrize("strategy", ["best-of-n", "tree-beam", "evolve", "review-loop", "synthesize"])
def test_report_loads_offline_without_errors_or_requests(browser, runs, strategy):
    report = runs[strategy]["report"]
    load_page(browser, report)
    assert browser.title.startswith(strategy)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    outside = [u for u in page_requests(browser) if not u.startswith("file://")]
    assert outside == []
    keep = os.environ.get("REPORT_SCREENSHOTS_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1440, min(max(height, 900), 2000))
        browser.save_screenshot(str(Path(keep) / f"report-{strategy}.png"))


def test_clicking_a_tree_node_shows_its_detail(browser, runs):
    from selenium.webdriver.common.by import By

    run = runs["tree-beam"]
    load_page(browser, run["report"])
    details = browser.find_elements(By.CSS_SELECTOR, ".node-detail")
    assert details and not any(d.is_displayed() for d in details)
    node = browser.find_element(By.CSS_SELECTOR, '.node[data-node="n1"]')
    node.click()
    shown = [d for d in details if d.is_displayed()]
    assert len(shown) == 1 and shown[0].get_attribute("id") == node.get_attribute("data-target")
    assert "evaluation output" in shown[0].text and "throughput" in shown[0].text
    other = browser.find_element(By.CSS_SELECTOR, '.node[data-node="n0"]')
    other.click()
    shown = [d for d in details if d.is_displayed()]
    assert len(shown) == 1 and shown[0].get_attribute("id") == other.get_attribute("data-target")
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_the_synthesis_section_in_the_browser_marks_the_selected_synthesis_and_each_hunks_source(browser, runs):
    from selenium.webdriver.common.by import By

    run = runs["synthesize"]
    load_page(browser, run["report"])
    (chosen,) = browser.find_elements(By.CSS_SELECTOR, ".compare .item.hi")
    assert chosen.is_displayed() and chosen.find_element(By.TAG_NAME, "h3").text == "synthesis winner"
    labels = [i.find_element(By.TAG_NAME, "h3").text for i in browser.find_elements(By.CSS_SELECTOR, ".compare .item")]
    assert labels == ["synthesis winner", "gen/0", "gen/1"]
    (table,) = [
        t
        for t in browser.find_elements(By.CSS_SELECTOR, ".section-TableSection")
        if t.find_element(By.TAG_NAME, "h3").text == "Where each hunk of the synthesis came from"
    ]
    rows = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")
    ]
    assert sorted(r[3] for r in rows) == ["gen/0", "gen/1", "new"]
    (new_row,) = table.find_elements(By.CSS_SELECTOR, "tbody tr.hi")
    assert new_row.find_elements(By.TAG_NAME, "td")[3].text == "new"
    # the synthesis's diff opens in place
    chosen.find_element(By.TAG_NAME, "summary").click()
    assert "return a * b" in chosen.find_element(By.TAG_NAME, "details").text
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


_CARD_TEXTS = """
return [...document.querySelectorAll('#tasks .output, #tasks pre.command')].map(e => e.textContent);
"""


@pytest.mark.parametrize("strategy", ["review-loop-tests", "evolve-stuck"])
def test_browser_report_shows_no_score_none_raw_json_or_protocol_lines(browser, runs, strategy):
    # issue 30: "score None", raw structured-output JSON and @@ wrapper lines in the review-loop and evolve reports
    load_page(browser, runs[strategy]["report"])
    strategy_text = browser.execute_script("return document.querySelector('.card.strategy').innerText")
    assert "None" not in strategy_text and '{"' not in strategy_text, strategy_text
    assert protocol_lines(strategy_text) == []
    cards = browser.execute_script(_CARD_TEXTS)
    assert len(cards) >= len(browser.execute_script("return document.querySelectorAll('#tasks .task-row')"))
    for text in cards:
        assert '{"' not in text and protocol_lines(text) == [], text
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_browser_review_loop_ranking_reads_tests_and_scores(browser, runs):
    from selenium.webdriver.common.by import By

    load_page(browser, runs["review-loop-tests"]["report"])
    (table,) = [
        s.find_element(By.TAG_NAME, "table")
        for s in browser.find_elements(By.CSS_SELECTOR, ".section-TableSection")
        if s.find_element(By.TAG_NAME, "h3").text == "Ideas ranked"
    ]
    header = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    assert "tests" in header and "score" in header, header
    rows = {
        cells[header.index("idea")]: cells
        for cells in (
            [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")
        )
    }
    assert rows["01-fast"][header.index("tests")] == "passed" and rows["01-fast"][header.index("score")] == "not scored"
    assert rows["02-slow"][header.index("tests")].startswith("failed"), rows


def test_browser_evolve_lists_could_not_move_and_draws_equal_goals_apart(browser, runs):
    from selenium.webdriver.common.by import By

    run = runs["evolve-stuck"]
    load_page(browser, run["report"])
    sections = {s.find_element(By.TAG_NAME, "h3").text: s for s in browser.find_elements(By.CSS_SELECTOR, ".section")}
    stuck = sections["Goals that could not move"]
    assert stuck.is_displayed()
    (row,) = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in stuck.find_elements(By.CSS_SELECTOR, "tbody tr")
    ]
    assert row[0] == "stuck" and int(row[1]) >= 2 and "attempts in a row reverted" in row[2], row

    # c1 and c2 of the other evolve run pass and fail together: their lines must not be drawn over each other
    load_page(browser, runs["evolve"]["report"])
    chart = next(
        s
        for s in browser.find_elements(By.CSS_SELECTOR, ".section-ChartSection")
        if s.find_element(By.TAG_NAME, "h3").text.startswith("Goals passing by cycle")
    )
    lines = browser.execute_script(
        "return [...arguments[0].querySelectorAll('path[fill=\"none\"]')].map(p => {"
        "const r = p.getBoundingClientRect(); return {d: p.getAttribute('d'), dash: p.getAttribute('stroke-dasharray'),"
        " top: r.top, bottom: r.bottom}; })",
        chart,
    )
    goals = _strategy_result(runs["evolve"])["goals"]
    assert len(lines) == len(goals), lines
    assert len({ln["d"] for ln in lines}) == len(lines), lines  # no two lines on the same pixels
    assert len({ln["dash"] for ln in lines}) == len(lines), lines  # and each drawn its own way
    assert len({(round(ln["top"]), round(ln["bottom"])) for ln in lines}) == len(lines), lines
    legend = chart.text
    for goal in goals:
        assert goal in legend


def test_an_interrupted_run_gets_a_report_and_its_resume_shows_the_interruption(tmp_path):
    import signal
    import subprocess

    from cli_helpers import ORCH, wait_for

    repo = make_repo(tmp_path / "repo")
    env = cli_env(tmp_path)
    prompt = "SIM: write work.txt data\nSIM: commit work\nSIM: sleep 5\nSIM: print finished"
    proc = subprocess.Popen(
        [ORCH, prompt, *IMG], cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def started():
        runs = [p.name for p in (tmp_path / "state").iterdir()] if (tmp_path / "state").exists() else []
        events = tmp_path / "logs" / runs[0] / "events.jsonl" if runs else None
        return runs[0] if events and events.exists() and '"task.started"' in events.read_text() else None

    try:
        run_id = wait_for(started, timeout=120)
        wait_for(
            lambda: (
                (tmp_path / "logs" / run_id / "runner.jsonl").exists()
                and '"runner.exec.started"' in (tmp_path / "logs" / run_id / "runner.jsonl").read_text()
            ),
            timeout=60,
        )
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    report = tmp_path / "results" / run_id / "report.html"
    page = report.read_text("utf-8")
    assert "status interrupted" in page and "interrupted</td>" in page
    done = run_cli(["--resume", run_id, "--no-tui"], cwd=repo, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    page = report.read_text("utf-8")
    assert "status completed" in page
    assert "(1 interrupted)" in page  # the task's row counts its interrupted attempt
    assert page.count('fill="#f59e0b"') == 1 and page.count('fill="#16a34a"') == 1  # amber, then green
