"""Scenario texts that several strategy test files run: goals files, benchmark scripts and the tree-beam run
worked out by hand in test_tree_beam_docker.py (the report tests run the same scenarios through the command)."""

from __future__ import annotations

import json

# The goal every evolve scenario starts from: it passes on the base and a fix must not break it.
KEEP_GOAL_YAML = """\
version: 1
goals:
  - id: keep
    description: keep.txt stays
    check: test -f keep.txt
    weight: 1
"""

# A benchmark whose throughput depends on which of these files exist; each scenario prints ``t`` its own way.
GAINS_BENCH = """import json, os
t = 100
for name, gain in (("fast.txt", 20), ("faster.txt", 25), ("slow.txt", -30)):
    if os.path.exists(name):
        t += gain
"""

BENCH = GAINS_BENCH + 'print(json.dumps({"metrics": {"throughput": t}, "expected": 3, "ok": 3}))\n'


def idea(title, path):
    return {"title": title, "description": f"SIM[coder]: write {path} 1\nSIM[coder]: commit {title}"}


GOAL = (
    "make the solver faster\n"
    f"SIM[n0]: print-json {json.dumps({'ideas': [idea('fast path', 'fast.txt'), idea('slow path', 'slow.txt')]})}\n"
    f"SIM[n1]: print-json {json.dumps({'ideas': [idea('faster path', 'faster.txt'), idea('notes', 'notes.txt')]})}\n"
)

# The tree-beam settings every scenario spells out the same way (each adds its benchmark, width and depth).
TREE_BEAM_FIXED = {
    "direction": "max",
    "weights": {},
    "tolerance": 0.01,
    "max_total_evals": None,
    "keep_rejected": False,
    "ideas_context": "node_plus_ancestors",
    "dedupe_scope": "path",
    "max_review_rounds": 0,
    "test_command": None,
    "eval_timeout_s": None,
}

PARAMS = {
    "eval_command": "python3 bench.py",
    "primary_metric": "throughput",
    **TREE_BEAM_FIXED,
    "ideas_per_node": 2,
    "max_depth": 2,
    "beam_width": 1,
}


GOALS_YAML = (
    KEEP_GOAL_YAML
    + """\
  - id: c1
    description: |
      add c1.txt
      SIM: write c1.txt ok
      SIM: write shared.txt one
      SIM: commit fix c1
    check: test -f c1.txt
    weight: 9
  - id: c2
    description: |
      add c2.txt
      SIM: write c2.txt ok
      SIM: write shared.txt two
      SIM: commit fix c2
    check: test -f c2.txt
    weight: 8
"""
)


STUCK_YAML = """\
version: 1
goals:
  - id: stuck
    description: |
      make stuck pass (its check looks for a file no fix writes)
      SIM: write stuck_try.txt tried
      SIM: commit try stuck
    check: test -f never_written.txt
    weight: 9
  - id: other
    description: |
      add other.txt
      SIM: write other.txt ok
      SIM: commit fix other
    check: test -f other.txt
    weight: 5
"""


# synthesize's scenario (test_synthesize_docker.py tells it): calc.py has two bugs; candidate 0 (``Role: fixadd``)
# fixes add, candidate 1 (``Role: fixmul``) fixes mul, each reviewer answers 7, and the synthesizer applies every
# candidate branch present in its workspace. Neither candidate passes TESTS; the synthesis does.
CALC = (
    "def add(a, b):\n    return a - b\n\n\n"
    "def unused_one():\n    return 1\n\n\n"
    "def unused_two():\n    return 2\n\n\n"
    "def mul(a, b):\n    return a * b + 1\n"
)
TESTS = 'python3 -c "import calc; assert calc.add(2, 3) == 5 and calc.mul(2, 3) == 6"'
CANDIDATES = (
    "Fix the bugs in calc.py\n"
    "SIM[fixadd]: edit calc.py return a - b => return a + b\n"
    "SIM[fixadd]: commit fix add\n"
    "SIM[fixmul]: edit calc.py return a * b + 1 => return a * b\n"
    "SIM[fixmul]: commit fix mul\n"
    'SIM[reviewer]: print-json {"score": 7, "rationale": "does its part"}\n'
)
# Every local branch but the checked-out one is a candidate the strategy made present.
APPLY_ALL = (
    "SIM[synthesizer]: exec cur=$(git rev-parse --abbrev-ref HEAD); "
    "for b in $(git for-each-ref --format='%(refname:short)' refs/heads/); do "
    '[ "$b" = "$cur" ] || [ "$b" = main ] || git diff "main...$b" | git apply || exit 1; done\n'
)
GOOD_SYNTH = APPLY_ALL + "SIM[synthesizer]: write NOTES.md both fixes combined\nSIM[synthesizer]: commit combine\n"
BROKEN_SYNTH = APPLY_ALL + (
    "SIM[synthesizer]: edit calc.py return a + b => return a + b + 1\nSIM[synthesizer]: commit combine badly\n"
)
APPROACHES = ["-S", 'approaches=["Role: fixadd", "Role: fixmul"]']
