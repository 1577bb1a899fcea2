"""Regenerate tests/golden/judge.jsonl (only when the event format changes on purpose).

uv run python tests/golden/make_golden.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from engine_helpers import make_config  # noqa: E402
from golden_strategies import judge  # noqa: E402

from orchestrator.engine.engine import Engine  # noqa: E402
from orchestrator.engine.testing import ScriptedRunner, failure, success  # noqa: E402


def script(req):
    if req.prompt.endswith("#2"):
        return failure(req, error_type="api", message="rate limited for good")
    if req.prompt.startswith("score "):
        return success(req, final_message=str(len(req.prompt) % 7), has_changes=False)
    return success(req, final_message=f"draft of {req.prompt}")


async def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    await Engine(make_config(tmp, run_id="run_golden"), ScriptedRunner(script)).run(
        judge, prompt="add a flag", params={}
    )
    shutil.copy(tmp / "logs" / "run_golden" / "events.jsonl", HERE / "judge.jsonl")


if __name__ == "__main__":
    anyio.run(main)
