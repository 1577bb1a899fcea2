"""``orchestrator --doctor``: one line per check (docs/cli.md). It calls the functions a run's pre-flight calls,
so the doctor and a run never disagree. Credentials are named, never shown."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import OrchestratorError
from .leftovers import counted
from .preflight import Check, _cli_overrides, build_environment, disk_check, existing, resolve_environment


def _docker_engine() -> Check:
    import anyio

    from ..runner import DOCKER_START_HINT, docker_available

    # The run's pre-flight check, with more patience: a busy daemon is not a missing one.
    ok, message = anyio.run(docker_available)
    if not ok:
        return Check("fail", "docker engine", message.split(f"; {DOCKER_START_HINT}")[0][:200], DOCKER_START_HINT)
    return Check("ok", "docker engine", message)


def _image(image: str, plugin: str, dry_run: bool = False) -> list[Check]:
    from ..agent_image.pins import mismatches, pinned_versions
    from ..agent_image.tools import TOOLS, explain_missing, probe_tools, required_tools
    from ..runner import get_plugin

    rebuild = f"orchestrator --build-image --docker-image {image}"
    try:
        tools = probe_tools(image)
    except OrchestratorError as exc:
        return [Check("fail", f"image {image}", str(exc), rebuild)]
    out = [Check("ok", f"image {image}", "present")]
    needed = set(required_tools(get_plugin(plugin), dry_run=dry_run))
    try:
        pins = pinned_versions()
    except OrchestratorError as exc:
        out.append(Check("warn", "agent CLI pins", str(exc), "reinstall orchestrator"))
        pins = {}
    wrong = mismatches(tools, pins)
    for tool in TOOLS:
        version, name = tools.get(tool), f"{tool} in {image}"
        if tool in wrong:
            got, pinned = wrong[tool]
            # An image from before the pins (or built by hand) runs a CLI whose
            # output the plugins were not checked against.
            out.append(Check("warn", name, f"{got or version} (pinned: {pinned})", rebuild))
        elif version is not None:
            pinned_note = f" (pinned: {pins[tool]})" if tool in pins and version != "simulated" else ""
            out.append(Check("ok", name, version + pinned_note))
        elif tool in needed:
            # Not always a missing tool: an image whose PATH leaves out its directory has it too.
            why, fix = explain_missing(image, [tool])
            runs = "a dry run runs it" if dry_run else f"plugin {plugin} runs it"
            out.append(Check("fail", name, f"missing ({runs}): {why[tool]}", fix if "PATH" in fix else rebuild))
        else:
            cannot = (
                "--dry-run cannot work with" if tool == "orchestrator-sim-agent" else "plugins that run it cannot use"
            )
            out.append(Check("warn", name, f"missing: {cannot} this image", "orchestrator --build-image"))
    return out


def _credentials(environ: dict[str, str], configured: str, mode: str | None, dry_run: bool = False) -> list[Check]:
    from ..runner import PLUGIN_MODULES, get_plugin
    from .auth import resolve_auth

    out = []
    for plugin in PLUGIN_MODULES:
        runner_plugin = get_plugin(plugin)
        caps = runner_plugin.capabilities
        names = caps.auth_env
        if not names:
            continue  # it needs no credentials
        present = [n for n in names if environ.get(n)]
        try:
            auth = resolve_auth(environ, plugin=runner_plugin, mode=mode if "oauth" in caps.auth_methods else None)
            runner_plugin.validate_environment(auth)
        except OrchestratorError:
            # A dry run's agent is simulated: it needs no credentials, a real run does.
            status = "fail" if plugin == configured and not dry_run else "warn"
            if plugin != configured:
                detail = "not set"
            elif dry_run:
                detail = "not set (a dry run needs none; a real run with the configured plugin does)"
            else:
                detail = "not set (the configured plugin)"
            out.append(
                Check(
                    status,
                    f"credentials for {plugin}",
                    detail,
                    f"set {' or '.join(names)} in the environment or ./.env"
                    + ("" if dry_run else " (or rehearse with --dry-run)"),
                )
            )
            continue
        out.append(Check("ok", f"credentials for {plugin}", f"{', '.join(present)} set (value not shown)"))
    return out


def _repository(repo: str, base_branch: str | None, ignore: tuple[Path, ...] = ()) -> list[Check]:
    from ..runner import open_repository, resolve_base_branch, validate_repository

    # The path and the branch are told apart: a repository without the branch
    # asked for is still a repository, and the fix is another branch name.
    try:
        top, _, _ = open_repository(repo)
    except OrchestratorError as exc:
        return [Check("fail", "repository", str(exc), "run from a git repository or pass --repo PATH")]
    out = [Check("ok", "repository", str(top))]
    try:
        base = resolve_base_branch(top, base_branch)
    except OrchestratorError as exc:
        # Its message is "what is wrong; what to do": the doctor's detail and fix.
        detail, _, fix = str(exc).partition("; ")
        out.append(Check("fail", "base branch", detail, fix or "pass --base-branch NAME"))
    else:
        out.append(Check("ok", "base branch", base.name + (f" ({base.chosen})" if base.chosen else "")))
        if validate_repository(top, base.name, ignore=ignore).dirty:
            detail = "uncommitted changes: agents start from the last commit"
            out.append(Check("warn", "working tree", detail, "commit or stash them"))
    ident = {
        key: subprocess.run(["git", "config", "--get", key], cwd=top, capture_output=True, text=True).stdout.strip()
        for key in ("user.name", "user.email")
    }
    missing = [k for k, v in ident.items() if not v]
    if missing:
        out.append(
            Check(
                "warn",
                "git identity",
                f"{' and '.join(missing)} not set for {top}",
                " && ".join(f'git config --global {k} "..."' for k in missing),
            )
        )
    else:
        out.append(Check("ok", "git identity", f"{ident['user.name']} <{ident['user.email']}>"))
    return out


def _writable(path: Path, label: str, env_var: str) -> Check:
    try:
        fd, name = tempfile.mkstemp(prefix=".doctor-", dir=existing(path))
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return Check(
            "fail",
            f"{label} directory",
            f"{path} is not writable ({exc.strerror})",
            f"fix its permissions or set {env_var} to a writable directory",
        )
    return Check("ok", f"{label} directory", f"{path} writable" + ("" if path.exists() else " (will be created)"))


def _environment(config, repo: str, base_branch: str | None, agent_image: str, plugin: str) -> list[Check]:
    """Find or build the project's environment (setup included) and look for the tools inside it."""
    from ..agent_image import environment
    from ..agent_image.tools import explain_missing, probe_tools, required_tools
    from ..runner import get_plugin, open_repository, resolve_base_branch

    try:
        top, _, _ = open_repository(repo)
        base = resolve_base_branch(top, base_branch)
    except OrchestratorError:
        return []  # the repository check says what is wrong
    found = subprocess.run(
        ["git", "-C", str(top), "rev-parse", "--verify", "-q", f"{base.name}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        return []
    repo = str(top)
    commit = found.stdout.decode().strip()
    try:
        spec = resolve_environment(config.environment, repo, commit)
    except OrchestratorError as exc:
        return [Check("fail", "environment", str(exc), "see docs/environment.md")]
    out = []
    if config.environment.devcontainer and (spec is None or spec.devcontainer):
        note = environment.worktree_note(repo, commit)
        if note:
            out.append(Check("warn", "environment", note.removeprefix("environment: ")))
    if spec is None:
        return [*out, Check("ok", "environment", f"none set: runs use the agent image {agent_image} as it is")]
    out += [Check("warn", "environment", note) for note in spec.notes]
    try:
        image = build_environment(spec, repo, commit, agent_image)
        tools = probe_tools(image)
    except OrchestratorError as exc:
        lines = str(exc).splitlines()
        for line in lines[1:]:
            print(f"  {line}", file=sys.stderr)
        return [
            *out,
            Check("fail", "environment", lines[0], "fix the setup (its output is above) and run --doctor again"),
        ]
    out.append(Check("ok", "environment", f"{spec.source}: image {image}"))
    wanted = list(dict.fromkeys(("git", *required_tools(get_plugin(plugin), dry_run=False), "orchestrator-sim-agent")))
    missing = [tool for tool in wanted if tools.get(tool) is None]
    why, fix = explain_missing(image, missing, source=spec.source) if missing else ({}, "")
    for tool in wanted:
        if tool in why:
            out.append(Check("fail", f"{tool} in the environment", f"missing: {why[tool]}", fix))
        else:
            out.append(Check("ok", f"{tool} in the environment", tools[tool] or "present"))
    return out


def _hosts(config) -> list[Check]:
    """What protects each configured engine's traffic; read from the configuration, no connection made."""
    from ..runner import resolve_hosts, transport_risk

    try:
        specs = resolve_hosts(config.runner.hosts)
    except OrchestratorError as exc:
        return [Check("fail", "docker hosts", str(exc))]
    out = []
    for spec in specs:
        name, detail = f"docker host {spec.name}", f"transport {spec.transport} ({spec.shown_url})"
        risk = transport_risk(spec)
        if risk is None:
            out.append(Check("ok", name, detail))
        else:
            why = f", {risk.why}" if risk.why else ""
            out.append(Check("warn", name, f"{detail}{why}: {risk.exposed}", risk.fix))
    return out


def _cluster(config, image: str) -> list[Check]:
    """runner.kubernetes: reachable, version, namespace, a SelfSubjectAccessReview per verb used, the image."""
    import anyio

    from ..runner import ClusterSpec, cluster_checks

    try:
        rows = anyio.run(cluster_checks, ClusterSpec.of(config.runner.kubernetes), image)
    except OrchestratorError as exc:
        return [Check("fail", "kubernetes", str(exc), "pass --kubeconfig FILE or set runner.kubernetes")]
    return [Check(*row) for row in rows]


def checks(args) -> list[Check]:
    from ..config import load_config
    from ..log.runs import RunDirs
    from ..runner import register_plugins, workspace_root

    out: list[Check] = []
    try:
        # Only where the tasks would run and in which environment: the other flags are checked as
        # given (--plugin, --docker-image).
        over = _cli_overrides(args)
        placement = {k: v for k, v in over.get("runner", {}).items() if k in ("hosts", "kubernetes")}
        over = {"runner": placement, "environment": over.get("environment")}
        loaded = load_config(config_file=args.config, cli_overrides={k: v for k, v in over.items() if v})
        register_plugins(loaded.config.runner.plugin_modules)
    except OrchestratorError as exc:
        return [Check("fail", "configuration", str(exc), "correct the file or variable named")]
    config = loaded.config
    out.append(Check("ok", "configuration", ", ".join(loaded.sources)))
    image = args.docker_image or config.runner.docker_image
    dry_run = bool(getattr(args, "dry_run", False))
    plugin = args.plugin or config.runner.plugin
    engine = _docker_engine()
    out.append(engine)
    if engine.status == "ok":
        out.extend(_image(image, plugin, dry_run))
    out.extend(_credentials(loaded.environ, plugin, args.mode, dry_run))
    if config.runner.hosts:
        out.extend(_hosts(config))
    if config.runner.kubernetes is not None:
        out.extend(_cluster(config, image))
    dirs = RunDirs.from_env()
    o = config.orchestration
    out.append(disk_check(dirs.logs, "logs", o.min_free_disk_gb, o.hard_min_free_disk_gb))
    out.append(disk_check(workspace_root(), "workspaces", o.min_free_disk_gb, o.hard_min_free_disk_gb))
    repo, base_branch = str(Path(args.repo or ".").absolute()), args.base_branch or o.base_branch
    out.extend(_repository(repo, base_branch, ignore=(dirs.logs, dirs.state, dirs.results)))
    if engine.status == "ok":
        out.extend(_environment(config, repo, base_branch, image, plugin))
    for path, label in ((dirs.state, "state"), (dirs.logs, "logs"), (dirs.results, "results")):
        out.append(_writable(path, label, f"ORCHESTRATOR_{label.upper()}_DIR"))
    out.append(_writable(workspace_root(), "workspace", "ORCHESTRATOR_WORKSPACE_ROOT"))
    return out


def doctor(args) -> int:
    results = checks(args)
    for check in results:
        print(check.line(), flush=True)
    failed = sum(c.status == "fail" for c in results)
    warned = sum(c.status == "warn" for c in results)
    what = " (checked what a dry run needs)" if getattr(args, "dry_run", False) else ""
    print(f"{failed} failed, {counted(warned, 'warning')}, {len(results) - failed - warned} ok{what}", file=sys.stderr)
    return 1 if failed else 0
