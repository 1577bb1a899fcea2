"""The ``orchestrator`` command: its flags, and the one command they ask for (exit codes: docs/cli.md)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

from ..errors import OrchestratorError, RunLockedError, UsageError

EPILOG = """\
examples:
  orchestrator "add input validation to the signup form"
  orchestrator "refactor the parser" --strategy best-of-n -S n=5 --runs 2
  orchestrator "make it faster" --strategy tree-beam -S eval_command="python bench.py --json"
  orchestrator "try it out" --dry-run            # rehearse at no cost with a simulated agent
  orchestrator --resume run_20250114_123456
  orchestrator --list-runs

strategies: simple, best-of-n, iterative, plan-score-implement, tree-beam, evolve, review-loop, synthesize,
or a file (./my_strategy.py[:func]) or module (pkg.mod:func). See their parameters with
  orchestrator --help-strategy NAME

exit codes: 0 success, 1 a strategy failed, 2 bad usage or configuration, 130 interrupted
"""


class _VersionAction(argparse.Action):
    """``--version``: the package metadata is read only when asked (it costs ~10 ms at every start)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"orchestrator {version('orchestrator')}")
        except PackageNotFoundError:
            print("orchestrator unknown")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        head, sep, said = message.partition(": ")
        if sep and head.startswith("argument ") and said.startswith("--"):
            raise UsageError(said)  # a flag's own check (_whole, _usd) said it all
        raise UsageError(f"{message} (see orchestrator --help)")


def _whole(flag: str, unit: str = "") -> Callable[[str], int]:
    """A flag's value as a whole number of at least 1, or the line that says what it must be."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number{unit}, at least 1, got {text}")
        return value

    return parse


def _usd(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"--max-cost must be a positive amount in US dollars, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="orchestrator",
        description="Run AI coding agents in parallel, each in its own container "
        "and git clone, driven by a durable strategy; every agent's work comes back as a branch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("prompt", nargs="?", help="what the agents should do ('-' reads it from standard input)")
    p.add_argument("--version", action=_VersionAction, help="show the version and exit")
    run = p.add_argument_group("run")
    _add_task_flags(run)
    _add_placement_flags(run)
    run.add_argument("--config", help="configuration file, YAML or JSON (default: ./orchestrator.yaml if present)")
    run.add_argument("--mode", choices=["api", "subscription"], help="Claude authentication mode")
    run.add_argument(
        "--max-cost", type=_usd, metavar="USD", help="spending cap of the whole run in USD (also with --resume)"
    )
    run.add_argument(
        "--max-tokens",
        type=_whole("--max-tokens", " of tokens"),
        metavar="N",
        help="cap on the tokens the whole run's agents use (also with --resume)",
    )
    run.add_argument("--safe-fsync", choices=["interval", "per_event"], help="event log flush policy")
    _switch(run, "--require-clean-wt", "refuse to start when the repository has uncommitted changes")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="real engine, git, Docker and command tasks; agent tasks answered by a simulated agent, no cost",
    )
    run.add_argument("--debug", action="store_true", help="also print component logs to stderr")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--no-tui", action="store_true", help="one line per event instead of the dashboard")
    out.add_argument("--json", action="store_true", help="machine-readable event lines")
    out.add_argument("--quiet", action="store_true", help="only the final summary")
    _add_management_flags(p)
    return p


def _switch(group, flag: str, help: str) -> None:
    """An on/off flag that is None when not given, so the configuration's value stands."""
    group.add_argument(flag, action="store_true", default=None, help=help)


def _repeated(group, *names: str, dest: str, metavar: str, help: str) -> None:
    group.add_argument(*names, dest=dest, action="append", default=[], metavar=metavar, help=help)


def _add_task_flags(run) -> None:
    """What the run does: the strategy, its parameters, the repository, the agent and its environment."""
    run.add_argument(
        "--strategy", help="built-in name, path/to/file.py[:func] or package.module:func (default: simple)"
    )
    _repeated(
        run,
        "-S",
        dest="params",
        metavar="KEY=VALUE",
        help="strategy parameter (repeatable; typed: int, float, bool, JSON list/object, else string)",
    )
    run.add_argument(
        "--runs", "--executions", type=_whole("--runs"), help="parallel strategy executions in this run (default 1)"
    )
    run.add_argument("--repo", help="repository to work on (default: current directory)")
    run.add_argument("--base-branch", help="branch the agents start from (default: main, else the current branch)")
    run.add_argument("--model", help="model name (default: sonnet)")
    run.add_argument("--plugin", help="agent tool: claude-code (default), codex, or command")
    run.add_argument("--docker-image", help="agent image (default: claude-code)")
    run.add_argument(
        "--env-image", metavar="IMAGE", help="the project's environment: agents run in IMAGE with the agent tools added"
    )
    run.add_argument(
        "--env-dockerfile",
        metavar="PATH",
        help="the project's environment built from this Dockerfile of the repository",
    )
    run.add_argument(
        "--env-setup",
        metavar="CMD",
        action="append",
        help="a setup command run once at the base commit before any task (repeatable)",
    )
    _switch(run, "--no-devcontainer", "ignore the repository's .devcontainer/devcontainer.json")


def _add_placement_flags(run) -> None:
    """Where the tasks run: how many at once, on which Docker engines or Kubernetes cluster."""
    run.add_argument(
        "--max-parallel",
        type=_whole("--max-parallel"),
        help="tasks running at once (default: auto from CPUs; with hosts: the sum of their slots, and this caps it)",
    )
    _repeated(
        run,
        "--docker-host",
        dest="docker_hosts",
        metavar="NAME=URL[:N]",
        help="place tasks on this Docker engine too (repeatable; ssh://, tcp://, unix:// or 'local'; N: its slots)",
    )
    _switch(run, "--sync-image", "copy the run's image to hosts that lack it (docker save | docker load)")
    run.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="run every task as a Pod of this Kubernetes cluster (runner.kubernetes.kubeconfig)",
    )
    run.add_argument(
        "--namespace",
        metavar="NS",
        help="the cluster's namespace for the run's Pods (runner.kubernetes.namespace; implies Kubernetes)",
    )


