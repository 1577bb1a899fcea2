"""Simulated coding agent for orchestrator dry runs and tests: ``claude`` or ``codex``, by ``--as`` or argv[0].

It takes the real CLIs' arguments and prints their output shapes; docs/docker.md
("The simulated agent") lists its ``SIM:`` verbs, its default behaviour and the
files it records. Modules: ``claude`` and ``codex`` (one per persona: argv and
output shapes), ``agent`` (the actions), ``answers`` (default and schema
answers), ``common`` (output, ids, files, git) and ``main`` (session, steps).
Stdlib only; Python 3.11. Run it from a checkout with ``python3 docker/sim_agent``.
"""
