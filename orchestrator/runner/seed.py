"""Workspace seeds: the git-ignored files an image's setup made (label :data:`~.types.SEED_LABEL`),
taken out once per image id and copied into each task's clone (docs/environment.md).

Copied on the host, not in the container: a read-only review workspace gets them too, and a
remote engine gets them with the clone it already receives.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ContainerError
from .docker_containers import DockerHost, OncePerKey
from .types import SEED_LABEL


class SeedCache:
    """The seed directory of each image, taken out once per image id under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._found: OncePerKey[Path | None] = OncePerKey()

    async def for_image(self, host: DockerHost, image: str) -> Path | None:
        """The host directory holding ``image``'s seed, or None when it has none."""

        async def take() -> Path | None:
            return await host.call(f"take the workspace seed out of {image}", self._take, await host.client(), image)

        return await self._found.get(image, take)

    def _take(self, client: Any, image: str) -> Path | None:
        info = client.api.inspect_image(image)
        seed = ((info.get("Config") or {}).get("Labels") or {}).get(SEED_LABEL)
        if not seed:
            return None
        target = self.root / info["Id"].replace("sha256:", "")[:24]
        if target.is_dir():
            return target
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".seed-", dir=self.root))
        try:
            container = client.api.create_container(image, command=["true"], labels={"orchestrator.seed": "true"})
            try:
                stream, _ = client.api.get_archive(container["Id"], seed)
                # a seed can be hundreds of MB (node_modules): through a file, not memory
                with tempfile.TemporaryFile(dir=self.root) as spool:
                    for chunk in stream:
                        spool.write(chunk)
                    spool.seek(0)
                    _extract(spool, tmp / "x")
            finally:
                client.api.remove_container(container["Id"], force=True)
            # the archive holds the directory itself: <name>/...
            (inner,) = list((tmp / "x").iterdir())
            try:
                os.replace(inner, target)
            except OSError:
                if not target.is_dir():
                    raise
                # another process took it out first: same image id, same files
        except OSError as exc:
            raise ContainerError(f"cannot keep the workspace seed of {image} under {self.root}: {exc}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target


def _extract(archive: Any, into: Path) -> None:
    """Unpack the seed's tar into ``into``, owners by number, modes as archived; the system's tar
    where there is one (docs/performance.md: a fraction of tarfile's time). Both refuse members
    that would land outside ``into``."""
    into.mkdir()
    if shutil.which("tar") is None:
        try:
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(into, filter="tar", numeric_owner=True)
        except tarfile.TarError as exc:
            raise OSError(f"cannot unpack it: {exc}") from None
        return
    run = subprocess.run(
        ["tar", "-x", "--numeric-owner", "-C", str(into)], stdin=archive, capture_output=True, text=True
    )
    if run.returncode != 0:
        raise OSError(f"tar could not unpack it: {run.stderr.strip()[-300:]}")


def copy_seed(seed: Path, workspace: Path) -> None:
    """Copy the seed's files into ``workspace`` (owners and modes kept, as the image had them)."""
    run = subprocess.run(["cp", "-a", f"{seed}/.", f"{workspace}/"], capture_output=True, text=True)
    if run.returncode != 0:
        raise ContainerError(
            f"cannot copy the environment's files into {workspace}: {run.stderr.strip()[:300]}", retryable=False
        )
