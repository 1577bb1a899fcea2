# Sourced by scripts/cli-matrix.sh and scripts/cli-drift.sh: build the agent
# image (the top-level Dockerfile) with given agent CLI versions instead of
# the pins in docker/cli-versions.env.
#
#   build_cli_image CLAUDE_VERSION CODEX_VERSION TAG LOG_DIR

_cli_image_base() {
    local candidate
    for candidate in "${BASE_IMAGE:-}" debian:bookworm-slim orchestrator-base:bookworm; do
        if [ -n "$candidate" ] && docker image inspect "$candidate" >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    echo "no base image; run scripts/setup-docker.sh first" >&2
    return 1
}

build_cli_image() {
    local claude="$1" codex="$2" tag="$3" log_dir="$4" repo ctx log base
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    base="$(_cli_image_base)" || return 1
    ctx="$(mktemp -d /tmp/orchestrator-cli-image.XXXXXX)"
    cp "$repo/Dockerfile" "$ctx/"
    cp -r "$repo/docker" "$ctx/docker"
    # The host's extra CA certificates (an intercepting proxy's), as --build-image does.
    find "${EXTRA_CA_SOURCE:-/usr/local/share/ca-certificates}" -type f -name '*.crt' \
        -exec cp {} "$ctx/docker/extra-ca/" \; 2>/dev/null || true
    log="$log_dir/build-${tag//[:\/]/_}.log"
    echo "building $tag (claude-code@$claude, codex@$codex; log $log)" >&2
    if ! docker build -f "$ctx/Dockerfile" -t "$tag" --build-arg "BASE_IMAGE=$base" \
            --build-arg "CLAUDE_CODE_VERSION=$claude" \
            --build-arg "CODEX_VERSION=$codex" "$ctx" >"$log" 2>&1; then
        rm -rf "$ctx"
        tail -n 20 "$log" >&2
        echo "build of $tag failed (log $log)" >&2
        return 1
    fi
    rm -rf "$ctx"
}
