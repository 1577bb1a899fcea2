#!/usr/bin/env bash
# Prepare Docker for orchestrator on a Linux machine. Idempotent: a second run
# only checks labels and finishes in seconds.
#
#   1. install docker.io if neither docker nor dockerd exists (root only)
#   2. start dockerd in the background if `docker info` fails (root only)
#   3. pick a base image: $BASE_IMAGE, else a local debian:bookworm-slim, else a
#      local orchestrator-base:bookworm, else pull debian:bookworm-slim, else
#      build orchestrator-base:bookworm with debootstrap (root only)
#   4. copy the host's extra CA certificates into docker/extra-ca/
#   5. build `claude-code` (Dockerfile), `orchestrator-test-agent`
#      (docker/Dockerfile.test-agent) and `orchestrator-fidelity`
#      (docker/Dockerfile.fidelity: the real CLIs behind a scripted local API,
#      for tests/test_fidelity.py), each skipped when the existing image
#      carries a label with the sha256 of its inputs
#
# Environment:
#   BASE_IMAGE          base image to use (skips base detection)
#   IMAGE_NAME          product image name (default claude-code)
#   TEST_IMAGE_NAME     test image name (default orchestrator-test-agent)
#   EXTRA_CA_SOURCE     dir whose *.crt are copied in (default /usr/local/share/ca-certificates)
#   FORCE_REBUILD=1     rebuild images even when the labels match
#   VERBOSE=1           stream `docker build` output instead of logging to a file
#   SKIP_TEST_IMAGE=1   do not build the test agent and fidelity images
#   FIDELITY_IMAGE_NAME fidelity test image name (default orchestrator-fidelity)
set -Eeuo pipefail

IMAGE_NAME="${IMAGE_NAME:-claude-code}"
TEST_IMAGE_NAME="${TEST_IMAGE_NAME:-orchestrator-test-agent}"
FIDELITY_IMAGE_NAME="${FIDELITY_IMAGE_NAME:-orchestrator-fidelity}"
LOCAL_BASE="orchestrator-base:bookworm"
UPSTREAM_BASE="debian:bookworm-slim"
LABEL_KEY="org.orchestrator.inputs-sha256"
EXTRA_CA_SOURCE="${EXTRA_CA_SOURCE:-/usr/local/share/ca-certificates}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
START_TS=$(date +%s)

if [ "$(id -u)" = 0 ]; then
    IS_ROOT=1
    CACHE_DIR="${ORCHESTRATOR_CACHE_DIR:-/var/cache/orchestrator}"
else
    IS_ROOT=0
    CACHE_DIR="${ORCHESTRATOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/orchestrator}"
fi
LOG_DIR="$CACHE_DIR/logs"

