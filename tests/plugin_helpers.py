"""What the runner plugin tests share: a typed request with test defaults, and a transcript fed to a plugin's parser
whole or cut into chunks (the outcome must not depend on where the stream was cut)."""

from __future__ import annotations

import itertools
import random
from functools import partial
from pathlib import Path

from orchestrator.runner.types import InstanceRequest

# Copied verbatim from the shared fixtures (provenance in SOURCES.md there).
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "agent-transcripts"

# What the claude-code plugin adds after the prompt, for the default model: the simulated agent parses the same.
CLAUDE_FLAGS = [
    "--output-format",
    "stream-json",
    "--verbose",
    "--model",
    "sonnet",
    "--permission-mode",
    "bypassPermissions",
]


def instance_request(**kw) -> InstanceRequest:
    fields = dict(
        prompt="fix the bug",
        repo_path="/repo",
        branch_name="b",
        run_id="r",
        strategy_execution_id="se",
        instance_id="i",
        task_key="k",
        container_name="c",
    )
    return InstanceRequest(**{**fields, **kw})


def requests_for(**defaults):
    """``instance_request`` with a test file's own defaults, which each call may still override."""
    return partial(instance_request, **defaults)


def parse(plugin, data: bytes, exit_code: int | None, chunks: list[int] | None = None, previous=None):
    """The outcome and every event of ``data`` fed in ``chunks`` (sizes; the rest in one piece) to a fresh parser."""
    parser = plugin.new_parser(previous=previous)
    events = []
    pos = 0
    for size in chunks or []:
        events += parser.feed(data[pos : pos + size])
        pos += size
    events += parser.feed(data[pos:])
    outcome = parser.finish(exit_code)
    return outcome, events + parser.final_events


def random_chunks(data: bytes, rng: random.Random) -> list[int]:
    sizes, total = [], 0
    while total < len(data):
        sizes.append(rng.randint(1, 7))
        total += sizes[-1]
    return sizes


def multibyte_splits(data: bytes) -> list[int]:
    """Chunk sizes that cut inside every multi-byte UTF-8 sequence."""
    cuts = [i for i in range(1, len(data)) if 0x80 <= data[i] < 0xC0]
    return [b - a for a, b in itertools.pairwise([0, *cuts])]


def assert_chunking_is_invisible(plugin, data: bytes, exit_code: int | None) -> None:
    whole = parse(plugin, data, exit_code)
    for seed in range(25):
        assert parse(plugin, data, exit_code, random_chunks(data, random.Random(seed))) == whole
    assert parse(plugin, data, exit_code, multibyte_splits(data)) == whole
    assert parse(plugin, data.rstrip(b"\n"), exit_code) == whole  # no newline at end of stream


def fixture_names(prefix: str) -> list[str]:
    return sorted(p.name for p in FIXTURES.glob(f"{prefix}_*.jsonl"))
