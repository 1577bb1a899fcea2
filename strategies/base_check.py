"""Checking the base branch before any agent task: a run whose yardstick is broken stops there.

A test command stops the run only when it *cannot run* (no exit status, or the shell's 126/127): failing
tests may be what the run is for. The rules: docs/evolve.md, "Fail fast on the base".
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import msgspec

from .evaluation import Evaluation, evaluation_of_output
from .pipeline import command_task

STDERR_MARK = "@@orch-base stderr"
EXIT_LINE = re.compile(r"^@@orch-base exit=(-?\d+)\s*$", re.M)
STDERR_LINES = 20
TESTS_CANNOT_RUN = "the test command cannot run on the base"
# What the shells say of a command they cannot run: dash "/bin/sh: 1: npm: not found", bash
# "bash: line 1: npm: command not found", busybox "sh: npm: not found"; "...: ./x.sh: Permission denied".
_NOT_FOUND = re.compile(r"(?:^|\s)([^\s:]+): (?:command )?not found\s*$", re.M)
_NOT_EXECUTABLE = re.compile(r"(?:^|\s)([^\s:]+): Permission denied\s*$", re.M)
_INSTALL = (
    "install it in the project's environment (--env-setup, --env-image or .devcontainer/devcontainer.json; "
    "see docs/environment.md), or correct the command"
)


def base_command(command: str) -> str:
    """``command`` under ``/bin/sh -c``, stdout as is, then its stderr's last lines and its exit status.

    It always exits 0, so the task's result carries both streams whatever the command did."""
    return (
        "err=$(mktemp /tmp/orch-base-err.XXXXXX) || exit 3; "
        f'/bin/sh -c {shlex.quote(command)} 2>"$err" </dev/null; rc=$?; '
        f'printf "\\n{STDERR_MARK}\\n"; tail -n {STDERR_LINES} "$err"; '
        'printf "\\n@@orch-base exit=%s\\n" "$rc"; rm -f "$err"; exit 0\n' + named_command(command)
    )


def named_command(command: str) -> str:
    """The comment line naming the user's command, for the dashboard; last, so the report finds the wrapper first."""
    lines = [ln.strip() for ln in command.splitlines() if ln.strip()]
    return f"# $ {lines[0] if lines else ''}{' ...' if len(lines) > 1 else ''}"


class BaseRun(msgspec.Struct, frozen=True, kw_only=True):
    """One command's run on the base: its exit status (None: it never reported one) and its output."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # the task itself failed: why
    commit: str | None = None  # the base commit the command ran on

    @property
    def output(self) -> str:
        """Stdout, then stderr: what the stop shows (its last lines)."""
        return "\n".join(s.rstrip("\n") for s in (self.stdout, self.stderr) if s.strip())


def split_streams(text: str, end_line: re.Pattern[str], stderr_mark: str) -> tuple[re.Match[str], str, str] | None:
    """A wrapper's output read back: its last end-marker line, then the stdout and stderr before it (without the
    newlines the markers add); None when it has no end marker."""
    ends = list(end_line.finditer(text))
    if not ends:
        return None
    body = text[: ends[-1].start()]
    stdout, sep, stderr = body.rpartition(stderr_mark)
    if not sep:
        stdout, stderr = body, ""
    return ends[-1], stdout.rstrip("\n"), stderr.rstrip("\n")


def parse_base_run(final_message: str) -> BaseRun:
    """Read a :func:`base_command` task's stdout; output without the markers is plain stdout of a success."""
    text = final_message or ""
    if (split := split_streams(text, EXIT_LINE, f"\n{STDERR_MARK}\n")) is None:
        return BaseRun(exit_code=0, stdout=text)
    end, stdout, stderr = split
    return BaseRun(exit_code=int(end.group(1)), stdout=stdout, stderr=stderr)


def run_on_base(ctx, command: str, branch: str, key_parts: tuple, *, timeout: float | None = None):
    """Schedule ``command`` on ``branch``: an awaitable of its :class:`BaseRun` (so several checks run in parallel)."""
    handle = ctx.run(command_task(base_command(command), branch, timeout=timeout), key=ctx.key(*key_parts))

    async def result() -> BaseRun:
        try:
            done = await ctx.wait(handle)
        except ctx.errors.TaskFailed as exc:
            return BaseRun(exit_code=None, stderr=exc.message, error=f"{exc.error_type}: {_first_line(exc.message)}")
        run = parse_base_run(done.get("final_message") or "")
        return msgspec.structs.replace(run, commit=(done.get("artifact") or {}).get("commit"))

    return result


def could_not_run(exit_code: int | None, output: str) -> str | None:
    """Why ``sh`` could not run a command (127: not found, 126: not executable), named from ``output``, with the fix."""
    if exit_code == 127:
        found = _NOT_FOUND.findall(output or "")
        return f"command not found{f': {found[-1]}' if found else ''} (exit status 127); {_INSTALL}"
    if exit_code == 126:
        found = _NOT_EXECUTABLE.findall(output or "")
        path = found[-1] if found else "PATH"
        return (
            f"cannot execute {found[-1] if found else 'the command'} (exit status 126: found, but not executable); "
            f"commit it executable (git update-index --chmod=+x {path}) or run it with its interpreter (sh {path})"
        )
    return None


def evaluation_of(run: BaseRun) -> Evaluation:
    """The :class:`Evaluation` a base run of the eval command stands for."""
    if run.error is not None:
        return Evaluation(status="failed", error=run.error)
    if (why := could_not_run(run.exit_code, run.stderr or run.stdout)) is not None:
        return Evaluation(status="failed", commit=run.commit, error=why)
    if run.exit_code != 0:
        return Evaluation(
            status="failed",
            commit=run.commit,
            error=f"command: exit status {run.exit_code}: {_first_line(run.stderr or run.stdout)}",
        )
    return evaluation_of_output(run.stdout, run.commit)


def unusable_evaluation(ev: Evaluation, needed: list[str]) -> tuple[str, str] | None:
    """``(stop reason, why)`` when the base's evaluation cannot anchor a run, else None."""
    if ev.status != "ok":
        error = _first_line(ev.error or "")
        if error.startswith(("command not found", "cannot execute")):  # could_not_run's words: the cause
            return "root_evaluation_failed", error
        return "root_evaluation_failed", f"it did not run to a result ({error})"
    if not ev.valid:
        return "root_evaluation_invalid", "it reports valid: false"
    if missing := [m for m in needed if m not in ev.metrics]:
        reported = ", ".join(sorted(ev.metrics)) or "none"
        line = (
            f"it does not report {', '.join(repr(m) for m in missing)} "
            f"(named by -S primary_metric/weights); it reports: {reported}"
        )
        return f"objective_metrics_missing: {line}", line
    return None


def why_tests_cannot_run(run: BaseRun) -> str | None:
    """Why a test command could not run on the base, or None when it ran (its tests passing or not)."""
    if run.error is not None:
        return f"its task ended without the command's exit status ({run.error})"
    return could_not_run(run.exit_code, run.stderr or run.stdout)


def summary_of(run: BaseRun) -> dict[str, Any]:
    """What a result records of a base run: status and the output's last lines."""
    tail = run.output.splitlines()[-STDERR_LINES:]
    return {"exit_code": run.exit_code, "error": run.error, "log_tail": "\n".join(tail)}


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:300]