def _add_management_flags(p: argparse.ArgumentParser) -> None:
    mgmt = p.add_argument_group("run management")
    mgmt.add_argument("--resume", metavar="RUN_ID", help="continue an interrupted run: nothing finished runs again")
    mgmt.add_argument(
        "--resume-fresh",
        action="store_true",
        help="with --resume: restart interrupted tasks in a fresh clone with a fresh agent session "
        "(by default each continues its session in the workspace it left)",
    )
    mgmt.add_argument("--list-runs", action="store_true", help="list runs with their status")
    mgmt.add_argument("--show-run", metavar="RUN_ID", help="show a run's details and summary")
    mgmt.add_argument("--follow", action="store_true", help="with --show-run: live dashboard of the run")
    mgmt.add_argument(
        "--html",
        action="store_true",
        help="with --show-run: rebuild results/RUN_ID/report.html from the event log and print its path",
    )
    mgmt.add_argument(
        "--open", dest="open_report", action="store_true", help="with --show-run --html: open the report in a browser"
    )
    mgmt.add_argument(
        "--cleanup-run", metavar="RUN_ID", help="remove a run's containers, volumes, workspaces and state"
    )
    mgmt.add_argument(
        "--clean-containers", action="store_true", help="remove stopped orchestrator containers past retention"
    )
    mgmt.add_argument("--force", action="store_true", help="with --clean-containers: do not ask for confirmation")
    mgmt.add_argument("--help-strategy", metavar="NAME", help="show a strategy's parameters")
    setup = p.add_argument_group("setup")
    setup.add_argument(
        "--build-image",
        action="store_true",
        help="build the agent image (--docker-image, default claude-code) from the installed sources",
    )
    setup.add_argument("--test-image", metavar="NAME", help=argparse.SUPPRESS)  # scripts/setup-docker.sh
    setup.add_argument(
        "--doctor",
        action="store_true",
        help="check Docker, the image and its tools, credentials, disk, the repository and directories",
    )
    mgmt.add_argument(
        "--hosts",
        dest="check_hosts",
        action="store_true",
        help="check every Docker host: version, image, free slots, round-trip time",
    )


def _dispatch(args: argparse.Namespace) -> int:
    import anyio

    from . import launch, preflight

    management = {
        "--resume": args.resume,
        "--list-runs": args.list_runs,
        "--show-run": args.show_run,
        "--cleanup-run": args.cleanup_run,
        "--clean-containers": args.clean_containers,
        "--help-strategy": args.help_strategy,
        "--build-image": args.build_image,
        "--doctor": args.doctor,
        "--hosts": args.check_hosts,
    }
    if sum(map(bool, management.values())) > 1:
        raise UsageError(f"use only one of {', '.join(management)}")
    if args.test_image and not args.build_image:
        raise UsageError("--test-image only works together with --build-image")
    if args.build_image:
        from ..agent_image.build import build_image
        from ..config import load_config

        kube = {k: v for k in ("kubeconfig", "namespace") if (v := getattr(args, k, None)) is not None}
        loaded = load_config(config_file=args.config, cli_overrides={"runner": {"kubernetes": kube}} if kube else {})
        image = args.docker_image or loaded.config.runner.docker_image
        build_image(image, test_image=args.test_image)
        if loaded.config.runner.kubernetes is not None:
            from ..runner import image_to_cluster

            # The tasks run the test image when one is built, on the agent image otherwise.
            image_to_cluster(loaded.config.runner.kubernetes.load_command, args.test_image or image)
        return 0
    if args.doctor:
        from .doctor import doctor

        return doctor(args)
    if args.resume_fresh and not args.resume:
        raise UsageError("--resume-fresh only works together with --resume RUN_ID")
    if args.follow and not args.show_run:
        raise UsageError("--follow only works together with --show-run RUN_ID")
    if (args.html or args.open_report) and not args.show_run:
        raise UsageError("--html and --open only work together with --show-run RUN_ID")
    if args.open_report and not args.html:
        raise UsageError("--open needs --html: orchestrator --show-run RUN_ID --html --open")
    if args.html and args.follow:
        raise UsageError("use either --follow (live dashboard) or --html (report file) with --show-run, not both")
    if any(management.values()) and not args.resume:
        from . import manage
    if args.help_strategy:
        return manage.help_strategy(args.help_strategy)
    if args.list_runs:
        return manage.list_runs(args.repo)
    if args.show_run and args.html:
        return manage.show_run_html(args.show_run, open_browser=args.open_report, repo=args.repo)
    if args.show_run:
        return anyio.run(manage.show_run, args.show_run, args.follow, args.repo)
    if args.check_hosts or args.cleanup_run or args.clean_containers:
        from ..config import load_config

        config = load_config(config_file=args.config, cli_overrides=preflight._cli_overrides(args)).config
        if args.check_hosts:
            from .hosts_cli import check_hosts

            return anyio.run(check_hosts, config)
        if args.cleanup_run:
            return anyio.run(manage.cleanup_run, args.cleanup_run, config, args.repo)
        return anyio.run(manage.clean_containers, args.dry_run, args.force, config)
    if args.resume:
        return anyio.run(launch.resume, args)
    return anyio.run(launch.start, args)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return _dispatch(args)
    except OrchestratorError as exc:
        print(f"orchestrator: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, (UsageError, RunLockedError)) else 1
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
