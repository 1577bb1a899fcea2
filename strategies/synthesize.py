"""synthesize: score candidates, combine the best k into one branch, keep it only when it earns it (docs/strategies.md)."""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any

from orchestrator.strategy import (
    ConfigError,
    Context,
    ImportPolicy,
    RunView,
    TaskInput,
    TaskResult,
    absent_branches,
    finished_run_branches,
    strategy_options,
)

from ._report import synthesize_sections as report_sections  # noqa: F401  (the run report's sections)
from ._report_tasks import report_task  # noqa: F401  (its command tasks in the report)
from ._scoring import (
    DEFAULT_CRITERIA,
    artifact_of,
    branch_of,
    concurrently,
    failure,
    none_scored,
    review_task,
    score_into,
    score_with_repair,
    with_model,
    write_output,
)
from .base_check import run_on_base
from .best_of_n import generation_task
from .branch_cleanup import listed_for_deletion
from .evaluation import fmt_number
from .pipeline import command_task
from .synthesize_provenance import diff_command, provenance, split_diffs


def _prepare(params: dict[str, Any], repo_path: str) -> dict[str, Any]:
    out = dict(params)
    for name in ("n", "k"):
        value = out.get(name, 3)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"synthesize: -S {name} must be a whole number >= 1, got {value!r}")
    branches = out.get("branches") or []
    if not isinstance(branches, list) or not all(isinstance(b, str) and b.strip() for b in branches):
        raise ConfigError('synthesize: -S branches must be a JSON list of branch names, e.g. ["fix-a","fix-b"]')
    if out.get("from_run") and branches:
        raise ConfigError("synthesize: give -S branches or -S from_run, not both")
    approaches = out.get("approaches") or []
    if not all(isinstance(a, str) and a.strip() for a in approaches):
        raise ConfigError("synthesize: -S approaches must be a JSON list of non-empty strings")
    if out.get("from_run"):
        out["branches"] = finished_run_branches(str(out["from_run"]), repo_path)
    elif branches:
        if gone := absent_branches(repo_path, branches):
            raise ConfigError(f"synthesize: -S branches: {gone[0]} is not a branch of {repo_path}")
        out["branches"] = list(dict.fromkeys(branches))
    return out


def synthesis_prompt(prompt: str, base: str, top: list[dict[str, Any]]) -> str:
    listed = "\n".join(
        f"- {r['branch']} (score {r['score']:g}): {(r.get('rationale') or '').strip()[:400]}" for r in top
    )
    return (
        "Role: synthesizer\n\n"
        f"Task:\n{prompt}\n\n"
        f"Several candidate solutions to this task are on these branches, best reviewed first:\n{listed}\n\n"
        f"The current directory is the base branch {base}; every candidate branch is present, so "
        f"`git diff {base}...BRANCH` shows what it changed. Combine the best parts of these candidates "
        "into one solution here: take each good change from the candidate that does it best, reconcile "
        "changes that overlap, and leave out what is wrong or redundant. Then commit the result."
    )


def side_by_side(other: str, **review: Any) -> dict[str, Any]:
    """A reviewer (:func:`review_task` of ``review``) that also has ``other`` present to compare with."""
    task, base = review_task(**review), review["base"]
    lead, _, rest = task["prompt"].partition("\n")
    compare = (
        f"For comparison, another solution to the same task is on branch {other} "
        f"(`git diff {base}...{other}`). Score the work in the current directory on the same 0-10 scale, "
        "judged against that one."
    )
    task["prompt"] = f"Role: reviewer\n\n{lead}\n{compare}\n{rest}"
    task["include_branches"] = list(dict.fromkeys([base, other]))
    return task


