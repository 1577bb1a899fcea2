"""How evolve holds up on noisy goals: the real strategy through the engine, on a synthetic goal set.

    uv run python bench/search_quality_evolve.py [--runs 200] [--before-ref REF] [--write-doc]

Every run drives ``strategies.evolve.evolve`` through the real engine with the
in-process scripted runner (orchestrator/engine/testing.py). The runner keeps a
model repository in which a branch is the set of fixes merged into it; checks,
fixes and merges are answered from that model, so the strategy's decisions
have real consequences. Each run is seeded; the seed picks weights, the flaky
check and its failure rate, and every flaky check's outcome (a hash of the
seed and the task key, so a replay measures the same thing).

Three scenarios:

- **flaky**: 3 goals pass from the start, one of them flaky (fails 10-30 % of
  its runs, whatever the code); 3 goals fail and each has an innocent fix; one
  more failing goal has a culprit fix that also breaks a passing goal for real.
  Figures: how often an innocent fix is blamed, and quarantined; how often the
  culprit's breakage is kept out; goals passing at the end; check runs and
  agent tasks spent.
- **idle-heaviest**: the 1-2 heaviest failing goals have an agent that never
  changes anything; 2-4 lighter goals are fixable. ``max_parallel`` is 1 or 2.
  Figures: how often every lighter goal ends fixed, the share of lighter goals
  fixed, check runs and agent tasks.
- **quota**: the agent API refuses every fix task of the first 1-3 cycles
  (quota exhausted), then works; three goals are fixable. Figures: how often
  every goal ends fixed, and the tasks spent. (The retry pause is set to 0 s
  so the bench does not sleep; a parameter the "before" code does not know is
  not passed to it.)

The flaky scenario is also run with ``recheck=2``, to show what one more
re-run buys and costs.

``--before-ref`` (default ``main``) measures the same scenarios with that
commit's ``strategies/`` package (extracted with ``git archive`` and run in a
subprocess), so the figures compare before and after on identical seeds.
``--write-doc`` replaces the section between ``<!-- evolve:begin -->`` and
``<!-- evolve:end -->`` in docs/search-quality.md (creating the file if needed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "search-quality.md"
BEGIN, END = "<!-- evolve:begin -->", "<!-- evolve:end -->"


# ---------------------------------------------------------------- the synthetic world


def _unit(*parts) -> float:
    """A deterministic number in [0, 1) from the parts (seeded noise that a replay reproduces)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Scenario:
    """Goals, and what each fix does, as plain data: ``fixes[gid]`` is None (agent changes nothing) or the
    set of goals the fix makes pass plus the set it breaks."""

    def __init__(self, name: str, seed: int) -> None:
        self.name, self.seed = name, seed
        self.goals: list[dict] = []
        self.passes_initially: set[str] = set()
        self.fixes: dict[str, tuple[frozenset, frozenset] | None] = {}
        self.flaky: dict[str, float] = {}
        self.params: dict = {}
        self.innocent: set[str] = set()
        self.culprit: str | None = None
        self.broken_by_culprit: str | None = None
        self.idle: set[str] = set()
        self.lighter: set[str] = set()
        self.quota_cycles = 0

    def goal(self, gid: str, weight: float) -> None:
        self.goals.append({"id": gid, "description": f"goal {gid}", "check": f"./checks/{gid}.sh", "weight": weight})


def flaky_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    s = Scenario("flaky", seed)
    for gid in ("ok-a", "ok-b", "ok-c"):
        s.goal(gid, rng.uniform(1, 3))
        s.passes_initially.add(gid)
    flaky = rng.choice(["ok-a", "ok-b", "ok-c"])
    s.flaky[flaky] = rng.uniform(0.10, 0.30)
    s.broken_by_culprit = rng.choice([g for g in ("ok-a", "ok-b", "ok-c") if g != flaky])
    for gid in ("fix-a", "fix-b", "fix-c"):
        s.goal(gid, rng.uniform(4, 9))
        s.fixes[gid] = (frozenset({gid}), frozenset())
        s.innocent.add(gid)
    s.goal("culprit", rng.uniform(4, 9))
    s.fixes["culprit"] = (frozenset({"culprit"}), frozenset({s.broken_by_culprit}))
    s.culprit = "culprit"
    s.params = {"max_parallel": rng.choice([1, 2, 3])}
    return s


def quota_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    s = Scenario("quota", seed)
    s.goal("ok", 1)
    s.passes_initially.add("ok")
    for i in range(3):
        gid = f"goal-{i}"
        s.goal(gid, rng.uniform(2, 9))
        s.fixes[gid] = (frozenset({gid}), frozenset())
    s.quota_cycles = rng.choice([1, 2, 3])
    s.params = {"max_parallel": rng.choice([1, 2, 3]), "retry_backoff_s": 0}
    return s


