"""``orchestrator --build-image``: the agent image from the sources shipped with the package (docs/docker.md,
"Building"). A management command with nothing else running, so blocking calls are fine.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import PreflightError
from .paths import cache_dir, source_dir
from .pins import CLIS, PINS_FILE, installed_version, mismatches, read_pins
from .tools import DEFAULT_IMAGE, TOOLS, probe_tools

LABEL_KEY = "org.orchestrator.inputs-sha256"
LOCAL_BASE = "orchestrator-base:bookworm"
UPSTREAM_BASE = "debian:bookworm-slim"
TEST_DOCKERFILE = "docker/Dockerfile.test-agent"
_SKIP_PARTS = {"__pycache__", ".pytest_cache"}


class _Say:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        print(f"[build-image {time.monotonic() - self.t0:4.0f}s] {msg}", flush=True)


def _docker(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise PreflightError(
            "the docker command is not installed; install Docker Engine "
            "(Linux: apt-get install docker.io) or Docker Desktop"
        ) from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["docker", *args], 124, "", f"timed out after {timeout:g} s")


def image_id(name: str) -> str | None:
    r = _docker("image", "inspect", "-f", "{{.Id}}", name)
    return r.stdout.strip() if r.returncode == 0 else None


def image_label(name: str) -> str:
    r = _docker("image", "inspect", "-f", f'{{{{ index .Config.Labels "{LABEL_KEY}" }}}}', name)
    value = r.stdout.strip() if r.returncode == 0 else ""
    return "" if value == "<no value>" else value


def _source_files(src: Path) -> list[str]:
    """Dockerfile and every file under docker/ (any layout of the agent sources), minus caches and certs."""
    files = ["Dockerfile"]
    for path in sorted((src / "docker").rglob("*")):
        rel = path.relative_to(src)
        if not path.is_file() or _SKIP_PARTS & set(rel.parts) or path.suffix == ".pyc":
            continue
        if rel.parts[:2] == ("docker", "extra-ca"):
            continue  # filled from the host below, never from what was packaged
        files.append(rel.as_posix())
    return files


def _inputs_hash(ctx: Path, base: str, files: list[str]) -> str:
    h = hashlib.sha256(f"base {base}\n".encode())
    for rel in sorted(files):
        h.update(f"file {rel} {hashlib.sha256((ctx / rel).read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


def _build_local_base(say: _Say, cache: Path) -> None:
    if os.geteuid() != 0:
        raise PreflightError(
            f"{UPSTREAM_BASE} cannot be pulled and building {LOCAL_BASE} with debootstrap needs "
            "root; set BASE_IMAGE to an image you have"
        )
    tarball = cache / "bookworm-minbase.tar"
    logs = cache / "logs"
    if not tarball.is_file() or tarball.stat().st_size == 0:
        if shutil.which("debootstrap") is None:
            say("installing debootstrap")
            with open(logs / "apt-debootstrap.log", "w") as log:
                env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
                for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "debootstrap"]):
                    if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode != 0:
                        raise PreflightError(f"{' '.join(cmd)} failed, see {logs / 'apt-debootstrap.log'}")
        rootfs = Path(tempfile.mkdtemp(prefix="orchestrator-rootfs."))
        try:
            say(f"debootstrap bookworm (minbase) into {rootfs} (about a minute; log: {logs / 'debootstrap.log'})")
            with open(logs / "debootstrap.log", "w") as log:
                r = subprocess.run(
                    ["debootstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(rootfs)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if r.returncode != 0:
                raise PreflightError(f"debootstrap failed, see {logs / 'debootstrap.log'}")
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "tmp"):
                for p in (rootfs / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
                    elif p.is_dir():
                        shutil.rmtree(p, ignore_errors=True)
            tmp = tarball.with_suffix(".tar.tmp")
            if subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tmp), "."]).returncode != 0:
                raise PreflightError("could not pack the debootstrap rootfs")
            tmp.replace(tarball)
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)
        say(f"rootfs cached at {tarball}")
    else:
        say(f"using cached rootfs {tarball}")
    say(f"importing {tarball} as {LOCAL_BASE}")
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        'CMD ["/bin/bash"]',
    ]
    imported = _docker("import", *(a for c in changes for a in ("-c", c)), str(tarball), LOCAL_BASE)
    if imported.returncode != 0:
        raise PreflightError(f"docker import failed: {imported.stderr.strip()[-300:]}")


def pick_base(say: _Say, cache: Path) -> str:
    wanted = os.environ.get("BASE_IMAGE")
    if wanted:
        if image_id(wanted) is None and _docker("pull", wanted, timeout=120).returncode != 0:
            raise PreflightError(f"BASE_IMAGE={wanted} is not present locally and cannot be pulled")
        say(f"base image: {wanted} (from $BASE_IMAGE)")
        return wanted
    for local in (UPSTREAM_BASE, LOCAL_BASE):
        if image_id(local) is not None:
            say(f"base image: {local} (present locally)")
            return local
    say(f"trying: docker pull {UPSTREAM_BASE}")
    r = _docker("pull", UPSTREAM_BASE, timeout=120)
    if r.returncode == 0:
        say(f"base image: {UPSTREAM_BASE} (pulled)")
        return UPSTREAM_BASE
    last = (r.stderr.strip().splitlines() or ["?"])[-1][:120]
    say(f"cannot pull {UPSTREAM_BASE} ({last}); building {LOCAL_BASE} locally")
    _build_local_base(say, cache)
    say(f"base image: {LOCAL_BASE} (built with debootstrap)")
    return LOCAL_BASE


def _build(
    say: _Say, name: str, dockerfile: str, ctx: Path, inputs: str, build_args: dict[str, str], logs: Path
) -> bool:
    log_path = logs / f"build-{name.replace('/', '_').replace(':', '_')}.log"
    verbose = bool(os.environ.get("VERBOSE"))
    current = image_label(name)
    if not os.environ.get("FORCE_REBUILD") and current == inputs:
        say(f"{name} is up to date (inputs sha256 {inputs[:12]})")
        return False
    if current:
        say(f"building {name} (inputs changed: {current[:12]} -> {inputs[:12]})")
    else:
        say(f"building {name} (inputs sha256 {inputs[:12]})")
    cmd = ["docker", "build", "-f", str(ctx / dockerfile), "-t", name, "--label", f"{LABEL_KEY}={inputs}"]
    for k, v in build_args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    cmd.append(str(ctx))
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        if verbose:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                print("    " + line, end="", flush=True)
            rc = proc.wait()
        else:
            say(f"  log: {log_path}")
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        if not verbose:
            tail = log_path.read_text(errors="replace").splitlines()[-40:]
            print(f"----- last lines of {log_path} -----", *tail, sep="\n", file=sys.stderr)
        raise PreflightError(f"docker build of {name} failed (log: {log_path})")
    say(f"built {name} in {time.monotonic() - t0:.0f} s")
    return True


def _fill_context(src: Path, ctx: Path, say: Callable[[str], None]) -> tuple[list[str], list[str]]:
    """Copy the sources and this host's extra CA certificates into ``ctx``; return both lists of files."""
    files = _source_files(src)
    for rel in files:
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, ctx / rel)
    ca_dir = ctx / "docker" / "extra-ca"
    ca_dir.mkdir(parents=True, exist_ok=True)
    (ca_dir / ".gitkeep").touch()
    ca_source = Path(os.environ.get("EXTRA_CA_SOURCE", "/usr/local/share/ca-certificates"))
    certs = sorted(ca_source.rglob("*.crt")) if ca_source.is_dir() else []
    for crt in certs:
        shutil.copyfile(crt, ca_dir / crt.name)
    ca_files = sorted(f"docker/extra-ca/{c.name}" for c in certs)
    say(f"extra CA certificates from {ca_source}: {len(ca_files)}")
    return files, ca_files


