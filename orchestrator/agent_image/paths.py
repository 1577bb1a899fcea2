"""Where the agent image's sources are, and where what is learnt about images is cached: apart, so that
the build, the pinned CLIs and the tool probe need not import one another to find a path."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import PreflightError


def source_dir() -> Path:
    """Where the Dockerfile and ``docker/`` are: package data when installed, the checkout otherwise."""
    # the orchestrator package: an installed wheel keeps the sources in orchestrator/_image/
    pkg = Path(__file__).resolve().parent.parent
    for candidate in (pkg / "_image", pkg.parent):
        if (candidate / "Dockerfile").is_file() and (candidate / "docker").is_dir():
            return candidate
    raise PreflightError(
        f"the image sources (Dockerfile, docker/) are missing next to {pkg}; "
        "reinstall orchestrator (uv tool install --reinstall orchestrator)"
    )


def cache_dir() -> Path:
    if os.environ.get("ORCHESTRATOR_CACHE_DIR"):
        return Path(os.environ["ORCHESTRATOR_CACHE_DIR"])
    if os.geteuid() == 0:
        return Path("/var/cache/orchestrator")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchestrator"
