"""The agent's execution in its task's container: one attempt, and what it left uncommitted."""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec

from ..errors import (
    AgentStreamLostError,
    ContainerError,
    GitError,
    PreflightError,
    ResourceLimitError,
    RunnerError,
    TaskTimeoutError,
)
from ..sanitize import SECRET_ENV_VARS, Sanitizer
from . import watchdog
from .base import RunnerEventCallback
from .docker_containers import HOME_MOUNT, DockerHost
from .docker_core import ContainerStopper, TaskEvents
from .docker_exec import ExecOutput
from .docker_workspace import WorkspaceSetup
from .plugin import AgentEvent, RunnerPlugin
from .registry import get_plugin
from .types import AuthConfig, Hardening, InstanceRequest

EVENT_STRING_LIMIT = 4000

# Run in the task's container after the agent exits: $1 is the policy, $2 the
# commit message. Counts changed and untracked files (the repository's
# .gitignore applies) and, under "commit", commits them. --no-verify: the
# agent's hooks must not veto the commit that keeps its work.
UNCOMMITTED_SCRIPT = (
    "n=$(git status --porcelain --untracked-files=all | wc -l) || exit 3\n"
    'echo "uncommitted=$n"\n'
    'if [ "$n" -gt 0 ] && [ "$1" = commit ]; then\n'
    '  git add -A && git commit -q --no-verify -m "$2" && echo committed\n'
    "fi\n"
)
# Every task's process runs under a wrapper that, once the process exits, writes one last stderr line
# (taken out of the stream by run_exec) and exits with the process's status: a busy Docker engine can
# close an exec's output before it has copied it, leaving a clean, empty stream and the real exit
# status, and that line is how a complete output is told from a lost one.
#
# For an agent whose uncommitted work is looked at, the line carries the count of files it left (as
# UNCOMMITTED_SCRIPT counts them, without git's optional index lock), so the look costs no `docker
# exec` of its own. Before the agent starts, the wrapper checks that git can read the task's commit and
# its tree: a repository unusable inside the container (alternates naming a store it lacks, unreadable
# objects) would fail every commit of the agent, and the task would end "completed" with no branch.
# It then writes the cause on one marked stderr line and exits GIT_UNUSABLE_EXIT.
#
# The agent's first line names its session. The wrapper of an agent that can resume also keeps that
# line in the task's home volume, where the session itself lives (it outlasts the container, and a
# read-only workspace cannot hold it): if the orchestrator dies before it read the line (a stream
# lagging on a loaded machine or a slow link), the resume reads it there and continues the session
# instead of paying for the agent's work again. The runner names the file in $ORCHESTRATOR_FIRST_LINE
# (unset for a command). The line passes through a FIFO so that the agent stays the wrapper's own
# child (END_AGENT_SCRIPT signals those); the reader ignores SIGTERM, so the agent's last lines still
# flow while it saves its session. Without mkfifo the agent runs as before.
FIRST_LINE_ENV = "ORCHESTRATOR_FIRST_LINE"
_RUN_KEEPING_THE_FIRST_LINE = (
    f'k="${FIRST_LINE_ENV}"\n'
    'f="/tmp/orchestrator-stdout.$$"\n'
    'if [ -n "$k" ] && rm -f "$k" && mkdir -p "${k%/*}" 2>/dev/null && mkfifo "$f" 2>/dev/null; then\n'
    "  (trap '' TERM\n"
    "   IFS= read -r line; s=$?\n"
    '   printf \'%s\\n\' "$line" >"$k" 2>/dev/null\n'
    '   if [ "$s" -eq 0 ]; then printf \'%s\\n\' "$line"; else printf %s "$line"; fi\n'
    '   exec cat) <"$f" &\n'
    '  "$@" >"$f"\n'
    "  rc=$?\n"
    # cat ends once the agent's stdout closes; a process the agent left running with
    # that stdout would keep it open, so the wrapper waits for it 2 s at most.
    "  i=0\n"
    '  while kill -0 "$!" 2>/dev/null && [ "$i" -lt 200 ]; do sleep 0.01; i=$((i + 1)); done\n'
    '  rm -f "$f"\n'
    "else\n"
    '  "$@"\n'
    "  rc=$?\n"
    "fi\n"
)
GIT_UNUSABLE_EXIT = 125
GIT_UNUSABLE_MARK = b"\n@@orchestrator-git-unusable="
AGENT_WRAPPER_SCRIPT = (
    "# orchestrator-agent-wrapper\n"
    'cause=$(git cat-file -e "HEAD^{tree}" 2>&1) || {\n'
    "  printf '\\n@@orchestrator-git-unusable=%s\\n' \"$(printf %s \"$cause\" | tr '\\n' ' ')\" >&2\n"
    f"  exit {GIT_UNUSABLE_EXIT}\n"
    "}\n"
    + _RUN_KEEPING_THE_FIRST_LINE
    + "n=$(GIT_OPTIONAL_LOCKS=0 git status --porcelain --untracked-files=all 2>/dev/null | wc -l)\n"
    "printf '\\n@@orchestrator-end=%s\\n' \"$n\" >&2\n"
    'exit "$rc"\n'
)
# Any other task's process (a command, an agent whose work is not imported).
EXEC_WRAPPER_SCRIPT = (
    "# orchestrator-exec-wrapper\n" + _RUN_KEEPING_THE_FIRST_LINE + "printf '\\n@@orchestrator-end=-\\n' >&2\n"
    'exit "$rc"\n'
)
UNCOMMITTED_MESSAGE = (
    "Changes the agent left uncommitted\n\n"
    "The agent exited without committing these files; the orchestrator committed them "
    "(uncommitted: commit) so that its work reaches the task's branch."
)