def idle_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    s = Scenario("idle-heaviest", seed)
    s.goal("ok", 1)
    s.passes_initially.add("ok")
    for i in range(rng.choice([1, 2])):
        gid = f"idle-{i}"
        s.goal(gid, rng.uniform(8, 10))
        s.fixes[gid] = None
        s.idle.add(gid)
    for i in range(rng.choice([2, 3, 4])):
        gid = f"light-{i}"
        s.goal(gid, rng.uniform(2, 7))
        s.fixes[gid] = (frozenset({gid}), frozenset())
        s.lighter.add(gid)
    s.params = {"max_parallel": rng.choice([1, 2])}
    return s


class World:
    """The scripted runner's answers: a branch is the set of fixes it contains."""

    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        self.branches: dict[str, frozenset] = {"main": frozenset()}
        self.checks = 0
        self.agents = 0
        self.tasks = 0

    def passing(self, fixes: frozenset) -> set[str]:
        ok = set(self.s.passes_initially)
        for gid in sorted(fixes):
            made, _broke = self.s.fixes[gid]
            ok |= made
        for gid in sorted(fixes):
            ok -= self.s.fixes[gid][1]
        return ok

    def __call__(self, req):
        from orchestrator.engine.testing import success

        self.tasks += 1
        parts = req.task_key.split("/")[2:]
        if getattr(req, "delete_branches", ()):
            for name in req.delete_branches:
                self.branches.pop(name, None)
            return success(
                req, final_message="".join(f"@@branch deleted: {n}\n" for n in req.delete_branches), has_changes=False
            )
        if req.plugin_name == "command" and req.import_policy == "never":
            self.checks += 1
            gid = parts[-1]
            fixes = self.branches[req.base_branch]
            ok = gid in self.passing(fixes)
            p = self.s.flaky.get(gid)
            if ok and p is not None and _unit(self.s.seed, req.task_key) < p:
                ok = False  # the flaky check fails whatever the code
            head = hashlib.sha1(",".join(sorted(fixes)).encode()).hexdigest()
            return success(
                req,
                has_changes=False,
                final_message=f"{gid}: {'ok' if ok else 'FAILED'}\n@@evolve stderr\n\n"
                f"@@evolve end exit={0 if ok else 1} head={head}\n",
            )
        if req.plugin_name == "command":  # a merge
            head = set(self.branches[req.base_branch])
            lines = []
            for b in req.include_branches:
                head |= self.branches[b]
                lines.append(f"@@evolve merged {b}")
            self.branches[req.branch_name] = frozenset(head)
            return success(req, final_message="\n".join(lines) + "\n")
        self.agents += 1
        gid = parts[-1]
        if parts[0] == "c" and int(parts[1]) <= self.s.quota_cycles:
            from orchestrator.engine.testing import failure

            return failure(req, error_type="api", message="429: quota exhausted, try again later")
        if self.s.fixes.get(gid) is None:
            return success(req, final_message="I looked but found nothing to change.", has_changes=False)
        self.branches[req.branch_name] = self.branches[req.base_branch] | {gid}
        return success(req, final_message=f"fixed {gid}")


# ---------------------------------------------------------------- running one variant


async def run_one(scenario: Scenario, tmp: Path, extra: dict | None = None) -> dict:
    import inspect

    from orchestrator.engine.engine import Engine, EngineConfig
    from orchestrator.engine.testing import ScriptedRunner
    from strategies.evolve import evolve

    known = inspect.signature(inspect.unwrap(evolve)).parameters
    params = {k: v for k, v in {**scenario.params, **(extra or {})}.items() if k in known}

    world = World(scenario)
    cfg = EngineConfig(
        run_id="run_b",
        repo_path=str(tmp),
        logs_dir=str(tmp / "logs"),
        state_dir=str(tmp / "state"),
        results_dir=str(tmp / "results"),
    )
    engine = Engine(cfg, ScriptedRunner(world))
    state = await engine.run(evolve, prompt="keep the project healthy", params={"goals": scenario.goals, **params})
    s = state.strategies["s1"]
    if s.status != "success":
        raise RuntimeError(f"{scenario.name} seed {scenario.seed}: {s.error}")
    result = s.result
    history = result["history"]
    blamed = {g for e in history for g in e.get("blamed", [])}
    final = world.branches.get(result["final_branch"], frozenset()) if result["final_branch"] != "main" else frozenset()
    passing_end = world.passing(final)
    out = {
        "checks": world.checks,
        "agents": world.agents,
        "tasks": world.tasks,
        "cycles": len(history),
        "passing_end": len(passing_end),
        "goals": len(scenario.goals),
    }
    if scenario.name == "flaky":
        out["innocent_blamed"] = bool(blamed & scenario.innocent)
        out["innocent_quarantined"] = bool(set(result["quarantined"]) & scenario.innocent)
        out["innocent_fixed"] = len(scenario.innocent & passing_end) / len(scenario.innocent)
        out["culprit_kept_out"] = scenario.broken_by_culprit in passing_end
    elif scenario.name == "quota":
        fixable = {g["id"] for g in scenario.goals} - scenario.passes_initially
        out["all_fixed"] = fixable <= passing_end
    else:
        fixed = scenario.lighter & passing_end
        out["all_lighter_fixed"] = fixed == scenario.lighter
        out["lighter_fixed"] = len(fixed) / len(scenario.lighter)
    return out


