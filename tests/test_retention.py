"""Workspaces and session volumes of finished runs expire; a resumable run's never do."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest
from cli_helpers import cli_env, run_cli
from conftest import TEST_IMAGE, make_repo
from engine_helpers import run_manifest

from orchestrator.log.runs import RunDirs, host_claims, now_iso, write_manifest

OLD = "2001-01-01T00:00:00.000Z"


def _fake_run(dirs: RunDirs, ws_root: Path, run_id: str, status: str, finished_at: str | None) -> tuple[Path, str]:
    write_manifest(
        dirs,
        run_manifest(
            run_id=run_id,
            created_at=OLD,
            repo_path="/nowhere",
            docker_image=TEST_IMAGE,
            dry_run=True,
            status=status,
            finished_at=finished_at,
        ),
    )
    ws = ws_root / run_id / "k_0123abcd"
    ws.mkdir(parents=True)
    (ws / "left.txt").write_text("what the agent did\n")
    for p in (ws / "left.txt", ws, ws.parent):
        os.utime(p, (978307200, 978307200))  # 2001
    volume = f"orc_home_{run_id}_g00000000"
    subprocess.run(
        ["docker", "volume", "create", "--label", "orchestrator=true", "--label", f"run_id={run_id}", volume],
        check=True,
        capture_output=True,
    )
    return ws.parent, volume


def _volumes() -> set[str]:
    return set(subprocess.run(["docker", "volume", "ls", "-q"], capture_output=True, text=True).stdout.split())


@pytest.mark.docker
def test_a_run_start_expires_finished_runs_leftovers_but_not_resumable_ones(tmp_path):
    env = cli_env(tmp_path)
    ws_root = Path(env["ORCHESTRATOR_WORKSPACE_ROOT"])
    dirs = RunDirs(state=tmp_path / "state", logs=tmp_path / "logs", results=tmp_path / "results")
    other = RunDirs(
        state=tmp_path / "elsewhere" / "state",
        logs=tmp_path / "elsewhere" / "logs",
        results=tmp_path / "elsewhere" / "results",
    )
    tag = f"{os.getpid()}"
    runs = {
        "failed": (dirs, "failed", OLD),
        "interrupted": (dirs, "interrupted", None),
        "crashed": (dirs, "running", None),
        "fresh": (dirs, "completed", now_iso()),
        "other_dir": (other, "completed", OLD),
    }
    made: dict[str, tuple[Path, str]] = {}
    claims: list[Path] = []
    try:
        for name, (d, status, finished) in runs.items():
            run_id = f"run_20010101_000000_{name}{tag}"
            made[name] = _fake_run(d, ws_root, run_id, status, finished)
        # The other directory's run is found through its owner record, as a real run writes it.
        owner = host_claims() / made["other_dir"][0].name
        owner.mkdir(parents=True, exist_ok=True)
        claims.append(owner)
        (owner / "owner.json").write_bytes(msgspec.json.encode({"state": str(other.state), "logs": str(other.logs)}))
        # A workspace of a run nobody here knows about (no manifest, no owner): kept.
        unknown = ws_root / f"run_20010101_000000_unknown{tag}"
        (unknown / "k_0").mkdir(parents=True)
        os.utime(unknown, (978307200, 978307200))

        repo = make_repo(tmp_path / "repo")
        r = run_cli(
            ["SIM: done", "--dry-run", "--no-tui", "--docker-image", TEST_IMAGE], cwd=repo, env=env, timeout=300
        )
        assert r.returncode == 0, r.stdout + r.stderr

        volumes = _volumes()
        for name in ("failed", "other_dir"):
            ws, volume = made[name]
            assert not ws.exists(), name
            assert volume not in volumes, name
        for name in ("interrupted", "crashed", "fresh"):
            ws, volume = made[name]
            assert ws.exists(), name
            assert volume in volumes, name
        assert unknown.exists()
    finally:
        for _ws, volume in made.values():
            subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
        for claim in claims:
            shutil.rmtree(claim, ignore_errors=True)
