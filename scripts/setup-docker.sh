#!/usr/bin/env bash
# Prepare Docker for orchestrator on a Linux machine. Idempotent: a second run
# only checks labels and finishes in seconds.
#
#   1. install docker.io if neither docker nor dockerd exists (root only)
#   2. start dockerd in the background if `docker info` fails (root only)
#   3-5. `orchestrator --build-image` (orchestrator/agent_image/build.py): pick a base image
#      ($BASE_IMAGE, else a local debian:bookworm-slim, else a local
#      orchestrator-base:bookworm, else pull debian:bookworm-slim, else build
#      orchestrator-base:bookworm with debootstrap, root only), put the host's
#      extra CA certificates into the build context, build `claude-code`
#      (Dockerfile) and `orchestrator-test-agent` (docker/Dockerfile.test-agent),
#      each skipped when the existing image carries a label with the sha256 of
#      its inputs, and check the agent tools are on the image's PATH
#   (the fidelity image, the real CLIs behind a scripted local API, is built by
#   tests/fidelity_helpers.py on first use, from docker/Dockerfile.fidelity)
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

# ------------------------------------------------- 3-5. base image, CA certs, images
# The image build lives in the product (`orchestrator --build-image`, from
# orchestrator/agent_image/build.py) so that an installed orchestrator builds the same image
# as a checkout; this script only provisions the host and calls it. It reads
# BASE_IMAGE, EXTRA_CA_SOURCE, FORCE_REBUILD, VERBOSE and ORCHESTRATOR_CACHE_DIR
# from the environment.
command -v uv >/dev/null 2>&1 || die "uv is not installed; run scripts/setup.sh (it installs uv and the Python environment)"
export EXTRA_CA_SOURCE ORCHESTRATOR_CACHE_DIR="$CACHE_DIR"
build_args=(--build-image --docker-image "$IMAGE_NAME")
[ -n "${SKIP_TEST_IMAGE:-}" ] || build_args+=(--test-image "$TEST_IMAGE_NAME")
cd "$REPO_ROOT"
UV_PYTHON_DOWNLOADS=never uv run --frozen --quiet orchestrator "${build_args[@]}" \
    || die "orchestrator --build-image failed (see the lines above)"
say "done: images $IMAGE_NAME$([ -z "${SKIP_TEST_IMAGE:-}" ] && echo " and $TEST_IMAGE_NAME") ready"
