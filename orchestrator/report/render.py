"""Render the report's HTML from the gathered run data and strategy sections, and write it."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import msgspec
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer

from ..log.runs import RunDirs, RunManifest
from ..log.state import RunState, recover, run_outcome, write_snapshot_bytes

if TYPE_CHECKING:
    from ..strategy import StrategyHooks
from ..sanitize import default_sanitizer
from .cards import SCRIPT_NOTE, task_card
from .charts import line_chart_svg, timeline_svg
from .data import RUN_DIFF_HTML_BUDGET, collect_diffs, gather, left_out
from .sections import InvalidSection, Section, commits_of, validate
from .selection import UNFINISHED, claims, fmt_duration, selection, unheld_branches, verdict
from .spend import spend_chart_svg, spend_over_time

_FORMATTER = HtmlFormatter(cssclass="hl", nowrap=False)


def _compiled_templates() -> jinja2.BytecodeCache | None:
    """Where compiled templates are kept between runs (jinja2's own per-user folder).

    Compiling the report's template took 0.15 CPU-s of every run's end; the
    cache is keyed by the template's source, so an upgrade compiles it afresh.
    """
    try:
        return jinja2.FileSystemBytecodeCache()
    except (OSError, RuntimeError):  # no usable temp folder: compile every time
        return None


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("orchestrator.report", "templates"),
        bytecode_cache=_compiled_templates(),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["money"] = lambda v: "N/A" if v is None else f"${v:.2f}"
    env.filters["tokens"] = lambda n: f"{n / 1000:.1f}k" if (n or 0) >= 1000 else str(n or 0)
    env.filters["secs"] = _secs
    env.filters["duration"] = lambda v: "–" if v is None else fmt_duration(v)
    env.filters["cell"] = _cell
    # A parameter left at null has no value to show (the dashboard leaves them out too).
    env.filters["given"] = lambda d: {k: v for k, v in (d or {}).items() if v is not None}
    return env


def _secs(v: float | None) -> str:
    if v is None:
        return "–"
    if v < 60:
        return f"{v:.1f}s"
    m, s = divmod(round(v), 60)
    return f"{m}m {s:02d}s" if m < 60 else f"{m // 60}h {m % 60:02d}m"


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):  # a table cell has no room for a nested table: ``key: value`` pairs
        return ", ".join(f"{k}: {_cell(x)}" for k, x in v.items()) or "–"
    if isinstance(v, list):
        return ", ".join(_cell(x) for x in v) or "–"
    return str(v)


def _highlight_diffs(diffs: dict[str, dict[str, Any]], base: str) -> dict[str, dict[str, Any]]:
    """Highlight each diff until the page's budget for them is spent; the rest get a note."""
    out, used = {}, 0
    for commit, diff in diffs.items():
        if diff.get("available") and diff.get("text"):
            if used >= RUN_DIFF_HTML_BUDGET:
                diff = left_out(base, commit)
            else:
                html = highlight(diff["text"], DiffLexer(), _FORMATTER)
                used += len(html)
                diff = dict(diff, html=Markup(html))
        out[commit] = diff
    return out


def _strategy_hooks(manifest: RunManifest, hooks: StrategyHooks | None) -> tuple[StrategyHooks | None, str | None]:
    if hooks is None:
        from ..strategy_loader import load_strategy

        try:
            hooks = load_strategy(manifest.strategy_spec).hooks
        except Exception as exc:  # the file may have moved since the run: the generic parts still render
            return None, f"strategy sections left out: could not load {manifest.strategy_spec} ({exc})"
    return hooks, None


def _sections_for(hook: Any, execution: dict[str, Any], tasks: list[dict[str, Any]]) -> list[Any]:
    run = {"execution": execution, "tasks": [{k: v for k, v in t.items() if k not in ("spans", "card")} for t in tasks]}
    try:
        raw = hook(run) or []
    except Exception as exc:  # a broken section must not cost the user the rest of the report
        return [InvalidSection(title="strategy sections", problem=f"{type(exc).__name__}: {exc}")]
    if not isinstance(raw, list):
        return [InvalidSection(title="strategy sections", problem="report_sections must return a list of dicts")]
    return [validate(s) for s in raw]


def _rendered_section(section: Any) -> dict[str, Any]:
    kind = type(section).__name__
    out: dict[str, Any] = {"kind": kind, "s": section}
    if kind == "ChartSection":
        out["svg"] = Markup(
            line_chart_svg(
                section.series, x_label=section.x_label, y_label=section.y_label, x_integer=section.x_integer
            )
        )
    if kind == "TreeSection":
        children: dict[str | None, list[Any]] = {}
        ids = {n.id for n in section.nodes}
        for n in section.nodes:
            children.setdefault(n.parent if n.parent in ids else None, []).append(n)
        out["children"] = children
    return out


def report_path(dirs: RunDirs, run_id: str) -> Path:
    return dirs.results / run_id / "report.html"


def write_report(
    dirs: RunDirs,
    manifest: RunManifest,
    *,
    hooks: StrategyHooks | None = None,
    state: RunState | None = None,
    live: bool = False,
) -> Path:
    """Render and atomically write the report; return its path.

    Blocking (it reads the log and runs git): call it from a worker thread in
    async code. ``hooks`` are the strategy's when the caller has it loaded;
    otherwise it is loaded from the manifest's strategy spec. ``state`` is the
    run's fold when the caller holds it (otherwise the log is folded here);
    ``live``: a process is running the run now.
    """
    run_id = manifest.run_id
    if state is None:
        state = recover(
            run_id, dirs.events(run_id), [dirs.state / run_id / "state.json", dirs.logs / run_id / "state.json"]
        )
    # The status and the duration every other reader gives too: both from the run's fold.
    status = run_outcome(state, live=live)
    data = gather(dirs, manifest, state, status=status, duration_s=state.duration_s())
    data["header"]["unusable"] = sum(t["unusable"] for t in data["tasks"])
    spend = spend_over_time(state)
    scrub = default_sanitizer().scrub
    found, note = _strategy_hooks(manifest, hooks)
    hook = found.report_sections if found else None
    refine = found.report_task if found else None
    for t in data["tasks"]:  # before the sanitizer runs: the card is made of the task's own text
        t["card"] = task_card(t, refine)
    executions = _executions(data, manifest, status, hook, scrub)
    commits = [t["commit"] for t in data["tasks"] if t["commit"]]
    for e in executions:
        commits += commits_of(e["sections"])
    diffs = collect_diffs(Path(manifest.repo_path), manifest.base_branch, commits)
    # The sanitizer runs on the data, diffs included, before any of it becomes HTML.
    data = scrub(data)
    diffs = _highlight_diffs({c: scrub(d) for c, d in diffs.items()}, manifest.base_branch)
    for e in executions:
        e["sections"] = [_rendered_section(_scrub_struct(s, scrub)) for s in e["sections"]]
    html = (
        _env()
        .get_template("report.html.j2")
        .render(
            h=data["header"],
            unfinished=status in UNFINISHED,
            tasks=data["tasks"],
            executions=executions,
            diffs=diffs,
            note=note,
            timeline=Markup(timeline_svg(data["tasks"], data["span_s"])),
            spend=spend,
            spend_svg=Markup(spend_chart_svg(spend)) if spend else None,
            css=Markup(_static("report.css")),
            js=Markup(_static("report.js")),
            hl_css=Markup(_FORMATTER.get_style_defs(".hl")),
            script_note=SCRIPT_NOTE,
        )
    )
    target = report_path(dirs, run_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_snapshot_bytes(html.encode("utf-8"), [target])
    return target


def _executions(
    data: dict[str, Any], manifest: RunManifest, status: str, hook: Any, scrub: Any
) -> list[dict[str, Any]]:
    """Each strategy execution with its sections, its selection and its verdict."""
    executions = []
    # The same choice the console summary and summary.json report (orchestrator.report.selection).
    ordered = sorted(data["executions"].items(), key=lambda kv: kv[0])
    pairs = claims(status, [(ex["status"], ex["result"]) for _, ex in ordered], manifest.base_branch)
    unheld = unheld_branches(manifest.repo_path, pairs)
    for sid, ex in ordered:
        tasks = [t for t in data["tasks"] if t["execution"] == sid]
        sections = _sections_for(hook, ex, tasks) if hook is not None else []
        decided = {"run_status": status, "status": ex["status"], "error": ex.get("error"), "result": ex["result"]}
        chosen = selection(**decided, base_branch=manifest.base_branch, unheld=unheld)
        said = verdict(**decided, base_branch=manifest.base_branch)
        executions.append(
            {"id": sid, "execution": ex, "sections": sections, "selection": scrub(chosen), "verdict": scrub(said)}
        )
    return executions


def _scrub_struct(section: Any, scrub: Any) -> Any:
    if isinstance(section, InvalidSection):
        return InvalidSection(title=scrub(section.title), problem=scrub(section.problem))
    return msgspec.convert(scrub(msgspec.to_builtins(section)), Section)


@lru_cache(maxsize=4)
def _static(name: str) -> str:
    return resources.files("orchestrator.report").joinpath("templates", name).read_text("utf-8")
