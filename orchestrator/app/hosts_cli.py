"""``orchestrator --hosts``, and the side of the cleanup commands that visits every engine of ``runner.hosts``."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio

from ..config import Config
from ..errors import RunnerError
from ..runner import (
    WORKSPACE_VOLUME_PREFIX,
    DockerHost,
    HostSpec,
    docker_host,
    image_id,
    list_caches,
    list_containers,
    remove_containers,
    remove_run_volumes,
    resolve_hosts,
    transport_warnings,
)


async def host_specs(config: Config | None) -> tuple[HostSpec, ...]:
    """runner.hosts as specs, () for the local engine alone; read on a worker thread, since a
    context's endpoint comes from ``docker context inspect`` and TLS settings from files."""
    if config is None or not config.runner.hosts:
        return ()
    return tuple(await anyio.to_thread.run_sync(resolve_hosts, config.runner.hosts))


def engines(specs: Sequence[HostSpec]) -> list[tuple[str, DockerHost]]:
    """(label, DockerHost) for every engine of ``specs``; the local one when there are none."""
    if not specs:
        return [("local", DockerHost(name="local"))]
    return [(spec.shown, docker_host(spec)) for spec in specs]


async def workspace_volumes(host: DockerHost, run_id: str | None, names: list[str]) -> list[str]:
    """The per-task /workspace volumes (remote engines) of these containers or of a run."""
    filters: dict[str, Any] = {"name": WORKSPACE_VOLUME_PREFIX}
    if run_id:
        filters["label"] = [f"run_id={run_id}"]
    listing = await host.api("list volumes", "volumes", filters=filters)
    found = [v["Name"] for v in (listing or {}).get("Volumes") or [] if v["Name"].startswith(WORKSPACE_VOLUME_PREFIX)]
    if run_id:
        return found
    wanted = {f"{WORKSPACE_VOLUME_PREFIX}{n}" for n in names}
    return [v for v in found if v in wanted]


async def remove_with_workspaces(host: DockerHost, names: list[str], run_id: str | None = None) -> list[str]:
    """Remove containers, then the workspace volumes they leave behind; returns the volumes removed."""
    await remove_containers(names, host=host)
    volumes = await workspace_volumes(host, run_id, names)
    for volume in volumes:
        await host.api(f"remove volume {volume}", "remove_volume", volume, force=True)
    return volumes


async def cleanup_run_everywhere(config: Config, run_id: str) -> tuple[int, int]:
    """--cleanup-run on every engine: (containers, volumes) removed."""
    containers = volumes = 0
    for label, host in engines(await host_specs(config)):
        try:
            names = [c["name"] for c in await list_containers(run_id, host=host)]
            volumes += len(await remove_with_workspaces(host, names, run_id))
            volumes += len(await remove_run_volumes(run_id, host=host))
            containers += len(names)
        except RunnerError as exc:
            print(f"warning: Docker host {label} not cleaned: {exc}")
        finally:
            await host.aclose()
    return containers, volumes


def describe_cache(cache: dict[str, Any]) -> str:
    """One object cache of an engine (object_cache.py), as --hosts shows it."""
    size = "size unknown" if cache["kb"] is None else f"{cache['kb'] / 1024:.1f} MB"
    if cache["last"]:
        last = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(cache["last"]))
    else:
        last = "never" if cache["kb"] is not None else "unknown"
    return f"object cache {cache['name']}: repo {cache['repo']}, {size}, last used {last}"


async def _check_one(spec: HostSpec, image: str, reference: str | None) -> dict[str, Any]:
    host = docker_host(spec)
    row: dict[str, Any] = {"name": spec.name, "engine": spec.shown, "transport": spec.transport, "ok": False}
    try:
        with anyio.fail_after(30):
            t = time.monotonic()
            await host.api(f"ping {spec.name}", "ping")
            row["rtt_ms"] = round((time.monotonic() - t) * 1000, 1)
            row["version"] = (await host.api(f"version of {spec.name}", "version")).get("Version", "?")
            found = await image_id(host, image)
            running = [c for c in await list_containers(host=host) if c["status"] == "running"]
            if spec.remote:
                # Read with the run's image, when the engine has it (a container reads the volumes).
                row["caches"] = await list_caches(host, image if found is not None else None)
    except (RunnerError, TimeoutError) as exc:
        row["error"] = str(exc) or "no answer within 30 s"
        return row
    finally:
        await host.aclose()
    row["image"] = "missing" if found is None else ("same" if reference in (None, found) else "different build")
    row["free_slots"] = max(0, spec.max_parallel - len(running))
    row["max_parallel"] = spec.max_parallel
    row["ok"] = row["image"] == "same"
    return row


async def check_hosts(config: Config) -> int:
    """``orchestrator --hosts``: one line per engine; exit 1 when any is down or lacks the image."""
    image = config.runner.docker_image
    specs = await host_specs(config) or (HostSpec("local", None, 0),)
    local = DockerHost(name="local")
    try:
        reference = await image_id(local, image)
    except RunnerError:
        reference = None
    finally:
        await local.aclose()
    # Every host at once: a host that does not answer costs its 30 s once, not once per host after it.
    rows: list[dict[str, Any]] = [{} for _ in specs]

    async def check(i: int, spec: HostSpec) -> None:
        rows[i] = await _check_one(spec, image, reference)

    async with anyio.create_task_group() as tg:
        for i, spec in enumerate(specs):
            tg.start_soon(check, i, spec)
    for row in rows:
        if "error" in row:
            print(f"{row['name']:<12} DOWN  {row['engine']}, transport {row['transport']}: {row['error']}")
            continue
        print(
            f"{row['name']:<12} up    Docker {row['version']}, rtt {row['rtt_ms']} ms, image {image}: "
            f"{row['image']}, free slots {row['free_slots']}/{row['max_parallel']}, "
            f"transport {row['transport']}  ({row['engine']})"
        )
        for cache in row.get("caches") or []:
            print(f"{'':<12}       {describe_cache(cache)}")
    for warning in transport_warnings(specs):
        print(f"warning: {warning}", file=sys.stderr)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        fixes = []
        if any("error" in r for r in bad):
            fixes.append("make the DOWN host(s) answer (see each line)")
        if any("error" not in r for r in bad):
            fixes.append("copy the image with --sync-image")
        print(f"{len(bad)} of {len(rows)} host(s) not ready: {'; '.join(fixes)}")
    return 1 if bad else 0
