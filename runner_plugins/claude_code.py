"""Claude Code (``claude -p --output-format stream-json --verbose``).

Facts this plugin relies on (fixtures in ``tests/fixtures/agent-transcripts``):

* API errors end with a ``result`` whose ``subtype`` is ``"success"`` but ``is_error`` is true, with
  ``api_error_status`` and ``terminal_reason`` ``"api_error"``; the CLI exits 1.
* After ``--resume``, ``total_cost_usd`` and ``modelUsage`` are cumulative over the whole session.
  ``model_usage_since_last_result`` (CLI 2.1.3xx) is the per-execution usage, so it wins when present.
* CLI 2.1.1-2.1.6 could print a spurious error ``result`` after a success one: the first successful result wins.
* The CLI retries 401/429/529 itself (10 times, about three minutes, by default). The runner retries with its own,
  longer backoff, so the CLI is told ``CLAUDE_CODE_MAX_RETRIES=2``: short blips are absorbed inside the turn,
  persistent failures reach the runner within seconds, at most 3 x 3 calls. ``request.env`` may override it.
* ``--json-schema '<schema>'`` adds a ``StructuredOutput`` tool the model must call once at the end; the final
  ``result`` line then carries ``structured_output`` (the object) and ``result`` (its JSON text).
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.errors import ConfigError, PreflightError
from orchestrator.runner.plugin import AgentEvent, AgentOutcome, PluginCapabilities
from orchestrator.runner.structured import schema_json
from orchestrator.runner.types import AuthConfig, ErrorCategory, InstanceRequest

from ._jsonl import (
    JsonLinesParser,
    SecretEnv,
    as_int,
    classify_api_text,
    classify_crash,
    classify_status,
    clip,
    dict_at,
    list_at,
    parse_object,
    tool_result,
    tool_use,
)

# Linux MAX_ARG_STRLEN is 131072 bytes per argument (NUL included). Prompts above
# this many UTF-8 bytes are sent on stdin instead (see ``stdin_payload``).
PROMPT_ARGV_LIMIT = 100_000
MAX_ARG_STRLEN = 131_072
DEFAULT_CLI_RETRIES = "2"

_ALIASES = {"sonnet": "sonnet", "opus": "opus", "haiku": "haiku"}
_SECRET_KEYS = frozenset({"CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_API_KEY"})
# What a result line's event keeps (the outcome reads the whole line).
_RESULT_KEYS = (
    "subtype",
    "is_error",
    "num_turns",
    "total_cost_usd",
    "session_id",
    "api_error_status",
    "terminal_reason",
)


class ModelTable(dict):
    """Friendly name -> ``--model``: the CLI resolves the aliases itself (to the newest model of each family),
    and a full id (``claude-...``) stands for itself."""

    def __missing__(self, key: str) -> str:
        if key in self:  # a full id
            return key
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) or (
            isinstance(key, str) and key.startswith("claude-") and len(key) > len("claude-")
        )


def prompt_via_stdin(prompt: str) -> bool:
    """True when the prompt cannot (or should not) travel as one argv entry."""
    return "\x00" in prompt or len(prompt.encode("utf-8")) > PROMPT_ARGV_LIMIT


class ClaudeCodePlugin:
    name = "claude-code"
    capabilities = PluginCapabilities(
        supports_resume=True,
        supports_cost=True,
        supports_streaming=False,  # no --include-partial-messages: whole messages only
        supports_output_schema=True,
        auth_env=("CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_API_KEY"),
        image_tools=("claude", "git"),
        simulated_as="claude",
        model_hint=" or a full model id starting with 'claude-'",
    )

    def resolve_auth(self, environ: dict[str, str], *, mode: str | None) -> AuthConfig:
        """``--mode api`` uses ``ANTHROPIC_API_KEY`` (with optional ``ANTHROPIC_BASE_URL``);
        otherwise an OAuth token means subscription mode, an API key alone means API mode."""
        oauth = environ.get("CLAUDE_CODE_OAUTH_TOKEN") or None
        api_key = environ.get("ANTHROPIC_API_KEY") or None
        base_url = environ.get("ANTHROPIC_BASE_URL") or None
        openai_key = environ.get("OPENAI_API_KEY") or None
        if mode == "api" and not api_key:
            raise PreflightError(
                "--mode api needs ANTHROPIC_API_KEY (optionally ANTHROPIC_BASE_URL for a custom endpoint)"
            )
        if mode == "subscription" and not oauth:
            raise PreflightError("--mode subscription needs CLAUDE_CODE_OAUTH_TOKEN (from `claude setup-token`)")
        if oauth and mode != "api":
            return AuthConfig(oauth_token=oauth, openai_api_key=openai_key)
        if api_key:
            return AuthConfig(api_key=api_key, base_url=base_url, openai_api_key=openai_key)
        raise PreflightError(
            "no credentials: set CLAUDE_CODE_OAUTH_TOKEN (subscription) or ANTHROPIC_API_KEY (API), "
            "in the environment or in ./.env; or rehearse with --dry-run"
        )

    def known_models(self) -> dict[str, str] | None:
        return ModelTable(_ALIASES)

    def validate_environment(self, auth: AuthConfig) -> None:
        if not (auth.oauth_token or auth.api_key):
            raise PreflightError(
                "claude-code needs credentials: set CLAUDE_CODE_OAUTH_TOKEN (subscription) "
                "or ANTHROPIC_API_KEY (API mode, optionally with ANTHROPIC_BASE_URL)"
            )

    def prepare_environment(self, auth: AuthConfig, request: InstanceRequest) -> dict[str, str]:
        self.validate_environment(auth)
        env = SecretEnv(
            {
                "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_AUTOUPDATER": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "CLAUDE_CODE_MAX_RETRIES": DEFAULT_CLI_RETRIES,
            },
            secret_keys=_SECRET_KEYS,
        )
        env.update(request.env)
        # A custom endpoint cannot take a subscription token: base_url means API mode.
        api_mode = bool(auth.api_key) and (bool(auth.base_url) or not auth.oauth_token)
        if api_mode:
            env["ANTHROPIC_API_KEY"] = auth.api_key or ""
            if auth.base_url:
                env["ANTHROPIC_BASE_URL"] = auth.base_url
        else:
            env["CLAUDE_CODE_OAUTH_TOKEN"] = auth.oauth_token or ""
        return env

    def build_command(self, request: InstanceRequest, *, resume_session_id: str | None) -> list[str]:
        if not request.prompt.strip():
            raise ConfigError("claude-code needs a non-empty prompt")
        model = request.model  # the CLI resolves an alias itself
        if model not in ModelTable(_ALIASES):
            raise ConfigError(
                f"unknown model {model!r} for claude-code; use one of {', '.join(sorted(_ALIASES))} "
                "or a full model id starting with 'claude-'"
            )
        argv = ["claude", "-p"]
        trailer: list[str] = []
        if not prompt_via_stdin(request.prompt):
            if request.prompt.startswith("-"):
                trailer = ["--", request.prompt]  # keep it from being read as an option
            else:
                argv.append(request.prompt)
        argv += ["--output-format", "stream-json", "--verbose", "--model", model]
        argv += ["--permission-mode", "bypassPermissions"]
        if resume_session_id:
            argv += ["--resume", resume_session_id]
        if request.system_prompt:
            argv += ["--system-prompt", request.system_prompt]
        if request.append_system_prompt:
            argv += ["--append-system-prompt", request.append_system_prompt]
        if request.max_turns is not None:
            if request.max_turns < 1:
                raise ConfigError(f"max_turns must be at least 1, got {request.max_turns}")
            argv += ["--max-turns", str(request.max_turns)]
        if request.output_schema is not None:
            # Adds a StructuredOutput tool; the result line then carries structured_output.
            argv += ["--json-schema", schema_json(request.output_schema)]
        argv += trailer
        for arg in argv:
            if "\x00" in arg or len(arg.encode("utf-8")) >= MAX_ARG_STRLEN:
                raise ConfigError(
                    "a claude-code argument (system prompt?) is too long or contains NUL; "
                    f"arguments must stay under {MAX_ARG_STRLEN} bytes"
                )
        return argv

    def stdin_payload(self, request: InstanceRequest) -> bytes | None:
        """The prompt's bytes for stdin, or ``None``: then stdin must be closed, or ``claude -p`` prepends it."""
        return request.prompt.encode("utf-8") if prompt_via_stdin(request.prompt) else None

    def new_parser(self, *, previous: dict[str, float] | None = None) -> ClaudeStreamParser:
        return ClaudeStreamParser(previous=previous)