@strategy_options(prepare=_prepare)
async def synthesize(
    prompt,
    base_branch,
    ctx: Context,
    *,
    n: Annotated[int, "number of candidates generated (unless branches or from_run is given)"] = 3,
    k: Annotated[int, "how many of the best-scored candidates the synthesizer combines"] = 3,
    branches: Annotated[list, "existing branches to take as the candidates instead of generating them"] = [],  # noqa: B006
    from_run: Annotated[str | None, "take a finished run's branches as the candidates"] = None,
    test_command: Annotated[
        str | None, "shell command run on the synthesis and each top candidate; non-zero: tests failed"
    ] = None,
    model: Annotated[str | None, "model for the candidates; unset: the run's --model"] = None,
    synth_model: Annotated[str | None, "model for the synthesizer; unset: the run's --model"] = None,
    scorer_model: Annotated[str | None, "model for the reviewers; unset: the run's --model"] = None,
    criteria: Annotated[str, "what the reviewer judges"] = DEFAULT_CRITERIA,
    approaches: Annotated[list, "optional hints; candidate i gets approaches[i % len]"] = [],  # noqa: B006
    import_policy: Annotated[ImportPolicy, "branch creation for candidates and the synthesis"] = "auto",
    keep_branches: Annotated[
        bool, "keep the branches it made; false: delete the candidates and synthesis not selected at the end"
    ] = True,
):
    """Score candidates, combine the best k into one branch; it wins only if it tests and scores as well."""
    job = _Job(ctx, prompt, base_branch, criteria, scorer_model, model, import_policy, test_command)
    given = list(branches or [])
    rows, results = await _candidates(job, given, n, approaches)
    scored = sorted((r for r in rows if r.get("status") == "scored"), key=lambda r: (-r["score"], r["index"]))
    record: dict[str, Any] = {
        "strategy_execution_id": ctx.strategy_execution_id,
        "source": "from_run" if from_run else ("branches" if given else "generated"),
        "from_run": from_run,
        "k": k,
        "tie_break": "highest score, then lowest index",
        "test_command": test_command,
        "candidates": rows,
        "top": [],
        "synthesis": None,
        "provenance": [],
        "selected": None,
    }
    if not scored:
        write_output(ctx, "synthesis", "json", record)
        raise none_scored(ctx, rows, "synthesis")
    top = scored[:k]
    record["top"] = [r["label"] for r in top]
    # The top candidates' tests run while the synthesizer works: they do not depend on it.
    waits = {}
    if test_command:
        for r in top:
            waits[r["label"]] = run_on_base(ctx, test_command, r["branch"], ("tests", *r["label"].split("/")))
    synthesis: dict[str, Any] = {"status": "skipped", "branch": None, "tests": None, "score": None}
    record["synthesis"] = synthesis
    if len(top) < 2:
        synthesis["why"] = "nothing to combine: " + (
            "only one candidate could be scored" if len(scored) < 2 else f"k={k} takes only the best candidate"
        )
        synth_result = None
    else:
        synth_result = await _synthesis(job, synthesis, top, synth_model or model, waits)
    tests = await _tests(waits, top)
    # The best single candidate: the top-scored one whose tests pass (when there are tests).
    best = next((r for r in top if not test_command or tests[r["label"]]["passed"]), top[0])
    if synth_result is not None:
        synthesis["tests"] = tests.get("synthesis")
        best_text = (results[best["index"]]["final_message"] or "") if best["index"] in results else ""
        await _compare(job, record, top, synth_result, best, best_text)
    chosen = _select(record, best, results.get(best["index"]), synth_result, test_command)
    if not keep_branches:
        # Only branches this run made: the generated candidates and the synthesis, never given ones.
        ours = [r.get("branch") for r in rows if r.get("key")] + [synthesis.get("branch")]
        selected = record["selected"]["branch"]
        record["delete_branches"] = [b for b in dict.fromkeys(ours) if b and b not in (selected, base_branch)]
    write_output(ctx, "synthesis", "json", record)
    write_output(ctx, "best_branch", "txt", record["selected"]["branch"] + "\n")
    return {**chosen, **{k_: v for k_, v in record.items() if k_ != "strategy_execution_id"}}


async def _tests(waits: dict[str, Any], top: list[dict[str, Any]]) -> dict[str, Any]:
    """Each scheduled test run's outcome by label (in scheduling order), also on its top row."""
    tests: dict[str, Any] = {}
    for label, get in waits.items():
        run = await get()
        tests[label] = {"passed": run.exit_code == 0, "exit_code": run.exit_code, "error": run.error}
        tests[label]["output"] = run.output[-2000:]
    for r in top:
        if r["label"] in tests:
            r["tests"] = tests[r["label"]]
    return tests


@dataclass(frozen=True)
class _Job:
    """What every step of one synthesize execution reads."""

    ctx: Context
    prompt: str
    base: str
    criteria: str
    scorer_model: str | None
    model: str | None
    import_policy: ImportPolicy
    test_command: str | None

    @property
    def review_fields(self) -> dict[str, Any]:
        """What every reviewer of this execution is given alike."""
        return {"prompt": self.prompt, "base": self.base, "criteria": self.criteria, "model": self.scorer_model}


