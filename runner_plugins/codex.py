"""OpenAI Codex CLI (``codex exec --json``). Two output formats are parsed:

* current (0.44+): ``thread.started`` (its ``thread_id`` is the session id used to resume), ``turn.started``,
  ``item.started/updated/completed`` with item types ``agent_message``, ``reasoning``, ``command_execution``,
  ``file_change``, ``mcp_tool_call``, ``web_search``, ``todo_list`` and ``error`` (a non-fatal warning), then
  ``turn.completed`` (with ``usage``) or ``turn.failed``; top-level ``error`` lines ("Reconnecting... n/5")
  precede a failure;
* legacy (before 0.44): a config summary object without ``type``, a ``{"prompt": ...}`` line, then
  ``{"id", "msg": {"type": ...}}`` lines ending in ``task_complete`` (``last_agent_message``) or ``error``.

Codex reports no cost (orchestration estimates it from token counts). ``turn.completed.usage`` is cumulative over
a resumed thread, so per-execution tokens are the difference from ``previous``; ``input_tokens`` already includes
``cached_input_tokens`` and ``output_tokens`` includes ``reasoning_output_tokens``.

Its default sandbox cannot start in a container (every command fails while the turn "completes"), so the plugin
passes ``--dangerously-bypass-approvals-and-sandbox``: the container is the sandbox. ``codex exec`` has no turn
limit, so ``max_turns`` is refused when the task is scheduled.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

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
    parse_object,
    session_gone,
    tool_result,
    tool_use,
)
from .claude_code import MAX_ARG_STRLEN, prompt_via_stdin

SCHEMA_DIR = "/tmp/orchestrator"
PROVIDER = "orc"
CLI_RETRIES = 2
USAGE_KEYS = (
    "input_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "output_tokens",
    "reasoning_output_tokens",
)


class CodexPlugin:
    name = "codex"
    capabilities = PluginCapabilities(
        supports_resume=True,
        supports_streaming=False,  # items arrive whole, not as partial text
        supports_output_schema=True,
        supports_max_turns=False,
        auth_methods=("api_key",),
        auth_env=("OPENAI_API_KEY",),
        image_tools=("codex", "git"),
        simulated_as="codex",
    )

    def resolve_auth(self, environ: dict[str, str], *, mode: str | None) -> AuthConfig:
        """``OPENAI_API_KEY`` (with optional ``OPENAI_BASE_URL``); codex has no subscription mode here."""
        openai_key = environ.get("OPENAI_API_KEY") or None
        if not openai_key:
            raise PreflightError("no credentials for codex: set OPENAI_API_KEY (or use --dry-run to rehearse)")
        return AuthConfig(openai_api_key=openai_key, openai_base_url=environ.get("OPENAI_BASE_URL") or None)

    def known_models(self) -> dict[str, str] | None:
        # Any non-empty model name is passed to ``-m`` unchanged: providers behind a custom base_url name models freely.
        # An unknown name fails at the API with a 400 (classified as a non-retryable "api" error).
        return None

    def validate_environment(self, auth: AuthConfig) -> None:
        if not auth.openai_api_key:
            raise PreflightError(
                "codex needs credentials: set OPENAI_API_KEY (and OPENAI_BASE_URL for a custom endpoint)"
            )

    def prepare_environment(self, auth: AuthConfig, request: InstanceRequest) -> dict[str, str]:
        self.validate_environment(auth)
        # No CODEX_HOME: codex refuses to start when that folder is missing (a fresh session volume has none), while its
        # default, ~/.codex, it creates itself -- on the session volume, so resume still finds the thread.
        env = SecretEnv({}, secret_keys=frozenset({"OPENAI_API_KEY"}))
        env.update(request.env)
        env["OPENAI_API_KEY"] = auth.openai_api_key or ""
        return env

    def build_command(
        self, request: InstanceRequest, *, resume_session_id: str | None, auth: AuthConfig | None = None
    ) -> list[str]:
        """argv for ``codex exec``. codex 0.169 ignores ``OPENAI_BASE_URL``: a custom endpoint, from ``auth`` (a
        keyword beyond the protocol) else ``request.env``, needs a model provider on the command line."""
        if not request.model.strip():
            raise ConfigError("codex needs a model name (-m)")
        if not request.prompt.strip():
            raise ConfigError("codex needs a non-empty prompt")
        argv = ["codex", "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        argv += ["-c", "analytics.enabled=false", "-c", "features.unbounded_connection_retries=false"]
        argv += ["-m", request.model]
        if base_url := (auth.openai_base_url if auth else None) or request.env.get("OPENAI_BASE_URL"):
            # Two retries inside the CLI, like claude-code's CLAUDE_CODE_MAX_RETRIES: by default codex retries a 401
            # five times (12 s here) before failing, and the runner's own backoff handles what is worth retrying.
            provider = (
                f'{{name="{PROVIDER}",base_url={json.dumps(base_url)},'
                f'env_key="OPENAI_API_KEY",wire_api="responses",'
                f"request_max_retries={CLI_RETRIES},stream_max_retries={CLI_RETRIES}}}"
            )
            argv += ["-c", f"model_provider={PROVIDER}", "-c", f"model_providers.{PROVIDER}={provider}"]
        if request.output_schema is not None:
            # The final agent message is then the JSON answer; the host validates it.
            argv += ["--output-schema", _file_path("output-schema", schema_json(request.output_schema), "json")]
        if request.system_prompt:
            path = json.dumps(_file_path("instructions", request.system_prompt, "md"))
            # Codex before model_instructions_file (0.63 and older) reads the same
            # file under the older name; newer versions only warn about it.
            argv += ["-c", f"model_instructions_file={path}", "-c", f"experimental_instructions_file={path}"]
        if request.append_system_prompt:
            # A JSON string is a valid TOML basic string (same escapes, \uXXXX included).
            argv += ["-c", f"developer_instructions={json.dumps(request.append_system_prompt)}"]
        if resume_session_id:
            argv += ["resume", resume_session_id]
        if _codex_stdin(request.prompt):
            argv.append("-")
        elif request.prompt.startswith("-"):
            argv += ["--", request.prompt]
        else:
            argv.append(request.prompt)
        if any(len(a.encode("utf-8")) >= MAX_ARG_STRLEN for a in argv):
            raise ConfigError(f"a codex argument is longer than {MAX_ARG_STRLEN} bytes")
        return argv

    def container_files(self, request: InstanceRequest) -> dict[str, bytes]:
        """The files the argv names (output schema, instructions), on the container's /tmp (readable by node)."""
        files: dict[str, bytes] = {}
        if request.output_schema is not None:
            schema = schema_json(request.output_schema)
            files[_file_path("output-schema", schema, "json")] = schema.encode("utf-8")
        if request.system_prompt:
            files[_file_path("instructions", request.system_prompt, "md")] = request.system_prompt.encode("utf-8")
        return files

    def stdin_payload(self, request: InstanceRequest) -> bytes | None:
        """Prompt bytes for stdin when the argv carries ``-``; otherwise ``None`` (close stdin)."""
        return request.prompt.encode("utf-8") if _codex_stdin(request.prompt) else None

    def new_parser(self, *, previous: dict[str, float] | None = None) -> CodexStreamParser:
        return CodexStreamParser(previous=previous)


