"""Reading what a user typed (``-S`` values, "did you mean"): on the ground floor, so that configuration and the
strategy loader share it without either importing the other."""

from __future__ import annotations

import difflib
import json
from typing import Any


def parse_value(raw: str) -> Any:
    """-S value typing: int, float, bool, JSON list/object, else the string itself."""
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        pass
    if raw.strip()[:1] in ("[", "{"):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            pass
    return raw


def did_you_mean(word: str, choices: list[str], prefix: str = "") -> str:
    """`` (did you mean X?)`` for the choice nearest to a mistyped ``word`` (``prefix`` before it), or ``""``."""
    # word itself is a choice only after a normalization (best_of_n -> best-of-n)
    close = [word] if word in choices else difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""
