"""evolve's goals file, independence rules and the shell commands it runs (real sh and git, no Docker)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import git, make_repo

from orchestrator.errors import ConfigError
from orchestrator.strategy_loader import load_strategy, parse_params
from strategies.evolve_commands import measure_command, merge_command, parse_measurement, parse_merge
from strategies.evolve_goals import Goal, goals_from_param, load_goals_file, prepare
from strategies.evolve_select import footprint, globs_may_overlap, independent, path_tokens, select_goals

GOOD = """\
version: 1
goals:
  - id: lint-clean
    description: ruff reports nothing
    check: ruff check .
    weight: 5
  - id: coverage
    description: coverage stays high
    check: python -m coverage report --format=total
    weight: 2.5
    timeout: 60
    writes: [tests/**]
    metric: {direction: higher, threshold: 80, tolerance: 0.5}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "GOALS.yaml"
    path.write_text(text)
    return path


def test_a_good_file_becomes_the_recorded_param(tmp_path):
    write(tmp_path, GOOD)
    params = prepare({"goals": "GOALS.yaml", "max_parallel": 3, "max_cycles": 10}, str(tmp_path))
    assert params["max_parallel"] == 3
    assert params["goals"] == [
        {
            "id": "lint-clean",
            "description": "ruff reports nothing",
            "check": "ruff check .",
            "weight": 5.0,
            "timeout": 300,
            "writes": None,
            "metric": None,
        },
        {
            "id": "coverage",
            "description": "coverage stays high",
            "check": "python -m coverage report --format=total",
            "weight": 2.5,
            "timeout": 60,
            "writes": ["tests/**"],
            "metric": {"direction": "higher", "threshold": 80.0, "json_key": None, "tolerance": 0.5},
        },
    ]
    # the recorded form validates to the same goals (resume never reads the file again)
    assert goals_from_param(params["goals"]) == load_goals_file(tmp_path / "GOALS.yaml")
    assert prepare(params, "/nonexistent") == params


BAD = [
    ("weight: five", "GOALS.yaml: goal 'lint-clean': field 'weight' must be a number greater than 0"),
    ("weight: 0", "GOALS.yaml: goal 'lint-clean': field 'weight' must be a number greater than 0"),
    ("weight: true", "GOALS.yaml: goal 'lint-clean': field 'weight' must be a number greater than 0"),
    ("check: ''", "GOALS.yaml: goal 'lint-clean': field 'check' must be a non-empty string"),
    ("timeout: 1.5", "GOALS.yaml: goal 'lint-clean': field 'timeout' must be a whole number of seconds"),
    ("writes: [/etc/passwd]", "GOALS.yaml: goal 'lint-clean': field 'writes' holds repository-relative globs"),
    ("writes: 3", "GOALS.yaml: goal 'lint-clean': field 'writes' must be a non-empty list of glob strings"),
    ("metric: {direction: up, threshold: 1}", "GOALS.yaml: goal 'lint-clean': field 'metric.direction' must be"),
    ("metric: {direction: lower}", "GOALS.yaml: goal 'lint-clean': field 'metric.threshold' must be a number"),
    (
        "metric: {direction: lower, threshold: 1, tolerance: -1}",
        "GOALS.yaml: goal 'lint-clean': field 'metric.tolerance' must be a number >= 0",
    ),
    (
        "metric: {direction: lower, threshold: 1, key: x}",
        "GOALS.yaml: goal 'lint-clean': field 'metric.key' is unknown",
    ),
    ("wieght: 3", "GOALS.yaml: goal 'lint-clean': unknown field 'wieght'"),
]


@pytest.mark.parametrize("line,message", BAD, ids=[b[0] for b in BAD])
def test_an_invalid_goal_fails_with_one_line_naming_goal_and_field(tmp_path, line, message):
    field = line.split(":")[0]
    goal = {"id": "lint-clean", "description": "d", "check": "true", "weight": 1}
    body = "\n".join(f"    {k}: {v!r}" for k, v in goal.items() if k != field and k != "id")
    write(tmp_path, f"version: 1\ngoals:\n  - id: lint-clean\n{body}\n    {line}\n")
    with pytest.raises(ConfigError) as err:
        prepare({"goals": "GOALS.yaml"}, str(tmp_path))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "text,message",
    [
        ("goals: []\nversion: 1\n", "GOALS.yaml: field 'goals' must be a non-empty list"),
        ("version: 2\ngoals: []\n", "GOALS.yaml: field 'version' must be 1, got 2"),
        ("version: 1\ngoals:\n  - id: Lint_Clean\n", "GOALS.yaml: goals[0]: field 'id' must be a kebab-case string"),
        (
            "version: 1\ngoals: [{id: a, description: d, check: c, weight: 1}, {id: a, description: d, check: c, weight: 2}]",
            "GOALS.yaml: goal 'a': field 'id' is used by more than one goal",
        ),
        ("version: 1\ngoals: [unclosed\n", "GOALS.yaml: line 3 is not valid YAML"),
        ("version: 1\ngoals: []\nextra: 1\n", "GOALS.yaml: unknown top-level field 'extra'"),
    ],
)
def test_invalid_files(tmp_path, text, message):
    write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        prepare({"goals": "GOALS.yaml"}, str(tmp_path))
    assert str(err.value).startswith(message)


def test_limits_and_missing_file_are_config_errors(tmp_path):
    write(tmp_path, GOOD)
    with pytest.raises(ConfigError, match="max_parallel must be a whole number from 1 to 5"):
        prepare({"goals": "GOALS.yaml", "max_parallel": 6}, str(tmp_path))
    with pytest.raises(ConfigError, match="max_cycles must be"):
        prepare({"goals": "GOALS.yaml", "max_cycles": 0}, str(tmp_path))
    with pytest.raises(ConfigError, match="quarantine_after must be"):
        prepare({"goals": "GOALS.yaml", "quarantine_after": 0}, str(tmp_path))
    with pytest.raises(ConfigError, match="recheck must be a whole number >= 0"):
        prepare({"goals": "GOALS.yaml", "recheck": -1}, str(tmp_path))
    with pytest.raises(ConfigError, match="max_cost_usd must be a number > 0"):
        prepare({"goals": "GOALS.yaml", "max_cost_usd": 0}, str(tmp_path))
    with pytest.raises(ConfigError, match="retry_backoff_s must be a number >= 0"):
        prepare({"goals": "GOALS.yaml", "retry_backoff_s": -5}, str(tmp_path))
    with pytest.raises(ConfigError, match=r"nope\.yaml: goals file not found"):
        prepare({"goals": "nope.yaml"}, str(tmp_path))
    with pytest.raises(ConfigError, match="needs -S goals="):
        prepare({}, str(tmp_path))


def test_loader_sees_the_parameters():
    loaded = load_strategy("evolve")
    assert loaded.options.prepare is prepare and loaded.params["goals"].required
    params = parse_params(loaded, ["goals=GOALS.yaml", "max_parallel=1", "bisect_on_regression=true"])
    assert params == {
        "goals": "GOALS.yaml",
        "max_parallel": 1,
        "bisect_on_regression": True,
        "max_cycles": 10,
        "quarantine_after": 3,
        "rest_after": 2,
        "recheck": 1,
        "max_failed_waves": 3,
        "retry_backoff_s": 60.0,
        "max_cost_usd": None,
        "max_wall_s": None,
        "keep_branches": False,
    }


# ---------------------------------------------------------------- independence


@pytest.mark.parametrize(
    "a,b,overlap",
    [
        ("src/*.py", "docs/*.md", False),
        ("src/*.py", "src/app.py", True),
        ("src/*.py", "src/app.js", False),
        ("src/**", "src/deep/x.txt", True),
        ("**/*.py", "docs/readme.md", True),  # '**' may be anything: conservative
        ("src", "src/a.py", True),  # a directory covers what is below it
        ("src/a*.py", "src/b*.py", False),  # literal prefixes contradict
        ("src/*_test.py", "src/*.js", False),  # literal suffixes contradict
        ("src/*_test.py", "src/*.py", True),
        ("src/{a,b}.py", "src/a.py", True),  # braces are not understood: conservative
        ("a/[xy].txt", "a/z.txt", False),
        ("./README.md", "README.md", True),
        (".", "anything/at/all", True),
    ],
)
def test_glob_overlap_is_conservative(a, b, overlap):
    assert globs_may_overlap(a, b) is overlap
    assert globs_may_overlap(b, a) is overlap


