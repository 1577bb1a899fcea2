"""One idea, end to end: plan -> code -> review rounds -> tests -> evaluate (docs/review-loop.md).

Files are written from task results only, so a resumed run rewrites identical bytes.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from orchestrator.strategy import TaskInput

from . import schemas
from ._json import ask_twice
from .evaluation import Evaluation, ScoringConfig, compare, evaluation_from_task, to_json

REVIEW_DIFF_LIMIT = 40_000
LOG_TAIL = 4_000


class Idea(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # stable and key-safe: it names keys and the artifact directory
    title: str
    text: str


class PipelineConfig(msgspec.Struct, frozen=True, kw_only=True):
    review: bool = True
    max_review_rounds: int = 2  # fixes after a rejection; the first review is not counted
    test_command: str | None = None
    eval_command: str | None = None
    eval_timeout_s: float | None = None
    scoring: ScoringConfig | None = None
    # Rounds in which a coder whose candidate failed the tests is shown the failure and may fix it.
    debug_rounds: int = 0


def _objective(objective: str) -> str:
    return f"{objective.strip()}\n\n" if objective else ""


def plan_prompt(goal: str, idea: Idea, objective: str = "") -> str:
    return (
        f"Role: planner\n\nOverall goal: {goal}\n\n{_objective(objective)}Idea to implement:\n{idea.text}\n\n"
        "Read the repository and write a concrete implementation plan for this idea: the files to change, "
        "the steps, and how to check the result. End with a section titled RISKS listing what could go wrong. "
        "Do not modify any files."
    )


def code_prompt(goal: str, idea: Idea, plan: str, objective: str = "") -> str:
    bench = "You may run the evaluation command yourself to check your change before committing.\n" if objective else ""
    return (
        f"Role: coder\n\nOverall goal: {goal}\n\n{_objective(objective)}Idea to implement:\n{idea.text}\n\n"
        f"Plan:\n{plan}\n\n{bench}"
        "Implement the plan in this repository. Keep the change focused on this one idea and commit it."
    )


def debug_prompt(test_command: str, log: str) -> str:
    return (
        "Role: coder\n\nYour change fails the tests. Find the cause, fix it on your branch and commit.\n\n"
        f"Test command: {test_command}\n\nIts output (the end):\n{_tail(log, 3000)}"
    )


def fix_prompt(issues: list[str]) -> str:
    listed = "\n".join(f"- {i}" for i in issues) or "- (the reviewer gave no details)"
    return f"Role: coder\n\nThe reviewer rejected your change. Fix these issues on your branch and commit:\n{listed}"


def review_prompt(goal: str, idea: Idea, plan: str, diff: str, n: int) -> str:
    if len(diff) > REVIEW_DIFF_LIMIT:
        diff = diff[:REVIEW_DIFF_LIMIT] + "\n[diff truncated]"
    return (
        f"Role: reviewer\nRound: review-{n}\n\nOverall goal: {goal}\n\nIdea:\n{idea.text}\n\nPlan:\n{plan}\n\n"
        f"Cumulative diff of the change (the checked-out branch):\n{diff}\n\n"
        "Review the change for correctness and safety only; tests and docs are not required for approval "
        "(a separate test gate runs them). Do not modify any files. Reply with ONLY a JSON object: "
        '{"verdict": "APPROVE" or "REJECT", "issues": ["concrete problem to fix", ...]}'
    )


def parse_review(data: Any) -> dict[str, Any] | None:
    """``{"verdict": "APPROVE"|"REJECT", "issues": [str]}`` or None when the shape is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("verdict"), str):
        return None
    verdict = data["verdict"].strip().upper()
    issues = data.get("issues", [])
    if verdict not in ("APPROVE", "REJECT") or not isinstance(issues, list):
        return None
    return {"verdict": verdict, "issues": [i if isinstance(i, str) else json.dumps(i, sort_keys=True) for i in issues]}


def _tail(text: str | None, limit: int = LOG_TAIL) -> str:
    text = text or ""
    return text if len(text) <= limit else text[-limit:]


def _write(out_dir: Path, name: str, text: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / name).write_text(text, "utf-8")


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n", "utf-8")


def command_task(command: str, branch: str, *, timeout: float | None = None) -> TaskInput:
    """A read-only command task on ``branch`` (its /workspace is mounted read-only)."""
    task: TaskInput = {"plugin": "command", "command": command, "base_branch": branch, "import_policy": "never"}
    if timeout:
        task["timeout_seconds"] = timeout
    return task


