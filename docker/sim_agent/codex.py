"""The ``codex`` persona: ``codex exec --json`` (0.16x shapes)."""

from __future__ import annotations

import json
import re
import sys

from .common import (
    OUT,
    Args,
    BaseEmitter,
    read_options,
    sha256_hex,
    shell_quote,
    tokens_for,
    warn,
)

CODEX_VERSION = "0.169.0-sim"
CODEX_DEFAULT_MODEL = "gpt-5-codex"


def read_schema_file(a: Args, path: str) -> None:
    try:
        with open(path, encoding="utf-8") as f:
            schema = json.loads(f.read())
    except (OSError, ValueError) as e:
        a.output_schema_error = f"cannot read the output schema {path}: {e}"
        return
    if isinstance(schema, dict):
        a.output_schema = schema
    else:
        a.output_schema_error = f"the output schema {path} must be a JSON object"


def _config(a: Args, val: str) -> None:
    if val.startswith("model_provider="):
        a.model_provider = val.partition("=")[2].strip().strip('"')
    elif m := re.search(r"stream_max_retries\s*=\s*(\d+)", val):
        a.stream_retries = int(m.group(1))


# The options that take a value: the Args attribute each sets, what it does, or None (ignored).
CODEX_OPTIONS = {
    "-m": "model",
    "--model": "model",
    "-c": _config,
    "--config": _config,
    "-s": None,
    "--sandbox": None,
    "-C": "cd",
    "--cd": "cd",
    "--color": None,
    "-o": "output_last_message",
    "--output-last-message": "output_last_message",
    "-p": None,
    "--profile": None,
    "-i": None,
    "--image": None,
    "--output-schema": read_schema_file,
    "--add-dir": None,
    "-a": None,
    "--ask-for-approval": None,
    "--enable": None,
    "--disable": None,
    "--local-provider": None,
}
CODEX_SWITCHES = {
    "--json": "json",
    "--experimental-json": "json",
    "--skip-git-repo-check": "skip_git_repo_check",
    "--dangerously-bypass-approvals-and-sandbox": "skip_permissions",
    "--yolo": "skip_permissions",
    "--last": "resume_last",
}


def parse_codex(argv: list[str], a: Args) -> None:
    positional = read_options(argv, a, CODEX_OPTIONS, CODEX_SWITCHES)
    # positional: [exec|e] [resume THREAD_ID] [PROMPT]
    if positional and positional[0] in ("exec", "e"):
        a.codex_subcommand = "exec"
        positional = positional[1:]
    if positional and positional[0] == "resume":
        positional = positional[1:]
        if positional and not a.resume_last:
            a.resume = positional[0]
            positional = positional[1:]
    if positional and positional[0] != "-":
        a.prompt = " ".join(positional)


