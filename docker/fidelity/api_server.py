"""Scripted model API for the fidelity suite (standard library only; docs/docker.md
"The fidelity suite" says what it answers and how tests use it).

The prompt selects a script with a line ``FIDELITY: <name>``: actions
followed by a final answer. The step is the number of tool results already in
the conversation, so the server needs no memory of the turn: a resumed session
sends its history and continues where it stopped. The few facts that must
outlive one request (how many 429s were served, whether the interruption
already happened) live in ``/home/node/.fidelity``, the session volume, which
survives container restarts; so does ``requests.jsonl``, one line per request
(path, status served, script, step, system text).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PORT = int(os.environ.get("FIDELITY_PORT", "18080"))
STATE = Path(os.environ.get("FIDELITY_STATE", "/home/node/.fidelity"))
LOCK = threading.Lock()

COMMIT_1 = "git add -A && git commit -m 'fidelity: add notes.txt'"
COMMIT_2 = "git add -A && git commit -m 'fidelity: edit notes.txt'"
WRITE = ("write", "notes.txt", "first line\n")
EDIT = ("edit", "notes.txt", "first line", "edited line")

# name -> (actions, final text); the final text may use {facts}.
SCRIPTS: dict[str, list[tuple]] = {
    "success": [WRITE, ("bash", COMMIT_1), EDIT, ("bash", COMMIT_2)],
    "ratelimit": [WRITE, ("bash", COMMIT_1)],
    "ratelimit-always": [],
    "auth": [WRITE],
    "interrupt": [WRITE, ("bash", COMMIT_1), ("stall",), EDIT, ("bash", COMMIT_2)],
    "maxturns": [("bash", f"echo turn {i}") for i in range(6)],
    "prompts": [],
    # the project's own tests, through the Bash tool, in whatever environment the container has
    "tests": [
        ("bash", "sh run-tests.sh > test-output.txt 2>&1; echo exit=$? >> test-output.txt"),
        ("bash", "git add test-output.txt && git commit -m 'fidelity: test output'"),
    ],
    "structured": [],
    "structured-repair": [],
}
# The answer the "structured" scripts give (the tests' schema: score and verdict).
GOOD_ANSWER = {"score": 7, "verdict": "ship it"}
BAD_ANSWER = {"score": "seven"}
REPAIR_PROMPT = "does not match the required JSON schema"  # in the host's repair prompt


def facts(req: dict[str, Any], kind: str) -> str:
    """A line the tests read from the final answer: what the server saw."""
    return json.dumps(
        {
            "tool_results": count_tool_results(req, kind),
            "user_prompts": count_user_messages(req, kind, "FIDELITY:"),
            "served_429": counter("429"),
        },
        sort_keys=True,
    )


# -- state -------------------------------------------------------------------------


def counter(name: str, add: int = 0) -> int:
    path = STATE / f"count-{name}"
    with LOCK:
        value = int(path.read_text()) if path.exists() else 0
        if add:
            value += add
            path.write_text(str(value))
    return value


def log_request(entry: dict[str, Any]) -> None:
    with LOCK, open(STATE / "requests.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")


# -- reading requests ----------------------------------------------------------------


def text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(text_of(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(text_of(value.get(k)) for k in ("text", "content", "input", "output") if k in value)
    return ""


def all_text(req: dict[str, Any], kind: str) -> str:
    return text_of(req.get("messages") if kind == "anthropic" else req.get("input"))


def system_text(req: dict[str, Any], kind: str) -> str:
    if kind == "anthropic":
        return text_of(req.get("system"))
    developer = [
        text_of(i.get("content"))
        for i in req.get("input") or []
        if isinstance(i, dict) and i.get("role") in ("developer", "system")
    ]
    return "\n".join([str(req.get("instructions") or ""), *developer])


def script_name(req: dict[str, Any], kind: str) -> str | None:
    for line in all_text(req, kind).splitlines():
        if line.strip().startswith("FIDELITY:"):
            return line.split(":", 1)[1].strip()
    return None


def count_tool_results(req: dict[str, Any], kind: str) -> int:
    if kind == "anthropic":
        return sum(
            1
            for m in req.get("messages") or []
            if isinstance(m.get("content"), list)
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        )
    return sum(
        1 for i in req.get("input") or [] if isinstance(i, dict) and str(i.get("type", "")).endswith("call_output")
    )


def tool_names(req: dict[str, Any]) -> list[str]:
    return [str(t.get("name") or t.get("type")) for t in req.get("tools") or [] if isinstance(t, dict)]


# -- choosing the answer -------------------------------------------------------------


def plan(req: dict[str, Any], kind: str) -> tuple[int, Any]:
    """(HTTP status, action or final text) for this request."""
    name = script_name(req, kind)
    if name is None:  # a side request (title, quota probe...): answer briefly
        return 200, "ok"
    if name == "auth":
        return 401, None
    if name == "ratelimit-always":
        counter("429", 1)
        return 429, None
    if name == "ratelimit" and counter("429") < 1:
        counter("429", 1)
        return 429, None
    actions = SCRIPTS.get(name)
    if actions is None:
        return 200, f"unknown fidelity script {name!r}"
    step = count_tool_results(req, kind)
    stall = next((i for i, a in enumerate(actions) if a[0] == "stall"), None)
    if stall is not None:
        marker = STATE / "stalled"
        if marker.exists():  # resumed: the stall is behind us
            actions = actions[:stall] + actions[stall + 1 :]
        elif step == stall:
            marker.write_text(str(time.time()))
            time.sleep(600)  # the test interrupts the run while this model call waits
            return 500, None
    if name.startswith("structured"):
        return 200, structured_answer(req, kind, repair=name == "structured-repair")
    if step < len(actions):
        return 200, actions[step]
    return 200, f"FIDELITY-DONE {name} {facts(req, kind)}"


def structured_answer(req: dict[str, Any], kind: str, *, repair: bool) -> Any:
    """The answer to a schema-bound task: Claude Code's StructuredOutput tool, Codex's final JSON text.

    With ``repair`` the answer breaks the schema until the host's repair
    prompt is in the conversation.
    """
    answer = BAD_ANSWER if repair and count_user_messages(req, kind, REPAIR_PROMPT) == 0 else GOOD_ANSWER
    if kind == "openai":
        return json.dumps(answer)
    if "StructuredOutput" not in tool_names(req):
        return "no StructuredOutput tool in the request"
    if tool_results_since_prompt(req):
        return "done"  # the tool was called for the latest prompt: close the turn
    return ("tool", "StructuredOutput", answer)


def count_user_messages(req: dict[str, Any], kind: str, text: str) -> int:
    """User messages that hold ``text`` (the prompt's script line, the host's repair prompt)."""
    items = req.get("messages") if kind == "anthropic" else req.get("input")
    return sum(
        1 for m in items or [] if isinstance(m, dict) and m.get("role") == "user" and text in text_of(m.get("content"))
    )


def tool_results_since_prompt(req: dict[str, Any]) -> int:
    """Tool results after the last user message that is a prompt (not only tool results)."""
    count = 0
    for m in reversed(req.get("messages") or []):
        if m.get("role") != "user":
            continue
        blocks = m.get("content") if isinstance(m.get("content"), list) else [m.get("content")]
        results = sum(1 for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result")
        if results:
            count += results
        else:
            return count
    return count


# -- Anthropic Messages API ----------------------------------------------------------


def anthropic_tool(action: tuple) -> tuple[str, dict[str, Any]]:
    if action[0] == "tool":
        return action[1], action[2]
    if action[0] == "write":
        return "Write", {"file_path": f"/workspace/{action[1]}", "content": action[2]}
    if action[0] == "edit":
        return "Edit", {"file_path": f"/workspace/{action[1]}", "old_string": action[2], "new_string": action[3]}
    return "Bash", {"command": action[1], "description": "fidelity step"}


def anthropic_blocks(answer: Any) -> tuple[list[dict[str, Any]], str]:
    if isinstance(answer, str):
        return [{"type": "text", "text": answer}], "end_turn"
    name, args = anthropic_tool(answer)
    return [
        {"type": "text", "text": f"Next: {answer[0]}."},
        {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": name, "input": args},
    ], "tool_use"


def event(name: str, **fields: Any) -> tuple[str, dict]:
    """A server-sent event: both APIs repeat its name as the payload's ``type``."""
    return name, {"type": name, **fields}