async def run_idea(
    ctx,
    idea: Idea,
    *,
    goal: str,
    base_branch: str,
    key_prefix: tuple,
    cfg: PipelineConfig,
    baseline: Evaluation | None,
    out_dir: Path,
    root: Evaluation | None = None,
    objective: str = "",
    evaluator: Callable[[str, tuple], Awaitable[tuple[Evaluation, str]]] | None = None,
) -> dict[str, Any]:
    """One idea's outcome (JSON-ready): compared with ``baseline`` and ``root``; ``objective`` goes into the plan and
    code prompts; ``evaluator(branch, key_parts)`` replaces the single evaluation run."""
    run = _IdeaRun(ctx, idea, goal, tuple(key_prefix), cfg, out_dir, base_branch)
    _write(out_dir, "idea.md", f"# {idea.title}\n\n{idea.text}\n")
    try:
        await run.plan(objective)
        await run.code(objective)
        if cfg.test_command:
            await run.tests(cfg.test_command)
        if cfg.eval_command:
            await run.evaluate(cfg.eval_command, evaluator, baseline, root)
    except _Stop as stop:
        return run.finish(*stop.args)
    return run.finish("completed")


class _Stop(Exception):
    """The idea ends early: ``(status, error)``."""


def _failure(exc: Any) -> str:
    return f"{exc.error_type}: {_tail(exc.message, 400)}"


