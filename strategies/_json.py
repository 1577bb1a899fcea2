"""Asking an agent for JSON, with exactly one repair attempt (docs/strategies.md, "Structured answers")."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)

STRICT_PREFIX = (
    "Your previous answer could not be parsed. Reply with ONLY the JSON value described below: "
    "no prose, no code fences.\n\n"
)
PREVIOUS_ANSWER_CHARS = 2000
_QUOTE_PREVIOUS = "\n\nYour previous answer, which was not valid, was:\n"


def tail(text: str | None, limit: int) -> str:
    """The end of ``text`` (where agents put their conclusions), marked when cut."""
    text = text or ""
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


def extract_json(text: str | None) -> Any:
    """The last JSON object/array in ``text`` (whole text, fenced blocks, then any embedded value)."""
    if not text:
        return None
    try:
        return json.loads(text.strip())
    except ValueError:
        pass
    for block in reversed(_FENCE.findall(text)):
        try:
            return json.loads(block.strip())
        except ValueError:
            continue
    decoder = json.JSONDecoder()
    found, end = None, 0
    for opening in re.finditer(r"[{\[]", text):
        if opening.start() >= end:  # not inside the value found last
            try:
                found, end = decoder.raw_decode(text, opening.start())
            except ValueError:
                continue
    return found


def score_of(data: Any) -> dict[str, Any] | None:
    """``{score, rationale}`` with a numeric score from 0 to 10 (NaN is not), else None."""
    if not isinstance(data, dict):
        return None
    score = data.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 10:
        return None
    return {"score": float(score), "rationale": str(data.get("rationale", ""))}


async def ask_twice(
    ctx,
    task: dict[str, Any],
    key_parts: tuple,
    validate: Callable[[Any], T | None],
    schema: dict[str, Any] | None,
    *,
    quote_previous: bool = False,
    at_cap_raise: bool = False,
) -> tuple[T | None, int, Any]:
    """Run ``task`` (keys ``<key_parts>/attempt-1|2``) until its answer validates: ``(value or None, attempts,
    the TaskFailed that ended it or None)``. ``schema`` becomes its ``output_schema`` where the plugin supports it.

    ``quote_previous``: the repair also quotes the invalid answer (a model fixes its own output better when it sees
    it). A failed task is not repaired: that is not a formatting problem. ``at_cap_raise``: the spending cap refusing
    the task raises ``BudgetReached``, for a caller that must tell "not judged" from "judged unusable".
    """
    if schema is not None and ctx.supports_output_schema(task.get("plugin_name") or task.get("plugin")):
        task = dict(task, output_schema=schema)
    previous = ""
    for attempt in (1, 2):
        prompt = task["prompt"]
        if attempt == 2:
            prompt = STRICT_PREFIX + prompt
            if quote_previous:
                prompt += _QUOTE_PREVIOUS + tail(previous, PREVIOUS_ANSWER_CHARS)
        try:
            # (inside: at the run's spending cap ctx.run itself raises BudgetReached, a TaskFailed)
            handle = ctx.run(dict(task, prompt=prompt), key=ctx.key(*key_parts, f"attempt-{attempt}"))
            result = await ctx.wait(handle)
        except ctx.errors.TaskFailed as exc:
            if at_cap_raise and isinstance(exc, ctx.errors.BudgetReached):
                raise
            return None, attempt, exc
        previous = result["final_message"] or ""
        output = result.get("output")  # validated against the schema when the task had one
        value = validate(output if output is not None else extract_json(previous))
        if value is not None:
            return value, attempt, None
    return None, 2, None
