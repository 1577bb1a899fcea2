"""Tests of the simulated agent (the docker/sim_agent package).

Most run the script directly on the host with python3; the one marked
``docker`` runs it inside the orchestrator-test-agent image as ``claude``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import git
from plugin_helpers import CLAUDE_FLAGS

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "docker" / "sim_agent"  # the package, run as `python3 docker/sim_agent`
CODEX_FLAGS = [
    "--json",
    "--skip-git-repo-check",
    "--dangerously-bypass-approvals-and-sandbox",
    "-c",
    "analytics.enabled=false",
    "-m",
    "gpt-5",
]


# ----------------------------------------------------------------- helpers


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "ws"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init")
    return r


class Run:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.rc = proc.returncode
        self.raw: bytes = proc.stdout
        self.stderr = proc.stderr.decode("utf-8", "replace")
        self.events: list[dict] = []
        self.junk: list[bytes] = []
        for line in self.raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                self.events.append(json.loads(line.decode("utf-8")))
            except (UnicodeDecodeError, ValueError):
                self.junk.append(line)

    def of(self, type_: str, subtype: str | None = None) -> list[dict]:
        return [e for e in self.events if e.get("type") == type_ and (subtype is None or e.get("subtype") == subtype)]

    @property
    def result(self) -> dict:
        results = self.of("result")
        assert len(results) == 1, self.raw[-2000:]
        return results[0]


def run_sim(
    args: list[str],
    *,
    cwd: Path,
    home: Path,
    persona: str = "claude",
    stdin: bytes | None = None,
    env: dict | None = None,
    timeout: float = 60,
) -> Run:
    full_env = {k: v for k, v in os.environ.items() if k not in ("TASK_KEY", "SIM_AGENT_RECORD")}
    full_env.update(
        {
            "HOME": str(home),
            "GIT_AUTHOR_NAME": "Sim Test",
            "GIT_AUTHOR_EMAIL": "sim@test",
            "GIT_COMMITTER_NAME": "Sim Test",
            "GIT_COMMITTER_EMAIL": "sim@test",
        }
    )
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(SIM), "--as", persona, *args],
        cwd=cwd,
        env=full_env,
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
    )
    return Run(proc)


def claude(prompt: str | None, *, cwd: Path, home: Path, extra: list[str] = (), **kw) -> Run:
    argv = ["-p"] + ([prompt] if prompt is not None else []) + CLAUDE_FLAGS + list(extra)
    return run_sim(argv, cwd=cwd, home=home, persona="claude", **kw)


def codex(prompt: str, *, cwd: Path, home: Path, resume: str | None = None, **kw) -> Run:
    argv = ["exec", *CODEX_FLAGS] + (["resume", resume] if resume else []) + [prompt]
    return run_sim(argv, cwd=cwd, home=home, persona="codex", **kw)


def executions(home: Path) -> list[dict]:
    path = home / ".sim-agent" / "executions.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def drop_last_commit(repo: Path) -> None:
    """Take back the agent's commit: the next execution finds the work tree as the last one did."""
    subprocess.run(["git", "reset", "-q", "--hard", "HEAD~1"], cwd=repo, check=True)