def test_path_tokens_of_check_commands():
    assert path_tokens("test -f done_a.txt") == ["done_a.txt"]
    assert path_tokens("./scripts/lint.sh --strict > /dev/null 2>&1") == ["./scripts/lint.sh"]
    assert path_tokens("python -m pytest tests/unit -q") == ["tests/unit"]
    assert path_tokens("ruff check .") == ["."]
    assert path_tokens("make lint && make -C sub test") == ["Makefile"]
    assert path_tokens("grep -q 'TODO' src/app.py; exit 1") == ["src/app.py"]


def _g(gid, check, writes=None, weight=1.0):
    return Goal(id=gid, description=gid, check=check, weight=weight, writes=writes)


def test_selection_by_weight_skipping_dependent_goals():
    goals = [
        _g("lint", "./scripts/check.sh lint", weight=5),
        _g("types", "./scripts/check.sh types", weight=4),  # shares the script with lint
        _g("docs", "test -f docs/index.md", weight=3),
        _g("api", "pytest tests/api", writes=("src/api/**",), weight=3),
        _g("web", "pytest tests/web", writes=("src/web/**", "docs/*.md"), weight=2),  # overlaps docs' check path
        _g("zzz", "exit 1", weight=2),  # nothing to compare: independent
    ]
    picked, skipped = select_goals(goals, 5)
    assert [g.id for g in picked] == ["lint", "api", "docs", "zzz"]
    assert skipped == {"types": "overlaps lint", "web": "overlaps docs"}
    picked, skipped = select_goals(goals, 2)
    assert [g.id for g in picked] == ["lint", "api"] and skipped["docs"] == "wave full"
    picked, _ = select_goals(goals, 5, frozenset({frozenset({"lint", "api"})}))
    assert [g.id for g in picked] == ["lint", "docs", "zzz"]
    assert independent(goals[2], goals[3]) and not independent(goals[0], goals[1])