async def _candidates(
    job: _Job, given: list[str], n: int, approaches: list[str]
) -> tuple[list[dict[str, Any]], dict[int, TaskResult]]:
    """Generate ``n`` candidates (or take the ``given`` branches) and score each: their rows and results."""
    ctx = job.ctx
    count = len(given) if given else n
    rows: list[dict[str, Any]] = [{} for _ in range(count)]
    results: dict[int, TaskResult] = {}

    async def review(i: int, branch: str, text: str, key_parts: tuple) -> None:
        task = review_task(subject="one candidate solution", subject_text=text, branch=branch, **job.review_fields)
        task["prompt"] = "Role: reviewer\n\n" + task["prompt"]
        await score_into(ctx, rows[i], task, key_parts)

    async def generated(i: int) -> None:
        key = ctx.key("gen", i)
        label = f"gen/{i}"
        try:
            task = generation_task(job.prompt, approaches, i, job.base, job.import_policy, job.model)
            result = await ctx.wait(ctx.run(task, key=key))
        except ctx.errors.TaskFailed as exc:
            rows[i] = {"index": i, "label": label, "key": key, "status": "failed", "score": None}
            rows[i]["error"] = failure(exc)
            return
        results[i] = result
        rows[i] = {
            "index": i,
            "label": label,
            "key": key,
            "instance_id": result["instance_id"],
            "branch": branch_of(result),
            "commit": result["artifact"].get("commit"),
            "has_changes": result["artifact"]["has_changes"],
        }
        await review(i, branch_of(result), result["final_message"] or "", ("score", result["instance_id"]))

    async def existing(i: int) -> None:
        rows[i] = {"index": i, "label": f"branch/{i}", "branch": given[i], "commit": None}
        note = f"(an existing branch, {given[i]}; there is no agent message: read its diff)"
        await review(i, given[i], note, ("score", f"branch-{i}"))

    one = existing if given else generated
    await concurrently([functools.partial(one, i) for i in range(count)])
    return rows, results


async def _synthesis(
    job: _Job, synthesis: dict[str, Any], top: list[dict[str, Any]], model: str | None, waits: dict[str, Any]
) -> TaskResult | None:
    """The synthesizer's task (``synth``), recorded in ``synthesis``, its tests scheduled into ``waits``; its result
    when it made changes."""
    ctx = job.ctx
    synth_task: TaskInput = {
        "prompt": synthesis_prompt(job.prompt, job.base, top),
        "base_branch": job.base,
        "include_branches": [r["branch"] for r in top],
        "import_policy": job.import_policy,
    }
    try:
        made = await ctx.wait(ctx.run(with_model(synth_task, model), key=ctx.key("synth")))
    except ctx.errors.TaskFailed as exc:
        synthesis.update(status="failed", why=f"the synthesizer failed ({exc.error_type}): {exc.message[:300]}")
        return None
    synth_branch = artifact_of(made).get("branch_final")
    synthesis.update(instance_id=made["instance_id"], branch=synth_branch, commit=artifact_of(made).get("commit"))
    if not synth_branch or not made["artifact"].get("has_changes"):
        synthesis.update(status="no_changes", why="the synthesizer committed no changes")
        return None
    synthesis["status"] = "made"
    if job.test_command:
        waits["synthesis"] = run_on_base(ctx, job.test_command, synth_branch, ("tests", "synthesis"))
    return made


async def _compare(
    job: _Job,
    record: dict[str, Any],
    top: list[dict[str, Any]],
    synth_result: TaskResult,
    best: dict[str, Any],
    best_text: str,
) -> None:
    """Provenance (``diffs``) and the side-by-side review of the synthesis and ``best``, into ``record``."""
    ctx, synthesis = job.ctx, record["synthesis"]
    synth_branch = synthesis["branch"]
    # Provenance and the side-by-side review need only the synthesis: all three run together.
    diff_task = command_task(
        diff_command(job.base, [("synthesis", "HEAD")] + [(r["label"], r["branch"]) for r in top]),
        synth_branch,
    )
    diff_task["include_branches"] = list(dict.fromkeys([job.base, *(r["branch"] for r in top)]))
    diffs_handle = ctx.run(diff_task, key=ctx.key("diffs"))
    side: dict[str, dict[str, Any]] = {}

    async def rescore(which: str, branch: str, other: str, subject: str, text: str) -> None:
        task = side_by_side(other, branch=branch, subject=subject, subject_text=text, **job.review_fields)
        side[which] = await score_with_repair(ctx, task, ("rescore", which))

    synth_subject = "a synthesis of several candidate solutions"
    synth_text = synth_result["final_message"] or ""
    await concurrently(
        [
            functools.partial(rescore, "synthesis", synth_branch, best["branch"], synth_subject, synth_text),
            functools.partial(rescore, "candidate", best["branch"], synth_branch, "one candidate solution", best_text),
        ]
    )
    synthesis["score"] = side["synthesis"]["score"]
    synthesis["rationale"] = side["synthesis"].get("rationale") or side["synthesis"].get("error")
    synthesis["candidate_rescore"] = {
        "label": best["label"],
        "score": side["candidate"]["score"],
        "rationale": side["candidate"].get("rationale") or side["candidate"].get("error"),
    }
    try:
        diffs = split_diffs((await ctx.wait(diffs_handle))["final_message"] or "")
    except ctx.errors.TaskFailed as exc:
        synthesis["provenance_error"] = f"{exc.error_type}: {exc.message[:300]}"
    else:
        record["provenance"] = provenance(
            diffs.get("synthesis", ""), [(r["label"], diffs.get(r["label"], "")) for r in top]
        )


