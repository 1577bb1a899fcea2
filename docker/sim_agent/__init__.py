"""Simulated coding agent for orchestrator dry runs and tests.

One package that impersonates both ``claude`` (Claude Code, ``-p
--output-format stream-json --verbose``) and ``codex`` (``codex exec --json``),
chosen by ``--as claude|codex`` or the basename of argv[0] (anything else is
claude). It accepts the real CLIs' argument shapes and prints their output
shapes (see the captured transcripts under fixtures/agent-transcripts).
``SIM: <verb> <args>`` lines in the prompt script it; without them its work
and answer are deterministic from the prompt. docs/docker.md ("The simulated
agent") lists the verbs, the default behaviour and the files it records.

Modules: ``claude`` and ``codex`` (one per persona: argv and output shapes),
``agent`` (the actions), ``answers`` (default and schema answers), ``common``
(output, ids, files, git) and ``main`` (session, steps). Stdlib only; Python
3.11. Run it from a checkout with ``python3 docker/sim_agent``.
"""