def build_image(image: str = DEFAULT_IMAGE, *, test_image: str | None = None) -> None:
    say = _Say()
    src = source_dir()
    cache = cache_dir()
    (cache / "logs").mkdir(parents=True, exist_ok=True)
    r = _docker("info", "--format", "{{.ServerVersion}}", timeout=30)
    if r.returncode != 0:
        raise PreflightError(
            "cannot reach the Docker engine (docker info failed); start it "
            "(Linux: sudo systemctl start docker, or scripts/setup-docker.sh as root) "
            "or add your user to the docker group"
        )
    say(f"Docker engine reachable (server {r.stdout.strip()}); sources: {src}")
    pins = read_pins(src / PINS_FILE)
    say(
        "agent CLIs: "
        + ", ".join(f"{CLIS[tool][1]}@{version}" for tool, version in pins.items())
        + f" (pinned in {PINS_FILE})"
    )
    base = pick_base(say, cache)
    base_id = image_id(base) or base
    with tempfile.TemporaryDirectory(prefix="orchestrator-build.") as tmp:
        # The context holds only the inputs: the hash and what docker sees are the same files.
        ctx = Path(tmp)
        files, ca_files = _fill_context(src, ctx, say)
        # The product image does not depend on the test image's Dockerfile.
        product_inputs = [f for f in files if f != TEST_DOCKERFILE] + ca_files
        product_hash = _inputs_hash(ctx, base_id, product_inputs)
        built = _build(say, image, "Dockerfile", ctx, product_hash, {"BASE_IMAGE": base}, cache / "logs")
        if test_image:
            if TEST_DOCKERFILE not in files:
                raise PreflightError(f"{TEST_DOCKERFILE} is missing from {src}")
            test_hash = _inputs_hash(ctx, image_id(image) or image, [f for f in files if f != "Dockerfile"])
            _build(say, test_image, TEST_DOCKERFILE, ctx, test_hash, {"BASE": image}, cache / "logs")

    # A new image id is probed anyway (the cache is per id); refresh covers a forced rebuild.
    tools = probe_tools(image, refresh=built)
    missing = [t for t in TOOLS if tools.get(t) is None]
    if missing:
        raise PreflightError(f"{image} does not have {', '.join(missing)} on PATH; rebuild with FORCE_REBUILD=1")
    wrong = mismatches(tools, pins)
    if wrong:
        raise PreflightError(
            f"{image} has "
            + ", ".join(f"{tool} {got or '?'} where {PINS_FILE} pins {pinned}" for tool, (got, pinned) in wrong.items())
            + "; rebuild with FORCE_REBUILD=1"
        )
    say("installed: " + ", ".join(f"{tool} {installed_version(tools[tool])}" for tool in pins))
    say(f"done: {image}{f' and {test_image}' if test_image else ''} ready (base {base})")


def test_image_is_current(image: str, test_image: str, src: Path | None = None) -> bool:
    """True when ``test_image`` was built from the sources in ``src`` on top of the current ``image``."""
    src = src or source_dir()
    want = image_label(test_image)
    if not want:
        return False
    files = [f for f in _source_files(src) if f != "Dockerfile"]
    return _inputs_hash(src, image_id(image) or image, files) == want