class ClaudeStreamParser(JsonLinesParser):
    def __init__(self, *, previous: dict[str, float] | None = None) -> None:
        super().__init__(previous=previous)
        self._last_text: str | None = None
        self._results: list[dict[str, Any]] = []
        self._api_error: dict[str, Any] | None = None  # last synthetic API-error message
        self._last_retry: dict[str, Any] | None = None
        self._rate_limited = False

    def _handle_line(self, line: str) -> list[AgentEvent]:
        obj = parse_object(line)
        if obj is None:
            return []
        if self.session_id is None and isinstance(obj.get("session_id"), str):
            self.session_id = obj["session_id"]
        kind = obj.get("type")
        if kind == "system":
            return self._on_system(obj)
        if kind == "assistant":
            return self._on_assistant(obj)
        if kind == "user":
            return self._on_user(obj)
        if kind == "rate_limit_event":
            info = dict_at(obj, "rate_limit_info")
            if info.get("status") == "rejected":
                self._rate_limited = True
            return [
                AgentEvent(kind="rate_limit", data={k: info.get(k) for k in ("status", "rateLimitType", "resetsAt")})
            ]
        if kind == "result":
            self._results.append(obj)
            return [AgentEvent(kind="result", data={k: obj.get(k) for k in _RESULT_KEYS})]
        return [AgentEvent(kind="other", data={"type": clip(str(kind), 200)})]

    def _on_system(self, obj: dict[str, Any]) -> list[AgentEvent]:
        subtype = obj.get("subtype")
        if subtype == "init":
            if isinstance(obj.get("session_id"), str):
                self.session_id = obj["session_id"]
            if isinstance(obj.get("model"), str):
                self.model = obj["model"]
            data = {
                "session_id": self.session_id,
                "model": self.model,
                "version": obj.get("claude_code_version"),
                "permission_mode": obj.get("permissionMode"),
            }
            return [AgentEvent(kind="init", data=data)]
        if subtype == "api_retry":
            self._last_retry = obj
            data = {
                "retrying": True,
                **{k: obj.get(k) for k in ("attempt", "max_retries", "error_status", "error", "retry_delay_ms")},
            }
            return [AgentEvent(kind="error", data=data)]
        return [AgentEvent(kind="other", data={"type": "system", "subtype": clip(str(subtype), 200)})]

    def _on_assistant(self, obj: dict[str, Any]) -> list[AgentEvent]:
        message = dict_at(obj, "message")
        events: list[AgentEvent] = []
        texts: list[str] = []
        for block in _blocks(message.get("content")):
            btype = block.get("type")
            if btype == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
                events.append(AgentEvent(kind="text", data={"text": clip(block["text"])}))
            elif btype == "tool_use":
                events.append(tool_use(block.get("id"), block.get("name"), _clip_json(block.get("input"))))
        if texts:
            self._last_text = "\n".join(texts)
        if obj.get("error") or obj.get("is_api_error_message"):
            self._api_error = {
                "error": obj.get("error"),
                "status": obj.get("api_error_status"),
                "text": "\n".join(texts),
            }
            events.append(AgentEvent(kind="error", data={k: clip(v) for k, v in self._api_error.items()}))
        usage = message.get("usage")
        if isinstance(usage, dict):
            tokens = {"input_tokens": _input_tokens(usage), "output_tokens": as_int(usage.get("output_tokens"))}
            events.append(AgentEvent(kind="usage", data=tokens))
        return events

    def _on_user(self, obj: dict[str, Any]) -> list[AgentEvent]:
        blocks = _blocks(dict_at(obj, "message").get("content"))
        return [
            tool_result(
                b.get("tool_use_id"), clip(_content_text(b.get("content")), 8 * 1024), is_error=bool(b.get("is_error"))
            )
            for b in blocks
            if b.get("type") == "tool_result"
        ]

    def finish(self, exit_code: int | None) -> AgentOutcome:
        # Events of an unterminated last line; the runner may log them after finish().
        self.final_events = [e for line in self._lines.flush() for e in self._handle_line(line)]
        if not self._results:
            return self._no_result(exit_code)
        result = next((r for r in self._results if not r.get("is_error")), self._results[0])

        session_id = result.get("session_id") if isinstance(result.get("session_id"), str) else self.session_id
        text = result.get("result")
        final = text if isinstance(text, str) and text else (self._last_text or "")
        tokens_in, tokens_out, cost = _usage_of(result)
        num_turns = result.get("num_turns")
        is_error = bool(result.get("is_error")) or result.get("subtype") not in (None, "success")
        category, retryable, message = self._classify_result(result, final) if is_error else (None, False, None)
        return AgentOutcome(
            final_message=final,
            session_id=session_id,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=cost,
            num_turns=num_turns if isinstance(num_turns, int) and num_turns >= 0 else None,
            is_error=is_error,
            error_category=category,
            error_message=message,
            retryable=retryable,
            exit_code=exit_code,
            cumulative=_cumulative_of(result),
            structured_output=result.get("structured_output"),
        )

    def _classify_result(self, result: dict[str, Any], final: str) -> tuple[ErrorCategory, bool, str]:
        details = "; ".join(str(e) for e in list_at(result, "errors"))
        text = result.get("result") if isinstance(result.get("result"), str) else ""
        message = text or details or final or f"claude-code reported {result.get('subtype')}"
        if result.get("subtype") == "error_max_turns" or result.get("terminal_reason") == "max_turns":
            # The turn budget is a limit like a timeout: the task failed, and
            # retrying with the same budget would fail the same way.
            return "timeout", False, message
        status = result.get("api_error_status")
        if not isinstance(status, int) and self._api_error and isinstance(self._api_error.get("status"), int):
            status = self._api_error["status"]
        decided = classify_status(status if isinstance(status, int) else None)
        if decided is None:
            hint = " ".join(
                str(x)
                for x in (text, details, result.get("api_error_type") or "", (self._api_error or {}).get("error") or "")
            )
            if self._rate_limited:
                return "api", True, message
            decided = classify_api_text(hint)
        return decided[0], decided[1], message

    def _no_result(self, exit_code: int | None) -> AgentOutcome:
        stderr = self._stderr.last_lines()
        hints = [stderr]
        if self._api_error:
            hints.append(f"{self._api_error.get('error')} {self._api_error.get('text')}")
        status = self._last_retry.get("error_status") if self._last_retry else None
        decided = classify_status(status) if isinstance(status, int) else None
        if self._rate_limited:
            decided = ("api", True)
        if decided is None:
            decided = classify_crash(exit_code, " ".join(hints))
        how = f"exited with status {exit_code}" if exit_code is not None else "stream ended"
        message = f"claude-code {how} without a result"
        if stderr:
            message += f": {stderr}"
        elif self._api_error and self._api_error.get("text"):
            message += f": {self._api_error['text']}"
        return AgentOutcome(
            final_message=self._last_text or "",
            session_id=self.session_id,
            is_error=True,
            error_category=decided[0],
            error_message=message,
            retryable=decided[1],
            exit_code=exit_code,
        )


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return "" if content is None else json.dumps(content, ensure_ascii=False)[:8192]


