"""Shared pieces of the selecting built-ins: scoring with one repair (an answer that does not validate is
excluded, never coerced), picking, output files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, cast

import anyio

from orchestrator.strategy import TaskInput

from . import schemas
from ._json import ask_twice, score_of, tail

SCORE_SCHEMA = '{"score": <number from 0 to 10>, "rationale": "<one short paragraph>"}'
MESSAGE_CHARS = 6000
DEFAULT_CRITERIA = "correctness, completeness, code quality and test coverage"


def artifact_of(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """A result's artifact; empty for a result that has none (a failed import, a branch cleanup)."""
    return result.get("artifact") or {}


def branch_of(result: Mapping[str, Any]) -> str:
    """The branch that holds a result's work: its imported branch, else the base it started from."""
    artifact = artifact_of(result)
    return cast(str, artifact.get("branch_final") or artifact.get("base"))  # every task result names its base


async def score_with_repair(ctx, task: dict[str, Any], key_parts: tuple) -> dict[str, Any]:
    """``{"score", "rationale", "attempts"}`` from ``task``'s answer (one repair quoting it), else ``score: None``."""
    value, attempts, failed = await ask_twice(ctx, task, key_parts, score_of, schemas.SCORE, quote_previous=True)
    if value is not None:
        return {**value, "attempts": attempts}
    why = "reviewer answer was not valid {score, rationale} JSON twice"
    if failed is not None:
        why = f"reviewer failed ({failed.error_type}): {failed.message}"
    return {"score": None, "attempts": attempts, "error": why}


def with_model(task: TaskInput, model: str | None) -> TaskInput:
    """``task`` on ``model`` when one is given; else the run's ``--model`` applies."""
    if model:
        task["model"] = model
    return task


def review_task(
    *,
    prompt: str,
    subject: str,
    subject_text: str,
    base: str,
    branch: str,
    criteria: str,
    model: str | None,
    heading: str = "",
    advice: str = "",
    schema: str = SCORE_SCHEMA,
) -> dict[str, Any]:
    """A read-only reviewer task over ``branch``, the base present for diffs; ``heading`` defaults to the subject."""
    lines = [f"You are reviewing {subject} for the task below. Do not modify any files.", "", "Task:", prompt, ""]
    if branch != base:
        lines += [f"The work is checked out in the current directory; see it with `git diff {base}...HEAD`.", ""]
    lines += [
        f"{heading or subject[0].upper() + subject[1:]} ends with:",
        tail(subject_text, MESSAGE_CHARS),
        "",
        f"Judge it on: {criteria}.{advice}",
        f"Reply with ONLY a JSON object: {schema}",
    ]
    task: dict[str, Any] = {"prompt": "\n".join(lines), "base_branch": branch, "import_policy": "never"}
    if branch != base:
        task["include_branches"] = [base]
    if model:
        task["model"] = model
    return task


async def score_into(ctx, row: dict[str, Any], task: dict[str, Any], key_parts: tuple) -> bool:
    """Score with ``task`` (:func:`score_with_repair`) into ``row``; True when it was scored."""
    verdict = await score_with_repair(ctx, task, key_parts)
    row.update(attempts=verdict["attempts"], score=verdict["score"])
    if verdict["score"] is None:
        row.update(status="unscorable", error=verdict["error"])
        return False
    row.update(status="scored", rationale=verdict["rationale"])
    return True


def failure(exc) -> str:
    return f"{exc.error_type}: {exc.message}"


def none_scored(ctx, rows: list[dict[str, Any]], stem: str) -> Exception:
    failed = sum(r.get("status") == "failed" for r in rows)
    return ctx.errors.NoViableCandidates(
        f"none of {len(rows)} candidates could be scored ({failed} failed, {len(rows) - failed} unscorable); "
        f"see strategy_output/{output_name(ctx.strategy_execution_id, stem, 'json')}"
    )


async def concurrently(fns: list[Callable[[], Coroutine[Any, Any, None]]]) -> None:
    """Run ``fns`` concurrently (the outcome depends only on keys and results, never on which finishes first);
    a single error surfaces as itself, not as an ExceptionGroup."""
    try:
        async with anyio.create_task_group() as tg:
            for fn in fns:
                tg.start_soon(fn)
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


def pick_best(scored: list[tuple[float, int, Any]]) -> tuple[float, int, Any]:
    """Highest score; ties go to the lowest index (generation order), never to completion order."""
    return min(scored, key=lambda t: (-t[0], t[1]))


def kept_unreviewed(result: Mapping[str, Any], step: str, before: str) -> dict[str, Any]:
    """``result`` kept because the spending cap stopped its review: ``"reviewed": false``, so the summary
    names its branch with the command to compare it, never as merge advice (``orchestrator.report.selection``).
    """
    return {
        **result,
        "verdict": f"{step} kept unscored: the spending cap was reached before {before}",
        "reviewed": False,
    }


def output_name(sid: str, stem: str, ext: str) -> str:
    """Execution ``sid``'s output file: the executions of ``--runs N`` share ``ctx.output_dir()``."""
    return f"{stem}.{ext}" if sid == "s1" else f"{stem}_{sid}.{ext}"


def write_output(ctx, stem: str, ext: str, data: Any) -> str:
    """Write a strategy output file atomically; JSON is sorted so a replay writes the same bytes."""
    text = data if isinstance(data, str) else json.dumps(data, indent=2, sort_keys=True) + "\n"
    name = output_name(ctx.strategy_execution_id, stem, ext)
    write_atomic(ctx.output_dir() / name, text)
    return name


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, "utf-8")
    os.replace(tmp, path)
