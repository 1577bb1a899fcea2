"""tree-beam's scripted world: a candidate branch carries the features of its path and the benchmark reports
throughput = 100 + the sum of its features' effects (``FEATURE: X`` ideas). test_tree_beam.py and
test_tree_beam_noise.py run the strategy against it through the real engine."""

from __future__ import annotations

import json
import re

import msgspec
from engine_helpers import run_engine
from scenarios import TREE_BEAM_FIXED

from orchestrator.engine.testing import ScriptedRunner, failure, success
from strategies.tree_beam import tree_beam

EFFECT = {"A": 20, "T": 20, "C": -5, "INC": 50, "B": 10, "FAILIMPL": 0, "NANREC": 2, "D": 0.5, "FAILEVAL": 0}
IDEAS = {"n0": ["A", "T", "C", "INC"], "n1": ["B", "FAILIMPL", "NANREC", "A"], "n2": ["D", "FAILEVAL", "B"]}
APPROVE = '{"verdict": "APPROVE", "issues": []}'


ROOT_COMMIT = "f" * 40


def with_commit(result, commit):
    return msgspec.structs.replace(result, artifact=msgspec.structs.replace(result.artifact, commit=commit))


def bench_line(feats) -> tuple[int, str]:
    """(exit code, last stdout line) of one benchmark run on a branch with ``feats``."""
    if "FAILEVAL" in feats:
        return 2, "Traceback: bench crashed"
    out: dict = {"metrics": {"throughput": 100 + sum(EFFECT[f] for f in sorted(feats))}}
    if "INC" in feats:
        out.update(expected=10, ok=9)
    if "NANREC" in feats:
        out["recommendation"] = {"should_explore": True, "grade": "promising", "score": None, "reasons": []}
    return 0, json.dumps(out)


def measure_spec(req):
    """The runs a measurement task asks for (its first line), or None for other commands."""
    first = req.command.splitlines()[0]
    return json.loads(first[len("# orch-measure ") :]) if first.startswith("# orch-measure ") else None


class World:
    def __init__(self, ideas=IDEAS, garbage_first=("n2",)):
        self.ideas, self.garbage_first = ideas, garbage_first
        self.features: dict[str, frozenset] = {"main": frozenset()}
        self.head: dict[str, str] = {"main": ROOT_COMMIT}
        self.at_commit: dict[str, frozenset] = {ROOT_COMMIT: frozenset()}

    def run_line(self, i, label, feats) -> str:
        code, last = bench_line(feats)
        return f"@@orch-run {i} {label} {code} {1 if code == 0 else 2} {last}"

    def __call__(self, req):
        key = req.task_key.split("/s1/")[1]
        if req.plugin_name == "command":
            head = self.head.get(req.base_branch, ROOT_COMMIT)
            spec = measure_spec(req)
            if spec is not None:
                feats = self.features[req.base_branch]
                lines = [
                    self.run_line(i, label, feats if ref == "HEAD" else self.at_commit[ref])
                    for i, (label, ref) in enumerate(spec["runs"])
                ]
                tail = ["| bench", f"| {bench_line(feats)[1]}"]
                return with_commit(
                    success(req, final_message="\n".join(lines + tail + [f"@@orch-done {len(lines)}"]), exit_code=0),
                    head,
                )
            return with_commit(
                success(req, final_message=f"output of {req.command[:20]} on {req.base_branch}", exit_code=0), head
            )
        role = re.search(r"^Role: (\w+)", req.prompt, re.M).group(1)
        if role == "ideator":
            node = re.search(r"^Node: (n\d+)", req.prompt, re.M).group(1)
            if node in self.garbage_first and key.endswith("attempt-1"):
                return success(req, final_message="Here are some thoughts: make it faster.", has_changes=False)
            ideas = [{"title": f"idea {f}", "description": f"FEATURE: {f}"} for f in self.ideas.get(node, [])]
            return success(req, final_message=json.dumps({"ideas": ideas}), has_changes=False)
        if role == "planner":
            return success(req, final_message="plan", has_changes=False)
        if role == "reviewer":
            return success(req, final_message=APPROVE, has_changes=False)
        feature = re.search(r"FEATURE: (\w+)", req.prompt).group(1)
        if feature == "FAILIMPL":
            return failure(req, error_type="agent", message="model refused")
        self.features[req.branch_name] = self.features[req.base_branch] | {feature}
        result = success(req, final_message="done")
        self.head[req.branch_name] = result.artifact.commit
        self.at_commit[result.artifact.commit] = self.features[req.branch_name]
        return result


BASE = {
    "eval_command": "python bench.py --json",
    "primary_metric": "throughput",
    **TREE_BEAM_FIXED,
    "ideas_per_node": 4,
    "max_depth": 2,
    "beam_width": 2,
    # one run per candidate and the smallest paired confirmation: the scripted benchmark has no noise
    "eval_repeats": 1,
    "confirm_pairs": 2,
}


async def run(tmp_path, world=None, runner=None, **params):
    runner = runner or ScriptedRunner(world or World())
    engine, state = await run_engine(tmp_path, tree_beam, runner, params={**BASE, **params})
    return engine, state, runner


def evals(result):
    return {r["id"]: r for r in result["tree"]["evaluations"]}