class _IdeaRun:
    """One idea's way through the steps; ``out`` is its outcome so far."""

    def __init__(self, ctx, idea: Idea, goal: str, prefix: tuple, cfg: PipelineConfig, out_dir, base_branch: str):
        self.ctx, self.idea, self.goal, self.prefix, self.cfg, self.out_dir = ctx, idea, goal, prefix, cfg, out_dir
        self.group = ctx.key(*prefix, "coder")  # the coder's rounds share one session group
        self.branch = self.base_commit = base_branch
        self.commit: str | None = None
        self.session: str | None = None
        self.plan_text = ""
        self.out: dict[str, Any] = {
            "idea_id": idea.id,
            "title": idea.title,
            "idea": idea.text,
            "status": "",
            "base_branch": base_branch,
            "base_commit": None,
            "plan": None,
            "branch": None,
            "commit": None,
            "coder_session_id": None,
            "rounds": [],
            "tests": None,
            "evaluation": None,
            "comparison": None,
            "root_comparison": None,
            "error": None,
        }

    def finish(self, status: str, error: str | None = None) -> dict[str, Any]:
        self.out["status"], self.out["error"] = status, error
        write_json(self.out_dir / "summary.json", self.out)
        return self.out

    async def _task(self, task: Any, *key_parts: str) -> dict[str, Any]:
        ctx = self.ctx
        return await ctx.wait(ctx.run(task, key=ctx.key(*self.prefix, *key_parts)))

    async def _coder(self, prompt: str, *key_parts: str) -> dict[str, Any]:
        task = {
            "prompt": prompt,
            "base_branch": self.branch,
            "session_group_key": self.group,
            "resume_session_id": self.session,
        }
        return await self._task(task, *key_parts)

    def _adopt(self, fixed: dict[str, Any], *, debug: bool = False) -> None:
        """A fix's branch (none when it committed nothing: same branch, same head) and session."""
        session = fixed.get("session_id") or self.session
        if (fixed.get("artifact") or {}).get("branch_final"):
            self.branch, self.commit = fixed["artifact"]["branch_final"], fixed["artifact"].get("commit")
            if debug:
                self.out["rounds"].append(self._round(len(self.out["rounds"]) + 1, session=session, debug=True))
        self.session = session
        self.out.update(branch=self.branch, coder_session_id=session)

    def _round(self, n: int, *, session: str | None, **extra: Any) -> dict[str, Any]:
        record = {"round": n, "branch": self.branch, "commit": self.commit, "session_id": session}
        return {**record, "verdict": None, "issues": [], **extra}

    async def plan(self, objective: str) -> None:
        """Read-only: the plan's artifact commit is the base commit the diffs start from."""
        task = {"prompt": plan_prompt(self.goal, self.idea, objective), "base_branch": self.branch}
        try:
            planned = await self._task({**task, "import_policy": "never"}, "plan")
        except self.ctx.errors.TaskFailed as exc:
            raise _Stop("plan_failed", _failure(exc)) from None
        self.plan_text = planned["final_message"] or ""
        self.base_commit = (planned.get("artifact") or {}).get("commit") or self.branch
        self.out.update(plan=self.plan_text, base_commit=self.base_commit)
        _write(self.out_dir, "plan.md", self.plan_text + "\n")

    async def code(self, objective: str) -> None:
        task = {
            "prompt": code_prompt(self.goal, self.idea, self.plan_text, objective),
            "base_branch": self.branch,
            "session_group_key": self.group,
        }
        try:
            coded = await self._task(task, "code", "round-1")
        except self.ctx.errors.TaskFailed as exc:
            raise _Stop("code_failed", _failure(exc)) from None
        if not (coded.get("artifact") or {}).get("branch_final"):
            raise _Stop("no_changes", "the coder committed nothing")
        self._adopt(coded)
        rounds = 1 + (self.cfg.max_review_rounds if self.cfg.review else 0)
        for n in range(1, rounds + 1):
            if await self.review(n, last=n == rounds):
                return

    async def review(self, n: int, *, last: bool) -> bool:
        """Round ``n``'s diff and review; a rejection is fixed. True when the rounds are over."""
        diff_task = command_task(f"git diff --no-ext-diff --no-color {self.base_commit} HEAD", self.branch)
        try:
            diff = (await self._task(diff_task, "diff", f"round-{n}"))["final_message"] or ""
        except self.ctx.errors.TaskFailed as exc:
            diff = f"(diff unavailable: {exc.error_type}: {_tail(exc.message, 400)})"
        _write(self.out_dir, f"diff_round_{n}.diff", diff)
        record = self._round(n, session=self.session)
        self.out["rounds"].append(record)
        if not self.cfg.review:
            return True
        task = {
            "prompt": review_prompt(self.goal, self.idea, self.plan_text, diff, n),
            "base_branch": self.branch,
            "import_policy": "never",
        }
        key_parts = (*self.prefix, "review", f"round-{n}")
        review = (await ask_twice(self.ctx, task, key_parts, parse_review, schemas.VERDICT))[0]
        if review is None:
            text = "# Review: invalid\n\nNo valid verdict after one repair attempt.\n"
            _write(self.out_dir, f"review_round_{n}.md", text)
            raise _Stop("review_invalid", f"round {n}: the review was not valid JSON after one repair attempt")
        record.update(verdict=review["verdict"], issues=review["issues"])
        issues_md = "\n".join(f"- {i}" for i in review["issues"]) or "(none)"
        _write(self.out_dir, f"review_round_{n}.md", f"# Review round {n}: {review['verdict']}\n\n{issues_md}\n")
        if review["verdict"] == "APPROVE":
            return True
        if last:
            raise _Stop("rejected", f"still rejected after {self.cfg.max_review_rounds} fix round(s)")
        try:
            fixed = await self._coder(fix_prompt(review["issues"]), "code", f"round-{n + 1}")
        except self.ctx.errors.TaskFailed as exc:
            raise _Stop("fix_failed", f"round {n + 1}: {_failure(exc)}") from None
        self._adopt(fixed)
        return False

    async def tests(self, test_command: str) -> None:
        """The test gate, with up to ``debug_rounds`` chances for the coder to fix a failure."""
        debug_rounds = self.cfg.debug_rounds
        for attempt in range(debug_rounds + 1):
            key = ("tests",) if attempt == 0 else ("tests", f"debug-{attempt}")
            try:
                tested = await self._task(command_task(test_command, self.branch), *key)
            except self.ctx.errors.TaskFailed as exc:
                log = f"[{exc.error_type}] {exc.message}"
                self._tests(log, None, exc.error_type, attempt)
                if attempt == debug_rounds:
                    after = f" after {attempt} debug round(s)" if attempt else ""
                    raise _Stop("tests_failed", f"tests failed ({exc.error_type}){after}") from None
                try:
                    fixed = await self._coder(debug_prompt(test_command, log), "code", f"debug-{attempt + 1}")
                except self.ctx.errors.TaskFailed as fexc:
                    why = f"tests failed; the debug round failed too ({fexc.error_type})"
                    raise _Stop("tests_failed", why) from None
                self._adopt(fixed, debug=True)
                continue
            self._tests(tested["final_message"] or "", tested.get("exit_code") or 0, None, attempt)
            return

    def _tests(self, log: str, code: int | None, error_type: str | None, attempt: int) -> None:
        _write(self.out_dir, "tests.log", log)
        self.out["tests"] = {
            "passed": error_type is None,
            "exit_code": code,
            "error_type": error_type,
            "log_tail": _tail(log),
            "debug_rounds": attempt,
        }

    async def evaluate(
        self, eval_command: str, evaluator, baseline: Evaluation | None, root: Evaluation | None
    ) -> None:
        """Measure the final branch and compare it with the baseline (and the root)."""
        key_parts = (*self.prefix, "eval")
        if evaluator is not None:
            evaluation, log = await evaluator(self.branch, key_parts)
        else:
            try:
                # the timeout becomes the task's timeout_seconds, enforced inside the container
                result = await self._task(
                    command_task(eval_command, self.branch, timeout=self.cfg.eval_timeout_s), "eval"
                )
            except self.ctx.errors.TaskFailed as exc:
                evaluation, log = evaluation_from_task(None, exc), f"[{exc.error_type}] {exc.message}"
            else:
                evaluation, log = evaluation_from_task(result), result.get("final_message") or ""
        _write(self.out_dir, "eval.log", log)
        self.out["evaluation"] = to_json(evaluation)
        self.out["commit"] = evaluation.commit
        if evaluation.status != "ok":
            raise _Stop("eval_failed", evaluation.error)
        for field, against in (("comparison", baseline), ("root_comparison", root)):
            if self.cfg.scoring is not None and against is not None and against.status == "ok":
                self.out[field] = to_json(compare(evaluation, against, self.cfg.scoring))
