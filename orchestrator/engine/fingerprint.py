"""Normalized task input and its fingerprint (SHA-256 of its RFC 8785 encoding): what makes a resumed key's
task "the same" task; the same key with another one is a :class:`~orchestrator.errors.KeyConflictDifferentFingerprint`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ..errors import ConfigError
from ..naming import jcs_sha256
from ..runner.registry import PLUGIN_MODULES, get_plugin
from .task_types import BranchCleanupTask, TaskInput

SCHEMA_VERSION = "1"

IMPORT_POLICIES = ("auto", "never", "always")
CONFLICT_POLICIES = ("fail", "overwrite", "suffix")
EGRESS = ("online", "offline", "proxy")
UNCOMMITTED_POLICIES = ("commit", "discard")


class TaskDefaults(msgspec.Struct, frozen=True, kw_only=True):
    """Run-level defaults a task input inherits (built-in defaults, then config and command line)."""

    model: str = "sonnet"
    plugin_name: str = "claude-code"
    import_policy: str = "auto"
    import_conflict_policy: str = "fail"
    skip_empty_import: bool = True
    container_cpus: float = 2
    container_memory: str = "4g"
    network_egress: str = "online"
    max_turns: int | None = None
    timeout_seconds: float = 3600.0


# The keys of the two task input types: a field added to them is accepted here too.
TASK_FIELDS = TaskInput.__optional_keys__ | BranchCleanupTask.__required_keys__


def normalize_task(task: Mapping[str, Any], defaults: TaskDefaults, *, default_base_branch: str) -> dict[str, Any]:
    """Validate a strategy's task dict and return the normalized input that is fingerprinted."""
    if not isinstance(task, dict):
        raise ConfigError(f"ctx.run expects a dict task input, got {type(task).__name__}")
    unknown = set(task) - TASK_FIELDS
    if unknown:
        raise ConfigError(
            f"unknown task field(s) {', '.join(sorted(unknown))}; accepted: {', '.join(sorted(TASK_FIELDS))}"
        )
    plugin, command, prompt = _what_runs(task, defaults.plugin_name)
    delete = task.get("delete_branches")

    def pick(name: str, allowed: tuple[str, ...], default: str | None = None) -> str:
        value = task.get(name)
        value = (default or getattr(defaults, name)) if value is None else value
        if value not in allowed:
            raise ConfigError(f"task field {name}={value!r} is invalid; use one of {', '.join(allowed)}")
        return value

    limits = task.get("container_limits") or {}
    runner = {
        "container_limits": {
            "cpus": limits.get("cpus", defaults.container_cpus),
            "memory": limits.get("memory", defaults.container_memory),
        },
        "network_egress": pick("network_egress", EGRESS),
        "max_turns": task.get("max_turns", defaults.max_turns),
    }
    include = task.get("include_branches")
    if include is not None and (not isinstance(include, (list, tuple)) or not all(isinstance(b, str) for b in include)):
        raise ConfigError("task field include_branches must be a list of branch names")
    output_schema = task.get("output_schema")
    if output_schema is not None:
        _check_output_schema(output_schema, plugin)
    skip_empty = task.get("skip_empty_import")
    group = task.get("session_group_key")
    if group is not None and not isinstance(group, str):
        # task.scheduled records it as a string: anything else could not be read back
        raise ConfigError(f"task field session_group_key must be a string (ctx.key(...) makes one), not {group!r}")
    normalized: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "prompt": prompt,
        "base_branch": task.get("base_branch") or default_base_branch,
        "model": task.get("model") or defaults.model,
        "import_policy": pick("import_policy", IMPORT_POLICIES),
        "import_conflict_policy": pick("import_conflict_policy", CONFLICT_POLICIES),
        "skip_empty_import": defaults.skip_empty_import if skip_empty is None else bool(skip_empty),
        "session_group_key": group,
        "resume_session_id": task.get("resume_session_id"),
        "plugin_name": plugin,
        "system_prompt": task.get("system_prompt"),
        "append_system_prompt": task.get("append_system_prompt"),
        "runner": runner,
        "command": command,
        "include_branches": list(include) if include else None,
        "timeout_seconds": task.get("timeout_seconds"),
    }
    if delete is not None:  # only when present: every other task keeps its fingerprint
        normalized["delete_branches"] = list(delete)
        normalized["import_policy"] = "never"
    if pick("uncommitted", UNCOMMITTED_POLICIES, "commit") == "discard":
        # Only the non-default value is part of the input: inputs recorded before
        # this field existed (all of them "commit") keep their fingerprints.
        normalized["uncommitted"] = "discard"
    normalized = _drop_nulls(normalized)
    if output_schema is not None:
        # Absent (not null) without a schema, so recorded runs keep their fingerprints;
        # kept whole with one, since null is meaningful inside a schema ({"const": null}).
        normalized["output_schema"] = output_schema
    return normalized


def _what_runs(task: Mapping[str, Any], default_plugin: str) -> tuple[str, str | None, str]:
    """The task's plugin, command and prompt, each checked against what the plugin runs."""
    plugin = task.get("plugin_name") or task.get("plugin") or default_plugin
    command = task.get("command")
    prompt = task.get("prompt")
    delete = task.get("delete_branches")
    if delete is not None:
        # A housekeeping task: the runner deletes this run's own branches and runs nothing.
        if not isinstance(delete, (list, tuple)) or not delete or not all(isinstance(b, str) and b for b in delete):
            raise ConfigError("task field delete_branches must be a non-empty list of branch names")
        if command is not None or task.get("plugin") or task.get("plugin_name") or task.get("include_branches"):
            raise ConfigError("a delete_branches task runs nothing else: drop command, plugin and include_branches")
        return "command", None, prompt or f"delete {len(delete)} working branch(es)"
    if get_plugin(plugin).capabilities.runs_command:
        if not isinstance(command, str) or not command.strip():
            raise ConfigError(f"a task with plugin {plugin!r} needs a non-empty 'command' string")
        return plugin, command, prompt if prompt is not None else command
    if not isinstance(prompt, str) or not prompt:
        raise ConfigError("every agent task needs a non-empty 'prompt' string")
    return plugin, command, prompt


def _check_output_schema(schema: Any, plugin: str) -> None:
    from ..runner.structured import check_schema

    check_schema(schema)
    if plugin in PLUGIN_MODULES and not get_plugin(plugin).capabilities.supports_output_schema:
        able = ", ".join(p for p in PLUGIN_MODULES if get_plugin(p).capabilities.supports_output_schema)
        raise ConfigError(
            f"plugin {plugin!r} cannot enforce output_schema; drop output_schema from the task or use one of: {able}"
        )


def _drop_nulls(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_nulls(v) for v in obj]
    return obj


def fingerprint(normalized: dict[str, Any]) -> str:
    return jcs_sha256(normalized)
