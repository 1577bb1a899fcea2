"""Entry point: parse argv, open or resume the session, run the SIM steps, print the result."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from . import claude, codex
from .agent import Agent
from .answers import schema_instance
from .common import (
    OUT,
    Args,
    answer_seed,
    is_git_worktree,
    load_json,
    now_iso,
    parse_instructions,
    ratelimit_should_fail,
    record_execution,
    save_json,
    sha256_hex,
    sim_home,
    unescape,
    uuid4_from,
    uuid_str,
)

# The answer given for an output schema after ``SIM: bad-output`` (in this session).
BAD_OUTPUT = "This answer ignores the requested JSON schema (SIM: bad-output)."


def parse_args(argv: list[str]) -> Args:
    a = Args()
    a.argv0 = argv[0] if argv else "orchestrator-sim-agent"
    rest = list(argv[1:])
    persona = None
    for idx, tok in enumerate(rest):
        if tok == "--as" and idx + 1 < len(rest):
            persona = rest[idx + 1]
            del rest[idx : idx + 2]
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
        claude.parse_claude(rest, a)
    else:
        codex.parse_codex(rest, a)
    if a.prompt is None:
        try:
            a.prompt = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
        except (OSError, ValueError):
            a.prompt = ""
    return a


def new_session_id(persona: str) -> str:
    if persona == "codex":
        # Codex thread ids are UUIDv7: 48-bit millisecond timestamp then random bits.
        ms = int(time.time() * 1000)
        rnd = int.from_bytes(os.urandom(10), "big")
        val = (ms << 80) | (0x7 << 76) | ((rnd >> 68) & 0xFFF) << 64 | (0b10 << 62) | (rnd & ((1 << 62) - 1))
        return uuid_str(val)
    return uuid4_from(os.urandom(16))


def refusal(a: Args, cwd: str) -> int | None:
    """The exit code of a refusal the real CLI makes before doing anything, else None."""
    if a.persona == "claude":
        if a.skip_permissions and os.geteuid() == 0 and not os.environ.get("IS_SANDBOX"):
            print(
                "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons",
                file=sys.stderr,
            )
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
    if a.output_schema_error:
        print(f"Error: {a.output_schema_error}", file=sys.stderr)
        return 1
    return None


class Session:
    """The session file: persona, totals and execution count, so --resume continues it."""

    def __init__(self, a: Args, model: str, cwd: str) -> None:
        self.a = a
        self.model = model
        self.cwd = cwd
        self.dir = os.path.join(sim_home(), "sessions")
        self.resumed = bool(a.resume) or a.resume_last
        self.prior: dict = {}
        self.data: dict = {}
        self.session_id = ""
        self.exec_no = 1
        self.em: claude.ClaudeEmitter | codex.CodexEmitter | None = None

    def open(self, prompt_hash: str) -> bool:
        """Resume or start the session; False (after printing the CLI's error) if it does not exist."""
        a = self.a
        if a.resume_last:
            names = (
                [n for n in os.listdir(self.dir) if n.endswith(".json") and not n.startswith(".")]
                if os.path.isdir(self.dir)
                else []
            )
            cands = sorted((os.path.join(self.dir, n) for n in names), key=os.path.getmtime)
            cands = [p for p in cands if (load_json(p) or {}).get("persona") == a.persona]
            a.resume = os.path.basename(cands[-1])[: -len(".json")] if cands else None
        if not self.resumed:
            self.session_id = new_session_id(a.persona)
            return True
        data = load_json(os.path.join(self.dir, f"{a.resume}.json")) if a.resume else None
        if data is None or data.get("persona") != a.persona:
            sid = a.resume or "(last)"
            self.record(prompt_hash, session_id=sid, error="session not found")
            if a.persona == "claude":
                print(f"No conversation found with session ID: {sid}", file=sys.stderr)
            else:
                msg = f"thread/session not found: {sid}"
                if a.json:
                    OUT.line({"type": "error", "message": msg})
                print(f"Error: {msg}", file=sys.stderr)
            return False
        self.session_id = a.resume or ""
        self.data = data
        self.prior = data.get("totals", {})
        self.exec_no = int(data.get("executions", 0)) + 1
        return True

    def record(self, prompt_hash: str, **extra: object) -> None:
        a = self.a
        entry: dict[str, object] = {
            "ts": now_iso(),
            "task_key": os.environ.get("TASK_KEY"),
            "argv0": os.path.basename(a.argv0),
            "session_id": self.session_id,
            "resumed": self.resumed,
            "prompt_sha256": prompt_hash,
            "persona": a.persona,
            "model": self.model,
            "cwd": self.cwd,
        }
        entry.update(extra)
        record_execution(entry)

    def save(self) -> None:
        assert self.em is not None, "save() before the emitter exists"
        data = {
            "persona": self.a.persona,
            "session_id": self.session_id,
            "model": self.model,
            "executions": self.exec_no,
            "totals": self.em.session_totals(),
            "updated": now_iso(),
            "cwd": self.cwd,
        }
        if self.data.get("bad_output"):
            data["bad_output"] = True
        save_json(os.path.join(self.dir, f"{self.session_id}.json"), data)


def api_failure(steps: list[tuple[str, str]], em, task_key: str) -> bool:
    """API-level failures happen before the first tool call; True when one was printed."""
    for verb, arg in steps:
        if verb == "ratelimit":
            try:
                n = int(arg.split()[0]) if arg else 1
            except ValueError:
                n = 1
            if ratelimit_should_fail(task_key, n):
                em.api_error(429)
                return True
        elif verb == "authfail":
            em.api_error(401)
            return True
    return False


class Stop(Exception):
    """A step ended the execution with this exit code (fail, max turns)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def run_step(a: Args, em, agent: Agent, verb: str, arg: str) -> None:
    if verb in ("write", "append"):
        path, _, text = arg.partition(" ")
        if not path:
            em.text(f"SIM: {verb} needs a path")
            return
        content = unescape(text)
        if not content.endswith("\n"):
            content += "\n"
        agent.write(path, content, append=(verb == "append"))
    elif verb == "edit":
        path, _, rest = arg.partition(" ")
        old, sep, new = rest.partition(" => ")
        if not path or not sep or not old:
            em.text("SIM: edit needs <path> <old text> => <new text>")
            return
        agent.edit(path, unescape(old), unescape(new))
    elif verb == "commit":
        agent.commit(arg or "sim: commit")
        if agent.commit_failure is not None:
            raise Stop(commit_failed(em, agent.commit_failure))
    elif verb == "print":
        agent.prints.append(unescape(arg))
    elif verb == "print-json":
        try:
            agent.prints.append(json.dumps(json.loads(arg)))
        except ValueError:
            agent.prints.append(arg)
        return
    elif verb == "sleep":
        with contextlib.suppress(ValueError, IndexError):
            time.sleep(max(0.0, float(arg.split()[0])))
        return
    elif verb == "fail":
        code_s, _, msg = arg.partition(" ")
        try:
            exit_code = int(code_s)
        except ValueError:
            exit_code, msg = 1, arg
        msg = msg or f"simulated failure (exit {exit_code})"
        em.text(f"Error: {msg}")
        em.finish(msg, is_error=True, subtype="error_during_execution", terminal_reason="error", errors=[msg])
        raise Stop(exit_code)
    elif verb in ("ratelimit", "authfail", "bad-output"):
        return  # handled before the steps run
    elif verb == "hang":
        em.text("Working on it...")
        while True:
            time.sleep(3600)
    elif verb == "garbage":
        em.garbage()
        return
    elif verb == "spam":
        try:
            mb = float(arg.split()[0])
        except (ValueError, IndexError):
            mb = 1.0
        agent.spam(mb)
        return
    elif verb == "write-outside":
        agent.write_outside(arg.split()[0] if arg else "")
    elif verb == "exec":
        agent.bash(arg, "run command")
    else:
        em.text(f"(ignoring unknown SIM verb {verb!r})")
        return
    if verb in ("write", "append", "edit", "commit", "write-outside", "exec") and agent.check_turns():
        msg = f"Reached maximum number of turns ({a.max_turns})"
        if a.persona == "claude":
            em.turns = (a.max_turns or 0) + 1  # (check_turns() is only true with a --max-turns)
            em.finish(
                "",
                is_error=True,
                subtype="error_max_turns",
                terminal_reason="max_turns",
                errors=[msg],
                stop_reason="tool_use",
            )
            raise Stop(1)


def commit_failed(em, cause: str) -> int:
    """End the execution as a failure because a commit failed; returns the exit code."""
    msg = f"git commit failed, so the work is not committed: {cause}"
    em.text(f"Error: {msg}")
    em.finish(msg, is_error=True, subtype="error_during_execution", terminal_reason="error", errors=[msg])
    return 1


def structured_answer(a: Args, final: str, from_steps: bool, bad: bool, seed: str) -> tuple[str, object]:
    """(final text, structured object or None) for a task with an output schema.

    SIM print lines answer as they say (parsed when they are JSON, so a test can
    send a wrong answer); otherwise the answer is an instance of the schema.
    """
    if bad:
        return BAD_OUTPUT, None
    if from_steps:
        try:
            return final, json.loads(final)
        except ValueError:
            return final, None
    value = schema_instance(a.output_schema, seed)
    return json.dumps(value, ensure_ascii=False), value


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
    refused = refusal(a, cwd)
    if refused is not None:
        return refused

    persona = claude if a.persona == "claude" else codex
    model = persona.model_for(a.model)
    session = Session(a, model, cwd)
    if not session.open(prompt_hash):
        return 1
    session.record(prompt_hash)
    em = persona.Emitter(a, session.session_id, session.exec_no, model, cwd, session.prior)
    session.em = em
    session.save()  # a hung or killed execution stays resumable
    em.start()
    agent = Agent(a, em, cwd, prompt_hash)
    steps = parse_instructions(prompt)
    if any(verb == "bad-output" for verb, _ in steps):
        session.data["bad_output"] = True
    task_key = os.environ.get("TASK_KEY") or f"prompt:{prompt_hash}"
    try:
        if api_failure(steps, em, task_key):
            return 1
        try:
            for verb, arg in steps:
                run_step(a, em, agent, verb, arg)
        except Stop as stop:
            return stop.code
        if not steps or (session.data.get("bad_output") and not (agent.prints or agent.reports)):
            final = agent.default_behaviour()
            from_steps = False
            if agent.commit_failure is not None:
                return commit_failed(em, agent.commit_failure)
        elif agent.prints:
            final, from_steps = "\n".join(agent.prints + agent.reports), True
        elif agent.reports:
            final, from_steps = "\n".join(agent.reports), True
        else:
            final, from_steps = f"Done: executed {len(steps)} simulated instruction(s).", False
        if a.output_schema is None:
            em.finish(final)
        else:
            seed = answer_seed(cwd, prompt_hash)
            final, value = structured_answer(a, final, from_steps, bool(session.data.get("bad_output")), seed)
            em.finish_structured(final, value)
        return 0
    finally:
        session.save()


def entry() -> None:
    try:
        sys.exit(main(sys.argv))
    except KeyboardInterrupt:
        sys.exit(130)
