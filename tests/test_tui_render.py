"""Dashboard frames on synthetic runs (1, 12, 60, 500 tasks), and the loops behind them."""

from __future__ import annotations

import io
import re
import sys
import time

import anyio
import pytest
from rich.console import Console

from orchestrator.log.eventlog import read_events
from orchestrator.log.events import encode_line, utc_ts
from orchestrator.log.state import FAILED, RUNNING, load_snapshot
from strategies.base_check import base_command
from strategies.tree_beam_measure import measure_command
from tui.dashboard import ENV_FORCE_MODE, Dashboard, choose_mode, render, run_dashboard
from tui.model import RunModel, task_doing
from tui.synthetic import SynthEvent, synthetic_run, write_run

W, H = 120, 40


async def make_run(tmp_path, run_id, n, **kw):
    events = synthetic_run(run_id, n, **kw)
    await write_run(events, run_id=run_id, logs_dir=tmp_path / "logs", state_dir=tmp_path / "state")
    return tmp_path / "logs" / run_id / "events.jsonl"


def model_of(path, run_id):
    model = RunModel(run_id)
    for ev in read_events(path):
        model.feed(ev)
    return model


def frame_text(model, *, now=None, width=W, height=H, **kw):
    console = Console(record=True, width=width, height=height, force_terminal=True, file=io.StringIO())
    console.print(render(model, width=width, height=height, now=now or model.last_ts + 5, **kw))
    return console.export_text()


def kid(task):
    """The task's readable key, as the dashboard (and the run summary) names it."""
    return task.key.split("/", 2)[2]


def shows(task, text):
    return re.search(rf"{re.escape(kid(task))}(?!\d)", text) is not None


async def test_one_task_run_is_detailed_with_activity_tokens_cost_and_branch(tmp_path):
    path = await make_run(tmp_path, "r1", 1, fail_every=0)
    model = model_of(path, "r1")
    text = frame_text(model)
    task = next(iter(model.state.tasks.values()))
    assert "[detailed]" in text
    assert shows(task, text) and f"inst-{task.instance_id[:5]}" in text
    assert "Implemented variant 0" in text  # the activity line: the agent's final message
    assert f"tokens {task.tokens_in / 1000:.1f}k in" in text
    assert f"${task.cost_usd:.2f}" in text
    assert f"→ {task.branch_final}" in text
    assert "run completed: 1 success" in text


async def test_failed_task_card_shows_its_error_text_and_footer_warns(tmp_path):
    path = await make_run(tmp_path, "rf", 1, fail_every=1)
    text = frame_text(model_of(path, "rf"))
    assert "timeout: Timeout after" in text and "waiting for the agent" in text
    assert re.search(r"⚠ 1 failed, last task/\d+ timeout", text)


async def test_twelve_tasks_are_compact_with_every_task_cost_and_runtime(tmp_path):
    path = await make_run(tmp_path, "r12", 12, finish=False)
    model = model_of(path, "r12")
    text = frame_text(model)
    assert "[compact]" in text
    for task in model.state.tasks.values():
        line = next(ln for ln in text.splitlines() if shows(task, ln))
        if task.state == RUNNING:
            assert "🔄" in line
        else:
            assert "✅" in line and f"${task.cost_usd:.2f}" in line
    s = model.summary(model.last_ts)
    assert f"▶ {s.running} running" in text and f"✅ {s.completed} done" in text and s.running > 0


async def test_sixty_tasks_are_dense_and_all_fit_in_forty_lines(tmp_path):
    path = await make_run(tmp_path, "r60", 60, finish=False)
    model = model_of(path, "r60")
    text = frame_text(model)
    assert "[dense]" in text
    assert len(text.splitlines()) <= H
    assert all(shows(t, text) for t in model.state.tasks.values())
    s = model.summary(model.last_ts)
    assert f"queue {s.pending} · running {s.running}/?" in text
    assert f"{s.completed + s.failed}/60 done" in text


