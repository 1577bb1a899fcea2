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


BUILT_IN = frozenset(PLUGIN_MODULES)


def get_plugin(name: str) -> RunnerPlugin:
    module_name = PLUGIN_MODULES.get(name)
    if module_name is None:
        raise ConfigError(f"unknown plugin {name!r}; choose one of: {', '.join(sorted(PLUGIN_MODULES))}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"plugin {name!r}: cannot import its module {module_name} ({exc})") from None
    plugin = getattr(module, "PLUGIN", None)
    if not isinstance(plugin, RunnerPlugin) or plugin.name != name:
        raise ConfigError(
            f"plugin {name!r}: module {module_name} must define PLUGIN, a runner plugin named {name!r} "
            "(see orchestrator.runner.plugin.RunnerPlugin)"
        )
    return plugin


def register_plugins(modules: dict[str, str]) -> None:
    """Add plugins from ``runner.plugin_modules`` (name -> a module defining ``PLUGIN``); a built-in
    name cannot be taken over."""
    for name, module_name in modules.items():
        if name in BUILT_IN and PLUGIN_MODULES[name] != module_name:
            raise ConfigError(f"runner.plugin_modules: {name!r} is a built-in plugin; give yours another name")
        PLUGIN_MODULES[name] = module_name
        get_plugin(name)  # a module that is not there, or not a plugin, is one line now, not a failed task


def check_model(plugin_name: str, model: str) -> None:
    """ConfigError naming the choices when ``plugin_name`` does not know ``model``: called when a task
    is scheduled, so a typo is one clear message at once, not a task failing in its container."""
    plugin = get_plugin(plugin_name)
    models = plugin.known_models()
    if models is not None and model not in models:
        names = ", ".join(sorted(k for k in models if "-" not in k)) or ", ".join(sorted(models))
        hint = plugin.capabilities.model_hint
        raise ConfigError(f"unknown model {model!r} for plugin {plugin_name}; use one of: {names}{hint}")