def git_log(repo: Path) -> list[str]:
    return subprocess.run(
        ["git", "log", "--format=%s"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.splitlines()


RESULT_KEYS = {
    "type",
    "subtype",
    "is_error",
    "result",
    "total_cost_usd",
    "usage",
    "modelUsage",
    "model_usage_since_last_result",
    "num_turns",
    "session_id",
    "terminal_reason",
    "duration_ms",
}


# ----------------------------------------------------------------- claude


def test_claude_default_run_shapes_and_commit(repo: Path, home: Path) -> None:
    prompt = "Add a greeting to the project."
    r = claude(prompt, cwd=repo, home=home)
    assert r.rc == 0, r.stderr
    assert not r.junk
    init = r.events[0]
    assert init["type"] == "system" and init["subtype"] == "init"
    uuid.UUID(init["session_id"])
    assert init["claude_code_version"] == "2.1.330-sim"
    assert init["model"] == "claude-sonnet-4-5"
    assert init["cwd"] == str(repo)
    assert "Write" in init["tools"] and "Bash" in init["tools"]

    tool_uses = [c for e in r.of("assistant") for c in e["message"]["content"] if c["type"] == "tool_use"]
    assert [t["name"] for t in tool_uses] == ["Write", "Bash"]
    results = [c for e in r.of("user") for c in e["message"]["content"] if c["type"] == "tool_result"]
    assert {t["tool_use_id"] for t in results} == {t["id"] for t in tool_uses}
    assert all(e["session_id"] == init["session_id"] for e in r.events)

    res = r.result
    assert set(res) >= RESULT_KEYS
    assert res["subtype"] == "success" and res["is_error"] is False
    assert res["terminal_reason"] == "completed"
    assert res["total_cost_usd"] > 0
    assert res["usage"]["input_tokens"] > 0 and res["usage"]["output_tokens"] > 0
    assert res["modelUsage"] == res["model_usage_since_last_result"]
    assert res["num_turns"] >= 3
    # the final assistant text is the result text
    last_text = [c["text"] for e in r.of("assistant") for c in e["message"]["content"] if c["type"] == "text"][-1]
    assert last_text == res["result"]

    h = hashlib.sha256(prompt.encode()).hexdigest()
    assert (repo / "sim" / f"{h[:8]}.txt").is_file()
    assert git_log(repo)[0].startswith("sim: ")
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == ""

    [ex] = executions(home)
    assert ex["session_id"] == init["session_id"] and ex["resumed"] is False
    assert ex["prompt_sha256"] == h and ex["argv0"] == "sim_agent" and "ts" in ex


def test_claude_deterministic_except_session_id(repo: Path, home: Path, tmp_path: Path) -> None:
    other = tmp_path / "home2"
    other.mkdir()
    a = claude("Summarise the repo", cwd=repo, home=home)
    b = claude("Summarise the repo", cwd=tmp_path, home=other)  # not a git repo: answers only
    assert a.result["result"].split(".")[0] == b.result["result"].split(".")[0]
    assert a.result["session_id"] != b.result["session_id"]
    assert not (tmp_path / "sim").exists()


def test_claude_resume_is_cumulative(repo: Path, home: Path) -> None:
    first = claude("SIM: write a.txt one\nSIM: commit first", cwd=repo, home=home, env={"TASK_KEY": "t1"})
    sid = first.result["session_id"]
    second = claude(
        "SIM: append a.txt two\nSIM: commit second",
        cwd=repo,
        home=home,
        extra=["--resume", sid],
        env={"TASK_KEY": "t1"},
    )
    assert second.rc == 0
    assert second.events[0]["session_id"] == sid
    r1, r2 = first.result, second.result
    assert r2["session_id"] == sid
    since = next(iter(r2["model_usage_since_last_result"].values()))
    total = next(iter(r2["modelUsage"].values()))
    assert r2["total_cost_usd"] == pytest.approx(r1["total_cost_usd"] + since["costUSD"], abs=1e-6)
    assert total["inputTokens"] == r1["usage"]["input_tokens"] + r2["usage"]["input_tokens"]
    assert since["inputTokens"] == r2["usage"]["input_tokens"]
    assert (repo / "a.txt").read_text() == "one\ntwo\n"
    assert git_log(repo)[:2] == ["second", "first"]
    exs = executions(home)
    assert [(e["task_key"], e["resumed"], e["session_id"]) for e in exs] == [("t1", False, sid), ("t1", True, sid)]
    assert (home / ".sim-agent" / "sessions" / f"{sid}.json").is_file()


def test_claude_resume_unknown_session_fails(repo: Path, home: Path) -> None:
    r = claude("hi", cwd=repo, home=home, extra=["--resume", str(uuid.uuid4())])
    assert r.rc == 1
    assert "No conversation found" in r.stderr


def test_claude_prompt_from_stdin(repo: Path, home: Path) -> None:
    r = claude(None, cwd=repo, home=home, stdin=b"SIM: print from stdin\n")
    assert r.rc == 0 and r.result["result"] == "from stdin"
    r = claude("-", cwd=repo, home=home, stdin=b"SIM: print dash stdin\n")
    assert r.result["result"] == "dash stdin"


def test_claude_score_and_ideas_json(repo: Path, home: Path) -> None:
    p = 'Review the branch. Answer with JSON: {"score": 0-10, "rationale": ...}'
    a = claude(p, cwd=repo, home=home)
    drop_last_commit(repo)  # the same work again (the answer is derived from the prompt and the work)
    b = claude(p, cwd=repo, home=home)
    sa, sb = json.loads(a.result["result"]), json.loads(b.result["result"])
    assert sa["score"] == sb["score"] and 0 <= sa["score"] <= 10 and sa["rationale"]
    ideas = json.loads(claude("Propose 4 ideas, reply as JSON", cwd=repo, home=home).result["result"])
    assert len(ideas["ideas"]) == 4 and all(i["title"] and i["description"] for i in ideas["ideas"])


def _read_only_clone(src: Path, dest: Path) -> Path:
    """A clone whose top folder cannot be written, as a review task's /workspace."""
    subprocess.run(["git", "clone", "-q", str(src), str(dest)], check=True)
    dest.chmod(0o555)
    return dest


def test_candidates_of_one_prompt_make_different_work_and_reviewers_score_the_work(repo, home, tmp_path):
    # A dry run's best-of-n candidates share one prompt, and their reviewers another: every
    # candidate got the same score and rationale, so a rehearsal never ranked anything.
    made = []
    for i in range(3):
        ws = tmp_path / f"gen{i}"
        subprocess.run(["git", "clone", "-q", str(repo), str(ws)], check=True)
        r = claude("raise the benchmark", cwd=ws, home=home, env={"TASK_KEY": f"run_20250101_000000/s1/gen/{i}"})
        assert r.rc == 0, r.stderr
        made.append(ws)
    texts = [next((ws / "sim").iterdir()).read_text() for ws in made]
    assert [t.splitlines()[-1] for t in texts] == ["by: s1/gen/0", "by: s1/gen/1", "by: s1/gen/2"], texts
    # another run's candidate of the same task makes the same work: the run id is not part of it
    other = tmp_path / "other-run"
    subprocess.run(["git", "clone", "-q", str(repo), str(other)], check=True)
    claude("raise the benchmark", cwd=other, home=home, env={"TASK_KEY": "run_20990101_000000_2/s1/gen/1"})
    assert next((other / "sim").iterdir()).read_text() == texts[1]

    review = "You are reviewing one candidate solution. Do not modify any files."
    schema = ["--json-schema", json.dumps({k: v for k, v in SCORE_SCHEMA.items() if k != "required"})]
    guessed = 'Review the branch. Answer with JSON: {"score": 0-10, "rationale": ...}'
    readers = [_read_only_clone(ws, tmp_path / f"review{i}") for i, ws in enumerate(made)]
    try:
        answers = [claude(review, cwd=ws, home=home, extra=schema).result["structured_output"] for ws in readers]
        assert len({a["score"] for a in answers}) == 3, answers
        assert len({a["rationale"] for a in answers}) == 3, answers
        plain = [json.loads(claude(guessed, cwd=ws, home=home).result["result"]) for ws in readers]
        assert len({json.dumps(a) for a in plain}) == 3, plain
        # the same work under the same prompt: the same answer, in another clone, another session
        again = _read_only_clone(other, tmp_path / "review-again")
        readers.append(again)
        assert claude(review, cwd=again, home=home, extra=schema).result["structured_output"] == answers[1]
        assert json.loads(claude(guessed, cwd=again, home=home).result["result"]) == plain[1]
    finally:
        for ws in readers:
            ws.chmod(0o755)


def test_claude_sim_verbs(repo: Path, home: Path) -> None:
    prompt = "\n".join(
        [
            "Please do the following.",
            "SIM: write src/x.txt hello\\nworld",
            "SIM: append src/x.txt again",
            "SIM: exec echo out-$((1+2)); echo err >&2",
            "SIM: commit add x",
            "SIM: print first line",
            'SIM: print-json {"ok": true}',
            "unrelated text SIM: print not-an-instruction",
        ]
    )
    r = claude(prompt, cwd=repo, home=home)
    assert r.rc == 0
    assert (repo / "src" / "x.txt").read_text() == "hello\nworld\nagain\n"
    assert git_log(repo)[0] == "add x"
    assert r.result["result"] == 'first line\n{"ok": true}'
    outputs = [c["content"] for e in r.of("user") for c in e["message"]["content"]]
    assert any("out-3" in o and "err" in o for o in outputs)
    assert r.of("system", "vcs_state_changed")


def test_claude_fail(repo: Path, home: Path) -> None:
    r = claude("SIM: fail 7 something broke", cwd=repo, home=home)
    assert r.rc == 7
    res = r.result
    assert res["is_error"] is True and res["subtype"] == "error_during_execution"
    assert "something broke" in res["errors"][0]


def test_claude_ratelimit_then_success(repo: Path, home: Path) -> None:
    prompt = "SIM: ratelimit 2\nSIM: print finally"
    for _ in range(2):
        r = claude(prompt, cwd=repo, home=home, env={"TASK_KEY": "rl", "ANTHROPIC_API_KEY": "sk-ant-test"})
        assert r.rc == 1
        # a plain API key's 429: retries and the error, no subscription limit event (as claude 2.1.330)
        assert not r.of("rate_limit_event")
        assert [e["error_status"] for e in r.of("system", "api_retry")] == [429, 429]
        synthetic = r.of("assistant")[-1]
        assert synthetic["error"] == "rate_limit" and synthetic["message"]["model"] == "<synthetic>"
        res = r.result
        assert res["subtype"] == "success" and res["is_error"] is True
        assert res["api_error_status"] == 429 and res["terminal_reason"] == "api_error"
        assert res["result"].startswith("API Error: 429")
    # another task key is counted separately
    assert claude(prompt, cwd=repo, home=home, env={"TASK_KEY": "other"}).rc == 1
    ok = claude(prompt, cwd=repo, home=home, env={"TASK_KEY": "rl"})
    assert ok.rc == 0 and ok.result["result"] == "finally"
    assert [e["task_key"] for e in executions(home)].count("rl") == 3


def test_claude_ratelimit_event_only_for_a_subscription_login(repo: Path, home: Path) -> None:
    env = {"TASK_KEY": "sub", "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat-test", "ANTHROPIC_API_KEY": ""}
    r = claude("SIM: ratelimit 1", cwd=repo, home=home, env=env)
    assert r.rc == 1
    assert r.of("rate_limit_event")[0]["rate_limit_info"]["status"] == "rejected"


def test_claude_edit_is_an_edit_tool_call(repo: Path, home: Path) -> None:
    r = claude(
        "SIM: write notes.txt first line\nSIM: commit add\nSIM: edit notes.txt first => edited\n"
        "SIM: commit edit\nSIM: edit notes.txt missing => x",
        cwd=repo,
        home=home,
    )
    assert r.rc == 0
    assert (repo / "notes.txt").read_text() == "edited line\n"
    assert git_log(repo)[:2] == ["edit", "add"]
    uses = [c for e in r.of("assistant") for c in e["message"]["content"] if c["type"] == "tool_use"]
    edits = [u for u in uses if u["name"] == "Edit"]
    assert [e["input"]["old_string"] for e in edits] == ["first", "missing"]
    results = r.of("user")
    done = next(x["tool_use_result"] for x in results if "oldString" in x.get("tool_use_result", {}))
    assert done["originalFile"] == "first line\n" and done["newString"] == "edited" and done["replaceAll"] is False
    assert results[-1]["message"]["content"][0]["is_error"] is True  # old text not found
    commits = [
        x["tool_use_result"]["gitOperation"]["commit"]
        for x in results
        if "gitOperation" in x.get("tool_use_result", {})
    ]
    assert [c["kind"] for c in commits] == ["committed", "committed"] and commits[0]["branch"] == "main"
    assert all(x["tool_result_meta"][0]["id"] == x["message"]["content"][0]["tool_use_id"] for x in results)


def test_claude_authfail(repo: Path, home: Path) -> None:
    r = claude("SIM: authfail", cwd=repo, home=home)
    assert r.rc == 1
    res = r.result
    assert res["is_error"] is True and res["api_error_status"] == 401
    assert res["api_error_type"] == "authentication_error" and "Invalid API key" in res["result"]


def test_claude_garbage_mixed_with_valid_lines(repo: Path, home: Path) -> None:
    r = claude("SIM: garbage\nSIM: print still fine", cwd=repo, home=home)
    assert r.rc == 0
    assert r.junk, "expected non-JSON lines"
    with pytest.raises(UnicodeDecodeError):
        r.raw.decode("utf-8")
    assert r.result["result"] == "still fine"


def test_claude_spam(repo: Path, home: Path) -> None:
    r = claude("SIM: spam 2", cwd=repo, home=home)
    assert r.rc == 0
    text = sum(len(c["text"]) for e in r.of("assistant") for c in e["message"]["content"] if c["type"] == "text")
    assert text >= 2 * 1024 * 1024


def test_claude_write_outside_reports(repo: Path, home: Path, tmp_path: Path) -> None:
    target = tmp_path / "outside" / "x.txt"
    r = claude(f"SIM: write-outside {target}\nSIM: write-outside /proc/definitely/not/here", cwd=repo, home=home)
    assert r.rc == 0
    assert target.exists()
    assert f"write-outside {target}: succeeded" in r.result["result"]
    assert "write-outside /proc/definitely/not/here: failed" in r.result["result"]


def test_claude_hang_and_sleep(repo: Path, home: Path) -> None:
    env = {**os.environ, "HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, str(SIM), "-p", "SIM: hang", *CLAUDE_FLAGS],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        first = json.loads(proc.stdout.readline())
        assert first["subtype"] == "init"
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=5)
    t0 = time.monotonic()
    r = claude("SIM: sleep 0.6\nSIM: print woke", cwd=repo, home=home)
    assert time.monotonic() - t0 >= 0.6 and r.result["result"] == "woke"


def test_claude_max_turns(repo: Path, home: Path) -> None:
    r = claude("SIM: exec true\nSIM: exec true\nSIM: exec true", cwd=repo, home=home, extra=["--max-turns", "2"])
    assert r.rc == 1
    assert r.result["subtype"] == "error_max_turns" and r.result["terminal_reason"] == "max_turns"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_claude_refuses_skip_permissions_as_root(repo: Path, home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "IS_SANDBOX"}
    env["HOME"] = str(home)
    p = subprocess.run(
        [
            sys.executable,
            str(SIM),
            "-p",
            "x",
            "--dangerously-skip-permissions",
            "--output-format",
            "stream-json",
            "--verbose",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
    )
    assert p.returncode == 1 and b"root" in p.stderr


def test_record_env_and_argv0_persona(repo: Path, home: Path, tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "codex").symlink_to(SIM)
    rec = tmp_path / "rec" / "x.jsonl"
    env = {**os.environ, "HOME": str(home), "SIM_AGENT_RECORD": str(rec), "TASK_KEY": "k"}
    p = subprocess.run(
        [sys.executable, str(bindir / "codex"), "exec", "--json", "SIM: print hi"],
        cwd=repo,
        env=env,
        capture_output=True,
        check=True,
    )
    assert json.loads(p.stdout.splitlines()[0])["type"] == "thread.started"
    [line] = [json.loads(x) for x in rec.read_text().splitlines()]
    assert line["argv0"] == "codex" and line["task_key"] == "k"
    assert executions(home) == [line]


# ----------------------------------------------------------------- codex


def test_codex_success_shapes(repo: Path, home: Path) -> None:
    r = codex("Implement the feature", cwd=repo, home=home)
    assert r.rc == 0, r.stderr
    types = [e["type"] for e in r.events]
    assert types[0] == "thread.started" and types[1] == "turn.started" and types[-1] == "turn.completed"
    uuid.UUID(r.events[0]["thread_id"])
    items = [e["item"] for e in r.events if e["type"] == "item.completed"]
    cmds = [i for i in items if i["type"] == "command_execution"]
    assert cmds and all(i["exit_code"] == 0 and i["status"] == "completed" for i in cmds)
    started = [e["item"]["id"] for e in r.events if e["type"] == "item.started"]
    assert started == [i["id"] for i in cmds]
    assert [i["id"] for i in items] == [f"item_{n}" for n in range(len(items))]
    assert items[-1]["type"] == "agent_message" and items[-1]["text"].startswith("Done")
    usage = r.events[-1]["usage"]
    assert set(usage) == {
        "input_tokens",
        "cached_input_tokens",
        "cache_write_input_tokens",
        "output_tokens",
        "reasoning_output_tokens",
    }
    assert len(git_log(repo)) == 2


def test_codex_resume_cumulative(repo: Path, home: Path) -> None:
    a = codex("SIM: print one", cwd=repo, home=home)
    tid = a.events[0]["thread_id"]
    b = codex("SIM: print two", cwd=repo, home=home, resume=tid)
    assert b.rc == 0 and b.events[0]["thread_id"] == tid
    ua, ub = a.events[-1]["usage"], b.events[-1]["usage"]
    assert ub["input_tokens"] > ua["input_tokens"] and ub["output_tokens"] > ua["output_tokens"]
    assert [i["id"] for i in (e["item"] for e in b.events if e["type"] == "item.completed")] == ["item_0"]
    assert [e["resumed"] for e in executions(home)] == [False, True]


def test_codex_stdin_prompt_and_exec_failure(repo: Path, home: Path) -> None:
    r = run_sim(
        ["exec", *CODEX_FLAGS, "-"], cwd=repo, home=home, persona="codex", stdin=b"SIM: exec exit 3\nSIM: print done"
    )
    assert r.rc == 0
    cmd = next(
        e["item"] for e in r.events if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"
    )
    assert cmd["exit_code"] == 3 and cmd["status"] == "failed"


def test_codex_ratelimit_and_auth(repo: Path, home: Path) -> None:
    r = codex("SIM: ratelimit 1", cwd=repo, home=home, env={"TASK_KEY": "c"})
    assert r.rc == 1
    errors = [e["message"] for e in r.events if e["type"] == "error"]
    assert [m.split(" (")[0] for m in errors[:5]] == [f"Reconnecting... {n}/5" for n in range(1, 6)]
    assert "429" in errors[-1]
    assert r.events[-1]["type"] == "turn.failed" and "429" in r.events[-1]["error"]["message"]
    assert codex("SIM: ratelimit 1", cwd=repo, home=home, env={"TASK_KEY": "c"}).rc == 0
    a = codex("SIM: authfail", cwd=repo, home=home)
    assert a.rc == 1 and "401" in a.events[-1]["error"]["message"]


def test_codex_custom_provider_warns_about_model_metadata(repo: Path, home: Path) -> None:
    provider = '{name="orc",base_url="http://127.0.0.1:9/v1",stream_max_retries=2}'
    flags = ["-c", "model_provider=orc", "-c", f"model_providers.orc={provider}"]
    r = run_sim(
        ["exec", *CODEX_FLAGS, *flags, "SIM: edit notes.txt a => b\nSIM: print done"],
        cwd=repo,
        home=home,
        persona="codex",
    )
    assert r.rc == 0, r.stderr
    assert [e["type"] for e in r.events[:3]] == ["thread.started", "item.completed", "turn.started"]
    warning = r.events[1]["item"]
    assert warning["id"] == "item_0" and warning["type"] == "error" and "gpt-5" in warning["message"]
    assert any("sed -i" in e["item"].get("command", "") for e in r.events if e["type"] == "item.started")
    rl = run_sim(["exec", *CODEX_FLAGS, *flags, "SIM: ratelimit 1"], cwd=repo, home=home, persona="codex")
    errors = [e["message"] for e in rl.events if e["type"] == "error"]
    assert [m.split(" (")[0] for m in errors[:-1]] == ["Reconnecting... 1/2", "Reconnecting... 2/2"]


def test_codex_fail(repo: Path, home: Path) -> None:
    r = codex("SIM: fail 4 nope", cwd=repo, home=home)
    assert r.rc == 4 and r.events[-1] == {"type": "turn.failed", "error": {"message": "nope"}}


def test_codex_requires_git_repo_check_flag(tmp_path: Path, home: Path) -> None:
    r = run_sim(["exec", "--json", "hi"], cwd=tmp_path, home=home, persona="codex")
    assert r.rc == 1 and "skip-git-repo-check" in r.stderr


# ----------------------------------------------------------------- docker


@pytest.mark.docker
def test_sim_agent_inside_test_image() -> None:
    # conftest skips it locally, and fails it on CI, when Docker or the image is missing
    from conftest import TEST_IMAGE

    script = (
        "set -e; cd /tmp && git init -q -b main ws && cd ws && "
        "git -c user.name=t -c user.email=t@t commit -q --allow-empty -m init && "
        "GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t TASK_KEY=dock "
        'claude -p "$1" --output-format stream-json --verbose --model sonnet '
        "--dangerously-skip-permissions && git log --format=%s -1 >&2 && "
        'readlink -f "$(command -v claude)" >&2 && tail -n1 ~/.sim-agent/executions.jsonl >&2'
    )
    prompt = "SIM: write hello.txt hi\nSIM: commit add hello\nSIM: print done in docker"
    p = subprocess.run(
        ["docker", "run", "--rm", "--user", "node", TEST_IMAGE, "sh", "-c", script, "sh", prompt],
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr.decode()
    events = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    assert events[0]["type"] == "system" and events[0]["cwd"] == "/tmp/ws"
    assert events[-1]["type"] == "result" and events[-1]["result"] == "done in docker"
    err = p.stderr.decode().splitlines()
    assert "add hello" in err
    assert "/usr/local/bin/orchestrator-sim-agent" in err
    rec = json.loads(err[-1])
    assert rec["task_key"] == "dock" and rec["argv0"] == "claude"


# ----------------------------------------------------------------- output schemas

IDEAS_SCHEMA = {
    "type": "object",
    "properties": {
        "ideas": {
            "type": "array",
            "minItems": 4,
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {"title": {"type": "string", "minLength": 3}, "description": {"type": "string"}},
                "required": ["title", "description"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["ideas"],
    "additionalProperties": False,
}
SCORE_SCHEMA = {
    "type": "object",
    "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 10},
        "rationale": {"type": "string"},
        "verdict": {"enum": ["APPROVE", "REQUEST_CHANGES"]},
        "passed": {"type": "boolean"},
        "count": {"type": "integer", "exclusiveMinimum": 0},
    },
    "required": ["score", "rationale", "verdict", "passed", "count"],
}


def _valid(schema: dict, value: object) -> bool:
    import jsonschema

    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_claude_answers_json_schema_with_a_deterministic_instance(repo: Path, home: Path) -> None:
    extra = ["--json-schema", json.dumps(IDEAS_SCHEMA)]
    r = claude("Propose ideas for the parser.", cwd=repo, home=home, extra=extra)
    assert r.rc == 0, r.stderr
    value = r.result["structured_output"]
    assert _valid(IDEAS_SCHEMA, value)
    assert json.loads(r.result["result"]) == value
    assert len({i["title"] for i in value["ideas"]}) == 4  # the ideas differ
    tools = [c for e in r.of("assistant") for c in e["message"]["content"] if c["type"] == "tool_use"]
    assert tools[-1]["name"] == "StructuredOutput" and tools[-1]["input"] == value
    drop_last_commit(repo)
    again = claude("Propose ideas for the parser.", cwd=repo, home=home, extra=extra)
    assert again.result["structured_output"] == value  # same prompt on the same work, same answer
    other = claude("Propose ideas for the lexer.", cwd=repo, home=home, extra=extra)
    assert other.result["structured_output"] != value


def test_schema_instances_vary_with_the_prompt(repo: Path, home: Path) -> None:
    extra = ["--json-schema", json.dumps(SCORE_SCHEMA)]
    scores = set()
    for n in range(6):
        r = claude(f"Score candidate {n}.", cwd=repo, home=home, extra=extra)
        value = r.result["structured_output"]
        assert _valid(SCORE_SCHEMA, value), value
        scores.add(value["score"])
    assert len(scores) >= 3


def test_codex_answers_output_schema_file(repo: Path, home: Path, tmp_path: Path) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCORE_SCHEMA))
    argv = ["exec", *CODEX_FLAGS, "--output-schema", str(schema_file), "Score it."]
    r = run_sim(argv, cwd=repo, home=home, persona="codex")
    assert r.rc == 0, r.stderr
    messages = [e["item"]["text"] for e in r.of("item.completed") if e["item"]["type"] == "agent_message"]
    assert _valid(SCORE_SCHEMA, json.loads(messages[-1]))
    missing = run_sim(
        ["exec", *CODEX_FLAGS, "--output-schema", str(tmp_path / "nope.json"), "x"],
        cwd=repo,
        home=home,
        persona="codex",
    )
    assert missing.rc == 1 and "nope.json" in missing.stderr


def test_bad_output_answers_in_prose_on_every_resume(repo: Path, home: Path) -> None:
    extra = ["--json-schema", json.dumps(SCORE_SCHEMA)]
    r = claude("SIM: bad-output", cwd=repo, home=home, extra=extra)
    assert r.rc == 0 and "structured_output" not in r.result
    with pytest.raises(ValueError):
        json.loads(r.result["result"])
    resumed = claude("Answer again with JSON.", cwd=repo, home=home, extra=[*extra, "--resume", r.result["session_id"]])
    assert "structured_output" not in resumed.result
    fresh = claude("Answer again with JSON.", cwd=repo, home=home, extra=extra)
    assert _valid(SCORE_SCHEMA, fresh.result["structured_output"])
    printed = claude('SIM: print-json {"score": 99}', cwd=repo, home=home, extra=extra)
    assert printed.result["structured_output"] == {"score": 99}  # SIM print overrides, even when invalid


def test_an_agent_does_not_redo_the_default_work_its_task_already_left_in_its_workspace(repo, home):
    def head():
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()

    (repo / ".git" / "BASE_COMMIT").write_text(head() + "\n")  # what the orchestrator records for a task
    first = claude("implement the greeting", cwd=repo, home=home)
    sid = first.result["session_id"]
    (path,) = (repo / "sim").iterdir()
    before = path.read_text()
    again = claude("implement the greeting", cwd=repo, home=home, extra=["--resume", sid])
    assert again.rc == 0 and again.result["session_id"] == sid
    assert path.read_text() == before  # it knows it already did this
    assert git_log(repo) == ["sim: implement the greeting", "init"]
    assert again.result["result"] == first.result["result"]
    # left uncommitted by an execution killed before its commit: the next one (even a new session) commits it
    subprocess.run(["git", "reset", "-q", "--soft", "HEAD~1"], cwd=repo, check=True)
    claude("implement the greeting", cwd=repo, home=home)
    assert git_log(repo) == ["sim: implement the greeting", "init"] and path.read_text() == before
    # a new task whose base already holds the file adds a revision, as before
    (repo / ".git" / "BASE_COMMIT").write_text(head() + "\n")
    claude("implement the greeting", cwd=repo, home=home)
    assert path.read_text().splitlines()[-1].startswith("revision 3: ")


def _unusable_clone(tmp_path: Path) -> Path:
    """A clone whose objects lived in a repository that is gone: every commit fails."""
    src, ws = tmp_path / "gone", tmp_path / "broken"
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(src),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "i",
        ],
        check=True,
    )
    subprocess.run(["git", "clone", "-q", "--shared", str(src), str(ws)], check=True)
    subprocess.run(["rm", "-rf", str(src)], check=True)
    return ws


@pytest.mark.parametrize("prompt", ["SIM: write a.txt x\nSIM: commit c\nSIM: print never", "no SIM line: default work"])
def test_a_commit_git_refuses_is_the_agents_failure(tmp_path: Path, home: Path, prompt: str) -> None:
    ws = _unusable_clone(tmp_path)
    claude_run = claude(prompt, cwd=ws, home=home)
    assert claude_run.rc == 1
    assert claude_run.result["is_error"] is True and claude_run.result["subtype"] == "error_during_execution"
    assert "git commit failed" in claude_run.result["result"]
    codex_run = codex(prompt, cwd=ws, home=home)
    assert codex_run.rc == 1 and codex_run.of("turn.failed"), codex_run.raw[-500:]


def test_nothing_to_commit_is_not_a_failure(repo: Path, home: Path) -> None:
    r = claude("SIM: commit nothing here\nSIM: print fine", cwd=repo, home=home)
    assert r.rc == 0 and r.result["is_error"] is False and r.result["result"] == "fine"