async def test_five_hundred_tasks_fit_the_screen_urgent_first(tmp_path):
    path = await make_run(tmp_path, "r500", 500, finish=False, max_parallel=20)
    model = model_of(path, "r500")
    text = frame_text(model, max_parallel=20)
    lines = text.splitlines()
    assert "[dense]" in text and len(lines) <= H
    urgent = [t for t in model.state.tasks.values() if t.state in (FAILED, RUNNING)]
    assert urgent and all(shows(t, text) for t in urgent)  # nothing that needs attention is hidden
    shown = len(re.findall(r"\btask/\d+", "\n".join(lines[3:-2])))
    assert f"{500 - shown} more not shown (urgent first)" in text
    s = model.summary(model.last_ts)
    assert f"running {s.running}/20" in text
    assert f"❌ {s.failed} failed" in lines[-2]  # the footer's totals cover hidden tasks too


async def test_display_mode_can_be_forced_by_argument_or_environment(tmp_path, monkeypatch):
    path = await make_run(tmp_path, "rm", 60, finish=False)
    model = model_of(path, "rm")
    assert "[compact]" in frame_text(model, mode="compact")
    monkeypatch.setenv(ENV_FORCE_MODE, "detailed")
    text = frame_text(model)
    assert "[detailed]" in text and "tokens" in text and "more not shown" in text
    monkeypatch.setenv(ENV_FORCE_MODE, "bogus")  # an unknown value falls back to automatic
    assert choose_mode(60) == "dense" and choose_mode(10) == "detailed" and choose_mode(11) == "compact"
    with pytest.raises(ValueError):
        Dashboard("rm", logs_dir=tmp_path, state_dir=tmp_path, results_dir=tmp_path, force_mode="huge")


async def test_staleness_shows_only_while_the_run_is_unfinished(tmp_path):
    live = model_of(await make_run(tmp_path, "rs", 5, finish=False), "rs")
    assert "no events for 42s" in frame_text(live, now=live.last_ts + 42)
    assert "no events for" not in frame_text(live, now=live.last_ts + 10)
    done = model_of(await make_run(tmp_path, "rd", 5), "rd")
    assert "no events for" not in frame_text(done, now=done.last_ts + 600)


async def test_each_strategy_execution_gets_its_own_section(tmp_path):
    model = model_of(await make_run(tmp_path, "rx", 9, executions=3, finish=False), "rx")
    text = frame_text(model)
    assert "best-of-n ×3" in text
    for sid in ("s1", "s2", "s3"):
        assert re.search(rf"╭─ +{sid} best-of-n", text)


def with_progress(events, *records):
    """The run's events with ``strategy.progress`` records of execution s1 appended (the latest wins)."""
    last = max(e.vt for e in events)
    return events + [
        SynthEvent(last + 0.01 * (i + 1), "strategy.progress", "s1", None, r) for i, r in enumerate(records)
    ]


async def test_each_section_shows_its_strategys_latest_progress_record(tmp_path):
    tree = with_progress(
        synthetic_run("rt", 4, strategy="tree-beam", finish=False),
        {"phase": "depth", "step": 1, "of_total": 3, "frontier": 1, "text": "generating ideas"},
        {
            "phase": "depth",
            "step": 2,
            "of_total": 3,
            "frontier": 2,
            "best": 8.5,
            "done": 1,
            "total": 4,
            "text": "1/4 candidates of this depth evaluated",
        },
    )
    await write_run(tree, run_id="rt", logs_dir=tmp_path / "logs", state_dir=tmp_path / "state")
    model = model_of(tmp_path / "logs" / "rt" / "events.jsonl", "rt")
    text = frame_text(model)
    assert "depth 2/3 · frontier 2 · best 8.5 · 1/4 candidates of this depth evaluated" in text
    assert "generating ideas" not in text  # only the latest record is shown

    evolve = with_progress(
        synthetic_run("re", 4, strategy="evolve", finish=False),
        {"phase": "cycle", "step": 2, "of_total": 10, "done": 3, "total": 5},
        {"not a progress field": True, "step": "two"},
    )  # malformed: ignored by the fold
    await write_run(evolve, run_id="re", logs_dir=tmp_path / "logs", state_dir=tmp_path / "state")
    model = model_of(tmp_path / "logs" / "re" / "events.jsonl", "re")
    assert "cycle 2/10 · 3/5 done" in frame_text(model)
    # the snapshot carries the record too: a dashboard that adopts it shows the same line
    adopted = RunModel("re")
    assert adopted.reconcile(load_snapshot([tmp_path / "state" / "re" / "state.json"]))
    assert "cycle 2/10 · 3/5 done" in frame_text(adopted, now=time.time())


