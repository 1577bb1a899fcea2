"""The live dashboard: renderables over a :class:`~tui.model.RunModel`, and the loops that drive it.

Three loops share one model, so that folding events never waits for drawing (docs/tui.md, "How the
dashboard works"). The frame is fitted to the terminal: with more cards than fit, the most urgent
are shown and the strategy's border says how many are hidden.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from orchestrator.log.eventlog import subscribe
from orchestrator.log.state import (
    COMPLETED,
    FAILED,
    INTERRUPTED,
    OUTCOME_COMPLETED,
    OUTCOME_FAILED,
    PENDING,
    RUNNING,
    UNUSABLE,
    RunState,
    StrategyState,
    TaskState,
    load_snapshot,
    run_outcome,
)

from .console import params_text
from .model import (
    HostLine,
    RunModel,
    Summary,
    fmt_cost,
    fmt_duration,
    fmt_progress,
    fmt_tokens,
    makes_branch,
    task_label,
    without_protocol,
)

MODES = ("detailed", "compact", "dense")
ENV_FORCE_MODE = "ORCHESTRATOR_TUI__FORCE_DISPLAY_MODE"
STALE_AFTER_S = 30.0
RECONCILE_EVERY_S = 3.0
SNAPSHOT_ALWAYS_BYTES = 4 << 20  # snapshots up to this size are decoded on every change

# An unusable task (completed, but what its strategy failed on) is shown as the failure it is.
STATUS_ICON = {PENDING: "⏳", RUNNING: "🔄", COMPLETED: "✅", FAILED: "❌", INTERRUPTED: "💤", UNUSABLE: "❌"}
STATUS_STYLE = {
    PENDING: "blue",
    RUNNING: "bold yellow",
    COMPLETED: "dim",
    FAILED: "bold red",
    INTERRUPTED: "magenta",
    UNUSABLE: "bold red",
}
# Cards that need attention come first when not all of them fit.
URGENCY = {FAILED: 0, UNUSABLE: 0, RUNNING: 1, INTERRUPTED: 2, PENDING: 3, COMPLETED: 4}
STRATEGY_BORDER = {
    "running": "cyan",
    "success": "green",
    "failed": "red",
    "canceled": "yellow",
    "budget_reached": "magenta",
}

# (lines per card, minimum cell width) per mode; the detailed card is a 4-line panel.
CARD_HEIGHT = {"detailed": 6, "compact": 1, "dense": 1}
CARD_WIDTH = {"detailed": 56, "compact": 56, "dense": 27}


def choose_mode(n_tasks: int, forced: str | None = None) -> str:
    """Display mode for ``n_tasks``: a valid ``forced`` value or the env override wins."""
    for candidate in (forced, os.environ.get(ENV_FORCE_MODE)):
        if candidate and candidate.strip().lower() in MODES:
            return candidate.strip().lower()
    if n_tasks <= 10:
        return "detailed"
    if n_tasks <= 50:
        return "compact"
    return "dense"


# ---------------------------------------------------------------- frame


def render(
    model: RunModel,
    *,
    width: int,
    height: int,
    now: float,
    mode: str | None = None,
    max_parallel: int | None = None,
    waiting_for: str | None = None,
) -> RenderableType:
    """One complete frame of the dashboard, fitted to ``width`` x ``height``."""
    summary = model.summary(now)
    chosen = choose_mode(summary.total, mode)
    parts: list[RenderableType] = [_header(model, summary), _health(summary, max_parallel, chosen, model.hosts())]
    avail = max(0, height - 4)  # header, health line, 2-line footer
    if waiting_for and model.empty:
        parts.append(Text(f"waiting for events in {waiting_for} …", style="italic"))
    else:
        parts.extend(_strategy_sections(model, summary, chosen, width, avail, now))
    parts.append(_footer(model, summary))
    return Group(*parts)


def _one_line(text: Text) -> Text:
    """``text`` never wraps: what does not fit a line ends in an ellipsis."""
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def _header(model: RunModel, s: Summary) -> Text:
    strategies = list(model.state.strategies.values())
    names = list(dict.fromkeys(st.name for st in strategies if st.name))
    desc = ", ".join(names) or "-"
    if len(strategies) > 1:
        desc += f" ×{len(strategies)}"
    params = params_text(strategies[0].params, 60) if strategies else ""
    models = Counter(t.model for t in model.state.tasks.values() if t.model)
    if models:
        top = models.most_common(1)[0][0]
        model_name = top + (f" +{len(models) - 1}" if len(models) > 1 else "")
    else:
        model_name = str(strategies[0].params.get("model") or "-") if strategies else "-"
    text = Text.assemble(("🚀 ", ""), (model.run_id, "bold"), "  ")
    if model.state.dry_run:
        text.append("DRY RUN", style="bold black on yellow")
        text.append("  ")
    budget = model.state.budget
    if budget is not None:  # early in the line: a narrow terminal cuts the end, never the spend
        text.append(budget_text(budget), style="bold red" if budget.reached else "magenta")
        text.append("  ")
    text.append(desc, style="bold cyan")
    if params:
        text.append(f" ({params})", style="cyan")
    text.append(f"  model {model_name}  ")
    text.append(f"▶ {s.running} running ", style="yellow")
    text.append(f"✅ {s.completed} done ", style="green")
    text.append(f"❌ {s.failed} failed ", style="red" if s.failed else "")
    if s.unusable:
        text.append(f"❌ {s.unusable} unusable ", style="red")
    text.append(f" ⏱ {fmt_duration(s.runtime_s)}")
    return _one_line(text)


def budget_text(budget: Any) -> str:
    """``💰 $0.21/$0.50`` (and tokens when they are capped): the run's spend against its cap."""
    parts = []
    if budget.max_cost_usd is not None or budget.max_tokens is None:
        cap = f"/${budget.max_cost_usd:.2f}" if budget.max_cost_usd is not None else ""
        parts.append(f"${budget.spent_cost_usd:.2f}{cap}")
    if budget.max_tokens is not None:
        parts.append(f"{fmt_tokens(budget.spent_tokens)}/{fmt_tokens(budget.max_tokens)} tok")
    return "💰 " + " · ".join(parts) + (" cap reached" if budget.reached else "")