def test_whole_project_checks_touch_everything_unless_writes_says_otherwise():
    # pytest and ruff name no file (or only a directory), yet any fix can break them
    tests = _g("tests", "pytest -q")
    lint = _g("lint", "ruff check src")
    types = _g("types", "uv run mypy", writes=("src/types/**",))
    docs = _g("docs", "test -f docs/index.md")
    script = _g("script", "./scripts/check.sh")
    assert footprint(tests) == footprint(lint) == (".",)
    assert not independent(tests, docs) and not independent(lint, script) and not independent(tests, lint)
    assert not independent(_g("unit", "python -m pytest tests/unit -q"), docs)
    assert not independent(_g("js", "cd web && npm test"), docs)
    assert not independent(_g("sh", "sh -c 'pytest -q tests/unit'"), docs)
    assert independent(_g("script-sh", "sh ./scripts/run.sh"), docs)
    # declared writes narrow a whole-project check again
    assert independent(types, docs) and independent(types, script)
    assert independent(docs, script) and independent(_g("zzz", "exit 1"), docs)
    picked, skipped = select_goals([tests, lint, docs, types], 4)
    assert [g.id for g in picked] == ["docs", "types"]
    assert skipped == {"lint": "overlaps docs", "tests": "overlaps docs"}


# ---------------------------------------------------------------- the shell protocol, for real


