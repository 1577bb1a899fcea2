"""The run's image on every engine: the same image ID everywhere (agents on different
engines must run the same bits), or a clear stop; ``--sync-image`` streams it instead
(docs/scaling.md).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence

import anyio
import anyio.to_thread

from ..errors import PreflightError, RunnerError
from ..sanitize import redact_url
from .docker_containers import DockerHost
from .hosts import HostSpec, docker_host

ProgressFn = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def image_id(host: DockerHost, image: str) -> str | None:
    info = await host.inspect_image(image)
    return info["Id"] if info is not None else None


def fix_command(spec: HostSpec, image: str) -> str:
    target = f"-H {redact_url(spec.url)}" if spec.url else ""
    return f"docker save {image} | docker {target} load".replace("  ", " ")


def _counting(chunks: Iterator[bytes], name: str, total: int, progress: ProgressFn, sent: list[int]) -> Iterator[bytes]:
    """``chunks``, counted into ``sent[0]``, with a progress line every two seconds."""
    last = 0.0
    for chunk in chunks:
        sent[0] += len(chunk)
        now = time.monotonic()
        if now - last >= 2.0:
            last = now
            pct = f" ({100 * sent[0] // total}%)" if total else ""
            progress(f"syncing image to host {name}: {sent[0] >> 20} MiB of about {total >> 20} MiB{pct}")
        yield chunk
    progress(f"syncing image to host {name}: {sent[0] >> 20} MiB sent, loading")


async def sync_image(
    source: DockerHost, target: DockerHost, spec: HostSpec, image: str, progress: ProgressFn = _stderr
) -> int:
    """Stream ``image`` from ``source`` into ``target``; returns the bytes sent."""
    src = await source.client()
    dst = await target.client()
    info = await source.call(f"inspect image {image}", src.api.inspect_image, image)
    total = int(info.get("Size") or 0)
    sent = [0]

    def _stream() -> None:
        chunks = _counting(src.api.get_image(image, chunk_size=1 << 20), spec.name, total, progress, sent)
        for _ in dst.api.load_image(chunks, quiet=True):
            pass

    await target.call(f"load image {image} on host {spec.name}", _stream)
    return sent[0]


async def preflight_images(
    specs: Sequence[HostSpec], image: str, *, sync: bool, progress: ProgressFn = _stderr
) -> dict[str, str]:
    """Every host has ``image`` with this machine's image ID (syncing it if asked): host name -> image ID,
    or PreflightError naming the host."""
    local = DockerHost(name="local")
    hosts = {spec.name: docker_host(spec) for spec in specs}
    try:
        try:
            reference = await image_id(local, image)
        except RunnerError as exc:
            reference = None
            if any(not s.remote for s in specs) or sync:
                raise PreflightError(f"this machine's Docker engine does not answer: {exc}") from None
        ids: dict[str, str] = {}
        for spec in specs:
            host = hosts[spec.name]
            try:
                with anyio.fail_after(60):
                    found = await image_id(host, image)
            except (RunnerError, TimeoutError) as exc:
                raise PreflightError(
                    f"Docker host {spec.shown} does not answer: {exc}; check it with `orchestrator --hosts`"
                ) from None
            if reference is None:
                if found is None:
                    raise PreflightError(
                        f"Docker image {image!r} not found on host {spec.name} nor on this machine; "
                        f"build it with scripts/setup-docker.sh (or: docker build -t {image} .)"
                    )
                reference = found
            if found != reference:
                if not sync or not spec.remote:
                    what = "lacks" if found is None else "has a different build of"
                    raise PreflightError(
                        f"Docker host {spec.name} {what} image {image!r} (want ID {reference[:19]}); "
                        f"fix: {fix_command(spec, image)}  (or pass --sync-image)"
                    )
                progress(f"host {spec.name} {'lacks' if found is None else 'has another build of'} {image}: syncing it")
                await sync_image(local, host, spec, image, progress)
                found = await image_id(host, image)
                if found != reference:
                    raise PreflightError(
                        f"image sync to host {spec.name} ended with ID {found} instead of "
                        f"{reference[:19]}; try: {fix_command(spec, image)}"
                    )
            ids[spec.name] = found
        return ids
    finally:
        await local.aclose()
        for host in hosts.values():
            await host.aclose()
