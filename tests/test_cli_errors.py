"""Bad input: one clear line on stderr, exit 2, no traceback, no run directory."""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from cli_helpers import cli_env, run_cli
from conftest import TEST_IMAGE, make_repo

IMG = ["--docker-image", TEST_IMAGE]


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo")


def assert_clean_usage_error(result, tmp_path, *needles):
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("orchestrator: error: ")
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    for d in ("logs", "state", "results"):
        path = tmp_path / d
        assert not path.exists() or not any(path.iterdir()), f"{d} was written"


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


CASES = {
    "not_a_repo": (lambda t, r: (["do it", "--repo", str(t)], {}), ["not a git repository"]),
    "unknown_base": (lambda t, r: (["do it", "--base-branch", "nope"], {}), ["nope"]),
    "bad_base_name": (lambda t, r: (["do it", "--base-branch", "--upload-pack=x"], {}), []),
    "unknown_strategy": (lambda t, r: (["do it", "--strategy", "best-of-five"], {}), ["best-of-five", "best-of-n"]),
    "missing_file": (lambda t, r: (["do it", "--strategy", str(t / "nope.py")], {}), ["does not exist"]),
    "syntax_error": (
        lambda t, r: (
            ["do it", "--strategy", str(write(t / "bad.py", "async def strategy(p, b, ctx):\n    return (\n"))],
            {},
        ),
        ["bad.py:", "syntax error"],
    ),
    "no_strategy_fn": (
        lambda t, r: (["do it", "--strategy", str(write(t / "empty.py", "X = 1\n"))], {}),
        ["no strategy function"],
    ),
    "unknown_param": (lambda t, r: (["do it", "--strategy", "simple", "-S", "n=3"], {}), ["'n'", "import_policy"]),
    # a near miss is named (issue 30): an underscore for a hyphen, a doubled letter
    "strategy_near_miss": (
        lambda t, r: (["do it", "--strategy", "best_of_n"], {}),
        ["unknown strategy 'best_of_n' (did you mean best-of-n?)"],
    ),
    "param_near_miss": (
        lambda t, r: (["do it", "--strategy", "best-of-n", "-S", "nn=3"], {}),
        ["has no parameter 'nn' (did you mean n?)"],
    ),
    "config_key_near_miss": (
        lambda t, r: (["do it", "--config", str(write(t / "c.yaml", "runner:\n  docker_imge: x\n"))], {}),
        ["'runner.docker_imge' (did you mean runner.docker_image?)"],
    ),
    "model_near_miss": (lambda t, r: (["do it", "--model", "sonet"], {}), ["'sonet'", "(did you mean sonnet?)"]),
    "bad_param_type": (
        lambda t, r: (["do it", "--strategy", "simple", "-S", "import_policy=sometimes"], {}),
        ["import_policy"],
    ),
    "param_missing_equals": (lambda t, r: (["do it", "-S", "import_policy"], {}), ["missing '='"]),
    "malformed_yaml": (
        lambda t, r: (["do it", "--config", str(write(t / "c.yaml", "runner: [unclosed\n"))], {}),
        ["c.yaml", "YAML"],
    ),
    "malformed_json": (lambda t, r: (["do it", "--config", str(write(t / "c.json", "{nope"))], {}), ["c.json", "JSON"]),
    "unknown_config_key": (
        lambda t, r: (["do it", "--config", str(write(t / "c.yaml", "runner:\n  cpu_count: 3\n"))], {}),
        ["runner.cpu_count", "c.yaml"],
    ),
    "config_wrong_type": (
        lambda t, r: (["do it", "--config", str(write(t / "c.yaml", "runner:\n  container_cpu: lots\n"))], {}),
        ["container_cpu"],
    ),
    "env_unknown_key": (lambda t, r: (["do it"], {"ORCHESTRATOR_RUNNER__NOPE": "1"}), ["ORCHESTRATOR_RUNNER__NOPE"]),
    "unknown_model": (lambda t, r: (["do it", "--model", "gpt-17"], {}), ["gpt-17"]),
    "unknown_plugin": (lambda t, r: (["do it", "--plugin", "cursor"], {}), ["cursor", "claude-code"]),
    "docker_unreachable": (lambda t, r: (["do it"], {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}), ["Docker"]),
    "missing_image": (
        lambda t, r: (["do it", "--docker-image", "no-such-image:42"], {}),
        ["no-such-image:42", "setup-docker.sh"],
    ),
    "missing_credentials": (lambda t, r: (["do it"], {"ANTHROPIC_API_KEY": ""}), ["ANTHROPIC_API_KEY"]),
    "resume_unknown": (lambda t, r: (["--resume", "run_19990101_000000"], {}), ["run_19990101_000000"]),
    "max_parallel_zero": (lambda t, r: (["do it", "--max-parallel", "0"], {}), ["--max-parallel"]),
    # numeric flags answer in the user's words, not the configuration validator's
    # ("budget.max_cost_usd: Expected `float` > 0.0") nor argparse's ("invalid int value")
    "max_cost_negative": (
        lambda t, r: (["do it", "--max-cost", "-5"], {}),
        ["orchestrator: error: --max-cost must be a positive amount in US dollars, got -5"],
    ),
    "max_cost_zero": (lambda t, r: (["do it", "--max-cost", "0"], {}), ["--max-cost must be a positive", "got 0"]),
    "max_cost_text": (lambda t, r: (["do it", "--max-cost", "ten"], {}), ["--max-cost must be a positive", "got ten"]),
    "max_cost_infinite": (lambda t, r: (["do it", "--max-cost", "inf"], {}), ["--max-cost must be", "got inf"]),
    "max_tokens_zero": (
        lambda t, r: (["do it", "--max-tokens", "0"], {}),
        ["orchestrator: error: --max-tokens must be a whole number of tokens, at least 1, got 0"],
    ),
    "max_tokens_fraction": (lambda t, r: (["do it", "--max-tokens", "1.5"], {}), ["--max-tokens must be", "got 1.5"]),
    "max_parallel_text": (
        lambda t, r: (["do it", "--max-parallel", "lots"], {}),
        ["orchestrator: error: --max-parallel must be a whole number, at least 1, got lots"],
    ),
    "runs_text": (
        lambda t, r: (["do it", "--runs", "two"], {}),
        ["--runs must be a whole number, at least 1, got two"],
    ),
    "docker_host_zero_slots": (
        lambda t, r: (["do it", "--docker-host", "big=local:0"], {}),
        ["--docker-host 'big=local:0': its slot count N must be a whole number of at least 1, got 0"],
    ),
    "docker_host_negative_slots": (
        lambda t, r: (["do it", "--docker-host", "big=ssh://ci@big:-2"], {}),
        ["--docker-host 'big=ssh://ci@big:-2': its slot count N must be a whole number of at least 1, got -2"],
    ),
    "resume_negative_cap": (
        lambda t, r: (["--resume", "run_19990101_000000", "--max-cost", "-1"], {}),
        ["--max-cost must be a positive amount in US dollars, got -1"],
    ),
    "config_negative_cap": (
        lambda t, r: (["do it", "--config", str(write(t / "c.yaml", "budget:\n  max_cost_usd: -5\n"))], {}),
        ["c.yaml: budget.max_cost_usd must be a number greater than 0"],
    ),
    "env_zero_tokens": (
        lambda t, r: (["do it"], {"ORCHESTRATOR_BUDGET__MAX_TOKENS": "0"}),
        ["ORCHESTRATOR_BUDGET__MAX_TOKENS: budget.max_tokens must be a whole number of at least 1"],
    ),
    "empty_prompt": (lambda t, r: (["   "], {}), ["empty"]),
    "no_prompt": (lambda t, r: ([], {}), ["no prompt"]),
    "runs_zero": (lambda t, r: (["do it", "--runs", "0"], {}), ["--runs"]),
    "two_output_modes": (lambda t, r: (["do it", "--json", "--quiet"], {}), ["not allowed"]),
    "unknown_flag": (lambda t, r: (["do it", "--frobnicate"], {}), ["--frobnicate"]),
    "resume_fresh_alone": (lambda t, r: (["do it", "--resume-fresh"], {}), ["--resume"]),
    # a resumed run keeps its configuration: a flag that would change it is named, before anything else
    "resume_with_model": (
        lambda t, r: (["--resume", "run_19990101_000000", "--model", "opus"], {}),
        ["--model", "cannot be used with --resume", "--max-parallel"],
    ),
    "resume_with_params": (
        lambda t, r: (["--resume", "run_19990101_000000", "-S", "n=2", "--strategy", "best-of-n"], {}),
        ["--strategy, -S", "cannot be used with --resume"],
    ),
    "resume_with_config": (lambda t, r: (["--resume", "run_19990101_000000", "--config", "x.yaml"], {}), ["--config"]),
    "resume_with_prompt": (lambda t, r: (["do it", "--resume", "run_19990101_000000"], {}), ["prompt", "--resume"]),
    # flags that cannot change a result are accepted: the error is about the unknown run
    "resume_allowed_flags": (
        lambda t, r: (
            ["--resume", "run_19990101_000000", "--resume-fresh", "--max-parallel", "3", "--quiet", "--debug"],
            {},
        ),
        ["no run 'run_19990101_000000'"],
    ),
}