async def test_reconciliation_adopts_a_snapshot_that_saw_more_events(tmp_path):
    path = await make_run(tmp_path, "rr", 30)
    full = model_of(path, "rr")
    partial = RunModel("rr")
    for i, ev in enumerate(read_events(path)):
        if i < 20:
            partial.feed(ev)
    snapshot = load_snapshot([tmp_path / "state" / "rr" / "state.json"])
    assert partial.reconcile(snapshot) is True
    assert partial.summary(0).completed == full.summary(0).completed == 29  # one in 17 fails
    assert partial.summary(0).cost_usd == pytest.approx(full.summary(0).cost_usd)
    # Events the snapshot already folded are ignored when the tail catches up: no double counting.
    for ev in read_events(path):
        partial.feed(ev)
    assert msgspec_equal(partial.state.counters, full.state.counters)
    assert partial.reconcile(snapshot) is False  # not newer than what the model has


def msgspec_equal(a, b):
    import msgspec

    return msgspec.to_builtins(a) == msgspec.to_builtins(b)


def recording_console():
    return Console(record=True, width=W, height=H, force_terminal=True, file=io.StringIO())


async def test_follow_false_returns_on_a_finished_run_and_restores_the_screen(tmp_path):
    await make_run(tmp_path, "rdone", 12)
    console = recording_console()
    with anyio.fail_after(10):
        await run_dashboard(
            "rdone",
            logs_dir=tmp_path / "logs",
            state_dir=tmp_path / "state",
            results_dir=tmp_path / "results",
            stop=anyio.Event(),
            console=console,
            follow=False,
        )
    raw = console.file.getvalue()
    assert raw.count("\x1b[?1049h") == 1 and raw.rstrip().endswith("\x1b[?1049l")  # alternate screen left
    assert "\x1b[?25h" in raw  # cursor shown again
    assert "run completed: 1 success" in raw


async def test_stderr_output_is_held_until_the_display_is_gone(tmp_path, capfd):
    await make_run(tmp_path, "rerr", 3)
    console = recording_console()
    stop = anyio.Event()

    async def noisy():
        await anyio.sleep(0.3)
        print("a log line from somewhere", file=sys.stderr)
        await anyio.sleep(0.3)
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(noisy)
        await run_dashboard(
            "rerr",
            logs_dir=tmp_path / "logs",
            state_dir=tmp_path / "state",
            results_dir=tmp_path / "results",
            stop=stop,
            console=console,
        )
    assert "a log line" not in console.file.getvalue()
    assert "a log line from somewhere" in capfd.readouterr().err


