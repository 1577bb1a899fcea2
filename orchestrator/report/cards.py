"""What a task's card in the report shows: the command it ran and its output, as a user reads them.

Strategies talk to themselves through their tasks (marker lines ``@@...``, a reviewer's JSON
answer); neither is for a reader. A strategy may refine a card with ``report_task(task)``
(docs/strategies.md, "Adding sections to the run report").
"""

from __future__ import annotations

import json
import re
from typing import Any

MARKER = "@@"
# ``@@name ...``; a diff's hunk header (``@@ -1,2 +1,3 @@``) is output, not a marker.
MARKER_LINE = re.compile(r"^\s*@@(?!\s*-\d)")
_PRINTS_MARKER = re.compile(r"@@[A-Za-z]")
SCRIPT_NOTE = "a script of the strategy's own (the event log has it whole)"
# An embedded JSON object is looked for at this many opening braces at most: a
# message full of braces (code) is not worth a quadratic scan.
MAX_JSON_STARTS = 200


def is_script(command: str) -> bool:
    """True for a strategy's wrapper script: it prints marker lines or starts with a ``# orch-`` header."""
    lines = [ln.strip() for ln in command.splitlines() if ln.strip()]
    return bool(lines) and (lines[0].startswith("# orch-") or any(_PRINTS_MARKER.search(ln) for ln in lines))


def without_markers(text: str) -> str:
    """``text`` with its marker lines left out, and the blank lines they leave at its ends."""
    kept = [ln for ln in text.splitlines() if not MARKER_LINE.match(ln)]
    return "\n".join(kept).strip("\n")


def json_objects(text: str) -> tuple[list[dict[str, Any]], str]:
    """The JSON objects written in ``text`` and the text around them (trimmed)."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    rest: list[str] = []
    i = start = tries = 0
    while tries < MAX_JSON_STARTS:
        i = text.find("{", i)
        if i < 0:
            break
        tries += 1
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        if isinstance(obj, dict) and obj:
            found.append(obj)
            rest.append(text[start:i])
            start = i = end
        else:
            i += 1
    rest.append(text[start:])
    return found, "".join(rest).strip()


def trailing_object(text: str) -> tuple[dict[str, Any] | None, str]:
    """The JSON object ``text`` ends with (an agent's answer after its prose), and the text before it."""
    stripped = text.rstrip()
    if not stripped.endswith("}"):
        return None, text
    decoder = json.JSONDecoder()
    i, tries = len(stripped), 0
    while tries < MAX_JSON_STARTS:
        i = stripped.rfind("{", 0, i)
        if i < 0:
            break
        tries += 1
        try:
            obj, end = decoder.raw_decode(stripped, i)
        except ValueError:
            continue
        if end == len(stripped) and isinstance(obj, dict) and obj:
            return obj, stripped[:i].strip()
    return None, text


def _fields_of(result: dict[str, Any], text: str, command: bool) -> tuple[dict[str, Any], str]:
    output = result.get("output")
    if command:  # a command's stdout: whatever JSON it printed is data
        objects, rest = json_objects(text)
        return _named(objects), rest if objects else text
    answer, before = trailing_object(text)
    if isinstance(output, dict) and output:
        # A structured answer: its fields, and the text the agent wrote before the JSON.
        return output, before if answer is not None else text
    # An agent's prose keeps any JSON it quotes; only a closing answer is read as fields.
    return (answer, before) if answer is not None else ({}, text)


def _named(objects: list[dict[str, Any]]) -> dict[str, Any]:
    if len(objects) == 1:
        return objects[0]
    return {f"object {n}": o for n, o in enumerate(objects, 1)}


def task_card(task: dict[str, Any], refine: Any = None) -> dict[str, Any]:
    """``{"command", "script", "fields", "output", "stderr"}`` for one task row."""
    result = task.get("result") or {}
    command = task.get("command") if task.get("runs_command") else None
    script = isinstance(command, str) and is_script(command)
    fields, output = _fields_of(result, without_markers(task.get("final_message") or ""), command is not None)
    card: dict[str, Any] = {
        "command": None if script else command,
        "script": script,
        "fields": fields,
        "output": output,
        "stderr": "",
    }
    if refine is not None:
        try:
            better = refine(task)
        except Exception:  # a broken hook must not cost the reader the generic card
            better = None
        if isinstance(better, dict):
            for key in ("command", "output", "stderr"):
                if key in better and (better[key] is None or isinstance(better[key], str)):
                    card[key] = better[key]
            if isinstance(better.get("fields"), dict):
                card["fields"] = better["fields"]
    for key in ("output", "stderr"):  # whatever a hook said, no marker line reaches the page
        card[key] = without_markers(card[key] or "")
    objects, rest = json_objects(card["output"]) if command is not None else ([], "")
    if objects:  # a command that prints JSON (an evaluation's metrics) reads as fields too
        card["fields"] = {**card["fields"], **_named(objects)}
        card["output"] = rest
    if card["command"] is not None and is_script(card["command"]):
        card["command"], card["script"] = None, True
    return card