def _select(
    record: dict[str, Any],
    best: dict[str, Any],
    best_result: TaskResult | None,
    synth_result: TaskResult | None,
    test_command: str | None,
) -> dict[str, Any]:
    """Decide between the synthesis and ``best`` into ``record``; the chosen TaskResult (or its branch)."""
    synthesis = record["synthesis"]
    won, why, compared = _decide(synthesis, best, test_command)
    synthesis["selected"] = won
    # The candidate was scored twice: alone (its rank among the candidates) and beside the
    # synthesis. A decision made side by side rests on the second: that is its score from here.
    kept_score = synthesis["candidate_rescore"]["score"] if compared else best["score"]
    if won:
        chosen: dict[str, Any] = dict(synth_result or {})
        record["selected"] = {"which": "synthesis", "branch": synthesis["branch"], "score": synthesis["score"]}
    else:
        chosen = dict(best_result or {"selected_branch": best["branch"]})
        record["selected"] = {"which": best["label"], "branch": best["branch"], "score": kept_score}
    record["why"] = why
    record["verdict"] = verdict_line(record, best, won, why, named_scores=compared)
    return chosen


def _decide(synthesis: dict[str, Any], best: dict[str, Any], test_command: str | None) -> tuple[bool, str, bool]:
    """Whether the synthesis is selected over ``best``, why (one clause), and whether the side-by-side scores decided."""
    label = best["label"]
    if synthesis["status"] != "made":
        return False, synthesis.get("why") or "there is no synthesis", False
    if test_command and not (synthesis.get("tests") or {}).get("passed"):
        t = synthesis.get("tests") or {}
        how = f"exit {t['exit_code']}" if t.get("exit_code") is not None else (t.get("error") or "did not run")
        return False, f"the synthesis failed its tests ({how})", False
    mine, theirs = synthesis.get("score"), (synthesis.get("candidate_rescore") or {}).get("score")
    if mine is None:
        return False, "the side-by-side review could not score the synthesis", False
    if theirs is None:
        return (
            False,
            f"the side-by-side review could not score {label}, so the synthesis is not shown to beat it",
            False,
        )
    if mine < theirs:
        return False, f"the synthesis scored {fmt_number(mine)} < {label}'s {fmt_number(theirs)} side by side", True
    tested = ", tests passed" if test_command else ""
    return True, f"the synthesis scored {fmt_number(mine)} >= {label}'s {fmt_number(theirs)} side by side{tested}", True


def verdict_line(record: dict[str, Any], best: dict[str, Any], won: bool, why: str, *, named_scores: bool) -> str:
    """``synthesis of gen/0, gen/1 selected: ...; hunks: 1 gen/0, 1 new`` or ``gen/0 stays best: ...``; each score
    is named once: when ``why`` gives the side-by-side one (``named_scores``), the first is left out."""
    counts = Counter(r["source"] for r in record["provenance"])
    order = [*record["top"], "new"]  # candidates in rank order, then what the synthesizer wrote
    hunks = ", ".join(f"{counts[src]} {src}" for src in order if src in counts)
    tail = f"; hunks: {hunks}" if hunks else ""
    if won:
        return f"synthesis of {', '.join(record['top'])} selected: {why}{tail}"
    score = "" if named_scores else f" (score {fmt_number(best['score'])})"
    return f"{best['label']} stays best{score}: {why}{tail}"


def branches_to_delete(run: RunView) -> list[str]:
    """After a finished run: what each execution run with ``keep_branches=false`` did not select."""
    return listed_for_deletion(run, "synthesis")