async def test_render_loop_keeps_ticking_through_a_burst_of_ten_thousand_events(tmp_path):
    run_id = "burst"
    log = tmp_path / "logs" / run_id / "events.jsonl"
    log.parent.mkdir(parents=True)
    log.touch()
    blob, offset = bytearray(), 0
    for ev in synthetic_run(run_id, 3400, max_parallel=50)[:10_000]:
        line = encode_line(
            ev.type,
            ts=utc_ts(),
            run_id=run_id,
            strategy_execution_id=ev.sid,
            start_offset=offset,
            payload=ev.payload,
            key=ev.key,
        )
        blob += line
        offset += len(line)
    dash = Dashboard(
        run_id,
        logs_dir=tmp_path / "logs",
        state_dir=tmp_path / "state",
        results_dir=tmp_path / "results",
        console=recording_console(),
    )
    stop = anyio.Event()
    counts = {}

    async def burst():
        await anyio.sleep(0.5)
        async with await anyio.open_file(log, "ab") as fh:
            await fh.write(blob)  # one write: 10,000 events land at once
        ticks0 = dash.ticks
        # No rate is asserted (a loaded machine is slow): the loop must go on
        # ticking while and after the burst is folded, however long that takes.
        with anyio.fail_after(120):
            # Polls: the dashboard signals neither its fold nor its ticks.
            while dash.model.events < 10_000 or dash.ticks < ticks0 + 12:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        counts["ticks"] = dash.ticks - ticks0
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(burst)
        await dash.run(stop)
    assert dash.model.events == 10_000
    assert dash.model.state.counters.scheduled == 3400
    assert counts["ticks"] >= 12, counts  # the burst did not stall the display
    assert dash.frames <= dash.ticks


async def test_dashboard_reads_a_changed_snapshot_once_with_the_progress_it_folded(tmp_path):
    events = with_progress(
        synthetic_run("rsnap", 6, strategy="evolve"),
        {"phase": "cycle", "step": 4, "of_total": 10, "done": 2, "total": 3, "text": "goals 2/3 passing"},
    )
    await write_run(events, run_id="rsnap", logs_dir=tmp_path / "logs", state_dir=tmp_path / "state")
    dash = Dashboard(
        "rsnap",
        logs_dir=tmp_path / "logs",
        state_dir=tmp_path / "state",
        results_dir=tmp_path / "results",
        console=recording_console(),
    )
    snapshot = dash._read_side_files()
    assert snapshot is not None and len(snapshot.tasks) == 6
    assert snapshot.strategies["s1"].progress.done == 2
    assert dash._read_side_files() is None  # unchanged since the last read: not decoded again
    assert dash.model.reconcile(snapshot) and dash.model.summary(0).total == 6
    frame = dash.frame(time.time())
    console = recording_console()
    console.print(frame)
    text = console.export_text()
    assert "cycle 4/10 · goals 2/3 passing" in text, text


async def test_more_executions_than_fit_are_folded_into_one_line(tmp_path):
    model = model_of(await make_run(tmp_path, "rmany", 60, executions=20, finish=False), "rmany")
    text = frame_text(model)
    assert len(text.splitlines()) <= H
    shown = re.findall(r"╭─ +(s\d+) best-of-n", text)
    assert 5 <= len(shown) < 20
    assert f"… {20 - len(shown)} more executions: {20 - len(shown)} running" in text
    assert "▶ " in text.splitlines()[-2]  # the footer is still there


def test_health_line_shows_running_tasks_per_docker_host():
    """With runner.hosts, task.started carries host: the health line counts running tasks per host."""
    from orchestrator.log.events import TASK_STARTED

    run_id = "run_hosts"
    model = RunModel(run_id)
    hosts = ["local", "b", "b", "local"]
    for n, ev in enumerate(synthetic_run(run_id, 4, finish=False)):
        payload = dict(ev.payload)
        if ev.type == TASK_STARTED:
            payload["host"] = hosts[int(ev.key.rsplit("/", 1)[1])]
        model.feed_raw(ev.type, ev.sid, ev.key, payload, n * 100, utc_ts())
    running = {k: 0 for k in ("local", "b")}
    for key, task in model.state.tasks.items():
        if task.state == RUNNING:
            running[hosts[int(key.rsplit("/", 1)[1])]] += 1
    assert sum(running.values()) > 0
    text = frame_text(model)
    health = next(line for line in text.splitlines() if line.startswith("health"))
    assert f"hosts local ▶{running['local']} · b ▶{running['b']}" in health, health