def anthropic_sse(req: dict[str, Any], blocks: list[dict[str, Any]], stop: str) -> list[tuple[str, dict]]:
    usage = {"input_tokens": 100, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    message = {
        "id": f"msg_{uuid.uuid4().hex[:20]}",
        "type": "message",
        "role": "assistant",
        "model": req.get("model", "claude"),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    out = [event("message_start", message=message)]
    for i, block in enumerate(blocks):
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {k: block[k] for k in ("type", "id", "name")} | {"input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        out += [
            event("content_block_start", index=i, content_block=start),
            event("content_block_delta", index=i, delta=delta),
            event("content_block_stop", index=i),
        ]
    out.append(event("message_delta", delta={"stop_reason": stop, "stop_sequence": None}, usage={"output_tokens": 20}))
    out.append(event("message_stop"))
    return out


def anthropic_error(status: int) -> dict[str, Any]:
    kind = {401: "authentication_error", 429: "rate_limit_error"}.get(status, "api_error")
    text = {401: "invalid x-api-key", 429: "Number of requests has exceeded your rate limit"}.get(status, "error")
    return {"type": "error", "error": {"type": kind, "message": text}}


# -- OpenAI Responses API ------------------------------------------------------------


def openai_items(answer: Any, tools: list[str]) -> list[dict[str, Any]]:
    if isinstance(answer, str):
        return [
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex[:16]}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": answer, "annotations": []}],
            }
        ]
    if answer[0] == "write":
        command = f"printf '%s' {sh_quote(answer[2])} > {answer[1]}"
    elif answer[0] == "edit":
        command = f"sed -i 's/{answer[2]}/{answer[3]}/' {answer[1]}"
    else:
        command = answer[1]
    call = f"call_{uuid.uuid4().hex[:16]}"
    args: dict[str, Any]
    if "exec_command" in tools:
        name, args = "exec_command", {"cmd": command, "workdir": "/workspace"}
    else:
        name, args = "shell", {"command": ["bash", "-lc", command], "workdir": "/workspace"}
    return [
        {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex[:16]}",
            "call_id": call,
            "name": name,
            "arguments": json.dumps(args),
            "status": "completed",
        }
    ]


def sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def openai_sse(items: list[dict[str, Any]], model: str) -> list[tuple[str, dict]]:
    rid = f"resp_{uuid.uuid4().hex[:20]}"
    base = {"id": rid, "object": "response", "created_at": int(time.time()), "model": model}
    out = [event("response.created", response={**base, "status": "in_progress", "output": []})]
    for i, item in enumerate(items):
        out.append(event("response.output_item.added", output_index=i, item=item))
        if item["type"] == "message":
            text = item["content"][0]["text"]
            out.append(
                event("response.output_text.delta", output_index=i, item_id=item["id"], content_index=0, delta=text)
            )
        out.append(event("response.output_item.done", output_index=i, item=item))
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 120,
    }
    out.append(event("response.completed", response={**base, "status": "completed", "output": items, "usage": usage}))
    return out


def openai_error(status: int) -> dict[str, Any]:
    kind = {401: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
    text = {401: "Incorrect API key provided", 429: "Rate limit reached for requests"}.get(status, "error")
    return {"error": {"type": kind, "code": kind, "message": text, "param": None}}


# -- HTTP ----------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("fidelity-api: " + (format % args) + "\n")

    def do_GET(self) -> None:
        body: dict[str, Any] = {"data": [], "models": []} if "/models" in self.path else {"ok": True}
        log_request({"method": "GET", "path": self.path, "status": 200})
        self.send_json(200, body)

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            req = json.loads(raw or b"{}")
        except ValueError:
            req = {}
        path = self.path.split("?", 1)[0]
        if path.endswith("/count_tokens"):
            self.send_json(200, {"input_tokens": 100})
            return
        kind = "anthropic" if path.endswith("/messages") else "openai" if path.endswith("/responses") else None
        if kind is None:
            log_request({"method": "POST", "path": path, "status": 404})
            self.send_json(404, {"error": {"type": "not_found_error", "message": f"no route {path}"}})
            return
        status, answer = plan(req, kind)
        log_request(
            {
                "method": "POST",
                "path": path,
                "status": status,
                "script": script_name(req, kind),
                "step": count_tool_results(req, kind),
                "model": req.get("model"),
                "stream": bool(req.get("stream")),
                "system": system_text(req, kind),
                "tools": tool_names(req),
                "answer": answer if isinstance(answer, str) else list(answer or []),
            }
        )
        if status != 200:
            body = anthropic_error(status) if kind == "anthropic" else openai_error(status)
            self.send_json(status, body, retry_after=status == 429)
            return
        if kind == "anthropic":
            blocks, stop = anthropic_blocks(answer)
            if req.get("stream"):
                self.send_sse(anthropic_sse(req, blocks, stop))
            else:
                self.send_json(
                    200,
                    {
                        "id": f"msg_{uuid.uuid4().hex[:20]}",
                        "type": "message",
                        "role": "assistant",
                        "model": req.get("model"),
                        "content": blocks,
                        "stop_reason": stop,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 100, "output_tokens": 20},
                    },
                )
            return
        self.send_sse(openai_sse(openai_items(answer, tool_names(req)), str(req.get("model") or "")))

    def send_json(self, status: int, body: dict[str, Any], *, retry_after: bool = False) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after:
            self.send_header("retry-after", "1")
        self.end_headers()
        self.wfile.write(data)

    def send_sse(self, events: list[tuple[str, dict]]) -> None:
        data = b"".join(f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode() for name, payload in events)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
