"""Structured answers: checking an agent's final answer against the task's JSON Schema.

Both agent CLIs can be told to answer with JSON matching a schema (Claude Code
``--json-schema``, Codex ``--output-schema``), but the host does not take their
word for it: the answer is parsed and validated here, so a strategy that reads
``result["output"]`` can rely on its shape whatever the CLI version did.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import ConfigError

VIOLATION_LIMIT = 600
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S | re.I)


def check_schema(schema: Any) -> None:
    """Raise :class:`ConfigError` unless ``schema`` is a usable JSON Schema object."""
    if not isinstance(schema, dict):
        raise ConfigError(
            f"task field output_schema must be a JSON Schema object (a dict), got {type(schema).__name__}"
        )
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"task field output_schema must be plain JSON data: {exc}") from None
    # Imported where a schema is used (about 70 ms): most runs have none, and every
    # command that reads results comes through this module.
    import jsonschema.exceptions
    import jsonschema.validators

    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(top level)"
        raise ConfigError(f"task field output_schema is not a valid JSON Schema at {where}: {exc.message}") from None


def violation_of(schema: dict[str, Any], value: Any) -> str | None:
    """One line naming where and how ``value`` breaks ``schema``, or ``None`` when it matches."""
    import jsonschema.exceptions
    import jsonschema.validators

    cls = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(cls(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    message = f"at {where}: {error.message}" if where else error.message
    return message if len(message) <= VIOLATION_LIMIT else message[:VIOLATION_LIMIT] + "..."


def checked_answer(schema: dict[str, Any], structured: Any, final_message: str) -> tuple[Any, str | None]:
    """(validated value, None) or (None, the violation to name in a repair turn): the CLI's
    structured object, else the final message read as JSON."""
    if structured is None:
        text = (final_message or "").strip()
        if not text:
            return None, "the answer is empty; a JSON value matching the schema was expected"
        fenced = _FENCE.match(text)
        try:
            structured = json.loads(fenced.group(1) if fenced else text)
        except json.JSONDecodeError as exc:
            return None, f"the answer is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    violation = violation_of(schema, structured)
    return (None, violation) if violation is not None else (structured, None)


def repair_prompt(violation: str) -> str:
    return (
        "Your final answer does not match the required JSON schema: "
        f"{violation}. Answer again with only the corrected JSON value; it must match the schema exactly."
    )


def schema_json(schema: dict[str, Any]) -> str:
    """The compact, key-sorted JSON text handed to the CLI (stable across runs)."""
    return json.dumps(schema, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