SCENARIOS = (
    ("flaky", flaky_scenario, None),
    ("idle-heaviest", idle_scenario, None),
    ("quota", quota_scenario, None),
    ("flaky-recheck-2", flaky_scenario, {"recheck": 2}),
)


def run_variant(runs: int, first_seed: int, names: tuple[str, ...]) -> dict:
    import anyio

    async def main() -> dict:
        results: dict[str, list[dict]] = {name: [] for name in names}
        with tempfile.TemporaryDirectory(prefix="sq-evolve-") as d:
            for i in range(runs):
                seed = first_seed + i
                for name, make, extra in SCENARIOS:
                    if name not in names:
                        continue
                    tmp = Path(d) / f"{name}-{seed}"
                    tmp.mkdir()
                    results[name].append(await run_one(make(seed), tmp, extra))
        return results

    return anyio.run(main)


def summarize(results: dict[str, list[dict]]) -> dict:
    def rate(rows, key):
        return sum(1 for r in rows if r[key]) / len(rows)

    def mean(rows, key):
        return statistics.fmean(r[key] for r in rows)

    def common(rows):
        return {
            "runs": len(rows),
            "checks": mean(rows, "checks"),
            "agents": mean(rows, "agents"),
            "tasks": mean(rows, "tasks"),
            "cycles": mean(rows, "cycles"),
        }

    out = {}
    for name, rows in results.items():
        if name.startswith("flaky"):
            out[name] = {
                **common(rows),
                "innocent_blamed": rate(rows, "innocent_blamed"),
                "innocent_quarantined": rate(rows, "innocent_quarantined"),
                "innocent_fixed": mean(rows, "innocent_fixed"),
                "culprit_kept_out": rate(rows, "culprit_kept_out"),
            }
        elif name == "quota":
            out[name] = {**common(rows), "all_fixed": rate(rows, "all_fixed")}
        else:
            out[name] = {
                **common(rows),
                "all_lighter_fixed": rate(rows, "all_lighter_fixed"),
                "lighter_fixed": mean(rows, "lighter_fixed"),
            }
    return out


