"""Derived names, each a pure function of durable inputs (nothing random): a resumed run derives the same instance
ids, container names, branch names and volume names as the original run did."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import rfc8785


def sha256_hex(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def short8(value: str) -> str:
    """First 8 hex characters of sha256(value)."""
    return sha256_hex(value)[:8]


def jcs_sha256(obj: Any) -> str:
    """SHA-256 hex of the RFC 8785 (JCS) encoding of ``obj``."""
    return sha256_hex(rfc8785.dumps(obj))


def instance_id(run_id: str, strategy_execution_id: str, key: str) -> str:
    return jcs_sha256({"run_id": run_id, "strategy_execution_id": strategy_execution_id, "key": key})[:16]


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_component(text: str, *, limit: int = 40) -> str:
    """A fragment valid in git refs and Docker names whatever ``text`` holds: strategy names and run ids come from
    users, and ``../``, spaces, leading dashes (``--upload-pack=``), newlines, unicode must not reach git or Docker."""
    cleaned = _UNSAFE.sub("-", text).strip("-.")
    cleaned = re.sub(r"\.{2,}", ".", cleaned)
    if cleaned.endswith(".lock"):
        cleaned = cleaned[: -len(".lock")]
    cleaned = cleaned[:limit].strip("-.")
    return cleaned or "x"


def container_name(run_id: str, strategy_index: int, key: str) -> str:
    return f"orchestrator_{safe_component(run_id)}_s{strategy_index}_k{short8(key)}"


def branch_name(strategy_name: str, run_id: str, key: str) -> str:
    return f"{safe_component(strategy_name)}_{safe_component(run_id)}_k{short8(key)}"


# What branch_name makes (run ids are run_YYYYMMDD_HHMMSS[_N]), with an import's "_N" suffix.
_RUN_BRANCH = re.compile(r".+_run_\d{8}_\d{6}(?:_\d+)?_k[0-9a-f]{8}(?:_\d+)?")


def is_run_branch(name: str) -> bool:
    """True for a branch a run made (:func:`branch_name`), not one of the user's own."""
    return _RUN_BRANCH.fullmatch(name) is not None


def ghash(session_group_key: str, *, plugin: str | None = None, model: str | None = None) -> str:
    """Session-group hash, part of the session volume's name. With plugin+model it is the global-scope variant."""
    obj: dict[str, str] = {"session_group_key": session_group_key}
    if plugin is not None and model is not None:
        obj.update(plugin=plugin, model=model)
    return jcs_sha256(obj)[:8]


def session_volume_name(run_id: str, ghash_value: str, *, scope: str = "run") -> str:
    if scope == "global":
        return f"orc_home_g{ghash_value}"
    return f"orc_home_{safe_component(run_id)}_g{ghash_value}"


def display_ids(key: str, inst_id: str) -> str:
    """The console prefix ``k<8hex>/inst-<5hex>``."""
    return f"k{short8(key)}/inst-{inst_id[:5]}"
