"""The run-wide spending cap as the command sees it (the flags, what can be measured, resume, the summary line);
the counting itself is an engine hook (:mod:`orchestrator.engine.budget`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..engine.budget import DEFAULT_RATE, BudgetCap, rate_for, spent_line
from ..errors import ConfigError, UsageError

if TYPE_CHECKING:  # the summary's readers import this module: it stays light
    from ..config import Config
    from ..runner import AuthConfig, RunnerPlugin

# The exit code of a run that ended at its spending cap (docs/cli.md).
EXIT_BUDGET_REACHED = 3
BUDGET_REACHED = "budget_reached"


def cap_of(config: Config) -> BudgetCap | None:
    b = config.budget
    cap = BudgetCap(max_cost_usd=b.max_cost_usd, max_tokens=b.max_tokens, on_reached=b.on_reached)
    return cap if cap.active else None


def rates_of(config: Config, plugin: RunnerPlugin) -> dict[str, tuple[float, float]]:
    """Per-token prices for the live count: the configured ``pricing`` (per 1k), else Sonnet's list price for a tool
    that reports its cost (Claude Code), whose reported cost replaces the estimate when each execution ends."""
    rates = {model: (i / 1000.0, o / 1000.0) for model, (i, o) in config.model_pricing().items()}
    if plugin.capabilities.supports_cost:
        rates.setdefault("*", DEFAULT_RATE)
    return rates


def subscription(mode: str | None, auth: AuthConfig) -> bool:
    """A subscription (an OAuth token, as Claude Code's): the tool's cost figure is not what is paid."""
    if mode is not None:
        return mode == "subscription"
    return bool(getattr(auth, "oauth_token", None)) and not getattr(auth, "api_key", None)


def check_measurable(config: Config, *, plugin: RunnerPlugin, model: str, mode: str | None, auth: AuthConfig) -> None:
    """Refuse, in one line, a ``--max-cost`` that no figure of this run could ever reach."""
    cap = cap_of(config)
    if cap is None or cap.max_cost_usd is None:
        return
    caps, plugin_name = plugin.capabilities, plugin.name
    if caps.runs_command:
        raise ConfigError(f"--max-cost: plugin {plugin_name} runs no agent and spends nothing; drop --max-cost")
    # A tool that reports its cost reports, on a subscription, a figure that is not what is paid.
    if caps.supports_cost and subscription(mode, auth):
        raise ConfigError(
            "--max-cost cannot be measured in subscription mode (the cost is not known): cap the run with "
            "--max-tokens N instead, or use --mode api"
        )
    if not caps.supports_cost and rate_for(model, rates_of(config, plugin)) is None:
        raise ConfigError(
            f"--max-cost cannot be measured: plugin {plugin_name} reports no cost and pricing has no entry for "
            f"model {model!r}; add pricing.<provider>.{model}.{{input_per_1k_usd, output_per_1k_usd}} "
            "or cap the run with --max-tokens N"
        )


def check_resume(config: Config, budget_state: Any, run_id: str) -> None:
    """A run that stopped at its cap resumes only under a higher one: else one line saying so."""
    if budget_state is None or not budget_state.reached:
        return
    cap = cap_of(config)
    spent_cost, spent_tokens = budget_state.spent_cost_usd, budget_state.spent_tokens
    if cap is not None and (
        (cap.max_cost_usd is not None and spent_cost >= cap.max_cost_usd)
        or (cap.max_tokens is not None and spent_tokens >= cap.max_tokens)
    ):
        raise UsageError(
            f"run {run_id} is still at its spending cap ({cap.describe()}; {spent_line(spent_cost, spent_tokens)}): "
            f"resume with a higher cap, e.g. orchestrator --resume {run_id} "
            + (
                f"--max-cost {max(spent_cost * 2, spent_cost + 1):.2f}"
                if cap.max_cost_usd is not None
                else f"--max-tokens {spent_tokens * 2}"
            )
        )


def summary_of(budget_state: Any) -> dict[str, Any] | None:
    """The ``budget`` block of summary.json."""
    if budget_state is None:
        return None
    fields = ("max_cost_usd", "max_tokens", "on_reached", "spent_cost_usd", "spent_tokens", "reached", "reached_at")
    out = {name: getattr(budget_state, name) for name in fields}
    out["spent_cost_usd"] = round(out["spent_cost_usd"], 6)
    return out


def spend_text(budget: dict[str, Any]) -> str:
    """``$0.4123 of $0.50 and 120,000 tokens spent (cap reached)`` for the summary and --list-runs."""
    cost = f"${budget.get('spent_cost_usd') or 0:.4f}"
    if budget.get("max_cost_usd") is not None:
        cost += f" of ${budget['max_cost_usd']:.2f}"
    tokens = f"{budget.get('spent_tokens') or 0:,} tokens"
    if budget.get("max_tokens") is not None:
        tokens += f" of {budget['max_tokens']:,}"
    return f"{cost} and {tokens} spent" + (" (cap reached)" if budget.get("reached") else "")