def run_before(ref: str, runs: int, first_seed: int) -> dict:
    """The same scenarios with ``ref``'s strategies package, in a subprocess (two ``strategies`` cannot share one)."""
    with tempfile.TemporaryDirectory(prefix="sq-evolve-before-") as d:
        archive = subprocess.run(["git", "archive", ref, "strategies"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", d], input=archive.stdout, check=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([d, str(ROOT)]))
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--variant-json",
                "--runs",
                str(runs),
                "--seed",
                str(first_seed),
                "--scenarios",
                "flaky,idle-heaviest,quota",
            ],
            cwd=d,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"the 'before' run with {ref} failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the report


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def section(before: dict, after: dict, ref: str, runs: int, first_seed: int, sha: str) -> str:
    fb, fa, f2 = before["flaky"], after["flaky"], after["flaky-recheck-2"]
    ib, ia = before["idle-heaviest"], after["idle-heaviest"]
    qb, qa = before["quota"], after["quota"]
    lines = [
        BEGIN,
        "## evolve",
        "",
        "Measured with `uv run python bench/search_quality_evolve.py --runs "
        f"{runs} --before-ref {ref} --write-doc`: the real evolve strategy through the engine with the scripted "
        f"runner, {runs} seeded runs per scenario (seeds {first_seed}..{first_seed + runs - 1}), default "
        'parameters except `max_parallel`. "Before" is the strategy at '
        f"`{ref}` (commit {sha}), on the same seeds.",
        "",
        "**A flaky check.** Three goals pass from the start; one of them is flaky and fails 10-30 % of its "
        "runs whatever the code. Three failing goals have innocent fixes; one more has a fix that really "
        "breaks a passing goal. `max_parallel` is 1, 2 or 3.",
        "",
        "| | before | after (`recheck=1`, the default) | after, `recheck=2` |",
        "|---|---|---|---|",
        f"| runs in which an innocent fix was blamed for a regression | {_pct(fb['innocent_blamed'])} | "
        f"{_pct(fa['innocent_blamed'])} | {_pct(f2['innocent_blamed'])} |",
        f"| runs in which an innocent goal was quarantined | {_pct(fb['innocent_quarantined'])} | "
        f"{_pct(fa['innocent_quarantined'])} | {_pct(f2['innocent_quarantined'])} |",
        f"| innocent goals fixed at the end | {_pct(fb['innocent_fixed'])} | {_pct(fa['innocent_fixed'])} | "
        f"{_pct(f2['innocent_fixed'])} |",
        f"| runs in which the real breakage was kept out | {_pct(fb['culprit_kept_out'])} | "
        f"{_pct(fa['culprit_kept_out'])} | {_pct(f2['culprit_kept_out'])} |",
        f"| check runs per run (mean) | {fb['checks']:.1f} | {fa['checks']:.1f} | {f2['checks']:.1f} |",
        f"| agent tasks per run (mean) | {fb['agents']:.1f} | {fa['agents']:.1f} | {f2['agents']:.1f} |",
        f"| cycles per run (mean) | {fb['cycles']:.1f} | {fa['cycles']:.1f} | {f2['cycles']:.1f} |",
        "",
        "**An idle heaviest goal.** The one or two heaviest failing goals have an agent that never changes "
        "anything; two to four lighter goals are fixable. `max_parallel` is 1 or 2.",
        "",
        "| | before | after |",
        "|---|---|---|",
        f"| runs in which every lighter goal got fixed | {_pct(ib['all_lighter_fixed'])} | "
        f"{_pct(ia['all_lighter_fixed'])} |",
        f"| lighter goals fixed | {_pct(ib['lighter_fixed'])} | {_pct(ia['lighter_fixed'])} |",
        f"| check runs per run (mean) | {ib['checks']:.1f} | {ia['checks']:.1f} |",
        f"| agent tasks per run (mean) | {ib['agents']:.1f} | {ia['agents']:.1f} |",
        f"| cycles per run (mean) | {ib['cycles']:.1f} | {ia['cycles']:.1f} |",
        "",
        "**Quota exhausted.** The agent API refuses every fix task of the first one to three cycles, then "
        "works; three goals are fixable. `max_parallel` is 1, 2 or 3; the retry pause is 0 s here "
        "(60 s, doubling, by default).",
        "",
        "| | before | after |",
        "|---|---|---|",
        f"| runs in which every goal got fixed | {_pct(qb['all_fixed'])} | {_pct(qa['all_fixed'])} |",
        f"| check runs per run (mean) | {qb['checks']:.1f} | {qa['checks']:.1f} |",
        f"| agent tasks per run, refused ones included (mean) | {qb['agents']:.1f} | {qa['agents']:.1f} |",
        f"| cycles per run (mean) | {qb['cycles']:.1f} | {qa['cycles']:.1f} |",
        "",
        "What changed: a check that newly fails on a wave is run again (`recheck`, default 1) before it "
        "counts as a regression, which costs one check run per suspect; and a goal whose agent changed "
        "nothing is set aside until the base moves, and then ranked after the others, so the wave goes "
        "to the next failing goals instead of ending the run; a wave whose every fix task failed is "
        "retried after a pause instead of ending the run. The extra check runs and agent tasks in the "
        "last two tables are the remaining goals being fixed. These are figures, not assertions; see "
        "docs/evolve.md.",
        END,
    ]
    return "\n".join(lines) + "\n"


def write_doc(text: str) -> None:
    current = DOC.read_text("utf-8") if DOC.exists() else "# Search quality\n"
    start, end = current.find(BEGIN), current.find(END)
    if start != -1 and end != -1:
        current = current[:start] + text + current[end + len(END) :].lstrip("\n")
    else:
        current = current.rstrip("\n") + "\n\n" + text
    DOC.write_text(current, "utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="seeded runs per scenario (default 200)")
    ap.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    ap.add_argument("--before-ref", default="main", help="git ref whose strategies/ is 'before' (default main)")
    ap.add_argument("--write-doc", action="store_true", help="replace the evolve section of docs/search-quality.md")
    ap.add_argument("--variant-json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scenarios", default=",".join(name for name, _, _ in SCENARIOS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")
    if args.variant_json:
        print(json.dumps(summarize(run_variant(args.runs, args.seed, tuple(args.scenarios.split(","))))))
        return
    sys.path.insert(0, str(ROOT))
    before = run_before(args.before_ref, args.runs, args.seed)
    after = summarize(run_variant(args.runs, args.seed, tuple(name for name, _, _ in SCENARIOS)))
    sha = subprocess.run(
        ["git", "rev-parse", "--short", args.before_ref], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    text = section(before, after, args.before_ref, args.runs, args.seed, sha)
    print(text)
    if args.write_doc:
        write_doc(text)


if __name__ == "__main__":
    main()
