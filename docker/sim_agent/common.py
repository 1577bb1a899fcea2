"""Parts shared by both personas: output, ids, files, git, session records and usage."""

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

# USD per token (input, output): a sonnet-like price list for every model.
PRICE_IN = 3e-6
PRICE_OUT = 15e-6

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


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


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
                sys.stdout = None
            finally:
                os._exit(141)

    def line(self, obj: dict) -> None:
        self.write_bytes(
            json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape") + b"\n"
        )

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


def ratelimit_should_fail(key: str, n: int) -> bool:
    """Count an attempt for ``key``; fail while fewer than ``n`` attempts failed."""
    path = os.path.join(sim_home(), "ratelimit", sha256_hex(key)[:32] + ".json")
    data = load_json(path) or {"key": key, "failed": 0}
    failed = int(data.get("failed", 0))
    if failed < n:
        data["failed"] = failed + 1
        save_json(path, data)
        return True
    return False


def git(cwd: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)


def is_git_worktree(cwd: str) -> bool:
    try:
        r = git(cwd, "rev-parse", "--is-inside-work-tree")
    except OSError:
        return False
    return r.returncode == 0 and r.stdout.strip() == "true"


def task_name() -> str | None:
    """The task's key without the run id that leads it (``s1/gen/0``): the same in every run."""
    key = os.environ.get("TASK_KEY")
    if not key:
        return None
    return key.split("/", 1)[1] if "/" in key else key


def answer_seed(cwd: str, prompt_hash: str) -> str:
    """What an answer is derived from: the prompt and, in a git work tree, the committed work in it.

    A reviewer of several candidates gets one prompt and a different tree
    (git's tree id: content only, no dates), so each candidate gets its own
    score and a dry run ranks them; the same work under the same prompt gets
    the same answer in every run.
    """
    try:
        tree = subprocess.run(
            ["git", "-c", "safe.directory=*", "rev-parse", "-q", "--verify", "HEAD^{tree}"],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
    except OSError:
        return prompt_hash
    tree_id = tree.stdout.strip() if tree.returncode == 0 else ""
    return sha256_hex(f"{prompt_hash}:{tree_id}") if tree_id else prompt_hash


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


def read_options(argv: list[str], a: Args, value_options: dict, switches: dict[str, str]) -> list[str]:
    """Set ``a`` from a CLI's options, the way both real CLIs read them; returns its positional words.

    An option in ``value_options`` takes a value (``--flag=v`` or ``--flag v``; ``""`` when argv ends
    first) and names the ``Args`` attribute it sets, a function of ``(a, value)``, or None (read and
    ignored); any other option is a switch, setting its attribute in ``switches`` (if any) to True.
    ``--`` ends the options, and a lone ``-`` (read stdin) is positional.
    """
    positional: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            positional.extend(argv[i + 1 :])
            break
        name, eq, val = tok.partition("=")
        if not tok.startswith("-") or tok == "-":
            positional.append(tok)
        elif name in value_options:
            if not eq:
                i += 1
                val = argv[i] if i < len(argv) else ""
            target = value_options[name]
            if callable(target):
                target(a, val)
            elif target:
                setattr(a, target, val)
        elif switches.get(name):
            setattr(a, switches[name], True)
        i += 1
    return positional


def shell_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


class Args:
    persona: str = "claude"
    argv0: str = ""
    prompt: str | None = None
    model: str | None = None
    model_provider: str | None = None  # codex -c model_provider=NAME
    stream_retries: int = 5  # codex -c model_providers.X={...stream_max_retries=N}
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
    # JSON Schema the final answer must match (claude --json-schema, codex --output-schema FILE).
    output_schema: dict | None = None
    output_schema_error: str | None = None


class Usage:
    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0

    @property
    def cost(self) -> float:
        return round(self.input_tokens * PRICE_IN + self.output_tokens * PRICE_OUT, 6)


class BaseEmitter:
    """What both personas' writers share: the execution they write for, its usage, and the stream switch."""

    def __init__(self, a: Args, session_id: str, exec_no: int, model: str, cwd: str, prior: dict, stream: bool) -> None:
        self.a = a
        self.session_id = session_id
        self.exec_no = exec_no
        self.model = model
        self.cwd = cwd
        self.prior = prior  # session totals before this execution
        self.usage = Usage()
        self.turns = 0
        self.stream = stream  # False: plain-text output, no JSON lines
        self.texts: list[str] = []

    priced = True  # codex reports no cost
    garbage_lines: tuple[bytes, ...] = ()  # the persona's own broken lines, after the two every persona prints

    def emit(self, obj: dict) -> None:
        if self.stream:
            OUT.line(obj)

    def garbage(self) -> None:
        if self.stream:
            for line in (
                b"this line is not JSON at all\n",
                b"\xff\xfe invalid utf-8 \xc3\x28 bytes \xed\xa0\x80\n",
                *self.garbage_lines,
            ):
                OUT.write_bytes(line)

    def session_totals(self) -> dict:
        return {
            "input_tokens": int(self.prior.get("input_tokens", 0)) + self.usage.input_tokens,
            "output_tokens": int(self.prior.get("output_tokens", 0)) + self.usage.output_tokens,
            "cost_usd": round(float(self.prior.get("cost_usd", 0.0)) + self.usage.cost, 6) if self.priced else 0.0,
        }