def _health(s: Summary, max_parallel: int | None, mode: str, hosts: list[HostLine] | None = None) -> Text:
    limit = str(max_parallel) if max_parallel else "?"
    rate = f"${s.cost_per_min:.2f}/min" if s.cost_per_min is not None else "N/A"
    text = Text.assemble(
        ("health ", "dim"),
        f"queue {s.pending} · running {s.running}/{limit} · ",
        f"cost rate {rate} · avg task {fmt_duration(s.avg_duration_s)}  ",
        (f"[{mode}]", "dim"),
    )
    if hosts:
        # Several Docker engines: per host the running tasks, its free slots, or that it is down.
        text.append("  hosts ", style="dim")
        for i, h in enumerate(hosts):
            if i:
                text.append(" · ")
            text.append(f"{h.name} ▶{h.running}")
            if h.down:
                text.append(" down", style="bold red")
            elif h.free is not None:
                text.append(f" {h.free} free", style="dim")
    return _one_line(text)


def _footer(model: RunModel, s: Summary) -> Text:
    cost = fmt_cost(s.cost_usd) if s.cost_known or not (s.completed + s.failed) else "N/A"
    line1 = Text.assemble(
        f"⏱ {fmt_duration(s.runtime_s)}  💰 {cost}  ",
        f"tokens {fmt_tokens(s.tokens_in)} in / {fmt_tokens(s.tokens_out)} out  ",
        (f"▶ {s.running} running  ", "yellow"),
        (f"✅ {s.completed} done  ", "green"),
        (f"❌ {s.failed} failed  ", "bold red" if s.failed else ""),
        f"⏳ {s.pending} queued",
    )
    if s.unusable:
        line1.append(f"  ❌ {s.unusable} unusable", style="bold red")
    if s.interrupted:
        line1.append(f"  💤 {s.interrupted} interrupted", style="magenta")
    warnings = _warnings(model, s)
    line2 = Text(
        " · ".join(w for w, _ in warnings) if warnings else "no warnings", style=warnings[0][1] if warnings else "dim"
    )
    return Text("\n").join([_one_line(line1), _one_line(line2)])


