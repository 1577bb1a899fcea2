#!/usr/bin/env python3
"""Simulated coding agent for orchestrator dry runs and tests.

One program that impersonates both ``claude`` (Claude Code, ``-p
--output-format stream-json --verbose``) and ``codex`` (``codex exec --json``).
The persona comes from ``--as claude|codex`` or the basename of argv[0]
(``claude`` / ``codex``); anything else defaults to claude.

It accepts the real CLIs' argument shapes and prints output shaped like the
real CLIs (see the captured transcripts under fixtures/agent-transcripts).

Behaviour is scripted by lines of the form ``SIM: <verb> <args>`` anywhere in
the prompt (other text is ignored):

    SIM: write <path> <text...>       write a file (\\n, \\t, \\\\ escapes; newline added)
    SIM: append <path> <text...>      append to a file (same escapes)
    SIM: commit <message...>          git add -A && git commit -m MESSAGE
    SIM: print <text...>              final result message (several prints join with \\n)
    SIM: print-json <json>            same, JSON text (re-serialised compactly if valid)
    SIM: sleep <seconds>              sleep
    SIM: fail <exit_code> <message>   error result (error_during_execution), exit code
    SIM: ratelimit <n>                429 for the first n executions of this task
    SIM: authfail                     401 authentication error
    SIM: hang                         sleep forever (after the init line)
    SIM: garbage                      non-JSON lines and invalid UTF-8 among valid lines
    SIM: spam <megabytes>             that much text in assistant messages
    SIM: write-outside <path>         try to write an absolute path; report, never crash
    SIM: exec <shell command>         run it with /bin/sh -c, output in a tool result
    SIM[tag]: <verb> <args>           only when the prompt has a line "Role: tag", "Node: tag" or "Round: tag"

Without any SIM line the agent is deterministic from sha256(prompt): in a
writable git work tree it writes (or appends a revision line to)
``sim/<8hex>.txt`` and commits it; the final message is a score JSON, an ideas
JSON, a review verdict ``{"verdict": "APPROVE", "issues": []}`` (prompt mentions
verdict and JSON) or a one-line summary depending on the prompt.

Every execution appends a JSON line {ts, task_key, argv0, session_id, resumed,
prompt_sha256, persona, model, cwd} to ``~/.sim-agent/executions.jsonl`` and,
if set, to the file named by ``$SIM_AGENT_RECORD``. Session totals live in
``~/.sim-agent/sessions/<id>.json``; ratelimit counters in
``~/.sim-agent/ratelimit/``. Stdlib only; Python 3.11.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time

# Every agent task of a run starts this program in its container, so its
# start-up is part of each task's cost: only cheap stdlib modules are imported
# (no uuid, datetime or pathlib), and a commit costs two git processes.

CLAUDE_VERSION = "2.1.330-sim"
CODEX_VERSION = "0.169.0-sim"

CLAUDE_MODELS = {
    "sonnet": "claude-sonnet-4-5",
    "opus": "claude-opus-4-1",
    "haiku": "claude-haiku-4-5",
}
CLAUDE_DEFAULT_MODEL = "claude-sonnet-4-5"
CODEX_DEFAULT_MODEL = "gpt-5-codex"

# USD per token (input, output): a sonnet-like price list for every model.
PRICE_IN = 3e-6
PRICE_OUT = 15e-6

CLAUDE_TOOLS = [
    "Task", "Bash", "Glob", "Grep", "ExitPlanMode", "Read", "Edit", "MultiEdit", "Write",
    "NotebookEdit", "WebFetch", "TodoWrite", "WebSearch", "BashOutput", "KillShell",
]

SIM_LINE = re.compile(r"^[\s>*#-]*SIM(?:\[([\w.-]+)\])?:\s*(\S+)(?:[ \t]+(.*?))?\s*$")
# A scoped line ``SIM[tag]: ...`` applies only when the prompt also has a line
# ``Role: tag``, ``Node: tag`` or ``Round: tag``, so one prompt can steer a
# planner, a coder and each review round (or one tree node's ideator) differently.
TAG_LINE = re.compile(r"^\s*(?:Role|Node|Round):\s*([\w.-]+)\s*$", re.I | re.M)


# --------------------------------------------------------------------------- utils


def now_iso() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(t)) + f"{int(t * 1000) % 1000:03d}Z"


def uuid_str(value: int, version: int | None = None) -> str:
    """``str(uuid.UUID(int=value, version=version))`` without importing uuid."""
    if version is not None:
        value &= ~(0xC000 << 48)
        value |= 0x8000 << 48
        value &= ~(0xF000 << 64)
        value |= version << 76
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid4_from(data: bytes) -> str:
    """``str(uuid.UUID(bytes=data[:16], version=4))``."""
    return uuid_str(int.from_bytes(data[:16], "big"), 4)


def sha256_hex(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    return hashlib.sha256(data).hexdigest()


def unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            n = text[i + 1]
            if n == "n":
                out.append("\n")
                i += 2
                continue
            if n == "t":
                out.append("\t")
                i += 2
                continue
            if n == "\\":
                out.append("\\")
                i += 2
                continue
        out.append(c)
        i += 1
    return "".join(out)


def tokens_for(text: str) -> int:
    return max(1, len(text) // 4)


def sim_home() -> str:
    return os.path.join(os.path.expanduser("~"), ".sim-agent")


def warn(msg: str) -> None:
    try:
        sys.stderr.write(f"sim-agent: {msg}\n")
        sys.stderr.flush()
    except Exception:
        pass


class Out:
    """Line writer that flushes every line and exits quietly on a closed pipe."""

    def write_bytes(self, data: bytes) -> None:
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            try:
                sys.stdout = None  # type: ignore[assignment]
            finally:
                os._exit(141)

    def line(self, obj: dict) -> None:
        self.write_bytes(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape") + b"\n")

    def text(self, s: str) -> None:
        self.write_bytes(s.encode("utf-8", "surrogateescape"))


OUT = Out()


def parse_instructions(prompt: str) -> list[tuple[str, str]]:
    tags = {t.lower() for t in TAG_LINE.findall(prompt)}
    steps = []
    for raw in prompt.splitlines():
        m = SIM_LINE.match(raw)
        if m and (m.group(1) is None or m.group(1).lower() in tags):
            steps.append((m.group(2).lower(), (m.group(3) or "").strip()))
    return steps


def load_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def save_json(path: str, data: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as e:
        warn(f"cannot save {path}: {e}")


def record_execution(entry: dict) -> None:
    line = json.dumps(entry, sort_keys=False) + "\n"
    targets = [os.path.join(sim_home(), "executions.jsonl")]
    extra = os.environ.get("SIM_AGENT_RECORD")
    if extra:
        targets.append(extra)
    for t in targets:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(t)), exist_ok=True)
            with open(t, "a", encoding="utf-8") as f:
                f.write(line)
        except OSError as e:
            warn(f"cannot record execution in {t}: {e}")


def ratelimit_should_fail(key: str, n: int) -> tuple[bool, int]:
    """Count an attempt for ``key``; fail while fewer than ``n`` attempts failed."""
    path = os.path.join(sim_home(), "ratelimit", sha256_hex(key)[:32] + ".json")
    data = load_json(path) or {"key": key, "failed": 0}
    failed = int(data.get("failed", 0))
    if failed < n:
        data["failed"] = failed + 1
        save_json(path, data)
        return True, failed + 1
    return False, failed


def git(cwd: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)


def is_git_worktree(cwd: str) -> bool:
    try:
        r = git(cwd, "rev-parse", "--is-inside-work-tree")
    except OSError:
        return False
    return r.returncode == 0 and r.stdout.strip() == "true"


def git_env(cwd: str) -> dict:
    """Environment for git commit: adds a fallback identity when none is configured."""
    env = dict(os.environ)
    have_name = env.get("GIT_AUTHOR_NAME") or git(cwd, "config", "user.name").stdout.strip()
    have_email = env.get("GIT_AUTHOR_EMAIL") or git(cwd, "config", "user.email").stdout.strip()
    if not have_name:
        env.setdefault("GIT_AUTHOR_NAME", "sim-agent")
    if not have_email:
        env.setdefault("GIT_AUTHOR_EMAIL", "sim-agent@localhost")
    env.setdefault("GIT_COMMITTER_NAME", env.get("GIT_AUTHOR_NAME") or have_name or "sim-agent")
    env.setdefault("GIT_COMMITTER_EMAIL", env.get("GIT_AUTHOR_EMAIL") or have_email or "sim-agent@localhost")
    return env


COMMIT_LINE = re.compile(r"^\[(.+?) (?:\(root-commit\) )?([0-9a-f]{4,})\]", re.M)


def commit_summary(cwd: str, commit_stdout: str) -> dict:
    """Short sha and branch of the commit just made, from git commit's ``[main 1a2b3c4] msg`` line."""
    m = COMMIT_LINE.search(commit_stdout)
    if m:
        branch = m.group(1)
        return {"commit_sha": m.group(2), "branch": "HEAD" if branch == "detached HEAD" else branch}
    r = git(cwd, "rev-parse", "--short", "HEAD")
    b = git(cwd, "rev-parse", "--abbrev-ref", "HEAD")
    return {"commit_sha": r.stdout.strip(), "branch": b.stdout.strip()}