class CodexEmitter(BaseEmitter):
    """Writes ``codex exec --json`` events (0.16x shapes)."""

    priced = False
    garbage_lines = (b'{"type":"item.completed","item":{"id":"x","type":"agent_mess\n', b"\n")

    def __init__(self, a: Args, session_id: str, exec_no: int, model: str, cwd: str, prior: dict) -> None:
        super().__init__(a, session_id, exec_no, model, cwd, prior, stream=a.json)
        self.item_no = 0

    def _item_id(self) -> str:
        iid = f"item_{self.item_no}"
        self.item_no += 1
        return iid

    def start(self) -> None:
        self.emit({"type": "thread.started", "thread_id": self.session_id})
        if self.a.model_provider not in (None, "openai"):
            # codex takes model metadata from its provider's model list; the
            # simulated custom provider lists none (as a scripted or self-hosted
            # endpoint often does), so codex warns before the turn, as item_0.
            self.emit(
                {
                    "type": "item.completed",
                    "item": {
                        "id": self._item_id(),
                        "type": "error",
                        "message": f"Model metadata for `{self.model}` not found. Defaulting to fallback metadata; "
                        "this can degrade performance and cause issues.",
                    },
                }
            )
        self.emit({"type": "turn.started"})

    def _count(self, text: str) -> None:
        self.turns += 1
        self.usage.input_tokens += 9000 + (len(self.a.prompt or "") // 4) + 100 * self.turns
        self.usage.output_tokens += tokens_for(text)

    def text(self, text: str) -> None:
        self._count(text)
        self.texts.append(text)
        self.emit({"type": "item.completed", "item": {"id": self._item_id(), "type": "agent_message", "text": text}})

    def tool(self, name: str, tool_input: dict, run) -> tuple[str, bool]:
        command = tool_input.get("command")
        if command is None:
            path = tool_input.get("file_path", "")
            command = f"printf %s {shell_quote(tool_input.get('content', ''))} > {shell_quote(path)}"
        command = f"/bin/sh -lc {shell_quote(command)}"
        self._count(command)
        iid = self._item_id()
        item = {
            "id": iid,
            "type": "command_execution",
            "command": command,
            "aggregated_output": "",
            "exit_code": None,
            "status": "in_progress",
        }
        self.emit({"type": "item.started", "item": item})
        output, is_error, extra = run()
        code = extra.get("exit_code", 1 if is_error else 0)
        done = dict(
            item,
            aggregated_output=output if output.endswith("\n") or not output else output + "\n",
            exit_code=code,
            status="failed" if code else "completed",
        )
        self.emit({"type": "item.completed", "item": done})
        return output, is_error

    def _write_last(self, text: str) -> None:
        if self.a.output_last_message:
            try:
                with open(self.a.output_last_message, "w", encoding="utf-8") as f:
                    f.write(text)
            except OSError as e:
                warn(f"cannot write {self.a.output_last_message}: {e}")

    def finish(self, result_text: str, *, is_error: bool = False, errors: list[str] | None = None, **_: object) -> None:
        if is_error:
            msg = (errors or [result_text])[0]
            self.emit({"type": "error", "message": msg})
            self.emit({"type": "turn.failed", "error": {"message": msg}})
            if not self.stream:
                sys.stderr.write(f"ERROR: {msg}\n")
            return
        if result_text and (not self.texts or self.texts[-1] != result_text):
            self.text(result_text)
        totals = self.session_totals()
        self.emit(
            {
                "type": "turn.completed",
                "usage": {
                    "input_tokens": totals["input_tokens"],
                    "cached_input_tokens": 0,
                    "cache_write_input_tokens": 0,
                    "output_tokens": totals["output_tokens"],
                    "reasoning_output_tokens": 0,
                },
            }
        )
        self._write_last(result_text)
        if not self.stream:
            OUT.text(result_text + "\n")

    def api_error(self, status: int) -> None:
        if status == 429:
            detail = "exceeded retry limit, last status: 429 Too Many Requests"
        else:
            detail = (
                "unexpected status 401 Unauthorized: Incorrect API key provided. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            )
        retries = self.a.stream_retries  # the provider's stream_max_retries (codex's default: 5)
        for n in range(1, retries + 1):
            rid = sha256_hex(f"{self.session_id}:{self.exec_no}:{n}")[:32]
            self.emit(
                {"type": "error", "message": f"Reconnecting... {n}/{retries} ({detail}, request id: req_sim_{rid})"}
            )
        rid = sha256_hex(f"{self.session_id}:{self.exec_no}:final")[:32]
        final = f"{detail}, request id: req_sim_{rid}"
        self.emit({"type": "error", "message": final})
        self.emit({"type": "turn.failed", "error": {"message": final}})
        if not self.stream:
            sys.stderr.write(f"ERROR: {final}\n")

    def finish_structured(self, result_text: str, value: object) -> None:
        """With --output-schema the final agent message is the JSON answer."""
        self.finish(result_text)


def model_for(requested: str | None) -> str:
    return requested or CODEX_DEFAULT_MODEL


Emitter = CodexEmitter