def sh(cwd: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_measure_command_reports_status_output_and_head(tmp_path):
    repo = make_repo(tmp_path / "r", {"ok.txt": "x"})
    head = git(repo, "rev-parse", "HEAD")
    passing = _g("p", "test -f ok.txt && echo fine")
    failing = _g("f", "echo 'some output'; echo 'an error' >&2; exit 3")
    for goal, ok, code in ((passing, True, 0), (failing, False, 3)):
        proc = sh(repo, measure_command(goal))
        assert proc.returncode == 0
        m = parse_measurement(goal, proc.stdout)
        assert (m.passed, m.exit_code, m.head) == (ok, code, head)
    m = parse_measurement(failing, sh(repo, measure_command(failing)).stdout)
    assert m.output == "some output\n[stderr]\nan error"


def test_measure_command_times_out_and_reads_metrics(tmp_path):
    repo = make_repo(tmp_path / "r")
    slow = Goal(id="slow", description="d", check="sleep 5", weight=1, timeout=1)
    m = parse_measurement(slow, sh(repo, measure_command(slow)).stdout)
    assert not m.passed and m.exit_code == 124 and "timed out after 1s" in m.output
    last_line = goals_from_param(
        [
            {
                "id": "cov",
                "description": "d",
                "check": "printf 'total\\n81.5%%\\n'",
                "weight": 1,
                "metric": {"direction": "higher", "threshold": 80},
            }
        ]
    )[0]
    m = parse_measurement(last_line, sh(repo, measure_command(last_line)).stdout)
    assert m.passed and m.value == 81.5
    keyed = goals_from_param(
        [
            {
                "id": "size",
                "description": "d",
                "weight": 1,
                "check": "echo 'log line'; echo '{\"stats\": {\"kb\": 120}}'; exit 1",
                "metric": {"direction": "lower", "threshold": 100, "json_key": "stats.kb"},
            }
        ]
    )[0]
    m = parse_measurement(keyed, sh(repo, measure_command(keyed)).stdout)
    assert not m.passed and m.value == 120.0
    assert not parse_measurement(keyed, "garbage without a marker").passed


def test_merge_command_stops_at_the_first_conflict_and_skips_merged_branches(tmp_path):
    repo = make_repo(tmp_path / "r", {"README.md": "base\n"})
    for branch, path, text in (
        ("fa", "a.txt", "a"),
        ("fb", "shared.txt", "one"),
        ("fc", "shared.txt", "two"),
        ("fd", "d.txt", "d"),
    ):
        git(repo, "checkout", "-q", "-b", branch, "main")
        (repo / path).write_text(text + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", branch)
    git(repo, "checkout", "-q", "main")
    proc = sh(repo, merge_command(["fa", "fb", "fc", "fd"]))
    assert proc.returncode == 0
    report = parse_merge(proc.stdout)
    assert report.merged == ("fa", "fb") and report.conflict == "fc"
    assert git(repo, "status", "--porcelain") == ""  # the failed merge was aborted
    assert (repo / "shared.txt").read_text() == "one\n" and not (repo / "d.txt").exists()
    # a later step skips what is already merged and goes on
    report = parse_merge(sh(repo, merge_command(["fb", "fd"])).stdout)
    assert report.merged == ("fb", "fd") and report.conflict is None
    assert "@@evolve already fb" in sh(repo, merge_command(["fb"])).stdout


def test_cli_rejects_an_invalid_goals_file_before_anything_runs(tmp_path):
    from cli_helpers import cli_env, run_cli

    repo = make_repo(
        tmp_path / "repo",
        {
            "GOALS.yaml": "version: 1\ngoals:\n  - id: lint-clean\n    description: d\n"
            "    check: ruff check .\n    weight: lots\n"
        },
    )
    result = run_cli(
        ["keep the project healthy", "--strategy", "evolve", "-S", "goals=GOALS.yaml", "--no-tui"],
        cwd=repo,
        env=cli_env(tmp_path),
        timeout=60,
    )
    assert result.returncode == 2
    assert "GOALS.yaml: goal 'lint-clean': field 'weight' must be a number greater than 0" in result.stderr
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())