def shell_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


# --------------------------------------------------------------------------- argv


class Args:
    persona: str = "claude"
    argv0: str = ""
    prompt: str | None = None
    model: str | None = None
    resume: str | None = None
    max_turns: int | None = None
    output_format: str = "text"
    verbose: bool = False
    permission_mode: str = "default"
    skip_permissions: bool = False
    json: bool = False
    skip_git_repo_check: bool = False
    output_last_message: str | None = None
    cd: str | None = None
    resume_last: bool = False
    codex_subcommand: str | None = None


CLAUDE_VALUE_FLAGS = {
    "--output-format", "--input-format", "--model", "--resume", "-r", "--max-turns", "--system-prompt",
    "--append-system-prompt", "--permission-mode", "--allowedTools", "--allowed-tools", "--disallowedTools",
    "--disallowed-tools", "--session-id", "--settings", "--mcp-config", "--add-dir", "--fallback-model",
    "--max-budget-usd", "--agents", "--setting-sources", "--permission-prompt-tool", "--system-prompt-file",
    "--append-system-prompt-file", "--debug-file", "--tools", "--plugin-dir", "--betas", "--json-schema",
    "--effort",
}

CODEX_VALUE_FLAGS = {
    "-m", "--model", "-c", "--config", "-s", "--sandbox", "-C", "--cd", "--color", "-o",
    "--output-last-message", "-p", "--profile", "-i", "--image", "--output-schema", "--add-dir",
    "-a", "--ask-for-approval", "--enable", "--disable", "--local-provider",
}