@pytest.mark.docker
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gets_one_line_and_exit_2(case, tmp_path, repo):
    build, needles = CASES[case]
    args, env_extra = build(tmp_path, repo)
    if "--docker-image" not in args and "--resume" not in args:  # a resumed run uses its recorded image
        args = args + IMG
    result = run_cli(args, cwd=repo, env=cli_env(tmp_path, **env_extra), timeout=60)
    assert_clean_usage_error(result, tmp_path, *needles)


@pytest.mark.docker
def test_resume_of_a_live_run_is_refused(tmp_path, repo):
    env = cli_env(tmp_path)
    proc = subprocess.Popen(
        [*__import__("cli_helpers").ORCH.split(), "SIM: sleep 30", "--no-tui", *IMG],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        import time

        deadline = time.time() + 60
        run_id = None
        while time.time() < deadline and run_id is None:
            state = tmp_path / "state"
            if state.exists():
                runs = [p.name for p in state.iterdir() if (p / "run.json").exists()]
                if runs and (tmp_path / "logs" / runs[0] / "events.jsonl").exists():
                    run_id = runs[0]
            time.sleep(0.1)
        assert run_id
        result = run_cli(["--resume", run_id], cwd=repo, env=env, timeout=60)
        assert result.returncode == 2
        assert "live process" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    finally:
        proc.send_signal(__import__("signal").SIGINT)
        proc.communicate(timeout=60)


def test_help_lists_every_flag(tmp_path):
    result = run_cli(["--help"], cwd=tmp_path, env=cli_env(tmp_path))
    assert result.returncode == 0
    for flag in [
        "--strategy",
        "-S",
        "--runs",
        "--repo",
        "--base-branch",
        "--model",
        "--plugin",
        "--docker-image",
        "--max-parallel",
        "--config",
        "--mode",
        "--safe-fsync",
        "--require-clean-wt",
        "--no-tui",
        "--json",
        "--quiet",
        "--resume",
        "--resume-fresh",
        "--list-runs",
        "--show-run",
        "--cleanup-run",
        "--clean-containers",
        "--dry-run",
        "--force",
    ]:
        assert flag in result.stdout, flag


@pytest.mark.docker
def test_a_missing_goals_file_is_named_once(tmp_path, repo):
    # Run from the repository, "relative to the repository" and "relative to here" are one path.
    result = run_cli(["do it", "--strategy", "evolve", "-S", "goals=nope.yaml", *IMG], cwd=repo, env=cli_env(tmp_path))
    assert_clean_usage_error(result, tmp_path, "nope.yaml: goals file not found (looked for ")
    line = result.stderr.strip()
    assert line.count("nope.yaml") == 2 and " or " not in line, line  # the value, then the one path looked at