def _file_path(stem: str, text: str, ext: str) -> str:
    """Content-addressed, so a reused container never reads another task's schema or instructions."""
    return f"{SCHEMA_DIR}/{stem}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]}.{ext}"


def _codex_stdin(prompt: str) -> bool:
    return prompt_via_stdin(prompt) or prompt.strip() == "-"


class CodexStreamParser(JsonLinesParser):
    def __init__(self, *, previous: dict[str, float] | None = None) -> None:
        super().__init__(previous=previous)
        self._last_message: str | None = None
        self._usage: dict[str, Any] | None = None
        self._completed = False
        self._failed: str | None = None
        self._last_error: str | None = None  # last top-level error other than "Reconnecting..."
        self._last_any_error: str | None = None

    def _handle_line(self, line: str) -> list[AgentEvent]:
        obj = parse_object(line)
        if obj is None:
            return []
        kind = obj.get("type")
        if isinstance(kind, str):
            return self._on_event(kind, obj)
        if isinstance(obj.get("msg"), dict):
            return self._on_legacy(obj["msg"])
        if "prompt" in obj:
            return [AgentEvent(kind="other", data={"legacy": "prompt"})]
        if "model" in obj:  # legacy config summary
            self.model = str(obj["model"])
            return [AgentEvent(kind="init", data={"model": self.model, "legacy": True})]
        return []

    def _on_event(self, kind: str, obj: dict[str, Any]) -> list[AgentEvent]:
        if kind == "thread.started":
            if isinstance(obj.get("thread_id"), str):
                self.session_id = obj["thread_id"]
            return [AgentEvent(kind="init", data={"session_id": self.session_id})]
        if kind.startswith("item.") and isinstance(obj.get("item"), dict):
            return self._on_item(kind, obj["item"])
        if kind == "turn.completed":
            self._completed = True
            usage = dict_at(obj, "usage")
            self._usage = usage
            return [AgentEvent(kind="usage", data={k: as_int(usage.get(k)) for k in USAGE_KEYS if k in usage})]
        if kind == "turn.failed":
            error = dict_at(obj, "error")
            self._failed = str(error.get("message") or "turn failed")
            return [_error(self._failed, fatal=True)]
        if kind == "error":
            message = str(obj.get("message") or "")
            retrying = message.startswith("Reconnecting")
            self._last_any_error = message
            if not retrying:
                self._last_error = message
            return [_error(message, retrying=retrying)]
        return [AgentEvent(kind="other", data={"type": clip(kind, 200)})]

    def _on_item(self, kind: str, item: dict[str, Any]) -> list[AgentEvent]:
        itype = item.get("type") or item.get("item_type")
        done = kind == "item.completed"
        if itype in ("agent_message", "assistant_message"):
            if done and isinstance(item.get("text"), str):
                self._last_message = item["text"]
                return [AgentEvent(kind="text", data={"text": clip(item["text"])})]
            return []
        if itype == "command_execution":
            if kind == "item.started":
                return [tool_use(item.get("id"), "command_execution", {"command": clip(item.get("command"), 8192)})]
            if done:
                code = item.get("exit_code")
                failed = item.get("status") == "failed" or (isinstance(code, int) and code != 0)
                output = clip(item.get("aggregated_output") or "", 8192)
                return [tool_result(item.get("id"), output, is_error=failed, exit_code=code)]
            return []
        if itype in ("file_change", "mcp_tool_call", "web_search") and done:
            return [
                tool_use(item.get("id"), itype, {k: clip(v, 8192) for k, v in item.items() if k not in ("id", "type")})
            ]
        if itype == "error":  # non-fatal warning item (e.g. unknown model metadata)
            return [_error(str(item.get("message")), fatal=False)]
        return [AgentEvent(kind="other", data={"item_type": clip(str(itype), 200), "event": kind})]

    def _on_legacy(self, msg: dict[str, Any]) -> list[AgentEvent]:
        mtype = msg.get("type")
        if mtype == "session_configured":
            if isinstance(msg.get("session_id"), str):
                self.session_id = msg["session_id"]
            return [AgentEvent(kind="init", data={"session_id": self.session_id, "legacy": True})]
        if mtype == "agent_message" and isinstance(msg.get("message"), str):
            self._last_message = msg["message"]
            return [AgentEvent(kind="text", data={"text": clip(msg["message"])})]
        if mtype == "exec_command_begin":
            return [
                tool_use(msg.get("call_id"), "exec_command", {"command": msg.get("command"), "cwd": msg.get("cwd")})
            ]
        if mtype == "exec_command_end":
            code = msg.get("exit_code")
            output = clip(f"{msg.get('stdout') or ''}{msg.get('stderr') or ''}", 8192)
            return [
                tool_result(msg.get("call_id"), output, exit_code=code, is_error=isinstance(code, int) and code != 0)
            ]
        if mtype == "task_complete":
            self._completed = True
            if isinstance(msg.get("last_agent_message"), str):
                self._last_message = msg["last_agent_message"]
            return [AgentEvent(kind="result", data={"legacy": True})]
        if mtype == "error":
            self._failed = self._last_error = str(msg.get("message") or "error")
            return [_error(self._failed, fatal=True)]
        if mtype == "token_count":
            info = msg.get("info") if isinstance(msg.get("info"), dict) else None
            usage = info.get("total_token_usage") if info and isinstance(info.get("total_token_usage"), dict) else msg
            self._usage = usage
            return [AgentEvent(kind="usage", data={k: as_int(usage.get(k)) for k in USAGE_KEYS if k in usage})]
        return [AgentEvent(kind="other", data={"legacy_type": clip(str(mtype), 200)})]

    def finish(self, exit_code: int | None) -> AgentOutcome:
        # Events of an unterminated last line; the runner may log them after finish().
        self.final_events = [e for line in self._lines.flush() for e in self._handle_line(line)]
        cumulative = (
            {k: float(as_int(self._usage.get(k))) for k in USAGE_KEYS if k in self._usage} if self._usage else {}
        )
        tokens_in, tokens_out = self._per_run(cumulative)
        base = AgentOutcome(
            final_message=self._last_message or "",
            session_id=self.session_id,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=None,
            exit_code=exit_code,
            cumulative=cumulative,
        )
        if self._completed and self._failed is None and exit_code in (0, None):
            return base
        category: ErrorCategory
        failure = self._failed or self._last_error
        if failure is not None:
            message, status = _decode_error(failure)
            category, retryable = classify_status(status) or classify_api_text(message)
            if session_gone(message):  # `codex exec resume <id>` of a thread it does not have
                category, retryable = "session_corrupted", False
        else:
            stderr = self._stderr.last_lines()
            category, retryable = classify_crash(exit_code, f"{stderr} {self._last_any_error or ''}")
            if self._completed:
                message = f"codex exited with status {exit_code} after completing the turn"
            else:
                how = f"exited with status {exit_code}" if exit_code is not None else "stream ended"
                message = f"codex {how} without completing the turn"
            if detail := stderr or self._last_any_error:
                message += f": {detail}"
        return msgspec.structs.replace(
            base, is_error=True, error_category=category, error_message=message, retryable=retryable
        )

    def _per_run(self, cumulative: dict[str, float]) -> tuple[int, int]:
        tokens_in = int(cumulative.get("input_tokens", 0))
        tokens_out = int(cumulative.get("output_tokens", 0))
        prev_in = int(self.previous.get("input_tokens", 0))
        prev_out = int(self.previous.get("output_tokens", 0))
        if cumulative and tokens_in >= prev_in and tokens_out >= prev_out:
            return tokens_in - prev_in, tokens_out - prev_out
        return tokens_in, tokens_out  # not the same thread's counters: take them as they are


def _error(message: str, **flags: bool) -> AgentEvent:
    return AgentEvent(kind="error", data={"message": clip(message, 8192), **flags})


def _decode_error(text: str) -> tuple[str, int | None]:
    """Unwrap a JSON-encoded API error body: (human message, HTTP status)."""
    body = parse_object(text)
    if body is None:
        return text, None
    inner = dict_at(body, "error")
    message = inner.get("message") or body.get("message") or text
    status = body.get("status") if isinstance(body.get("status"), int) else None
    kind = inner.get("type")
    return (f"{message} ({kind})" if kind else str(message)), status


PLUGIN = CodexPlugin()