say() { printf '[setup-docker %3ss] %s\n' "$(( $(date +%s) - START_TS ))" "$*"; }
die() { printf '[setup-docker] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'rc=$?; printf "[setup-docker] ERROR: command failed (exit %s) at line %s: %s\n" "$rc" "$LINENO" "$BASH_COMMAND" >&2; exit $rc' ERR

sha256_of_stdin() { sha256sum | cut -d' ' -f1; }

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

image_label() {
    docker image inspect -f "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}

image_id() { docker image inspect -f '{{.Id}}' "$1"; }

mkdir -p "$LOG_DIR" || die "cannot create $LOG_DIR"

# ---------------------------------------------------------------- 1. install
if ! command -v docker >/dev/null 2>&1 || { ! command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; }; then
    [ "$IS_ROOT" = 1 ] || die "docker is not installed and this script is not running as root; install docker.io (or Docker Engine) first"
    command -v apt-get >/dev/null 2>&1 || die "docker is missing and apt-get is unavailable; install Docker Engine manually"
    say "installing docker.io (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >"$LOG_DIR/apt-docker.log" 2>&1 || die "apt-get update failed, see $LOG_DIR/apt-docker.log"
    APT_UPDATED=1
    apt-get install -y -qq --no-install-recommends docker.io iptables ca-certificates >>"$LOG_DIR/apt-docker.log" 2>&1 \
        || die "apt-get install docker.io failed, see $LOG_DIR/apt-docker.log"
    say "docker.io installed: $(docker --version)"
else
    say "docker client present: $(docker --version 2>/dev/null)"
fi

# ---------------------------------------------------------------- 2. daemon
if ! docker info >/dev/null 2>&1; then
    if [ "$IS_ROOT" = 1 ] && command -v dockerd >/dev/null 2>&1; then
        if pgrep -x dockerd >/dev/null 2>&1; then
            say "dockerd is running but not answering yet; waiting"
        else
            say "starting dockerd in the background (log: /var/log/dockerd.log)"
            if command -v setsid >/dev/null 2>&1; then
                setsid nohup dockerd >>/var/log/dockerd.log 2>&1 </dev/null &
            else
                nohup dockerd >>/var/log/dockerd.log 2>&1 </dev/null &
            fi
            disown 2>/dev/null || true
        fi
        for _ in $(seq 1 60); do
            docker info >/dev/null 2>&1 && break
            sleep 1
        done
        docker info >/dev/null 2>&1 || {
            tail -n 20 /var/log/dockerd.log >&2 || true
            die "dockerd did not become ready within 60 s (see /var/log/dockerd.log)"
        }
        say "dockerd is ready"
    else
        die "cannot reach the Docker engine (docker info failed); start dockerd or add this user to the docker group"
    fi
else
    say "Docker engine reachable (server $(docker version -f '{{.Server.Version}}' 2>/dev/null))"
fi

# ---------------------------------------------------------------- 3. base image
build_local_base() {
    local tarball="$CACHE_DIR/bookworm-minbase.tar"
    [ "$IS_ROOT" = 1 ] || die "$UPSTREAM_BASE cannot be pulled and building $LOCAL_BASE with debootstrap needs root; set BASE_IMAGE to an image you have"
    if [ ! -s "$tarball" ]; then
        if ! command -v debootstrap >/dev/null 2>&1; then
            say "installing debootstrap"
            export DEBIAN_FRONTEND=noninteractive
            if [ -z "${APT_UPDATED:-}" ]; then
                apt-get update -qq >"$LOG_DIR/apt-debootstrap.log" 2>&1 || die "apt-get update failed, see $LOG_DIR/apt-debootstrap.log"
                APT_UPDATED=1
            fi
            apt-get install -y -qq debootstrap >>"$LOG_DIR/apt-debootstrap.log" 2>&1 \
                || die "apt-get install debootstrap failed, see $LOG_DIR/apt-debootstrap.log"
        fi
        local rootfs
        rootfs="$(mktemp -d /tmp/orchestrator-rootfs.XXXXXX)"
        say "debootstrap bookworm (minbase) into $rootfs (about a minute; log: $LOG_DIR/debootstrap.log)"
        debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" >"$LOG_DIR/debootstrap.log" 2>&1 \
            || { rm -rf "$rootfs"; die "debootstrap failed, see $LOG_DIR/debootstrap.log"; }
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/* || true
        tar -C "$rootfs" -cf "$tarball.tmp" . || { rm -rf "$rootfs"; die "could not pack the rootfs"; }
        mv "$tarball.tmp" "$tarball"
        rm -rf "$rootfs"
        say "rootfs cached at $tarball"
    else
        say "using cached rootfs $tarball"
    fi
    say "importing $tarball as $LOCAL_BASE"
    docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        -c 'CMD ["/bin/bash"]' \
        "$tarball" "$LOCAL_BASE" >/dev/null || die "docker import failed"
}

if [ -n "${BASE_IMAGE:-}" ]; then
    image_exists "$BASE_IMAGE" || docker pull "$BASE_IMAGE" >/dev/null 2>&1 \
        || die "BASE_IMAGE=$BASE_IMAGE is not present locally and cannot be pulled"
    say "base image: $BASE_IMAGE (from \$BASE_IMAGE)"
elif image_exists "$UPSTREAM_BASE"; then
    BASE_IMAGE="$UPSTREAM_BASE"
    say "base image: $BASE_IMAGE (present locally)"
elif image_exists "$LOCAL_BASE"; then
    BASE_IMAGE="$LOCAL_BASE"
    say "base image: $BASE_IMAGE (present locally)"
elif say "trying: docker pull $UPSTREAM_BASE" && timeout 120 docker pull "$UPSTREAM_BASE" >"$LOG_DIR/pull.log" 2>&1; then
    BASE_IMAGE="$UPSTREAM_BASE"
    say "base image: $BASE_IMAGE (pulled)"
else
    say "cannot pull $UPSTREAM_BASE ($(tail -n 1 "$LOG_DIR/pull.log" 2>/dev/null | cut -c1-120)); building $LOCAL_BASE locally"
    build_local_base
    BASE_IMAGE="$LOCAL_BASE"
    say "base image: $BASE_IMAGE (built with debootstrap)"
fi
BASE_ID="$(image_id "$BASE_IMAGE")"

# ---------------------------------------------------------------- 4. CA certs
CA_DEST="$REPO_ROOT/docker/extra-ca"
mkdir -p "$CA_DEST"
find "$CA_DEST" -maxdepth 1 -type f -name '*.crt' -delete
ca_count=0
if [ -d "$EXTRA_CA_SOURCE" ]; then
    while IFS= read -r -d '' crt; do
        name="$(basename "$crt")"
        cp "$crt" "$CA_DEST/$name"
        ca_count=$((ca_count + 1))
    done < <(find "$EXTRA_CA_SOURCE" -type f -name '*.crt' -print0 | sort -z)
fi
say "extra CA certificates copied into docker/extra-ca/: $ca_count"

# ---------------------------------------------------------------- 5. images
# Build contexts are assembled in a temp dir holding only the inputs (the repo
# has no .dockerignore, and this keeps the hash and the context identical).
CTX="$(mktemp -d /tmp/orchestrator-build.XXXXXX)"
cleanup() { rm -rf "$CTX"; }
trap cleanup EXIT
mkdir -p "$CTX/docker/extra-ca"
cp "$REPO_ROOT/Dockerfile" "$CTX/Dockerfile"
mkdir -p "$CTX/docker/sim_agent"
cp "$REPO_ROOT"/docker/sim_agent/*.py "$CTX/docker/sim_agent/"
cp "$REPO_ROOT/docker/Dockerfile.test-agent" "$CTX/docker/Dockerfile.test-agent"
cp "$REPO_ROOT/docker/Dockerfile.fidelity" "$CTX/docker/Dockerfile.fidelity"
mkdir -p "$CTX/docker/fidelity"
cp "$REPO_ROOT/docker/fidelity/api_server.py" "$REPO_ROOT/docker/fidelity/ensure_server.py" "$CTX/docker/fidelity/"
find "$CA_DEST" -maxdepth 1 -type f -name '*.crt' -exec cp {} "$CTX/docker/extra-ca/" \;
touch "$CTX/docker/extra-ca/.gitkeep"

inputs_hash() {
    # $1: base image id; rest: files (relative to $CTX)
    local base="$1"; shift
    {
        printf 'base %s\n' "$base"
        local f
        for f in "$@"; do
            printf 'file %s %s\n' "$f" "$(sha256sum <"$CTX/$f" | cut -d' ' -f1)"
        done
    } | sha256_of_stdin
}

build_image() {
    # $1 image name, $2 dockerfile (in $CTX), $3 hash, rest: extra docker build args
    local name="$1" dockerfile="$2" hash="$3"; shift 3
    local current
    current="$(image_label "$name" "$LABEL_KEY")"
    if [ -z "${FORCE_REBUILD:-}" ] && [ "$current" = "$hash" ]; then
        say "$name is up to date (inputs sha256 ${hash:0:12})"
        return 0
    fi
    if [ -n "$current" ] && [ "$current" != "<no value>" ]; then
        say "building $name (inputs changed: ${current:0:12} -> ${hash:0:12})"
    else
        say "building $name (inputs sha256 ${hash:0:12})"
    fi
    local log="$LOG_DIR/build-$name.log" t0
    t0=$(date +%s)
    local -a cmd=(docker build -f "$CTX/$dockerfile" -t "$name" --label "$LABEL_KEY=$hash" "$@" "$CTX")
    if [ -n "${VERBOSE:-}" ]; then
        "${cmd[@]}" 2>&1 | tee "$log" | sed 's/^/    /' || die "docker build of $name failed (log: $log)"
    else
        say "  log: $log"
        if ! "${cmd[@]}" >"$log" 2>&1; then
            echo "----- last lines of $log -----" >&2
            tail -n 40 "$log" >&2 || true
            die "docker build of $name failed (log: $log)"
        fi
    fi
    say "built $name in $(( $(date +%s) - t0 )) s"
}

sim_files=()
while IFS= read -r -d '' f; do sim_files+=("docker/sim_agent/$(basename "$f")"); done \
    < <(find "$CTX/docker/sim_agent" -maxdepth 1 -type f -name '*.py' -print0 | sort -z)

ca_files=()
while IFS= read -r -d '' f; do ca_files+=("docker/extra-ca/$(basename "$f")"); done \
    < <(find "$CTX/docker/extra-ca" -maxdepth 1 -type f -name '*.crt' -print0 | sort -z)

product_hash="$(inputs_hash "$BASE_ID" Dockerfile "${sim_files[@]}" "${ca_files[@]}")"
build_image "$IMAGE_NAME" Dockerfile "$product_hash" --build-arg "BASE_IMAGE=$BASE_IMAGE"

if [ -z "${SKIP_TEST_IMAGE:-}" ]; then
    test_hash="$(inputs_hash "$(image_id "$IMAGE_NAME")" docker/Dockerfile.test-agent "${sim_files[@]}")"
    build_image "$TEST_IMAGE_NAME" docker/Dockerfile.test-agent "$test_hash" --build-arg "BASE=$IMAGE_NAME"
    # Same hash as tests/fidelity_helpers.py computes, so the tests reuse this build.
    fidelity_hash="$(inputs_hash "$(image_id "$IMAGE_NAME")" docker/Dockerfile.fidelity docker/fidelity/api_server.py \
        docker/fidelity/ensure_server.py)"
    build_image "$FIDELITY_IMAGE_NAME" docker/Dockerfile.fidelity "$fidelity_hash" --build-arg "BASE=$IMAGE_NAME"
fi

# ---------------------------------------------------------------- smoke check
if ! docker run --rm --user node "$IMAGE_NAME" sh -c 'command -v claude >/dev/null && command -v codex >/dev/null && command -v orchestrator-sim-agent >/dev/null' >/dev/null 2>&1; then
    die "$IMAGE_NAME does not have claude, codex and orchestrator-sim-agent on PATH"
fi
say "done: images $IMAGE_NAME${SKIP_TEST_IMAGE:+}$([ -z "${SKIP_TEST_IMAGE:-}" ] && echo ", $TEST_IMAGE_NAME and $FIDELITY_IMAGE_NAME") ready (base $BASE_IMAGE)"