def test_health_line_has_no_hosts_without_them(tmp_path):
    model = RunModel("run_plain")
    for n, ev in enumerate(synthetic_run("run_plain", 4, finish=False)):
        model.feed_raw(ev.type, ev.sid, ev.key, ev.payload, n * 100, utc_ts())
    assert "hosts" not in next(line for line in frame_text(model).splitlines() if line.startswith("health"))


def _hosts_model(run_id: str, placed: list[str]):
    """A run over hosts local:2 and b:2 with tasks placed as ``placed`` says (by task index)."""
    from orchestrator.log.events import TASK_STARTED

    model = RunModel(run_id)
    n = 0
    _feed_hosts_status(model, n)
    for ev in synthetic_run(run_id, len(placed), finish=False):
        n += 100
        payload = dict(ev.payload)
        if ev.type == TASK_STARTED:
            payload["host"] = placed[int(ev.key.rsplit("/", 1)[1])]
        model.feed_raw(ev.type, ev.sid, ev.key, payload, n, utc_ts())
    return model, n


def _feed_hosts_status(model, n: int, b_down: str | None = None) -> None:
    """A hosts.status event: local with 2 slots, and b with 2, down for the reason ``b_down`` if given."""
    from orchestrator.log.events import HOSTS_STATUS

    b: dict = {"name": "b", "max_parallel": 2, "down": b_down is not None}
    if b_down is not None:
        b["reason"] = b_down
    model.feed_raw(
        HOSTS_STATUS, "", None, {"hosts": [{"name": "local", "max_parallel": 2, "down": False}, b]}, n, utc_ts()
    )


def _health_line(model) -> str:
    return next(line for line in frame_text(model, width=200).splitlines() if line.startswith("health"))


def test_health_line_shows_free_slots_and_a_down_host_from_hosts_status_events():
    """hosts.status gives each host's slots and whether it is down; task.session with a host
    (its host went away) moves the task's count to the host it now runs on."""
    from orchestrator.log.events import TASK_SESSION

    model, n = _hosts_model("run_hosts_status", ["local", "b", "b", "local"])
    running = {k: [t for t in model.state.tasks.values() if t.state == RUNNING and t.host == k] for k in ("local", "b")}
    assert running["b"], "the synthetic run has a task running on b"
    assert (
        f"hosts local ▶{len(running['local'])} {2 - len(running['local'])} free · "
        f"b ▶{len(running['b'])} {2 - len(running['b'])} free" in _health_line(model)
    )

    _feed_hosts_status(model, n + 100, b_down="Docker host b stopped answering")
    moved = running["b"][0]
    model.feed_raw(
        TASK_SESSION,
        moved.strategy_execution_id,
        moved.key,
        {
            "key": moved.key,
            "instance_id": moved.instance_id,
            "session_id": None,
            "reason": "host_down",
            "host": "local",
            "error_type": "docker",
            "detail": "Docker host b stopped answering",
        },
        n + 200,
        utc_ts(),
    )
    on_local = len(running["local"]) + 1
    health = _health_line(model)
    assert f"hosts local ▶{on_local} {max(0, 2 - on_local)} free · b ▶{len(running['b']) - 1} down" in health, health
    assert model.state.hosts["b"].down and model.state.hosts["b"].reason == "Docker host b stopped answering"


def test_hosts_status_survives_a_snapshot_and_a_resume_replaces_the_set():
    from orchestrator.log.events import HOSTS_STATUS
    from orchestrator.log.state import decode_snapshot, encode_snapshot

    model, n = _hosts_model("run_hosts_snap", ["local", "b"])
    again = decode_snapshot(encode_snapshot(model.state))
    assert again.hosts == model.state.hosts and set(again.hosts) == {"local", "b"}
    # A resume with only the local engine: the new table replaces the old one.
    model.feed_raw(
        HOSTS_STATUS, "", None, {"hosts": [{"name": "local", "max_parallel": 3, "down": False}]}, n + 100, utc_ts()
    )
    assert list(model.state.hosts) == ["local"] and model.state.hosts["local"].max_parallel == 3


