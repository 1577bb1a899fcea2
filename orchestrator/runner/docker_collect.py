"""Collecting a finished task's work: the secret scan and the import of its branch.

On a remote engine the agent's commits first come back as a git bundle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from ..errors import SecretLeakError
from . import archive, git_cmd, git_ops, secret_scan
from .base import RunnerEventCallback
from .docker_containers import DockerHost
from .docker_core import ContainerStopper, TaskEvents
from .types import AuthConfig, BranchArtifact, Hardening, InstanceRequest


@dataclass(eq=False)
class Collector:
    """The collect phase: the agent's commits come back (remote engine), are
    scanned for secrets and imported as the task's branch, per policy."""

    host: DockerHost
    hardening: Hardening
    auth: AuthConfig
    emit_event: TaskEvents
    stopper: ContainerStopper

    async def collect(
        self, request: InstanceRequest, workspace: Path, ws_info: Any, on_event: RunnerEventCallback | None
    ) -> BranchArtifact:
        """The task's branch (per policy), with the finalize stop alongside: the agent has finished, so
        the stop does not wait for the import (each takes a tenth of a second or so)."""
        if self.host.archive and request.import_policy != "never":
            await self._archive_bundle_out(request, workspace, ws_info, on_event)
        result: dict[str, Any] = {}

        async def collect() -> None:
            t = time.monotonic()
            try:
                if request.import_policy == "never":
                    artifact = BranchArtifact(
                        branch_planned=request.branch_name,
                        branch_final=None,
                        base=request.base_branch,
                        commit=ws_info.base_commit,
                        has_changes=False,
                    )
                else:
                    await self._scan_for_secrets(request, workspace, ws_info, on_event)
                    artifact = await git_ops.import_branch(
                        request.repo_path,
                        workspace,
                        branch_name=request.branch_name,
                        task_key=request.task_key,
                        run_id=request.run_id,
                        import_policy=request.import_policy,
                        import_conflict_policy=request.import_conflict_policy,
                        skip_empty_import=request.skip_empty_import,
                    )
            except Exception as exc:  # raised below, outside the task group, unwrapped
                result["error"] = exc
                return
            result["artifact"] = artifact
            self.emit_event(
                request,
                on_event,
                "runner.import.finished",
                phase="import",
                branch=artifact.branch_final,
                has_changes=artifact.has_changes,
                commit_count=artifact.commit_count,
                duration_s=round(time.monotonic() - t, 4),
            )

        if request.finalize:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.stopper.stop_quietly, request, on_event)
                await collect()
        else:
            await collect()
        if "error" in result:
            raise result["error"]
        return result["artifact"]

    async def _scan_for_secrets(
        self, request: InstanceRequest, workspace: Path, ws_info: Any, on_event: RunnerEventCallback | None
    ) -> None:
        """Refuse (or report) a branch whose commits contain a credential, before it reaches the repository."""
        if self.hardening.secret_scan == "off":
            return
        t = time.monotonic()

        def scan() -> list[Any]:
            head = git_cmd.ws_git(workspace, ["rev-parse", "--verify", "HEAD^{commit}"]).stdout.strip()
            return secret_scan.scan_commits(workspace, ws_info.base_commit, head, self.auth.labelled_secrets())

        findings = await anyio.to_thread.run_sync(scan)
        self.emit_event(
            request,
            on_event,
            "runner.secret_scan.finished",
            phase="import",
            findings=len(findings),
            duration_s=round(time.monotonic() - t, 4),
        )
        if not findings:
            return
        where = "; ".join(f.describe() for f in findings[:10]) + (
            f"; and {len(findings) - 10} more" if len(findings) > 10 else ""
        )
        if self.hardening.secret_scan == "warn":
            self.emit_event(
                request,
                on_event,
                "runner.secret_scan.warning",
                "warn",
                findings=where,
                detail="imported anyway (runner.secret_scan: warn)",
            )
            return
        raise SecretLeakError(
            f"the agent committed what looks like a credential, so its branch was not imported: "
            f"{where}. The workspace {workspace} is kept for inspection; set "
            f"runner.secret_scan: warn to import such branches anyway"
        )

    async def _archive_bundle_out(
        self, request: InstanceRequest, workspace: Path, ws_info: Any, on_event: RunnerEventCallback | None
    ) -> None:
        """Remote engine: the agent's commits come back as a git bundle into the local clone."""
        t = time.monotonic()
        got = await archive.bundle_out(self.host, request.container_name, workspace, ws_info.base_commit)
        self.emit_event(
            request,
            on_event,
            "runner.archive.bundle_read",
            phase="import",
            host=self.host.name,
            bytes=got["bytes"],
            head=got["head"],
            duration_s=round(time.monotonic() - t, 4),
        )
