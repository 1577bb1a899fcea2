"""Simulated coding agent for orchestrator dry runs and tests.

One package that impersonates both ``claude`` (Claude Code, ``-p
--output-format stream-json --verbose``) and ``codex`` (``codex exec --json``).
The persona comes from ``--as claude|codex`` or the basename of argv[0]
(``claude`` / ``codex``); anything else defaults to claude.

It accepts the real CLIs' argument shapes and prints output shaped like the
real CLIs (see the captured transcripts under fixtures/agent-transcripts).

Behaviour is scripted by lines of the form ``SIM: <verb> <args>`` anywhere in
the prompt (other text is ignored):

    SIM: write <path> <text...>       write a file (\\n, \\t, \\\\ escapes; newline added)
    SIM: append <path> <text...>      append to a file (same escapes)
    SIM: edit <path> <old> => <new>   replace the first <old> with <new> (claude: Edit tool; same escapes)
    SIM: commit <message...>          git add -A && git commit -m MESSAGE (a commit git refuses ends
                                      the execution as a failure; nothing to commit, or a read-only
                                      workspace (a review task's), does not)
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
    SIM: bad-output                   with an output schema: answer in prose, now and on every resume
    SIM[tag]: <verb> <args>           only when the prompt has a line "Role: tag", "Node: tag" or "Round: tag"

Without any SIM line the agent is deterministic from sha256(prompt): in a
writable git work tree it writes (or appends a revision line to)
``sim/<8hex>.txt``, naming its task (``$TASK_KEY`` without the run id), and
commits it; the answer is derived from the prompt and the committed work (git's
tree id), so reviewers of different work score it differently. The final
message is a score JSON, an ideas
JSON, a review verdict ``{"verdict": "APPROVE", "issues": []}`` (prompt mentions
verdict and JSON) or a one-line summary depending on the prompt. With an
output schema (claude ``--json-schema``, codex ``--output-schema FILE``) the
answer is a deterministic instance of the schema derived from the same seed
(claude: a ``StructuredOutput`` tool call and ``structured_output`` on the
result line); SIM print lines override it, parsed when they are JSON.

Modules: ``claude`` and ``codex`` (one per persona: argv and output shapes),
``agent`` (the actions), ``answers`` (default and schema answers), ``common``
(output, ids, files, git) and ``main`` (session, steps).

Every execution appends a JSON line {ts, task_key, argv0, session_id, resumed,
prompt_sha256, persona, model, cwd} to ``~/.sim-agent/executions.jsonl`` and,
if set, to the file named by ``$SIM_AGENT_RECORD``. Session totals live in
``~/.sim-agent/sessions/<id>.json``; ratelimit counters in
``~/.sim-agent/ratelimit/``. Stdlib only; Python 3.11. Run it from a checkout with ``python3 docker/sim_agent``.
"""