def test_the_header_marks_a_dry_run_and_start_up_warnings_stay_in_the_footer():
    """A start-up warning is printed before the dashboard takes the screen: it used to scroll away
    while the footer said 'no warnings'. The header had no DRY RUN marker and showed unset
    parameters as model=None."""
    from orchestrator.log.events import RUN_STARTED

    model = RunModel("run_dry")
    first = "/repo has uncommitted changes; agents start from the last commit of main"
    model.feed_raw(RUN_STARTED, "", None, {"dry_run": True, "resumed": False, "warnings": [first]}, 0, utc_ts())
    for n, ev in enumerate(synthetic_run("run_dry", 3, finish=False), start=1):
        payload = dict(ev.payload)
        if ev.type == "strategy.started":
            payload["params"] = {"model": None, "scorer_model": None, "n": 3}
        model.feed_raw(ev.type, ev.sid, ev.key, payload, n * 100, utc_ts())
    text = frame_text(model, width=200)
    header = text.splitlines()[0]
    assert "DRY RUN" in header and "None" not in header, header
    assert "no warnings" not in text
    assert f"1 start-up warning, latest: {first}" in text
    # a resume adds its own; the count grows and the latest is shown
    model.feed_raw(
        RUN_STARTED, "", None, {"dry_run": True, "resumed": True, "warnings": ["only 3 GB free"]}, 9999, utc_ts()
    )
    assert "2 start-up warnings, latest: only 3 GB free" in frame_text(model, width=200)


def test_a_long_parameter_line_is_cut_between_parameters_never_mid_name():
    from tui.console import params_text

    shown = params_text({"max_total_evals": 12, "max_wall_seconds": 3600, "ideas_per_node": 3}, limit=45)
    assert shown.endswith("…") and "max_wall_" not in shown.replace("max_wall_seconds=3600", ""), shown
    assert shown == "max_total_evals=12, max_wall_seconds=3600…"


def test_the_header_shows_the_spend_against_the_cap_from_the_budget_events():
    """Issue 29: the dashboard reads the spending cap and the live spend from state alone (budget.* events)."""
    from orchestrator.log.events import BUDGET_CAP, BUDGET_REACHED, BUDGET_SPEND

    model = RunModel("run_cap")
    model.feed_raw(BUDGET_CAP, "", None, {"max_cost_usd": 0.5, "max_tokens": None, "on_reached": "finish"}, 0, utc_ts())
    for n, ev in enumerate(synthetic_run("run_cap", 2, finish=False), start=1):
        model.feed_raw(ev.type, ev.sid, ev.key, dict(ev.payload), n * 100, utc_ts())
    model.feed_raw(BUDGET_SPEND, "", None, {"task": "k1", "tokens": 12000, "cost_usd": 0.21}, 5000, utc_ts())
    header = frame_text(model, width=200).splitlines()[0]
    assert "$0.21/$0.50" in header and "cap reached" not in header, header
    model.feed_raw(BUDGET_SPEND, "", None, {"task": "k2", "tokens": 20000, "cost_usd": 0.3}, 5100, utc_ts())
    model.feed_raw(BUDGET_REACHED, "", None, {"spent_cost_usd": 0.51}, 5200, utc_ts())
    header = frame_text(model, width=200).splitlines()[0]
    assert "$0.51/$0.50 cap reached" in header, header