def _clip_json(value: Any, limit: int = 16 * 1024) -> Any:
    encoded = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(encoded) <= limit else {"truncated": encoded[:limit]}


def _input_tokens(usage: dict[str, Any]) -> int:
    return (
        as_int(usage.get("input_tokens"))
        + as_int(usage.get("cache_creation_input_tokens"))
        + as_int(usage.get("cache_read_input_tokens"))
    )


def _model_usage_totals(model_usage: dict[str, Any]) -> tuple[int, int, float]:
    tokens_in = tokens_out = 0
    cost = 0.0
    for entry in model_usage.values():
        if not isinstance(entry, dict):
            continue
        tokens_in += (
            as_int(entry.get("inputTokens"))
            + as_int(entry.get("cacheReadInputTokens"))
            + as_int(entry.get("cacheCreationInputTokens"))
        )
        tokens_out += as_int(entry.get("outputTokens"))
        if isinstance(entry.get("costUSD"), (int, float)):
            cost += float(entry["costUSD"])
    return tokens_in, tokens_out, cost


def _usage_of(result: dict[str, Any]) -> tuple[int, int, float | None]:
    """Per-execution (tokens_in, tokens_out, cost): cache reads/writes count as input."""
    since = result.get("model_usage_since_last_result")
    if isinstance(since, dict):
        tokens_in, tokens_out, cost = _model_usage_totals(since)
        return tokens_in, tokens_out, round(cost, 10)
    usage = dict_at(result, "usage")
    total = result.get("total_cost_usd")
    total_cost = float(total) if isinstance(total, (int, float)) and not isinstance(total, bool) else None
    return _input_tokens(usage), as_int(usage.get("output_tokens")), total_cost


def _cumulative_of(result: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    total = result.get("total_cost_usd")
    if isinstance(total, (int, float)) and not isinstance(total, bool):
        out["cost_usd"] = float(total)
    model_usage = result.get("modelUsage")
    if isinstance(model_usage, dict) and model_usage:
        tokens_in, tokens_out, _ = _model_usage_totals(model_usage)
        out.update(tokens_in=float(tokens_in), tokens_out=float(tokens_out))
    return out


PLUGIN = ClaudeCodePlugin()
