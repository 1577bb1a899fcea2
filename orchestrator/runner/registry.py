"""The plugin registry: the one place that maps a plugin's name to its module.

A plugin module (in the top-level ``runner_plugins`` package) imports only the
plugin types of :mod:`orchestrator.runner.plugin`; nothing but this registry
imports a plugin module, and only the plugin a run uses is loaded. A new agent
CLI is one module and one line in ``PLUGIN_MODULES``.
"""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from .plugin import RunnerPlugin

PLUGIN_MODULES = {
    "claude-code": "runner_plugins.claude_code",
    "codex": "runner_plugins.codex",
    "command": "runner_plugins.command",
}


def get_plugin(name: str) -> RunnerPlugin:
    module_name = PLUGIN_MODULES.get(name)
    if module_name is None:
        raise ConfigError(f"unknown plugin {name!r}; choose one of: {', '.join(sorted(PLUGIN_MODULES))}")
    module = importlib.import_module(module_name)
    return module.PLUGIN


def check_model(plugin_name: str, model: str) -> None:
    """Raise :class:`ConfigError` naming the choices when ``plugin_name`` does not know ``model``.

    Orchestration calls this when a task is scheduled, so a typo in a task's
    ``model`` is one clear message at once, not a task that fails in its container.
    """
    plugin = get_plugin(plugin_name)
    models = plugin.known_models()
    if models is not None and model not in models:
        names = ", ".join(sorted(k for k in models if "-" not in k)) or ", ".join(sorted(models))
        hint = " or a full model id starting with 'claude-'" if plugin_name == "claude-code" else ""
        raise ConfigError(f"unknown model {model!r} for plugin {plugin_name}; use one of: {names}{hint}")


def supports_resume(plugin_name: str) -> bool:
    """Whether the plugin's tool can continue a session (and so a task can continue its workspace)."""
    return get_plugin(plugin_name).capabilities.supports_resume