@pytest.mark.parametrize(
    ("script", "shown"),
    [
        # a tree-beam measurement showed "$ set -u -f", its wrapper's first line
        (measure_command("python3 bench.py --json", [("c", "HEAD"), ("p", "abc123")]), "$ python3 bench.py --json"),
        (measure_command("make bench\nmake report", [("c", "HEAD")]), "$ make bench ..."),
        (base_command("npm test"), "$ npm test"),  # a base check: it said only "command"
        ("pytest -q\n", "$ pytest -q"),
    ],
)
def test_a_command_task_shows_the_users_command_not_its_wrapper(script, shown):
    task = {"plugin_name": "command", "command": script, "prompt": script, "import_policy": "never"}
    assert task_doing(task, runs_command=True) == shown


def test_a_command_task_of_any_plugin_shows_its_command_and_no_model():
    """Issue 45: the card reads the kind task.scheduled recorded (and the fold keeps), not the plugin's name."""
    from orchestrator.log.state import RunState, apply

    key = "run_cmd/s1/check"
    scheduled = {
        "key": key,
        "instance_id": "abcdef0123",
        "model": "sonnet",
        "plugin": "shell",
        "runs_command": True,
        "input": {"prompt": "make check", "command": "make check", "plugin_name": "shell"},
    }
    started = {"key": key, "instance_id": "abcdef0123", "model": "sonnet"}
    fed = RunModel("run_cmd")
    state = RunState(run_id="run_cmd")
    for n, (etype, payload) in enumerate((("task.scheduled", scheduled), ("task.started", started))):
        fed.feed_raw(etype, "s1", key, payload, n * 100, utc_ts())
        apply(state, etype, "s1", key, payload, n * 100, utc_ts())
    adopted = RunModel("run_cmd")
    assert adopted.reconcile(state)  # a dashboard that starts from the snapshot knows it too
    for model in (fed, adopted):
        text = frame_text(model)
        head = next(line for line in text.splitlines() if "inst-abcde" in line)
        assert "$ make check" in text and "sonnet" not in head


@pytest.mark.parametrize("mode", ["detailed", "compact", "dense"])
def test_a_dashboard_that_adopts_the_snapshot_draws_what_one_fed_every_event_draws(mode):
    """Issue 45, one fold: the dashboard is a view of the run's fold, not a second fold of the events.

    A monitor opened late (or one that fell behind) starts from state.json and
    must draw the same frame as one that read every event: the same activity
    lines (a finished task's final message, a failure, a host move, an
    interruption), hosts, runtimes and totals.
    """
    from orchestrator.log.events import TASK_INTERRUPTED, TASK_SESSION
    from orchestrator.log.state import decode_snapshot, encode_snapshot

    fed, n = _hosts_model(f"run_one_fold_{mode}", ["local", "b", "b", "local", "b", "local"])
    running = [t for t in fed.state.tasks.values() if t.state == RUNNING]
    assert len(running) >= 2 and any(t.state == "COMPLETED" for t in fed.state.tasks.values())
    moved, cut = running[0], running[1]
    session = {"key": moved.key, "instance_id": moved.instance_id, "session_id": None, "reason": "host_down"}
    fed.feed_raw(TASK_SESSION, moved.strategy_execution_id, moved.key, {**session, "host": "local"}, n + 100, utc_ts())
    interrupted = {"key": cut.key, "instance_id": cut.instance_id, "reason": "crash"}
    fed.feed_raw(TASK_INTERRUPTED, cut.strategy_execution_id, cut.key, interrupted, n + 200, utc_ts())

    adopted = RunModel(fed.run_id)
    assert adopted.reconcile(decode_snapshot(encode_snapshot(fed.state)))
    now = fed.last_ts + 5
    frame = frame_text(fed, now=now, mode=mode, width=160, height=60)
    assert frame_text(adopted, now=now, mode=mode, width=160, height=60) == frame
    if mode != "dense":  # (dense cells show no activity)
        assert "moved to host local (host_down)" in frame and "interrupted (crash)" in frame
    if mode == "detailed":  # a finished task's activity: its final message
        done = [t for t in fed.state.tasks.values() if t.state == "COMPLETED"]
        assert all(f"Implemented variant {t.key.rsplit('/', 1)[1]}" in frame for t in done), frame
