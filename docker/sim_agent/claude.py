"""The ``claude`` persona: Claude Code ``-p --output-format stream-json --verbose`` (2.1.x shapes)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from typing import Any

from .common import (
    OUT,
    Args,
    BaseEmitter,
    now_iso,
    read_options,
    sha256_hex,
    tokens_for,
    uuid4_from,
)

CLAUDE_VERSION = "2.1.330-sim"

CLAUDE_MODELS = {
    "sonnet": "claude-sonnet-4-5",
    "opus": "claude-opus-4-1",
    "haiku": "claude-haiku-4-5",
}
CLAUDE_DEFAULT_MODEL = "claude-sonnet-4-5"

CLAUDE_TOOLS = [
    "Task",
    "Bash",
    "Glob",
    "Grep",
    "ExitPlanMode",
    "Read",
    "Edit",
    "MultiEdit",
    "Write",
    "NotebookEdit",
    "WebFetch",
    "TodoWrite",
    "WebSearch",
    "BashOutput",
    "KillShell",
]

CLAUDE_CAPABILITIES = ["interrupt_receipt_v1", "msg_lifecycle_v1", "sdk_mcp_manifests", "ui_surface_v1"]

# Every result line carries these, success or API error.
SUBAGENT_STATS = {
    "spawned": 0,
    "requested": {"background": 0, "foreground": 0, "unset": 0},
    "started_in_background": 0,
    "max_depth": 0,
    "spawned_by_subagents": 0,
    "completed": 0,
    "failed": 0,
    "killed": {"parent": 0, "user": 0, "system": 0},
    "refused": {"depth_limit": 0, "concurrency_limit": 0, "budget": 0},
    "by_type": {},
}


def read_schema(a: Args, text: str) -> None:
    try:
        schema = json.loads(text)
    except ValueError as e:
        a.output_schema_error = f"--json-schema is not valid JSON: {e}"
        return
    if isinstance(schema, dict):
        a.output_schema = schema
    else:
        a.output_schema_error = "--json-schema must be a JSON object"


def _max_turns(a: Args, val: str) -> None:
    with contextlib.suppress(ValueError):
        a.max_turns = int(val)


# The options that take a value: the Args attribute each sets, what it does, or None (ignored).
CLAUDE_OPTIONS = {
    "--output-format": "output_format",
    "--input-format": None,
    "--model": "model",
    "--resume": "resume",
    "-r": "resume",
    "--max-turns": _max_turns,
    "--system-prompt": None,
    "--append-system-prompt": None,
    "--permission-mode": "permission_mode",
    "--allowedTools": None,
    "--allowed-tools": None,
    "--disallowedTools": None,
    "--disallowed-tools": None,
    "--session-id": None,
    "--settings": None,
    "--mcp-config": None,
    "--add-dir": None,
    "--fallback-model": None,
    "--max-budget-usd": None,
    "--agents": None,
    "--setting-sources": None,
    "--permission-prompt-tool": None,
    "--system-prompt-file": None,
    "--append-system-prompt-file": None,
    "--debug-file": None,
    "--tools": None,
    "--plugin-dir": None,
    "--betas": None,
    "--json-schema": read_schema,
    "--effort": None,
}
# -p/--print and the other switches need nothing.
CLAUDE_SWITCHES = {
    "--verbose": "verbose",
    "--dangerously-skip-permissions": "skip_permissions",
    "--allow-dangerously-skip-permissions": "skip_permissions",
}


def parse_claude(argv: list[str], a: Args) -> None:
    positional = read_options(argv, a, CLAUDE_OPTIONS, CLAUDE_SWITCHES)
    if positional and positional[0] != "-":
        a.prompt = " ".join(positional)


class ClaudeEmitter(BaseEmitter):
    """Writes Claude Code stream-json (2.1.x shapes)."""

    garbage_lines = (
        b'{"type":"assistant","message":{"content":[{"type":"text","text":"trunc\n',
        b'{"type":"system","subtype":"sim_garbage","note":"bad \xff\xfe byte"}\n',
        b"\n",
        b"[sim] plain log line between events\n",
    )

    def __init__(self, a: Args, session_id: str, exec_no: int, model: str, cwd: str, prior: dict) -> None:
        super().__init__(a, session_id, exec_no, model, cwd, prior, stream=a.output_format == "stream-json")
        self.n_lines = 0
        self.n_msgs = 0
        self.t0 = time.monotonic()

    # deterministic ids from the session id and counters
    def _uuid(self) -> str:
        self.n_lines += 1
        h = hashlib.sha256(f"{self.session_id}:{self.exec_no}:{self.n_lines}".encode()).digest()
        return uuid4_from(h)

    def _id(self, prefix: str) -> str:
        h = sha256_hex(f"{self.session_id}:{self.exec_no}:{prefix}:{self.n_msgs}")
        return f"{prefix}_sim_{self.n_msgs:03d}_{h[:12]}"

    def start(self) -> None:
        perm = "bypassPermissions" if self.a.skip_permissions else self.a.permission_mode
        self.emit(
            {
                "type": "system",
                "subtype": "init",
                "cwd": self.cwd,
                "session_id": self.session_id,
                "tools": CLAUDE_TOOLS,
                "mcp_servers": [],
                "model": self.model,
                "permissionMode": perm,
                "slash_commands": ["compact", "context", "cost", "init", "review"],
                "apiKeySource": "ANTHROPIC_API_KEY" if os.environ.get("ANTHROPIC_API_KEY") else "none",
                "claude_code_version": CLAUDE_VERSION,
                "output_style": "default",
                "agents": ["general-purpose", "Explore", "Plan"],
                "skills": [],
                "plugins": [],
                "uuid": self._uuid(),
                "memory_paths": {
                    "auto": os.path.expanduser("~/.claude/projects/") + self.cwd.replace("/", "-") + "/memory/"
                },
                "original_cwd": self.cwd,
                "additional_directories": [],
                "fast_mode_state": "off",
                "capabilities": CLAUDE_CAPABILITIES,
                "terminal_slash_commands": ["doctor", "color", "focus"],
                "analytics_disabled": True,
                "product_feedback_disabled": True,
                # claude reports whether the base URL is Anthropic's own API
                "served_by_anthropic": not os.environ.get("ANTHROPIC_BASE_URL"),
                "messaging_socket_path": f"/tmp/cc-socks/{os.getpid()}.sock",
                "fast_mode_disabled_reason": "sdk_opt_in_required",
                "per_turn_effort_active": True,
                "ultrathink_available": False,
                "ultrathink_typed_raises": False,
                "view_mode": "default",
            }
        )

    def _turn_usage(self, out_text: str) -> dict:
        self.turns += 1
        inp = 12000 + (len(self.a.prompt or "") // 4) + 100 * self.turns
        out = tokens_for(out_text)
        self.usage.input_tokens += inp
        self.usage.output_tokens += out
        return {
            "input_tokens": inp,
            "output_tokens": out,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }

    def _assistant(self, content: list[dict], usage: dict) -> None:
        message = {
            "id": self._id("msg"),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
            "context_management": None,
        }
        self.emit(self._message_line("assistant", message))

    def _message_line(self, line_type: str, message: dict, **after: object) -> dict[str, Any]:
        """An assistant or user line: its message, then the ids every such line carries, then ``after``."""
        return {
            "type": line_type,
            "message": message,
            "parent_tool_use_id": None,
            "session_id": self.session_id,
            "uuid": self._uuid(),
            "timestamp": now_iso(),
            **after,
        }

    def text(self, text: str) -> None:
        self.n_msgs += 1
        self.texts.append(text)
        self._assistant([{"type": "text", "text": text}], self._turn_usage(text))

    def tool(self, name: str, tool_input: dict, run) -> tuple[str, bool]:
        """Emit tool_use, run ``run()`` -> (output, is_error, extra), emit tool_result."""
        self.n_msgs += 1
        tool_id = self._id("toolu")
        self._assistant(
            [{"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}],
            self._turn_usage(json.dumps(tool_input)),
        )
        output, is_error, extra = run()
        if extra.get("commit_sha"):
            self.emit(
                {
                    "type": "system",
                    "subtype": "vcs_state_changed",
                    "kind": "commit",
                    "branch": extra.get("branch", ""),
                    "cwd": self.cwd,
                    "uuid": self._uuid(),
                    "session_id": self.session_id,
                }
            )
        result_block = {"tool_use_id": tool_id, "type": "tool_result", "content": output}
        if name == "Bash" or is_error:
            result_block["is_error"] = is_error
        line = self._message_line("user", {"role": "user", "content": [result_block]})
        if name == "Bash":
            line["tool_use_result"] = {
                "stdout": output,
                "stderr": "",
                "interrupted": False,
                "isImage": False,
                "noOutputExpected": False,
            }
            if extra.get("commit_sha"):
                line["tool_use_result"]["gitOperation"] = {
                    "commit": {"sha": extra["commit_sha"], "kind": "committed", "branch": extra.get("branch", "")}
                }
        elif name == "Edit" and not is_error:
            line["tool_use_result"] = {
                "filePath": tool_input.get("file_path"),
                "oldString": tool_input.get("old_string"),
                "newString": tool_input.get("new_string"),
                "originalFile": extra.get("original", ""),
                "structuredPatch": extra.get("patch", []),
                "userModified": False,
                "replaceAll": bool(tool_input.get("replace_all")),
            }
        elif name == "Write" and not is_error:
            line["tool_use_result"] = {
                "type": extra.get("write_kind", "create"),
                "filePath": tool_input.get("file_path"),
                "content": tool_input.get("content"),
                "structuredPatch": [],
                "originalFile": None,
                "userModified": False,
            }
        # with --dangerously-skip-permissions every tool call is accepted by the mode
        line["tool_result_meta"] = [
            {"id": tool_id, "permission_decision": {"decision": "accept", "source": "config", "reason_type": "mode"}}
        ]
        self.emit(line)
        return output, is_error

    def _model_usage(self, inp: int, out: int, cost: float) -> dict:
        return {
            self.model: {
                "inputTokens": inp,
                "outputTokens": out,
                "cacheReadInputTokens": 0,
                "cacheCreationInputTokens": 0,
                "webSearchRequests": 0,
                "costUSD": cost,
                "contextWindow": 200000,
                "maxOutputTokens": 64000,
                "thinkingTokens": 0,
                "cacheCreationEphemeral5mInputTokens": 0,
                "cacheCreationEphemeral1hInputTokens": 0,
                "canonicalModel": self.model,
                "provider": "firstParty",
                "costBasis": "list",
            }
        }

    def _usage_block(self, inp: int, out: int) -> dict:
        return {
            "output_tokens_details": {"thinking_tokens": 0},
            "input_tokens": inp,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": out,
            "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
            "service_tier": "standard",
            "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
            "inference_geo": "",
            "iterations": [],
            "speed": "standard",
            "fallback_credit": None,
        }

    def finish(
        self,
        result_text: str,
        *,
        is_error: bool = False,
        subtype: str = "success",
        terminal_reason: str = "completed",
        errors: list[str] | None = None,
        api_error_status: int | None = None,
        api_error_type: str | None = None,
        stop_reason: str = "end_turn",
        count_usage: bool = True,
        structured: object = None,
    ) -> None:
        if (
            subtype == "success"
            and not is_error
            and result_text
            and structured is None
            and (not self.texts or self.texts[-1] != result_text)
        ):
            self.text(result_text)
        totals = self.session_totals()
        duration = int((time.monotonic() - self.t0) * 1000)
        counted = count_usage and (self.usage.input_tokens or self.usage.output_tokens)
        model_usage = (
            self._model_usage(totals["input_tokens"], totals["output_tokens"], totals["cost_usd"])
            if counted or totals["input_tokens"]
            else {}
        )
        since = self._model_usage(self.usage.input_tokens, self.usage.output_tokens, self.usage.cost) if counted else {}
        result = {
            "type": "result",
            "subtype": subtype,
            "is_error": is_error,
            "duration_ms": duration,
            "duration_api_ms": max(0, duration - 5),
            "num_turns": max(1, self.turns),
            "stop_reason": stop_reason,
            "session_id": self.session_id,
            "total_cost_usd": totals["cost_usd"],
            "usage": self._usage_block(self.usage.input_tokens, self.usage.output_tokens),
            "modelUsage": model_usage,
            "permission_denials": [],
            "terminal_reason": terminal_reason,
            "fast_mode_state": "off",
            "fast_mode_disabled_reason": "sdk_opt_in_required",
            "subagent_stats": json.loads(json.dumps(SUBAGENT_STATS)),
            "safety_stops": 0,
            "api_error_status": api_error_status,
            "uuid": self._uuid(),
            "queued_turn_count": 0,
            "result_index": 0,
            "model_usage_since_last_result": since,
        }
        if self.turns and api_error_status is None:
            # latency figures exist only once the model answered
            ttft = max(1, duration // 2)
            result.update(
                ttft_ms=ttft, ttft_stream_ms=ttft, time_to_request_ms=max(0, ttft - 1), first_content_frame_ms=ttft
            )
        if api_error_type:
            result["api_error_type"] = api_error_type
        if structured is not None:
            result["structured_output"] = structured
        if subtype == "success":
            result["result"] = result_text
        else:
            result["errors"] = errors if errors is not None else [result_text]
            if result_text:
                result["result"] = result_text
        if self.stream:
            self.emit(result)
        elif self.a.output_format == "json":
            OUT.line(result)
        else:
            OUT.text(result_text + "\n")

    def finish_structured(self, result_text: str, value: object) -> None:
        """With --json-schema the model answers by calling the StructuredOutput tool once at the end."""
        if value is None:  # it answered in prose instead: no structured_output
            self.finish(result_text)
            return
        self.tool(
            "StructuredOutput",
            value if isinstance(value, dict) else {"value": value},
            lambda: ("Structured output provided successfully", False, {}),
        )
        self.finish(result_text, structured=value)

    def api_error(self, status: int) -> None:
        if status == 429:
            err, etype = "rate_limit", "rate_limit_error"
            text = (
                'API Error: 429 {"type":"error","error":{"type":"rate_limit_error","message":"This request would '
                'exceed the rate limit for your organization of 50 requests per minute (simulated)."}}'
            )
        else:
            err, etype = "authentication_failed", "authentication_error"
            text = "Invalid API key · Fix external API key"
        self._api_retries(status, err)
        self._api_error_message(text, status, err, etype)
        self.finish(
            text,
            is_error=True,
            subtype="success",
            terminal_reason="api_error",
            api_error_status=status,
            api_error_type=etype,
            stop_reason="stop_sequence",
            count_usage=False,
        )

    def _api_retries(self, status: int, err: str) -> None:
        for attempt in (1, 2):
            self.emit(
                {
                    "type": "system",
                    "subtype": "api_retry",
                    "attempt": attempt,
                    "max_retries": 2,
                    "retry_delay_ms": 500 * attempt,
                    "error_status": status,
                    "error": err,
                    "session_id": self.session_id,
                    "uuid": self._uuid(),
                }
            )
        # The five-hour/weekly limit event belongs to subscription (OAuth) logins;
        # a plain API key's 429 is only retries and the error message.
        if status == 429 and os.environ.get("CLAUDE_CODE_OAUTH_TOKEN") and not os.environ.get("ANTHROPIC_API_KEY"):
            self.emit(
                {
                    "type": "rate_limit_event",
                    "rate_limit_info": {
                        "status": "rejected",
                        "rateLimitType": "five_hour",
                        "resetsAt": int(time.time()) + 3600,
                    },
                    "uuid": self._uuid(),
                    "session_id": self.session_id,
                }
            )

    def _api_error_message(self, text: str, status: int, err: str, etype: str) -> None:
        zero = {
            "output_tokens_details": None,
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
            "service_tier": None,
            "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
            "inference_geo": None,
            "iterations": None,
            "speed": None,
            "fallback_credit": None,
        }
        self.turns = 1
        message = {
            "diagnostics": None,
            "id": uuid4_from(hashlib.sha256(f"{self.session_id}:{self.exec_no}:err".encode()).digest()),
            "container": None,
            "model": "<synthetic>",
            "role": "assistant",
            "stop_details": None,
            "stop_reason": "stop_sequence",
            "stop_sequence": "",
            "type": "message",
            "usage": zero,
            "content": [{"type": "text", "text": text}],
            "context_management": None,
        }
        self.emit(
            self._message_line(
                "assistant",
                message,
                error=err,
                is_api_error_message=True,
                api_error_status=status,
                api_error_type=etype,
            )
        )


def model_for(requested: str | None) -> str:
    return CLAUDE_MODELS.get(requested or "", requested or CLAUDE_DEFAULT_MODEL)


Emitter = ClaudeEmitter