def _warnings(model: RunModel, s: Summary) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    started = model.state.warnings
    if started:
        # Printed before the dashboard took the screen, so they would scroll away: the count and the latest stay.
        count = f"{len(started)} start-up warning{'s' if len(started) > 1 else ''}"
        out.append((f"⚠ {count}, latest: {started[-1]}", "yellow"))
    if s.stale_s is not None and s.stale_s > STALE_AFTER_S:
        out.append((f"⚠ no events for {int(s.stale_s)}s", "bold yellow"))
    for st in model.state.strategies.values():
        if st.status == "failed":
            out.append((f"✗ {st.id} failed: {st.error or 'unknown error'}", "bold red"))
    if s.failed:
        last = max((t for t in model.state.tasks.values() if t.state == FAILED), key=lambda t: t.completed_at or "")
        out.append(
            (
                f"⚠ {s.failed} failed, last {model.label(last.key)} {last.error_type}: "
                f"{without_protocol(last.message)}",
                "bold red",
            )
        )
    if model.finished:
        # the run's status in the word every other reader uses (--list-runs, the summary, the report)
        outcome = run_outcome(model.state)
        done = Counter(st.status for st in model.state.strategies.values())
        out.append(
            (
                f"run {outcome}: " + ", ".join(f"{n} {status}" for status, n in sorted(done.items())),
                "bold green" if outcome == OUTCOME_COMPLETED else "bold red" if outcome == OUTCOME_FAILED else "bold",
            )
        )
    return out


# ---------------------------------------------------------------- strategy sections


