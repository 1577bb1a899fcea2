"""A tree-beam tree's full check, as ``orchestrator --show-run`` does it: consistency, then the git layer."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import anyio

from orchestrator.runner import unheld_branch_claims
from strategies.tree_beam_report import branch_claims, tree_problems


def validate_tree(tree, repo) -> list[str]:
    """Problems found (empty = valid); callable from sync tests and from inside a running loop."""
    claims = branch_claims(tree)
    with ThreadPoolExecutor(max_workers=1) as pool:
        verdicts = pool.submit(anyio.run, unheld_branch_claims, repo, [(b, c) for _, b, c in claims]).result()
    return tree_problems(tree) + [f"{node}: {why}" for (node, _, _), why in zip(claims, verdicts, strict=True) if why]
