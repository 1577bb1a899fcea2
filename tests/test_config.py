"""Configuration precedence, validation and the documented example."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from engine_helpers import run_manifest

from orchestrator.app.auth import resolve_auth
from orchestrator.app.cli import main
from orchestrator.config import load_config
from orchestrator.errors import ConfigError, PreflightError
from orchestrator.strategy_loader import BUILTINS

DOCS = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def test_documented_yaml_is_valid_and_matches_defaults(tmp_path):
    block = re.search(r"```yaml\n(.*?)```", DOCS.read_text(), re.S).group(1)
    (tmp_path / "orchestrator.yaml").write_text(block)
    documented = load_config(config_file=None, cli_overrides={}, cwd=tmp_path, environ={}).config
    defaults = load_config(config_file=None, cli_overrides={}, cwd=tmp_path / "nowhere", environ={}).config
    assert documented.runner == defaults.runner
    assert documented.orchestration == defaults.orchestration
    assert documented.events == defaults.events
    # `strategy:` holds a user's own defaults; the built-ins' are their signatures' (--help-strategy)
    assert documented.strategy == defaults.strategy
    assert documented.model_pricing() == {"gpt-5": (0.00125, 0.01)}


def test_documented_strategy_parameters_are_what_help_strategy_prints(capsys):
    # The doc once said best-of-n's n is 3 while runs used 5: its block is now written by
    # scripts/strategy_docs.py from the command, and must hold each built-in's output as it is now.
    script = DOCS.parent.parent / "scripts" / "strategy_docs.py"
    spec = importlib.util.spec_from_file_location("strategy_docs", script)
    assert spec is not None and spec.loader is not None
    strategy_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(strategy_docs)
    text = DOCS.read_text()
    assert strategy_docs.BEGIN in text, "docs/cli.md has no generated block: uv run python scripts/strategy_docs.py"
    shown = strategy_docs.documented(text)
    for name in BUILTINS:
        assert main(["--help-strategy", name]) == 0
        printed = capsys.readouterr().out.rstrip("\n")
        assert f"$ orchestrator --help-strategy {name}\n{printed}\n" in shown, (
            f"docs/cli.md differs from orchestrator --help-strategy {name}: uv run python scripts/strategy_docs.py"
        )
    assert shown == strategy_docs.block()


def test_precedence_cli_over_env_over_dotenv_over_file(tmp_path):
    (tmp_path / "orchestrator.yaml").write_text(
        "runner:\n  container_memory: 1g\n  container_cpu: 1\norchestration:\n  default_model: haiku\n  runs: 2\n"
    )
    (tmp_path / ".env").write_text(
        "ORCHESTRATOR_RUNNER__CONTAINER_MEMORY=2g\nexport ORCHESTRATOR_ORCHESTRATION__RUNS=3\n"
        "ANTHROPIC_API_KEY='sk-from-dotenv-123456'\n"
    )
    env = {"ORCHESTRATOR_RUNNER__CONTAINER_MEMORY": "3g"}
    loaded = load_config(
        config_file=None, cli_overrides={"orchestration": {"default_model": "opus"}}, cwd=tmp_path, environ=env
    )
    c = loaded.config
    assert c.runner.container_memory == "3g"  # env beats .env and file
    assert c.orchestration.runs == 3  # .env beats file
    assert c.runner.container_cpu == 1  # file beats defaults, deep merge keeps siblings
    assert c.orchestration.default_model == "opus"  # CLI beats everything
    assert loaded.environ["ANTHROPIC_API_KEY"] == "sk-from-dotenv-123456"


def test_strategy_defaults_from_env_use_dashed_names(tmp_path):
    c = load_config(
        config_file=None, cli_overrides={}, cwd=tmp_path, environ={"ORCHESTRATOR_STRATEGY__BEST_OF_N__N": "5"}
    ).config
    assert c.strategy == {"best-of-n": {"n": 5}}


def _refused_config(path: Path, text: str) -> str:
    """The ConfigError message for a configuration file holding ``text``."""
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(config_file=str(path), cli_overrides={}, cwd=path.parent, environ={})
    return str(err.value)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("runner:\n  nope: 1\n", "runner.nope"),
        ("runner:\n  container_cpu: many\n", "container_cpu"),
        ("events:\n  flush_policy: sometimes\n", "flush_policy"),
        ("- a list\n", "mapping"),
    ],
)
def test_bad_config_file_names_the_key_and_file(tmp_path, text, needle):
    message = _refused_config(tmp_path / "bad.yaml", text)
    assert needle in message and "bad.yaml" in message


def test_bad_environment_variable_is_named(tmp_path):
    with pytest.raises(ConfigError, match="ORCHESTRATOR_RUNNER__CONTAINER_CPU"):
        load_config(
            config_file=None, cli_overrides={}, cwd=tmp_path, environ={"ORCHESTRATOR_RUNNER__CONTAINER_CPU": "x"}
        )


def test_auth_mode_selection():
    from orchestrator.runner import get_plugin

    both = {"CLAUDE_CODE_OAUTH_TOKEN": "oauth-tok-123456", "ANTHROPIC_API_KEY": "sk-api-123456"}
    assert resolve_auth(both, plugin=get_plugin("claude-code")).oauth_token == "oauth-tok-123456"
    api = resolve_auth(both, plugin=get_plugin("claude-code"), mode="api")
    assert api.api_key == "sk-api-123456" and api.oauth_token is None
    assert (
        resolve_auth({"ANTHROPIC_API_KEY": "sk-api-123456"}, plugin=get_plugin("claude-code")).api_key
        == "sk-api-123456"
    )
    with pytest.raises(PreflightError, match="CLAUDE_CODE_OAUTH_TOKEN"):
        resolve_auth({}, plugin=get_plugin("claude-code"))
    with pytest.raises(PreflightError, match="OPENAI_API_KEY"):
        resolve_auth({}, plugin=get_plugin("codex"))
    assert resolve_auth({}, plugin=get_plugin("claude-code"), dry_run=True).secret_values() == []
    assert "sk-api" not in repr(api)


def test_run_ids_are_unique_across_state_folders_in_the_same_second(tmp_path):
    from datetime import datetime

    from orchestrator.log.runs import RunDirs, claim_run_id

    when = datetime(2001, 2, 3, 4, 5, 6)
    a = RunDirs(logs=tmp_path / "a/logs", state=tmp_path / "a/state", results=tmp_path / "a/results")
    b = RunDirs(logs=tmp_path / "b/logs", state=tmp_path / "b/state", results=tmp_path / "b/results")
    ids = [claim_run_id(a, when), claim_run_id(b, when), claim_run_id(a, when)]
    assert len(set(ids)) == 3 and all(i.startswith("run_20010203_040506") for i in ids)


def test_summary_never_offers_to_merge_the_base_branch(tmp_path):
    from orchestrator.app.results import build_summary, render_summary
    from orchestrator.log.state import RunState, StrategyState

    manifest = run_manifest(created_at="t", strategy_spec="evolve", max_parallel=2)
    state = RunState(run_id="run_x")
    state.strategies["s1"] = StrategyState(id="s1", name="evolve", status="success", result={"final_branch": "main"})
    summary = build_summary(manifest, state)
    assert summary["final_branches"] == []
    text = render_summary(summary, results_path=tmp_path)
    assert "git merge" not in text and "No branch to merge" in text and "Kept main" in text


def test_spec_forms_of_the_configuration_are_accepted(tmp_path):
    (tmp_path / "orchestrator.yaml").write_text(
        "events:\n  flush_policy:\n    mode: per_event\n    interval_ms: 20\n    max_batch: 64\n"
        "orchestration:\n  max_parallel_instances: 3\n"
    )
    loaded = load_config(
        config_file=None, cli_overrides={}, cwd=tmp_path, environ={"ORCHESTRATOR_TUI__REFRESH_RATE": "100"}
    )
    c = loaded.config
    assert (c.events.flush_policy, c.events.interval_ms, c.events.max_batch) == ("per_event", 20, 64)
    assert c.tui.refresh_hz == 10.0  # 100 ms per frame
    assert c.orchestration.max_parallel_tasks == 3
    assert len(loaded.warnings) == 1 and "max_parallel_instances is deprecated" in loaded.warnings[0]


def test_nested_flush_policy_from_the_environment_and_its_precedence(tmp_path):
    (tmp_path / "orchestrator.yaml").write_text("events:\n  flush_policy: per_event\n  interval_ms: 5\n")
    c = load_config(
        config_file=None,
        cli_overrides={},
        cwd=tmp_path,
        environ={
            "ORCHESTRATOR_EVENTS__FLUSH_POLICY__MODE": "interval",
            "ORCHESTRATOR_EVENTS__FLUSH_POLICY__MAX_BATCH": "9",
        },
    ).config
    assert (c.events.flush_policy, c.events.interval_ms, c.events.max_batch) == ("interval", 5, 9)
    # --safe-fsync (the command line) beats the nested form in the environment.
    c = load_config(
        config_file=None,
        cli_overrides={"events": {"flush_policy": "per_event"}},
        cwd=tmp_path,
        environ={"ORCHESTRATOR_EVENTS__FLUSH_POLICY__MODE": "interval"},
    ).config
    assert c.events.flush_policy == "per_event"


def test_command_line_max_parallel_beats_the_deprecated_alias(tmp_path):
    from orchestrator.app.preflight import _max_parallel

    (tmp_path / "orchestrator.yaml").write_text("orchestration:\n  max_parallel_instances: 4\n")
    loaded = load_config(
        config_file=None, cli_overrides={"orchestration": {"max_parallel_tasks": 8}}, cwd=tmp_path, environ={}
    )
    assert _max_parallel(loaded.config) == 8
    # The alias in the environment beats the canonical key in the file (a higher source).
    (tmp_path / "orchestrator.yaml").write_text("orchestration:\n  max_parallel_tasks: 2\n")
    loaded = load_config(
        config_file=None,
        cli_overrides={},
        cwd=tmp_path,
        environ={"ORCHESTRATOR_ORCHESTRATION__MAX_PARALLEL_INSTANCES": "5"},
    )
    assert _max_parallel(loaded.config) == 5
    assert len(loaded.warnings) == 1


@pytest.mark.parametrize(
    "text,needle",
    [
        ("events:\n  flush_policy:\n    mode: sometimes\n", "flush_policy"),
        ("events:\n  flush_policy:\n    every: 3\n", "events.flush_policy.every"),
        ("tui:\n  refresh_rate: 0\n", "tui.refresh_rate"),
    ],
)
def test_bad_spec_forms_name_the_key(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    message = _refused_config(path, text)
    assert needle in message and str(path) in message


def test_dotenv_inline_comments_quotes_and_bad_lines(tmp_path):
    from orchestrator.config import read_dotenv

    env = tmp_path / ".env"
    env.write_text(
        'ANTHROPIC_API_KEY=sk-abc123 # the team key\nexport NAME="a \\"quoted\\" word"\n'
        "RAW='${NOT_EXPANDED}'\n\n# a comment\n"
    )
    assert read_dotenv(env) == {"ANTHROPIC_API_KEY": "sk-abc123", "NAME": 'a "quoted" word', "RAW": "${NOT_EXPANDED}"}
    env.write_text("GOOD=1\nANTHROPIC_API_KEY sk-typo\n")
    with pytest.raises(ConfigError) as err:
        read_dotenv(env)
    assert f"{env}:2" in str(err.value)
