"""Search quality of tree-beam on a synthetic, noisy landscape (writes docs/search-quality.md).

The REAL tree-beam strategy function runs through the engine with the scripted
runner (orchestrator/engine/testing.py); only the agents and the benchmark are
scripted:

- every node offers the same kinds of ideas, in a seeded order: ``good3`` (a true
  +3 % throughput), ``small1`` (+1 %), ``bad2`` (-2 %) and two ``noop`` ideas that
  change nothing;
- a candidate's true throughput is ``100 * prod(1 + effect)`` over the ideas on
  its path; every run of the benchmark returns it times ``1 + noise * N(0, 1)``,
  seeded by the seed, the task key and the run's position, so a search is
  reproducible.

Per setting (noise 0 %, 2 %, 5 %) it runs ``--searches`` seeded searches and
reports: the share of evaluated no-op ideas that were promoted to a node (false
promotion), the share of evaluated +3 % ideas that were promoted, how often the
returned best is the truly best reachable node, the true effect of the returned
best (mean and worst), and the benchmark runs spent per search.

    uv run python bench/search_quality.py --label after --searches 200
    uv run python bench/search_quality.py --write-doc   # docs/search-quality.md from the saved figures

The figures of each label are saved to bench/results/search_quality_<label>.json;
``--write-doc`` puts "before" (main's code) next to "after".
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import anyio
import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from engine_helpers import run_engine  # noqa: E402

from orchestrator.engine.testing import ScriptedRunner, success  # noqa: E402
from strategies.tree_beam import tree_beam  # noqa: E402

EFFECTS = {"good3": 0.03, "small1": 0.01, "bad2": -0.02, "noop": 0.0}
KINDS = ["good3", "small1", "bad2", "noop", "noop"]
ROOT_COMMIT = "a" * 40
PARAMS = {
    "eval_command": "python bench.py",
    "primary_metric": "throughput",
    "direction": "max",
    "ideas_per_node": 5,
    "max_depth": 2,
    "beam_width": 2,
}
RESULTS = ROOT / "bench" / "results"


def _seed(*parts) -> int:
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:15], 16)


def true_value(kinds) -> float:
    return 100.0 * math.prod(1 + EFFECTS[k] for k in kinds)


class Landscape:
    """The scripted agents and benchmark of one search."""

    def __init__(self, seed: int, noise: float) -> None:
        self.seed, self.noise = seed, noise
        self.branch_kinds: dict[str, tuple[str, ...]] = {"main": ()}
        self.head: dict[str, str] = {"main": ROOT_COMMIT}
        self.commit_kinds: dict[str, tuple[str, ...]] = {ROOT_COMMIT: ()}
        self.idea_kind: dict[str, str] = {}
        self.runs = 0

    def sample(self, kinds, *key) -> float:
        self.runs += 1
        rng = random.Random(_seed(self.seed, *key))
        return true_value(kinds) * (1 + self.noise * rng.gauss(0.0, 1.0))

    def _with_commit(self, result, commit):
        return msgspec.structs.replace(result, artifact=msgspec.structs.replace(result.artifact, commit=commit))

    def __call__(self, req):
        if req.plugin_name == "command":
            head = self.head.get(req.base_branch, ROOT_COMMIT)
            kinds = self.branch_kinds.get(req.base_branch, ())
            if req.command.startswith("# orch-measure"):
                spec = json.loads(req.command.splitlines()[0][len("# orch-measure") :])
                lines = []
                for i, (label, ref) in enumerate(spec["runs"]):
                    k = kinds if ref == "HEAD" else self.commit_kinds[ref]
                    line = json.dumps({"metrics": {"throughput": self.sample(k, req.task_key, i)}})
                    lines.append(f"@@orch-run {i} {label} 0 1 {line}")
                return self._with_commit(
                    success(req, final_message="\n".join([*lines, f"@@orch-done {len(lines)}"]), exit_code=0), head
                )
            if req.command.startswith("python bench.py"):
                out = json.dumps({"metrics": {"throughput": self.sample(kinds, req.task_key, 0)}})
                return self._with_commit(success(req, final_message=out, exit_code=0), head)
            return self._with_commit(success(req, final_message="(diff stat)", exit_code=0), head)
        role = re.search(r"^Role: (\w+)", req.prompt, re.M).group(1)
        if role == "ideator":
            node = re.search(r"^Node: (n\d+)", req.prompt, re.M).group(1)
            kinds = list(KINDS)
            random.Random(_seed(self.seed, "ideas", node)).shuffle(kinds)
            ideas = [
                {"title": f"{node} {kind} {j}", "description": f"EFFECT: {kind} ({node}/{j})"}
                for j, kind in enumerate(kinds)
            ]
            return success(req, final_message=json.dumps({"ideas": ideas}), has_changes=False)
        if role in ("planner", "reviewer"):
            return success(req, final_message='{"verdict": "APPROVE", "issues": []}', has_changes=False)
        kind = re.search(r"EFFECT: (\w+)", req.prompt).group(1)
        result = success(req, final_message="done")
        if req.branch_name:
            kinds = (*self.branch_kinds.get(req.base_branch, ()), kind)
            self.branch_kinds[req.branch_name] = kinds
            self.head[req.branch_name] = result.artifact.commit
            self.commit_kinds[result.artifact.commit] = kinds
        return result


def _params(extra: dict) -> dict:
    accepted = inspect.signature(inspect.unwrap(tree_beam)).parameters
    return {k: v for k, v in {**PARAMS, **extra}.items() if k in accepted}


async def one_search(tmp: Path, seed: int, noise: float, extra: dict) -> dict:
    world = Landscape(seed, noise)
    _, state = await run_engine(tmp, tree_beam, ScriptedRunner(world), params=_params(extra))
    s = state.strategies["s1"]
    if s.status != "success":
        raise RuntimeError(f"search {seed} failed: {s.error}")
    res = s.result
    nodes = {n["id"]: n for n in res["tree"]["nodes"]}
    best = nodes[res["best_node"]]
    best_kinds = world.branch_kinds.get(best["branch"], ())
    outcome = {"noop": [0, 0], "good3": [0, 0]}
    for r in res["tree"]["evaluations"]:
        kind = r["idea"]["title"].split()[1]
        # the +3 % idea off the root is the best idea there, so only the gate can stop it (deeper ones
        # may lose to a sibling path's node in the beam, which is the beam's job, not a measuring error)
        if kind == "noop" or (kind == "good3" and r["parent"] == "n0"):
            outcome[kind][0] += 1
            outcome[kind][1] += bool(r.get("promoted_to"))
    depth = PARAMS["max_depth"]
    best_reachable = true_value(["good3"] * depth)
    return {
        "noop": outcome["noop"],
        "good3": outcome["good3"],
        "best_effect": true_value(best_kinds) / 100.0 - 1.0,
        "found_best": abs(true_value(best_kinds) - best_reachable) < 1e-9,
        "runs": world.runs,
    }


async def setting(noise: float, searches: int, extra: dict) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="search-quality-") as tmp:
        for seed in range(searches):
            rows.append(await one_search(Path(tmp) / f"s{seed}", seed, noise, extra))
    noop = [sum(r["noop"][i] for r in rows) for i in (0, 1)]
    good = [sum(r["good3"][i] for r in rows) for i in (0, 1)]
    effects = [r["best_effect"] for r in rows]
    return {
        "noise": noise,
        "searches": searches,
        "false_promotion": noop[1] / noop[0] if noop[0] else None,
        "noop_evaluated": noop[0],
        "good3_promoted": good[1] / good[0] if good[0] else None,
        "good3_evaluated": good[0],
        "found_best": sum(r["found_best"] for r in rows) / len(rows),
        "best_effect_mean": sum(effects) / len(effects),
        "best_effect_min": min(effects),
        "below_base": sum(e < -1e-12 for e in effects),
        "runs_per_search": sum(r["runs"] for r in rows) / len(rows),
    }


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(figures: dict) -> list[str]:
    lines = [
        "| noise | searches | no-op promoted (false promotion) | +3 % idea off the root promoted | truly best found | "
        "returned best: mean true effect | worst true effect | searches returning below base | "
        "benchmark runs per search |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures["settings"]:
        lines.append(
            f"| {_pct(f['noise'])} | {f['searches']} | {_pct(f['false_promotion'])} "
            f"({f['noop_evaluated']} evaluated) | {_pct(f['good3_promoted'])} ({f['good3_evaluated']} evaluated) | "
            f"{_pct(f['found_best'])} | {100 * f['best_effect_mean']:+.2f}% | {100 * f['best_effect_min']:+.2f}% | "
            f"{f['below_base']} | {f['runs_per_search']:.1f} |"
        )
    return lines


EVOLVE_MARK = "<!-- evolve section: written by the evolve bench (h17b); tree-beam's bench leaves it alone -->"


def write_doc() -> Path:
    doc = ROOT / "docs" / "search-quality.md"
    before = json.loads((RESULTS / "search_quality_before.json").read_text())
    after = json.loads((RESULTS / "search_quality_after.json").read_text())
    evolve = "## evolve\n\n(Not measured here yet.)\n"
    if doc.exists() and EVOLVE_MARK in doc.read_text():
        evolve = doc.read_text().split(EVOLVE_MARK, 1)[1].strip() + "\n"
    text = "\n".join(
        [
            "# Search quality on noisy benchmarks",
            "",
            "How often the search strategies promote changes that do nothing, find real improvements, and return",
            'a "best" that is truly better than the base, on a synthetic landscape whose true effects are known.',
            "Regenerate with:",
            "",
            "```",
            "uv run python bench/search_quality.py --label after --searches 200",
            "uv run python bench/search_quality.py --write-doc",
            "```",
            "",
            "## tree-beam",
            "",
            "Landscape (bench/search_quality.py): every node offers five ideas in a seeded order: one true +3 %,",
            "one +1 %, one -2 % and two no-ops. Each benchmark run returns the true throughput times",
            "`1 + noise * N(0, 1)`. Search: `ideas_per_node=5 max_depth=2 beam_width=2`; the truly best reachable",
            'node is +3 % twice (+6.09 %). "Promoted" means the idea became a node of the tree.',
            "",
            f"### Before (main's code, {before['commit']})",
            "",
            f"Parameters: `{json.dumps(before['params'])}`",
            "",
            *table(before),
            "",
            f"### After ({after['commit']})",
            "",
            f"Parameters: `{json.dumps(after['params'])}` (the defaults otherwise)",
            "",
            *table(after),
            "",
            "Targets at 2 % noise: false promotion <= 5 %, a true +3 % idea promoted >= 90 %, the returned best never",
            'below the base. At 0 % noise a no-op that changes nothing passes the strict "no regression" gate',
            "(its interval is tight and its change is exactly 0), as the design intends; it is only promoted when the",
            "beam has room left after the real improvements.",
            "",
            "Reading the figures:",
            "",
            "- *No-op promoted* is the share of evaluated no-op ideas that became a node. Before, a no-op that got a",
            "  lucky run was promoted, and its children were then judged against that lucky number (the winner's",
            "  curse), which is why fewer true +3 % ideas were promoted and the returned best was sometimes below the",
            "  base. After, a no-op has to look better in screening *and* have its whole paired interval above zero.",
            "- *+3 % idea off the root promoted* counts only the +3 % idea at depth 1, where it is the best idea on",
            "  offer, so only the measurement can stop it (deeper +3 % ideas may lose their beam slot to a better path).",
            "- At 5 % noise a +3 % change is smaller than what 10 paired runs can tell from luck at 90 % confidence,",
            "  so the search is conservative: it promotes little and returns the base rather than a guess. Raise",
            "  `confirm_pairs` (the interval narrows with its square root) when the benchmark is that noisy.",
            "- The price is benchmark runs: about ten times as many per search with the defaults",
            "  (`eval_repeats=3`, `confirm_pairs=10`, docs/tree-beam.md has the table). Agent tasks (the expensive",
            "  part of a real search) are the same.",
            "",
            EVOLVE_MARK,
            "",
            evolve,
        ]
    )
    doc.write_text(text, "utf-8")
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="after", help="saved as bench/results/search_quality_<label>.json")
    ap.add_argument("--searches", type=int, default=200)
    ap.add_argument("--noise", default="0,0.02,0.05", help="comma-separated relative noise levels")
    ap.add_argument("--param", action="append", default=[], help="extra tree-beam parameter NAME=JSON")
    ap.add_argument("--write-doc", action="store_true", help="write docs/search-quality.md from saved figures")
    args = ap.parse_args(argv)
    if args.write_doc:
        print(write_doc())
        return 0
    extra = {}
    for item in args.param:
        name, _, value = item.partition("=")
        extra[name] = json.loads(value)
    import subprocess

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    figures = {"label": args.label, "commit": commit, "params": _params(extra), "settings": []}
    for noise in (float(x) for x in args.noise.split(",")):
        t = time.monotonic()
        figures["settings"].append(anyio.run(setting, noise, args.searches, extra))
        print(json.dumps(figures["settings"][-1]), f"({time.monotonic() - t:.0f}s)", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"search_quality_{args.label}.json").write_text(json.dumps(figures, indent=2) + "\n")
    print("\n".join(table(figures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
