"""Cost estimates from token counts, for tools that report none (an estimate beats no cost at all).

The table is supplied by configuration: model name -> (USD per million input
tokens, USD per million output tokens). No prices are built in, because they
change; an unknown model gives ``None`` ("N/A"), never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping

PriceTable = Mapping[str, tuple[float, float]]


def estimate_cost(model: str | None, tokens_in: int, tokens_out: int, table: PriceTable | None) -> float | None:
    """USD for the given tokens, or ``None`` when the model has no configured price.

    A model matches its exact name first, then the longest table key it starts
    with (so ``"gpt-5"`` prices ``"gpt-5-2025-08-07"``).
    """
    if not model or not table:
        return None
    rates = table.get(model)
    if rates is None:
        prefixes = [key for key in table if model.startswith(key)]
        if not prefixes:
            return None
        rates = table[max(prefixes, key=len)]
    per_in, per_out = rates
    return round((tokens_in * per_in + tokens_out * per_out) / 1_000_000, 10)