def parse_claude(argv: list[str], a: Args) -> None:
    positional: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            positional.extend(argv[i + 1:])
            break
        name, eq, val = tok.partition("=")
        if tok.startswith("-") and tok != "-":
            if name in CLAUDE_VALUE_FLAGS:
                if not eq:
                    i += 1
                    val = argv[i] if i < len(argv) else ""
                if name == "--output-format":
                    a.output_format = val
                elif name == "--model":
                    a.model = val
                elif name in ("--resume", "-r"):
                    a.resume = val
                elif name == "--max-turns":
                    try:
                        a.max_turns = int(val)
                    except ValueError:
                        pass
                elif name == "--permission-mode":
                    a.permission_mode = val
            elif name == "--verbose":
                a.verbose = True
            elif name in ("--dangerously-skip-permissions", "--allow-dangerously-skip-permissions"):
                a.skip_permissions = True
            # -p/--print and other boolean flags need nothing.
        else:
            positional.append(tok)
        i += 1
    if positional and positional[0] != "-":
        a.prompt = " ".join(positional)


def parse_codex(argv: list[str], a: Args) -> None:
    positional: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            positional.extend(argv[i + 1:])
            break
        name, eq, val = tok.partition("=")
        if tok.startswith("-") and tok != "-":
            if name in CODEX_VALUE_FLAGS:
                if not eq:
                    i += 1
                    val = argv[i] if i < len(argv) else ""
                if name in ("-m", "--model"):
                    a.model = val
                elif name in ("-C", "--cd"):
                    a.cd = val
                elif name in ("-o", "--output-last-message"):
                    a.output_last_message = val
            elif name in ("--json", "--experimental-json"):
                a.json = True
            elif name == "--skip-git-repo-check":
                a.skip_git_repo_check = True
            elif name in ("--dangerously-bypass-approvals-and-sandbox", "--yolo"):
                a.skip_permissions = True
            elif name == "--last":
                a.resume_last = True
        else:
            positional.append(tok)
        i += 1
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


def parse_args(argv: list[str]) -> Args:
    a = Args()
    a.argv0 = argv[0] if argv else "orchestrator-sim-agent"
    rest = list(argv[1:])
    persona = None
    for idx, tok in enumerate(rest):
        if tok == "--as" and idx + 1 < len(rest):
            persona = rest[idx + 1]
            del rest[idx:idx + 2]
            break
        if tok.startswith("--as="):
            persona = tok.split("=", 1)[1]
            del rest[idx]
            break
    if persona is None:
        base = os.path.basename(a.argv0)
        persona = base if base in ("claude", "codex") else "claude"
    if persona not in ("claude", "codex"):
        print(f"sim-agent: unknown persona {persona!r} (use claude or codex)", file=sys.stderr)
        sys.exit(2)
    a.persona = persona
    if persona == "claude":
        parse_claude(rest, a)
    else:
        parse_codex(rest, a)
    if a.prompt is None:
        try:
            a.prompt = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
        except (OSError, ValueError):
            a.prompt = ""
    return a


# --------------------------------------------------------------------------- emitters


class Usage:
    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0

    @property
    def cost(self) -> float:
        return round(self.input_tokens * PRICE_IN + self.output_tokens * PRICE_OUT, 6)