def _clip(obj: Any) -> Any:
    """Bound the size of strings in agent events written to runner.jsonl."""
    if isinstance(obj, str):
        return obj if len(obj) <= EVENT_STRING_LIMIT else obj[:EVENT_STRING_LIMIT] + f"...[{len(obj)} chars]"
    if isinstance(obj, dict):
        return {k: _clip(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clip(v) for v in obj]
    return obj


@dataclass
class Attempt:
    """What one execution attempt produced (an exec output or an error)."""

    output: ExecOutput | None = None
    error: RunnerError | None = None
    # the agent's session when the attempt failed after the agent announced it
    # (its output stream was lost), so the retry can resume it
    session_id: str | None = None


@dataclass(eq=False)
class AgentExec:
    """``workspace``: a retry on a remote engine copies the clone in again when the container's volume lost it."""

    host: DockerHost
    hardening: Hardening
    auth: AuthConfig
    sanitizer: Sanitizer
    emit_event: TaskEvents
    stopper: ContainerStopper
    workspace: WorkspaceSetup
    dry_run: bool = False

    async def attempt(
        self,
        request: InstanceRequest,
        plugin: RunnerPlugin,
        workspace: Path,
        on_event: RunnerEventCallback | None,
        resume: str | None,
        previous: dict[str, float] | None,
        n: int,
        first: dict[str, Any] | None = None,
    ) -> Attempt:
        """Attempt ``n`` (0-based); ``first``: the first attempt's container, started alongside the clone."""
        ready = await self._container(request, workspace, on_event, n, first)
        if isinstance(ready, Attempt):
            return ready
        counts = _looks_at_uncommitted(request, plugin)
        argv, env = self._command(request, plugin, resume, counts)
        stdin_fn = getattr(plugin, "stdin_payload", None)
        payload = stdin_fn(request) if stdin_fn is not None else None
        files_fn = getattr(plugin, "container_files", None)
        for path, content in (files_fn(request) if files_fn is not None else {}).items():
            failure = await self._write_container_file(request.container_name, path, content)
            if failure is not None:
                return Attempt(error=failure)
        parser = plugin.new_parser(previous=previous)
        t = time.monotonic()
        self.emit_event(
            request,
            on_event,
            "runner.exec.started",
            phase="execute",
            attempt=n,
            resume_session_id=resume,
            prompt_via_stdin=payload is not None,
        )
        probe = await self._probe(request, workspace, on_event)
        tripped: list[str] = []
        self.stopper.live_agents.add(request.container_name)
        try:
            output = await self._exec(request, argv, env, parser, payload, probe, tripped, on_event)
        except TimeoutError:
            return Attempt(
                error=TaskTimeoutError(
                    f"task exceeded its timeout of {request.timeout_seconds:g}s; container stopped and kept for resume"
                )
            )
        except AgentStreamLostError as exc:
            # The agent may still be working: ended now, so it spends nothing more
            # during the backoff (a retry tries again if this fails).
            self.emit_event(request, on_event, "runner.exec.stream_lost", "warn", attempt=n, error=str(exc))
            await self.stopper.end_orphan(request, on_event)
            return Attempt(error=exc, session_id=parser.finish(None).session_id)
        except RunnerError as exc:
            self.stopper.live_agents.discard(request.container_name)
            return Attempt(error=ResourceLimitError(tripped[0]) if tripped else exc)
        self.stopper.live_agents.discard(request.container_name)
        return await self._verdict(request, output, counts, probe, tripped, on_event, n, t)

    async def recover_session(
        self, request: InstanceRequest, plugin: RunnerPlugin, on_event: RunnerEventCallback | None
    ) -> InstanceRequest:
        """The request with the session its agent announced, for a task resumed in its kept workspace whose
        process died before it read the agent's first line: the wrapper kept that line in the home volume."""
        if not (request.resume_workspace and request.session_id is None and plugin.capabilities.supports_resume):
            return request
        try:
            line = await self.host.read_file(request.container_name, first_line_path(request))
        except RunnerError:
            return request  # no line kept: the agent never wrote one, or an older wrapper ran it
        parser = plugin.new_parser()
        parser.feed(line)
        session_id = parser.finish(None).session_id
        if not session_id:
            return request
        self.emit_event(request, on_event, "runner.session.recovered", "warn", session_id=session_id)
        return msgspec.structs.replace(request, session_id=session_id)

    async def _container(
        self,
        request: InstanceRequest,
        workspace: Path,
        on_event: RunnerEventCallback | None,
        n: int,
        first: dict[str, Any] | None,
    ) -> Any:
        """The attempt's running container (announced), or the failed Attempt."""
        if first is not None:  # started alongside the clone
            if "error" in first:
                return Attempt(error=first["error"])
            ready, duration = first["ready"], first["duration_s"]
        else:
            t = time.monotonic()
            if request.container_name in self.stopper.live_agents and not await self.stopper.end_orphan(
                request, on_event
            ):
                return Attempt(
                    error=AgentStreamLostError(
                        f"the agent of the previous attempt may still be running in container "
                        f"{request.container_name}, which cannot be reached to end it; no second agent was started"
                    )
                )
            try:
                # attempt 0 follows a fresh clone; retries reuse the same workspace and container
                ready = await self.workspace.ensure_container(request, workspace, fresh=n == 0)
            except RunnerError as exc:
                return Attempt(error=exc)
            if self.host.archive:
                failure = await self.workspace.archive_copy_in(request, workspace, ready, on_event, fresh=False)
                if failure is not None:
                    return Attempt(error=failure)
            duration = round(time.monotonic() - t, 4)
        if ready.action == "replaced":
            self.emit_event(
                request,
                on_event,
                "runner.container.replaced",
                "warn",
                container=ready.name,
                reason=ready.reason,
                volume=ready.volume,
            )
        self.emit_event(
            request,
            on_event,
            "runner.container.ready",
            phase="container",
            action=ready.action,
            container=ready.name,
            volume=ready.volume,
            attempt=n,
            duration_s=duration,
        )
        return ready

    def _command(
        self, request: InstanceRequest, plugin: RunnerPlugin, resume: str | None, counts: bool
    ) -> tuple[list[str], dict[str, str]]:
        """The agent's argv under its wrapper, and its environment (its secrets given to the sanitizer)."""
        build: Any = plugin.build_command  # a plugin may also take the credentials, beyond the protocol
        if "auth" in inspect.signature(build).parameters:
            argv = build(request, resume_session_id=resume, auth=self.auth)
        else:
            argv = build(request, resume_session_id=resume)
        persona = plugin.capabilities.simulated_as
        if self.dry_run and persona is not None:
            # Dry run: the deterministic simulated agent answers in the same container, at no cost.
            argv = ["orchestrator-sim-agent", "--as", persona, *argv[1:]]
        script = AGENT_WRAPPER_SCRIPT if counts else EXEC_WRAPPER_SCRIPT
        argv = ["sh", "-c", script, "orchestrator-agent", *argv]
        env = dict(request.env)
        if plugin.capabilities.supports_resume:
            env[FIRST_LINE_ENV] = first_line_path(request)
        try:
            env.update(plugin.prepare_environment(self.auth, request))
        except PreflightError:
            if not self.dry_run:
                raise
            # the simulated agent needs no credentials
        self.sanitizer.add_secrets(v for k, v in env.items() if k in SECRET_ENV_VARS)
        return argv, env

    async def _exec(
        self,
        request: InstanceRequest,
        argv: list[str],
        env: dict[str, str],
        parser: Any,
        payload: bytes | None,
        probe: watchdog.Probe | None,
        tripped: list[str],
        on_event: RunnerEventCallback | None,
    ) -> ExecOutput:
        """The agent's exec under the task's timeout, with the watchdog alongside."""

        def forward(event: AgentEvent) -> None:
            self.emit_event(request, on_event, f"runner.{event.kind}", "debug", data=_clip(event.data))

        async def end_agent() -> None:
            # Ctrl+C or the timeout: the agent gets its grace to save its session while
            # its last lines (and, read late, its first, which names the session) are read.
            # Given once only: the container's stop that follows does not wait again.
            if request.container_name in self.stopper.live_agents:
                await self.stopper.end_agent(request, on_event)
                self.stopper.live_agents.discard(request.container_name)

        error: RunnerError | None = None
        with anyio.fail_after(request.timeout_seconds):
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, request, probe, tripped, on_event)
                try:
                    output: ExecOutput = await self.host.run_exec(
                        request.container_name,
                        argv,
                        env=env,
                        parser=parser,
                        stdin_payload=payload,
                        on_event=forward,
                        wrapped=True,
                        on_cancel=end_agent,
                    )
                except RunnerError as exc:
                    # Kept inside the group: leaving it would wrap the error in an
                    # ExceptionGroup, and a Docker failure would pass for a bug of ours.
                    error = exc
                finally:
                    tg.cancel_scope.cancel()
        if error is not None:
            raise error
        return output

    async def _verdict(
        self,
        request: InstanceRequest,
        output: ExecOutput,
        counts: bool,
        probe: watchdog.Probe | None,
        tripped: list[str],
        on_event: RunnerEventCallback | None,
        n: int,
        t: float,
    ) -> Attempt:
        """What a finished exec means: an unusable repository, a lost output, a limit hit, or the output."""
        unusable = _git_unusable(output) if counts else None
        if unusable is not None:
            return Attempt(error=unusable)
        lost = _output_lost(output, time.monotonic() - t)
        if lost is not None:
            # The process ran to its end; only what it said is gone. A session an
            # agent announced is resumed, so a retry pays for one more turn at
            # most; a command runs again.
            self.emit_event(request, on_event, "runner.exec.output_lost", "warn", attempt=n, error=str(lost))
            return Attempt(error=lost, session_id=output.outcome.session_id)
        # once more at the end: a runaway that finished between two looks still counts
        reason = tripped[0] if tripped else (await anyio.to_thread.run_sync(watchdog.check, probe) if probe else None)
        if reason:
            self.emit_event(request, on_event, "runner.limit.hit", "error", reason=reason)
            return Attempt(error=ResourceLimitError(reason))
        self.emit_event(
            request,
            on_event,
            "runner.exec.finished",
            phase="execute",
            attempt=n,
            exit_code=output.exit_code,
            is_error=output.outcome.is_error,
            session_id=output.outcome.session_id,
            events=output.events,
            duration_s=round(time.monotonic() - t, 4),
        )
        return Attempt(output=output)

    async def _write_container_file(self, container: str, path: str, content: bytes) -> RunnerError | None:
        """Write ``content`` to ``path`` inside the container (as node, so the tool can read it)."""
        argv = ["/bin/sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path]
        try:
            out = await self.host.run_exec(
                container,
                argv,
                env={},
                parser=get_plugin("command").new_parser(),
                stdin_payload=content,
                on_event=lambda event: None,
            )
        except RunnerError as exc:
            return exc
        if out.exit_code != 0:
            detail = out.stderr_tail.decode("utf-8", "replace").strip()[-500:]
            return ContainerError(
                f"could not write {path} in container {container} (exit {out.exit_code}): {detail}", retryable=False
            )
        return None

    async def _probe(
        self, request: InstanceRequest, workspace: Path, on_event: RunnerEventCallback | None = None
    ) -> watchdog.Probe | None:
        """Where the watchdog reads this container's numbers (None when the container cannot be inspected)."""
        if self.host.archive:
            # Another machine's engine: its container's pid, cgroup and /tmp are not
            # on this machine (a pid here would be some other process), and the agent
            # writes a volume there, not the local clone. Only the container's own
            # limits apply.
            self.emit_event(
                request,
                on_event,
                "runner.watchdog.skipped",
                host=self.host.name,
                reason="remote engine: only the container's limits apply",
            )
            return None
        try:
            info = await self.host.api(
                f"inspect container {request.container_name}", "inspect_container", request.container_name
            )
        except RunnerError:
            return None
        return await anyio.to_thread.run_sync(
            lambda: watchdog.make_probe(
                info,
                workspace=workspace,
                pids_limit=self.hardening.pids_limit,
                max_workspace_mb=self.hardening.max_workspace_mb,
            )
        )

    async def _watch(
        self,
        request: InstanceRequest,
        probe: watchdog.Probe | None,
        tripped: list[str],
        on_event: RunnerEventCallback | None,
    ) -> None:
        """Stop the container when the agent runs away; the exec then ends and the attempt reports why."""
        if probe is None:
            return
        looks = 0
        while True:
            await anyio.sleep(watchdog.WATCH_INTERVAL_S)
            looks += 1
            walk = looks % watchdog.WORKSPACE_EVERY == 0
            reason = await anyio.to_thread.run_sync(functools.partial(watchdog.check, probe, workspace=walk))
            if reason:
                tripped.append(reason)
                self.stopper.live_agents.discard(request.container_name)  # killed, not given a grace to save a session
                self.emit_event(request, on_event, "runner.limit.hit", "error", reason=reason)
                # kill, not a graceful stop: a fork bomb has no session worth saving
                try:
                    await self.host.kill(request.container_name)
                except RunnerError:
                    await self.stopper.stop_quietly(request, on_event)
                return

    async def uncommitted(
        self, request: InstanceRequest, plugin: RunnerPlugin, on_event: RunnerEventCallback | None, counted: int | None
    ) -> tuple[int, bool] | None:
        """Changes the agent left uncommitted: (file count, committed?), or None when not looked at.

        Agents in non-interactive mode often edit files and finish without
        committing, and the import transfers commits only. Status and commit run
        inside the task's container, as the agent's user: git there may run
        filters and hooks the agent configured, which must never run on the
        host. ``counted``: the agent wrapper's count, taken when the agent exited;
        with nothing to commit it is the answer, and no exec is needed.
        """
        if not _looks_at_uncommitted(request, plugin):
            return None
        t = time.monotonic()
        if counted is not None and (counted == 0 or request.uncommitted != "commit"):
            count, committed = counted, False
        else:
            try:
                code, raw = await self.host.exec_simple(
                    request.container_name,
                    ["sh", "-c", UNCOMMITTED_SCRIPT, "uncommitted", request.uncommitted, UNCOMMITTED_MESSAGE],
                )
            except RunnerError as exc:
                self.emit_event(request, on_event, "runner.uncommitted.failed", "warn", error=str(exc))
                return None
            text = raw.decode("utf-8", "replace")
            found = [ln for ln in text.splitlines() if ln.startswith("uncommitted=")]
            count = int(found[0].split("=", 1)[1].strip() or 0) if found else 0
            committed = code == 0 and "committed" in text.splitlines()
            if not found or (count and request.uncommitted == "commit" and not committed):
                error = self.sanitizer.scrub_text(text.strip()[-500:])
                self.emit_event(request, on_event, "runner.uncommitted.failed", "warn", exit_code=code, error=error)
            if not found:
                return None
        level = "warn" if count and not committed else "info" if count else "debug"
        self.emit_event(
            request,
            on_event,
            "runner.uncommitted",
            level,
            phase="collect",
            files=count,
            policy=request.uncommitted,
            auto_committed=committed,
            duration_s=round(time.monotonic() - t, 4),
        )
        return count, committed


def _git_unusable(output: ExecOutput) -> GitError | None:
    """The wrapper's finding that git cannot read the task's commit in the container, if it made one."""
    if output.exit_code != GIT_UNUSABLE_EXIT:
        return None
    tail = output.stderr_tail
    at = tail.rfind(GIT_UNUSABLE_MARK)
    if at < 0:  # the agent's own exit status 125
        return None
    cause = tail[at + len(GIT_UNUSABLE_MARK) :].decode("utf-8", "replace").strip() or "git exited with an error"
    return GitError(
        f"the task's repository is unusable inside its container, so the agent was not started: "
        f"git cannot read the base commit there ({cause[-500:]})"
    )


def _output_lost(output: ExecOutput, elapsed: float) -> ContainerError | None:
    """The engine's loss of a task's output: the wrapper's last line is missing. Only a wrapper killed
    by a signal (status 128 and up: a stop, the OOM killer) ends without it; any other status means a
    busy dockerd ended the stream before it had copied the output."""
    if output.ended or output.exit_code is None or output.exit_code >= 128:
        return None
    if output.extra.get("stream_error"):
        return None  # a broken stream is reported as such
    what = "the end of the task's output" if output.events or output.stdout_tail else "none of the task's output"
    return ContainerError(
        f"the Docker engine returned {what} (its process exited with status {output.exit_code} "
        f"after {elapsed:.1f} s); a busy engine can close an exec's output before copying it",
        retryable=True,
    )


def first_line_path(request: InstanceRequest) -> str:
    """Where the wrapper keeps the task's agent's first line: one file per task, as a group's tasks share a home."""
    return f"{HOME_MOUNT}/.orchestrator/first-line/{request.container_name}"


def _looks_at_uncommitted(request: InstanceRequest, plugin: RunnerPlugin) -> bool:
    """Whether what the agent leaves uncommitted is counted (and, per policy, committed) after it exits."""
    return request.import_policy != "never" and plugin.capabilities.makes_commits
