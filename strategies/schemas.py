"""JSON Schemas of the answers the built-in strategies ask agents for (``output_schema``).

Every object requires all its properties and forbids others, with only keywords OpenAI's strict mode accepts
(no ``minLength``): Codex rejects other schemas.
"""

from __future__ import annotations

from typing import Any


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _text(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


_SCORE = {"type": "number", "minimum": 0, "maximum": 10, "description": "0 (useless) to 10 (excellent)"}
SCORE = _object(score=_SCORE, rationale=_text("one short paragraph"))
FEEDBACK = _object(score=_SCORE, feedback=_text("the most important concrete improvements"))
VERDICT = _object(
    verdict={"type": "string", "enum": ["APPROVE", "REJECT"]},
    issues={"type": "array", "items": {"type": "string"}, "description": "concrete problems to fix"},
)


def ideas(count: int) -> dict[str, Any]:
    """``{"ideas": [{title, description}]}`` with exactly ``count`` ideas."""
    idea = _object(
        title=_text("a short name for the change"), description=_text("what to change and why it should help")
    )
    return _object(ideas={"type": "array", "items": idea, "minItems": count, "maxItems": count})