def _strategy_sections(
    model: RunModel, s: Summary, mode: str, width: int, avail: int, now: float
) -> list[RenderableType]:
    by_sid: dict[str, list[TaskState]] = {}
    for task in model.state.tasks.values():
        by_sid.setdefault(task.strategy_execution_id, []).append(task)
    sids = list(model.state.strategies) + [sid for sid in by_sid if sid not in model.state.strategies]
    # Running executions first (they need attention), then in start order.
    sids.sort(key=lambda sid: (_strategy(model, sid).status != "running", _sid_order(sid)))
    if not sids:
        return []
    inner = max(10, width - 4)
    card_h, card_w = CARD_HEIGHT[mode], CARD_WIDTH[mode]
    per_row = max(1, inner // card_w)
    # Every shown section costs 2 border lines; what is left holds cards.
    shown = sids
    if len(sids) * 3 > avail:
        shown = sids[: max(1, (avail - 1) // 3)]
    hidden = sids[len(shown) :]
    budget = max(0, avail - 2 * len(shown) - (1 if hidden else 0))
    needs = []
    for sid in shown:
        n = len(by_sid.get(sid, []))
        needs.append(-(-n // per_row) * card_h if n else 1)
    rows = _share(needs, budget, card_h)
    out: list[RenderableType] = []
    for sid, lines in zip(shown, rows, strict=True):
        out.append(_section(model, _strategy(model, sid), by_sid.get(sid, []), mode, per_row, inner, lines, now))
    if hidden:
        status = Counter(_strategy(model, sid).status for sid in hidden)
        out.append(
            Text(
                f"… {len(hidden)} more executions: " + ", ".join(f"{n} {k}" for k, n in sorted(status.items())),
                style="dim",
            )
        )
    return out


def _strategy(model: RunModel, sid: str) -> StrategyState:
    return model.state.strategies.get(sid) or StrategyState(id=sid)


def _sid_order(sid: str) -> tuple[int, str]:
    digits = sid.lstrip("s")
    return (int(digits), sid) if digits.isdigit() else (1 << 30, sid)


def _share(needs: list[int], budget: int, unit: int) -> list[int]:
    """Split ``budget`` lines among sections: everyone gets what they need if it fits,
    otherwise small sections are served in full and the rest share equally (in whole cards)."""
    if sum(needs) <= budget:
        return needs
    out = [0] * len(needs)
    order = sorted(range(len(needs)), key=lambda i: needs[i])
    left = budget
    for pos, i in enumerate(order):
        fair = left // (len(needs) - pos)
        give = min(needs[i], max(fair // unit * unit, min(unit, left)))
        out[i] = give
        left -= give
    return out


def _section(
    model: RunModel,
    strat: StrategyState,
    all_tasks: list[TaskState],
    mode: str,
    per_row: int,
    inner: int,
    lines: int,
    now: float,
) -> Panel:
    card_h = CARD_HEIGHT[mode]
    capacity = (lines // card_h) * per_row
    tasks = all_tasks
    total = len(tasks)
    if total > capacity:
        tasks = sorted(tasks, key=_urgency_key(model))[:capacity]
    hidden = total - len(tasks)
    if not total:
        body: RenderableType = Text("no tasks yet", style="dim")
    elif not tasks:
        body = Text(f"{total} tasks (enlarge the terminal to see them)", style="dim")
    elif mode == "detailed":
        body = _detailed_grid(model, tasks, per_row, now)
    else:
        body = _cell_grid(model, tasks, mode, per_row, inner, now)
    done = sum(1 for t in all_tasks if t.state in (COMPLETED, FAILED))
    title = Text.assemble((f" {strat.id} ", "bold"), (strat.name or "?", "bold cyan"))
    if strat.params:
        title.append(f" ({params_text(strat.params, 40)})")
    title.append(f" · {strat.status} ", style=STRATEGY_BORDER.get(strat.status, ""))
    subtitle = Text(f" {_bar(done, total)} {done}/{total} done ")
    extra = fmt_progress(strat.progress)
    if extra:
        subtitle.append(f"· {extra} ", style="bold")
    if hidden > 0:
        subtitle.append(f"· {hidden} more not shown (urgent first) ", style="dim")
    if strat.status == "failed" and strat.error:
        subtitle.append(f"· {strat.error[:60]} ", style="red")
    return Panel(
        body,
        title=title,
        title_align="left",
        subtitle=subtitle,
        subtitle_align="left",
        border_style=STRATEGY_BORDER.get(strat.status, "cyan"),
        height=lines + 2,
        padding=(0, 1),
    )


def _urgency_key(model: RunModel):
    """Failed, running, interrupted, queued, then the most recently finished; older runs first within a state."""

    def key(task: TaskState) -> tuple[int, float]:
        status = model.status(task)
        if status == COMPLETED:
            return URGENCY[COMPLETED], -(model.ended(task) or 0.0)
        return URGENCY.get(status, 5), model.started(task) or 0.0

    return key


def _bar(done: int, total: int, width: int = 12) -> str:
    filled = round(width * done / total) if total else 0
    return "█" * filled + "░" * (width - filled)


def _card_head(model: RunModel, task: TaskState, now: float) -> tuple[str, str, str]:
    # Cards sit in their strategy execution's panel: the key without it is enough.
    return (STATUS_ICON.get(model.status(task), "?"), task_label(task.key), fmt_duration(model.task_runtime(task, now)))


def _cell_grid(model: RunModel, tasks: list[TaskState], mode: str, per_row: int, inner: int, now: float) -> Text:
    """Compact (id, runtime, cost, activity) or dense (id, cost, runtime) one-line cells."""
    cells: list[Text] = []
    for task in tasks:
        icon, kid, runtime = _card_head(model, task, now)
        status = model.status(task)
        style = STATUS_STYLE.get(status, "")
        cost = fmt_cost(task.cost_usd) if task.state in (COMPLETED, FAILED) else "-"
        if mode == "dense":
            cell = Text.assemble(f"{icon} ", (kid, style), f" {cost:>6} {runtime:>6}")
            cell.truncate(CARD_WIDTH["dense"] - 1, overflow="ellipsis", pad=True)
        else:
            cell = Text.assemble(
                f"{icon} ",
                (kid, style),
                f" {runtime:>7} {cost:>6} ",
                (model.activity(task), "red" if status in (FAILED, UNUSABLE) else "italic"),
            )
        cells.append(cell)
    if mode == "compact":
        width = max(20, inner // per_row - 1)
        for c in cells:
            c.truncate(width, overflow="ellipsis", pad=True)
    rows = [Text(" ").join(cells[i : i + per_row]) for i in range(0, len(cells), per_row)]
    return _one_line(Text("\n").join(rows))


def _detailed_grid(model: RunModel, tasks: list[TaskState], per_row: int, now: float) -> Table:
    per_row = min(per_row, len(tasks)) or 1
    grid = Table.grid(expand=True, padding=(0, 1))
    for _ in range(per_row):
        grid.add_column(ratio=1)
    cards = [_detailed_card(model, t, now) for t in tasks]
    for i in range(0, len(cards), per_row):
        row = cards[i : i + per_row]
        grid.add_row(*row, *([""] * (per_row - len(row))))
    return grid


def _detailed_card(model: RunModel, task: TaskState, now: float) -> Panel:
    icon, kid, runtime = _card_head(model, task, now)
    status = model.status(task)
    style = STATUS_STYLE.get(status, "")
    head = Text.assemble(f"{icon} ", (status.lower(), style), f"  {runtime}  inst-{task.instance_id[:5]}")
    if task.model and not task.runs_command:
        head.append(f"  {task.model}", style="dim")
    tokens = task.tokens_in + task.tokens_out
    metrics = Text(
        f"tokens {fmt_tokens(task.tokens_in)} in / {fmt_tokens(task.tokens_out)} out / "
        f"{fmt_tokens(tokens)} total · {fmt_cost(task.cost_usd) if task.state in (COMPLETED, FAILED) else '$…'}"
    )
    if task.state == FAILED:
        # The full error text, as much as two lines of the card hold.
        message = f"{task.error_type or 'error'}: {without_protocol(task.message)}"
        activity = Text(message, style="red")
        activity.no_wrap = False
        lines: list[RenderableType] = [_one_line(head), _one_line(metrics), activity]
    else:
        activity = _one_line(Text(model.activity(task), style="red" if status == UNUSABLE else "italic"))
        if task.state == COMPLETED:
            changes = f"+{task.lines_added}/-{task.lines_deleted}" if task.has_changes else "no changes"
            last = Text(f"→ {task.branch_final or 'no branch'} ({changes})", style="green")
        elif not makes_branch(task.input):
            last = Text("makes no branch", style="dim")
        else:
            last = Text(f"branch {task.branch_name or '-'}", style="dim")
        lines = [_one_line(head), activity, _one_line(metrics), _one_line(last)]
    return Panel(
        Group(*lines),
        title=Text(kid, style="bold" if status != COMPLETED else "dim"),
        title_align="left",
        height=CARD_HEIGHT["detailed"],
        padding=(0, 1),
        border_style={RUNNING: "yellow", FAILED: "red", UNUSABLE: "red", COMPLETED: "bright_black"}.get(status, "blue"),
        style="dim" if status == COMPLETED else "",
    )


# ---------------------------------------------------------------- loops


class Dashboard:
    """Model + loops for one run; ``ticks`` and ``frames`` count render-loop iterations and redraws."""

    def __init__(
        self,
        run_id: str,
        *,
        logs_dir: Path,
        state_dir: Path,
        results_dir: Path | None = None,
        console: Console | None = None,
        refresh_hz: float = 10,
        force_mode: str | None = None,
        max_parallel: int | None = None,
    ) -> None:
        # results_dir is no longer read (strategies' progress comes from the state now);
        # it is still accepted so the monitor's callers and --results-dir keep working.
        if force_mode is not None and force_mode not in MODES:
            raise ValueError(f"display mode must be one of {', '.join(MODES)}, not {force_mode!r}")
        if refresh_hz <= 0:
            raise ValueError("refresh_hz must be positive")
        self.model = RunModel(run_id)
        self.events_path = Path(logs_dir) / run_id / "events.jsonl"
        self.snapshot_paths = [Path(state_dir) / run_id / "state.json", Path(logs_dir) / run_id / "state.json"]
        self.console = console or Console()
        self.period = 1.0 / refresh_hz
        self.force_mode = force_mode
        self.max_parallel = max_parallel
        self.ticks = 0
        self.frames = 0
        self._last_frame_key: tuple | None = None
        self._snapshot_stamp: tuple[int, int] | None = None

    def frame(self, now: float) -> RenderableType | None:
        """A new frame when something visible changed since the last one, else None."""
        width, height = self.console.size
        key = (self.model.version, int(now), width, height)
        if key == self._last_frame_key:
            return None
        self._last_frame_key = key
        self.frames += 1
        return render(
            self.model,
            width=width,
            height=height,
            now=now,
            mode=self.force_mode,
            max_parallel=self.max_parallel,
            waiting_for=str(self.events_path),
        )

    async def run(self, stop: anyio.Event, *, follow: bool = True) -> None:
        ingest_stop = anyio.Event()
        # Log lines printed to stderr while the display is up would tear it; hold them until it is gone.
        held = io.StringIO()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._ingest, ingest_stop)
            tg.start_soon(self._reconcile_loop)
            try:
                with (
                    contextlib.redirect_stderr(held),
                    Live(
                        console=self.console,
                        screen=True,
                        auto_refresh=False,
                        redirect_stdout=False,
                        redirect_stderr=False,
                        transient=True,
                    ) as live,
                ):
                    await self._render_loop(live, stop, follow)
            finally:
                ingest_stop.set()
                tg.cancel_scope.cancel()
        if held.getvalue():
            sys.stderr.write(held.getvalue())

    async def _render_loop(self, live: Live, stop: anyio.Event, follow: bool) -> None:
        next_tick = time.monotonic()
        finished_ticks = 0
        while not stop.is_set():
            self.ticks += 1
            frame = self.frame(time.time())
            if frame is not None:
                live.update(frame, refresh=True)
            if not follow:
                # Two quiet ticks after the last strategy completed: the tail has been read.
                finished_ticks = finished_ticks + 1 if self.model.finished else 0
                if finished_ticks > 2:
                    return
            next_tick += self.period
            delay = next_tick - time.monotonic()
            if delay < 0:  # fell behind (a slow frame): skip ahead instead of bursting
                next_tick = time.monotonic()
                delay = 0
            with anyio.move_on_after(delay):
                await stop.wait()

    async def _ingest(self, stop: anyio.Event) -> None:
        n = 0
        async for ev in subscribe(self.events_path, 0, poll_interval=0.1, stop=stop):
            self.model.feed(ev)
            n += 1
            if n % 256 == 0:
                await anyio.lowlevel.checkpoint()  # a burst of events must not starve the render loop

    async def _reconcile_loop(self) -> None:
        while True:
            snapshot = await anyio.to_thread.run_sync(self._read_side_files)
            self.model.reconcile(snapshot)
            await anyio.sleep(RECONCILE_EVERY_S)

    def _read_side_files(self) -> RunState | None:
        """The snapshot, when it changed and is worth decoding (worker thread)."""
        stamp = None
        for path in self.snapshot_paths:
            with contextlib.suppress(OSError):
                st = path.stat()
                stamp = (st.st_mtime_ns, st.st_size)
                break
        if stamp is None or stamp == self._snapshot_stamp:
            return None
        self._snapshot_stamp = stamp
        try:
            log_size = self.events_path.stat().st_size
        except OSError:
            log_size = 0
        # Decoding holds the GIL (a 100k-task snapshot takes about 0.2 s), so a big
        # snapshot is only read when the tail is far behind the log; then it can help.
        behind = log_size - max(0, self.model.state.last_event_start_offset)
        if stamp[1] > SNAPSHOT_ALWAYS_BYTES and behind <= SNAPSHOT_ALWAYS_BYTES:
            return None
        snapshot = load_snapshot(self.snapshot_paths, log_size=log_size)
        if snapshot is not None:
            snapshot.tasks.load_all()  # here, not in the render loop's thread
        return snapshot


async def run_dashboard(
    run_id: str,
    *,
    logs_dir: Path,
    state_dir: Path,
    results_dir: Path,
    stop: anyio.Event,
    console: Console | None = None,
    refresh_hz: float = 10,
    follow: bool = True,
    force_mode: str | None = None,
    max_parallel: int | None = None,
) -> None:
    """Show the live dashboard of ``run_id`` until ``stop`` is set (docs/tui.md, "Public functions")."""
    dash = Dashboard(
        run_id,
        logs_dir=logs_dir,
        state_dir=state_dir,
        results_dir=results_dir,
        console=console,
        refresh_hz=refresh_hz,
        force_mode=force_mode,
        max_parallel=max_parallel,
    )
    await dash.run(stop, follow=follow)


async def quit_on_keys(stop: anyio.Event, fd: int | None = None) -> None:
    """Set ``stop`` when ``q`` (or Esc) is pressed on the terminal ``fd`` (in cbreak mode meanwhile); no-op without a tty."""
    fd = sys.stdin.fileno() if fd is None else fd
    if not os.isatty(fd):
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        while not stop.is_set():
            await anyio.wait_readable(fd)
            data = os.read(fd, 64)
            if not data or any(ch in data for ch in b"qQ\x1b"):
                stop.set()
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def watch_signals(stop: anyio.Event) -> None:
    import signal

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            stop.set()
            return


async def monitor(
    run_id: str,
    *,
    logs_dir: Path,
    state_dir: Path,
    results_dir: Path,
    follow: bool = True,
    refresh_hz: float = 10,
    force_mode: str | None = None,
    max_parallel: int | None = None,
) -> None:
    """The standalone monitor: the dashboard until q, Esc, Ctrl+C or SIGTERM (read-only, takes no lock)."""
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch_signals, stop)
        tg.start_soon(quit_on_keys, stop)
        await run_dashboard(
            run_id,
            logs_dir=logs_dir,
            state_dir=state_dir,
            results_dir=results_dir,
            stop=stop,
            refresh_hz=refresh_hz,
            follow=follow,
            force_mode=force_mode,
            max_parallel=max_parallel,
        )
        tg.cancel_scope.cancel()