class ClaudeEmitter:
    """Writes Claude Code stream-json (2.1.x shapes)."""

    def __init__(self, a: Args, session_id: str, exec_no: int, model: str, cwd: str, prior: dict) -> None:
        self.a = a
        self.session_id = session_id
        self.exec_no = exec_no
        self.model = model
        self.cwd = cwd
        self.prior = prior  # session totals before this execution
        self.usage = Usage()
        self.turns = 0
        self.n_lines = 0
        self.n_msgs = 0
        self.t0 = time.monotonic()
        self.stream = a.output_format == "stream-json"
        self.texts: list[str] = []

    # deterministic ids from the session id and counters
    def _uuid(self) -> str:
        self.n_lines += 1
        h = hashlib.sha256(f"{self.session_id}:{self.exec_no}:{self.n_lines}".encode()).digest()
        return uuid4_from(h)

    def _id(self, prefix: str) -> str:
        h = sha256_hex(f"{self.session_id}:{self.exec_no}:{prefix}:{self.n_msgs}")
        return f"{prefix}_sim_{self.n_msgs:03d}_{h[:12]}"

    def emit(self, obj: dict) -> None:
        if self.stream:
            OUT.line(obj)

    def start(self) -> None:
        perm = "bypassPermissions" if self.a.skip_permissions else self.a.permission_mode
        self.emit({
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
            "memory_paths": {"auto": os.path.expanduser("~/.claude/projects/") + self.cwd.replace("/", "-") + "/memory/"},
            "original_cwd": self.cwd,
            "additional_directories": [],
            "fast_mode_state": "off",
        })

    def _turn_usage(self, out_text: str) -> dict:
        self.turns += 1
        inp = 12000 + (len(self.a.prompt or "") // 4) + 100 * self.turns
        out = tokens_for(out_text)
        self.usage.input_tokens += inp
        self.usage.output_tokens += out
        return {"input_tokens": inp, "output_tokens": out, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}

    def _assistant(self, content: list[dict], usage: dict) -> None:
        self.emit({
            "type": "assistant",
            "message": {
                "id": self._id("msg"),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": content,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
                "context_management": None,
            },
            "parent_tool_use_id": None,
            "session_id": self.session_id,
            "uuid": self._uuid(),
            "timestamp": now_iso(),
        })

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
            self.emit({
                "type": "system", "subtype": "vcs_state_changed", "kind": "commit",
                "branch": extra.get("branch", ""), "cwd": self.cwd, "uuid": self._uuid(),
                "session_id": self.session_id,
            })
        result_block = {"tool_use_id": tool_id, "type": "tool_result", "content": output}
        if name == "Bash" or is_error:
            result_block["is_error"] = is_error
        line = {
            "type": "user",
            "message": {"role": "user", "content": [result_block]},
            "parent_tool_use_id": None,
            "session_id": self.session_id,
            "uuid": self._uuid(),
            "timestamp": now_iso(),
        }
        if name == "Bash":
            line["tool_use_result"] = {
                "stdout": output, "stderr": "", "interrupted": False, "isImage": False,
                "noOutputExpected": False,
            }
        elif name == "Write" and not is_error:
            line["tool_use_result"] = {
                "type": extra.get("write_kind", "create"), "filePath": tool_input.get("file_path"),
                "content": tool_input.get("content"), "structuredPatch": [], "originalFile": None,
                "userModified": False,
            }
        self.emit(line)
        return output, is_error

    def garbage(self) -> None:
        if not self.stream:
            return
        OUT.write_bytes(b"this line is not JSON at all\n")
        OUT.write_bytes(b"\xff\xfe invalid utf-8 \xc3\x28 bytes \xed\xa0\x80\n")
        OUT.write_bytes(b'{"type":"assistant","message":{"content":[{"type":"text","text":"trunc\n')
        OUT.write_bytes(b'{"type":"system","subtype":"sim_garbage","note":"bad \xff\xfe byte"}\n')
        OUT.write_bytes(b"\n")
        OUT.write_bytes(b"[sim] plain log line between events\n")

    def _model_usage(self, inp: int, out: int, cost: float) -> dict:
        return {
            self.model: {
                "inputTokens": inp, "outputTokens": out, "cacheReadInputTokens": 0,
                "cacheCreationInputTokens": 0, "webSearchRequests": 0, "costUSD": cost,
                "contextWindow": 200000, "maxOutputTokens": 64000, "thinkingTokens": 0,
            }
        }

    def session_totals(self) -> dict:
        return {
            "input_tokens": int(self.prior.get("input_tokens", 0)) + self.usage.input_tokens,
            "output_tokens": int(self.prior.get("output_tokens", 0)) + self.usage.output_tokens,
            "cost_usd": round(float(self.prior.get("cost_usd", 0.0)) + self.usage.cost, 6),
        }

    def _usage_block(self, inp: int, out: int) -> dict:
        return {
            "input_tokens": inp, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": out, "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
            "service_tier": "standard", "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
        }

    def finish(self, result_text: str, *, is_error: bool = False, subtype: str = "success",
               terminal_reason: str = "completed", errors: list[str] | None = None,
               api_error_status: int | None = None, api_error_type: str | None = None,
               stop_reason: str = "end_turn", count_usage: bool = True) -> None:
        if subtype == "success" and not is_error and result_text and (not self.texts or self.texts[-1] != result_text):
            self.text(result_text)
        totals = self.session_totals()
        duration = int((time.monotonic() - self.t0) * 1000)
        if count_usage and (self.usage.input_tokens or self.usage.output_tokens):
            model_usage = self._model_usage(totals["input_tokens"], totals["output_tokens"], totals["cost_usd"])
            since = self._model_usage(self.usage.input_tokens, self.usage.output_tokens, self.usage.cost)
        else:
            model_usage = (
                self._model_usage(totals["input_tokens"], totals["output_tokens"], totals["cost_usd"])
                if totals["input_tokens"] else {}
            )
            since = {}
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
            "api_error_status": api_error_status,
            "uuid": self._uuid(),
            "model_usage_since_last_result": since,
        }
        if api_error_type:
            result["api_error_type"] = api_error_type
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

    def api_error(self, status: int) -> None:
        if status == 429:
            err, etype = "rate_limit", "rate_limit_error"
            text = ('API Error: 429 {"type":"error","error":{"type":"rate_limit_error","message":"This request would '
                    'exceed the rate limit for your organization of 50 requests per minute (simulated)."}}')
        else:
            err, etype = "authentication_failed", "authentication_error"
            text = "Invalid API key · Fix external API key"
        for attempt in (1, 2):
            self.emit({
                "type": "system", "subtype": "api_retry", "attempt": attempt, "max_retries": 2,
                "retry_delay_ms": 500 * attempt, "error_status": status, "error": err,
                "session_id": self.session_id, "uuid": self._uuid(),
            })
        if status == 429:
            self.emit({
                "type": "rate_limit_event",
                "rate_limit_info": {"status": "rejected", "rateLimitType": "five_hour",
                                    "resetsAt": int(time.time()) + 3600},
                "uuid": self._uuid(), "session_id": self.session_id,
            })
        zero = {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        self.turns = 1
        self.emit({
            "type": "assistant",
            "message": {
                "id": uuid4_from(hashlib.sha256(f"{self.session_id}:{self.exec_no}:err".encode()).digest()),
                "container": None, "model": "<synthetic>", "role": "assistant", "stop_reason": "stop_sequence",
                "stop_sequence": "", "type": "message", "usage": zero,
                "content": [{"type": "text", "text": text}], "context_management": None,
            },
            "parent_tool_use_id": None, "session_id": self.session_id, "uuid": self._uuid(),
            "timestamp": now_iso(), "error": err, "is_api_error_message": True,
            "api_error_status": status, "api_error_type": etype,
        })
        self.finish(text, is_error=True, subtype="success", terminal_reason="api_error",
                    api_error_status=status, api_error_type=etype, stop_reason="stop_sequence", count_usage=False)


class CodexEmitter:
    """Writes ``codex exec --json`` events (0.16x shapes)."""

    def __init__(self, a: Args, session_id: str, exec_no: int, model: str, cwd: str, prior: dict) -> None:
        self.a = a
        self.session_id = session_id
        self.exec_no = exec_no
        self.model = model
        self.cwd = cwd
        self.prior = prior
        self.usage = Usage()
        self.turns = 0
        self.item_no = 0
        self.stream = a.json
        self.texts: list[str] = []

    def emit(self, obj: dict) -> None:
        if self.stream:
            OUT.line(obj)

    def _item_id(self) -> str:
        iid = f"item_{self.item_no}"
        self.item_no += 1
        return iid

    def start(self) -> None:
        self.emit({"type": "thread.started", "thread_id": self.session_id})
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
        item = {"id": iid, "type": "command_execution", "command": command, "aggregated_output": "",
                "exit_code": None, "status": "in_progress"}
        self.emit({"type": "item.started", "item": item})
        output, is_error, extra = run()
        code = extra.get("exit_code", 1 if is_error else 0)
        done = dict(item, aggregated_output=output if output.endswith("\n") or not output else output + "\n",
                    exit_code=code, status="failed" if code else "completed")
        self.emit({"type": "item.completed", "item": done})
        return output, is_error

    def garbage(self) -> None:
        if not self.stream:
            return
        OUT.write_bytes(b"this line is not JSON at all\n")
        OUT.write_bytes(b"\xff\xfe invalid utf-8 \xc3\x28 bytes \xed\xa0\x80\n")
        OUT.write_bytes(b'{"type":"item.completed","item":{"id":"x","type":"agent_mess\n')
        OUT.write_bytes(b"\n")

    def session_totals(self) -> dict:
        return {
            "input_tokens": int(self.prior.get("input_tokens", 0)) + self.usage.input_tokens,
            "output_tokens": int(self.prior.get("output_tokens", 0)) + self.usage.output_tokens,
            "cost_usd": 0.0,
        }

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
        self.emit({"type": "turn.completed", "usage": {
            "input_tokens": totals["input_tokens"], "cached_input_tokens": 0, "cache_write_input_tokens": 0,
            "output_tokens": totals["output_tokens"], "reasoning_output_tokens": 0,
        }})
        self._write_last(result_text)
        if not self.stream:
            OUT.text(result_text + "\n")

    def api_error(self, status: int) -> None:
        if status == 429:
            detail = "exceeded retry limit, last status: 429 Too Many Requests"
            base = detail
        else:
            base = ("unexpected status 401 Unauthorized: Incorrect API key provided. You can find your API key at "
                    "https://platform.openai.com/account/api-keys.")
            detail = base
        for n in range(1, 6):
            rid = sha256_hex(f"{self.session_id}:{self.exec_no}:{n}")[:32]
            self.emit({"type": "error", "message": f"Reconnecting... {n}/5 ({detail}, request id: req_sim_{rid})"})
        rid = sha256_hex(f"{self.session_id}:{self.exec_no}:final")[:32]
        final = f"{base}, request id: req_sim_{rid}"
        self.emit({"type": "error", "message": final})
        self.emit({"type": "turn.failed", "error": {"message": final}})
        if not self.stream:
            sys.stderr.write(f"ERROR: {final}\n")


# --------------------------------------------------------------------------- actions


class Agent:
    def __init__(self, a: Args, em, cwd: str, prompt_hash: str) -> None:
        self.a = a
        self.em = em
        self.cwd = cwd
        self.h = prompt_hash
        self.prints: list[str] = []
        self.reports: list[str] = []
        self.tool_turns = 0

    def _abs(self, path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(self.cwd, path)

    def check_turns(self) -> bool:
        """True when --max-turns is exhausted (the caller then stops)."""
        self.tool_turns += 1
        return self.a.max_turns is not None and self.tool_turns >= self.a.max_turns

    def write(self, path: str, content: str, append: bool = False) -> tuple[str, bool]:
        full = self._abs(path)

        def run():
            existed = os.path.exists(full)
            try:
                os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
                with open(full, "a" if append else "w", encoding="utf-8") as f:
                    f.write(content)
            except OSError as e:
                return f"Error writing {full}: {e.strerror or e}", True, {}
            verb = "appended to" if append else ("updated" if existed else "created")
            msg = (f"File {verb} successfully at: {full}" if not append or not existed
                   else f"The file {full} has been updated successfully.")
            return msg, False, {"write_kind": "update" if existed else "create"}

        if append:
            return self.em.tool("Bash", {"command": f"printf %s {shell_quote(content)} >> {shell_quote(full)}",
                                         "description": f"append to {path}"}, run)
        return self.em.tool("Write", {"file_path": full, "content": content}, run)

    def bash(self, command: str, description: str, env: dict | None = None) -> tuple[str, bool]:
        def run():
            try:
                p = subprocess.run(["/bin/sh", "-c", command], cwd=self.cwd, capture_output=True, env=env)
            except OSError as e:
                return f"failed to run command: {e}", True, {"exit_code": 127}
            out = (p.stdout + p.stderr).decode("utf-8", "replace").rstrip("\n")
            extra: dict = {"exit_code": p.returncode}
            if p.returncode != 0:
                out = f"Exit code {p.returncode}\n{out}" if self.a.persona == "claude" else out
            return out, p.returncode != 0, extra
        return self.em.tool("Bash", {"command": command, "description": description}, run)

    def commit(self, message: str) -> tuple[str, bool]:
        def run():
            # `git add -A && git commit -m MESSAGE`, without the shell; outside a
            # work tree `git add` fails just the same.
            env = git_env(self.cwd)
            stdout, stderr, code = b"", b"", 0
            for argv in (["git", "add", "-A"], ["git", "commit", "-m", message]):
                try:
                    p = subprocess.run(argv, cwd=self.cwd, capture_output=True, env=env)
                except OSError as e:
                    return f"failed to run git: {e}", True, {"exit_code": 127}
                stdout, stderr, code = stdout + p.stdout, stderr + p.stderr, p.returncode
                if code != 0:
                    break
            out = (stdout + stderr).decode("utf-8", "replace").rstrip("\n")
            extra: dict = {"exit_code": code}
            if code == 0:
                extra.update(commit_summary(self.cwd, stdout.decode("utf-8", "replace")))
            elif self.a.persona == "claude":
                out = f"Exit code {p.returncode}\n{out}"
            return out, code != 0, extra

        return self.em.tool("Bash", {"command": f"git add -A && git commit -m {shell_quote(message)}",
                                     "description": "commit changes"}, run)

    def write_outside(self, path: str) -> None:
        content = f"sim-agent write-outside probe {self.h[:8]}\n"

        def run():
            if not os.path.isabs(path):
                return f"write-outside: {path} is not an absolute path", True, {}
            try:
                os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(content)
            except OSError as e:
                return f"write-outside {path}: failed: {type(e).__name__}: {e.strerror or e}", True, {}
            return f"write-outside {path}: succeeded", False, {}

        out, _ = self.em.tool("Write", {"file_path": path, "content": content}, run)
        self.reports.append(out)
        self.em.text(out)

    def spam(self, megabytes: float) -> None:
        total = int(megabytes * 1024 * 1024)
        chunk = 64 * 1024
        sent = 0
        n = 0
        while sent < total:
            size = min(chunk, total - sent)
            seed = f"spam {n} {self.h[:16]} "
            body = (seed * (size // len(seed) + 1))[:size]
            self.em.text(body)
            sent += size
            n += 1
        self.reports.append(f"spammed {sent} bytes in {n} messages")

    def _after_one_execution(self, rel: str, first: str) -> str | None:
        """The file as one default execution leaves it, from the task's base commit (None: unknown)."""
        try:
            with open(os.path.join(self.cwd, ".git", "BASE_COMMIT"), encoding="utf-8") as f:
                base = f.read().strip()
        except OSError:
            return None  # not a task workspace: nothing to tell this task's work from earlier work
        shown = git(self.cwd, "show", f"{base}:{rel}")
        if shown.returncode != 0:
            return f"sim-agent output for prompt {self.h}\ntask: {first}\n"
        n = len(shown.stdout.splitlines())
        return shown.stdout + f"revision {n + 1}: {self.h[:16]}\n"

    # -------------------------------------------------------------- default
    def default_behaviour(self) -> str:
        prompt = self.a.prompt or ""
        writable = os.access(self.cwd, os.W_OK) and is_git_worktree(self.cwd)
        did = ""
        if writable:
            rel = f"sim/{self.h[:8]}.txt"
            full = self._abs(rel)
            first = next((ln.strip() for ln in prompt.splitlines() if ln.strip()), "(empty prompt)")[:72]
            try:
                with open(full, encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                text = None
            lines = None if text is None else text.splitlines()
            # An agent that finds its own finished work in the workspace (it was
            # interrupted, and the task continues where it stopped) does not do it
            # again, as a real agent would not. Its work is what one execution adds
            # to the file as it was at the task's base commit.
            done = text is not None and text == self._after_one_execution(rel, first)
            if done:
                out, err = "", False
                if git(self.cwd, "status", "--porcelain", "--", rel).stdout.strip():
                    out, err = self.commit(f"sim: {first}")
            elif lines is not None:
                n = len(lines)
                out, err = self.write(rel, f"revision {n + 1}: {self.h[:16]}\n", append=True)
            else:
                self.em.text(f"I'll record the task in {rel}.")
                out, err = self.write(rel, f"sim-agent output for prompt {self.h}\ntask: {first}\n")
            if done:
                did = f" Wrote {rel} and committed it." if not err else f" Wrote {rel} (commit failed)."
            elif not err:
                out, err = self.commit(f"sim: {first}")
                did = f" Wrote {rel} and committed it." if not err else f" Wrote {rel} (commit failed)."
            else:
                did = f" Could not write {rel}."
        lower = prompt.lower()
        n_hash = int(self.h[8:16], 16)
        if "json" in lower and "verdict" in lower:
            return json.dumps({"verdict": "APPROVE", "issues": []})
        if "json" in lower and "score" in lower:
            score = n_hash % 11
            return json.dumps({
                "score": score,
                "rationale": f"Simulated review {self.h[:8]}: the change is {'solid' if score >= 7 else 'acceptable' if score >= 4 else 'weak'} "
                             f"(deterministic score {score}/10 derived from the prompt hash).",
            })
        if "json" in lower and "idea" in lower:
            m = re.search(r"(\d+)\s+(?:\w+\s+){0,3}ideas", lower)
            count = max(1, min(10, int(m.group(1)))) if m else 3
            themes = ["caching", "error handling", "test coverage", "logging", "performance", "documentation",
                      "refactoring", "input validation", "configuration", "observability"]
            ideas = []
            for i in range(count):
                t = themes[(n_hash + i) % len(themes)]
                ideas.append({
                    "title": f"Improve {t}",
                    "description": f"Simulated idea {i + 1} ({self.h[i:i + 6]}): improve {t} in the affected module.",
                })
            return json.dumps({"ideas": ideas})
        return f"Done: simulated work for task {self.h[:8]}.{did}".strip()


# --------------------------------------------------------------------------- main


def new_session_id(persona: str) -> str:
    if persona == "codex":
        # Codex thread ids are UUIDv7: 48-bit millisecond timestamp then random bits.
        ms = int(time.time() * 1000)
        rnd = int.from_bytes(os.urandom(10), "big")
        val = (ms << 80) | (0x7 << 76) | ((rnd >> 68) & 0xFFF) << 64 | (0b10 << 62) | (rnd & ((1 << 62) - 1))
        return uuid_str(val)
    return uuid4_from(os.urandom(16))


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    prompt = a.prompt or ""
    if a.cd:
        try:
            os.chdir(a.cd)
        except OSError as e:
            print(f"Error: cannot change to {a.cd}: {e}", file=sys.stderr)
            return 1
    cwd = os.getcwd()
    prompt_hash = sha256_hex(prompt)

    # Refusals the real CLIs make before doing anything.
    if a.persona == "claude":
        if a.skip_permissions and os.geteuid() == 0 and not os.environ.get("IS_SANDBOX"):
            print("--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons",
                  file=sys.stderr)
            return 1
        if a.output_format == "stream-json" and not a.verbose:
            print("Error: When using --print, --output-format=stream-json requires --verbose", file=sys.stderr)
            return 1
    else:
        if a.codex_subcommand != "exec":
            print("sim-agent (codex): only `codex exec` is simulated", file=sys.stderr)
            return 2
        if not a.skip_git_repo_check and not is_git_worktree(cwd):
            print("Not inside a trusted directory and --skip-git-repo-check was not specified.", file=sys.stderr)
            return 1

    if a.persona == "claude":
        model = CLAUDE_MODELS.get(a.model or "", a.model or CLAUDE_DEFAULT_MODEL)
    else:
        model = a.model or CODEX_DEFAULT_MODEL

    sessions = os.path.join(sim_home(), "sessions")
    resumed = bool(a.resume) or a.resume_last
    prior: dict = {}
    if a.resume_last:
        names = [n for n in os.listdir(sessions) if n.endswith(".json") and not n.startswith(".")] \
            if os.path.isdir(sessions) else []
        cands = sorted((os.path.join(sessions, n) for n in names), key=os.path.getmtime)
        cands = [p for p in cands if (load_json(p) or {}).get("persona") == a.persona]
        a.resume = os.path.basename(cands[-1])[:-len(".json")] if cands else None
    if resumed:
        data = load_json(os.path.join(sessions, f"{a.resume}.json")) if a.resume else None
        if data is None or data.get("persona") != a.persona:
            sid = a.resume or "(last)"
            record_execution({
                "ts": now_iso(), "task_key": os.environ.get("TASK_KEY"), "argv0": os.path.basename(a.argv0),
                "session_id": sid, "resumed": True, "prompt_sha256": prompt_hash, "persona": a.persona,
                "model": model, "cwd": cwd, "error": "session not found",
            })
            if a.persona == "claude":
                print(f"No conversation found with session ID: {sid}", file=sys.stderr)
            else:
                msg = f"thread/session not found: {sid}"
                if a.json:
                    OUT.line({"type": "error", "message": msg})
                print(f"Error: {msg}", file=sys.stderr)
            return 1
        session_id = a.resume
        prior = data.get("totals", {})
        exec_no = int(data.get("executions", 0)) + 1
    else:
        session_id = new_session_id(a.persona)
        exec_no = 1

    record_execution({
        "ts": now_iso(), "task_key": os.environ.get("TASK_KEY"), "argv0": os.path.basename(a.argv0),
        "session_id": session_id, "resumed": resumed, "prompt_sha256": prompt_hash, "persona": a.persona,
        "model": model, "cwd": cwd,
    })

    em_cls = ClaudeEmitter if a.persona == "claude" else CodexEmitter
    em = em_cls(a, session_id, exec_no, model, cwd, prior)

    def save_session() -> None:
        save_json(os.path.join(sessions, f"{session_id}.json"), {
            "persona": a.persona, "session_id": session_id, "model": model, "executions": exec_no,
            "totals": em.session_totals(), "updated": now_iso(), "cwd": cwd,
        })

    save_session()  # a hung or killed execution stays resumable
    em.start()
    agent = Agent(a, em, cwd, prompt_hash)
    steps = parse_instructions(prompt)
    task_key = os.environ.get("TASK_KEY") or f"prompt:{prompt_hash}"

    # API-level failures happen before the first tool call.
    for verb, arg in steps:
        if verb == "ratelimit":
            try:
                n = int(arg.split()[0]) if arg else 1
            except ValueError:
                n = 1
            fail, _count = ratelimit_should_fail(task_key, n)
            if fail:
                em.api_error(429)
                save_session()
                return 1
        elif verb == "authfail":
            em.api_error(401)
            save_session()
            return 1

    exit_code = 0
    try:
        if not steps:
            final = agent.default_behaviour()
            em.finish(final)
            return 0
        for verb, arg in steps:
            if verb in ("write", "append"):
                path, _, text = arg.partition(" ")
                if not path:
                    em.text(f"SIM: {verb} needs a path")
                    continue
                content = unescape(text)
                if not content.endswith("\n"):
                    content += "\n"
                agent.write(path, content, append=(verb == "append"))
            elif verb == "commit":
                agent.commit(arg or "sim: commit")
            elif verb == "print":
                agent.prints.append(unescape(arg))
            elif verb == "print-json":
                try:
                    agent.prints.append(json.dumps(json.loads(arg)))
                except ValueError:
                    agent.prints.append(arg)
                continue
            elif verb == "sleep":
                try:
                    time.sleep(max(0.0, float(arg.split()[0])))
                except (ValueError, IndexError):
                    pass
                continue
            elif verb == "fail":
                code_s, _, msg = arg.partition(" ")
                try:
                    exit_code = int(code_s)
                except ValueError:
                    exit_code, msg = 1, arg
                msg = msg or f"simulated failure (exit {exit_code})"
                em.text(f"Error: {msg}")
                em.finish(msg, is_error=True, subtype="error_during_execution",
                          terminal_reason="error", errors=[msg])
                return exit_code
            elif verb in ("ratelimit", "authfail"):
                continue  # handled above
            elif verb == "hang":
                em.text("Working on it...")
                while True:
                    time.sleep(3600)
            elif verb == "garbage":
                em.garbage()
                continue
            elif verb == "spam":
                try:
                    mb = float(arg.split()[0])
                except (ValueError, IndexError):
                    mb = 1.0
                agent.spam(mb)
                continue
            elif verb == "write-outside":
                agent.write_outside(arg.split()[0] if arg else "")
            elif verb == "exec":
                agent.bash(arg, "run command")
            else:
                em.text(f"(ignoring unknown SIM verb {verb!r})")
                continue
            if verb in ("write", "append", "commit", "write-outside", "exec") and agent.check_turns():
                msg = f"Reached maximum number of turns ({a.max_turns})"
                if a.persona == "claude":
                    em.turns = a.max_turns + 1
                    em.finish("", is_error=True, subtype="error_max_turns", terminal_reason="max_turns",
                              errors=[msg], stop_reason="tool_use")
                    return 1
        if agent.prints:
            final = "\n".join(agent.prints + agent.reports)
        elif agent.reports:
            final = "\n".join(agent.reports)
        else:
            final = f"Done: executed {len(steps)} simulated instruction(s)."
        em.finish(final)
        return exit_code
    finally:
        save_session()


def entry() -> None:
    try:
        sys.exit(main(sys.argv))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    entry()
