#!/usr/bin/env bash
# What the newest agent CLI releases print differently from the pinned ones.
#
#   scripts/cli-drift.sh                  # the newest versions on the npm registry
#   scripts/cli-drift.sh 2.1.332 0.170.0  # or given CLAUDE and CODEX versions
#
# Builds the agent image with those versions, runs both real CLIs (pinned and
# newest) against the scripted API of the fidelity image for the same four
# scenarios as tests/test_fidelity_shapes.py, and prints per line type the keys
# added (+), gone (-) and whose JSON type changed (~). Exits 0 whatever it
# finds: drift is news to act on, never a failure of the suite or CI. It exits
# non-zero only when it cannot look (no Docker, a failed build).
# Upgrading the pins: docs/docker.md, "Upgrading the agent CLIs".
set -Eeuo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${DRIFT_DIR:-/tmp/orchestrator-cli-drift}"
mkdir -p "$OUT"
export UV_PYTHON_DOWNLOADS=never
# shellcheck source=scripts/cli-image.sh
. "$REPO_ROOT/scripts/cli-image.sh"

newest() {
    # An exact version, so that docker's layer cache cannot keep an old "latest".
    npm view "$1" version 2>/dev/null || {
        echo "cli-drift: cannot ask the npm registry for $1's newest version; give the versions as arguments" >&2
        exit 1
    }
}

case "$#" in
    0) claude="$(newest @anthropic-ai/claude-code)"; codex="$(newest @openai/codex)" ;;
    2) claude="$1"; codex="$2" ;;
    *) echo "usage: scripts/cli-drift.sh [CLAUDE_VERSION CODEX_VERSION]" >&2; exit 2 ;;
esac
. "$REPO_ROOT/docker/cli-versions.env"
echo "cli-drift: pinned claude-code $CLAUDE_CODE_VERSION / codex $CODEX_VERSION; comparing with $claude / $codex" >&2

cd "$REPO_ROOT"
docker image inspect claude-code >/dev/null 2>&1 || { echo "cli-drift: image claude-code missing; run scripts/setup.sh" >&2; exit 1; }
tag="orchestrator-cli-drift:$claude-$codex"
build_cli_image "$claude" "$codex" "$tag" "$OUT" || exit 1
fidelity() {
    FIDELITY_BASE="$1" FIDELITY_IMAGE="$2" uv run --frozen --quiet python -c \
        'import sys; sys.path.insert(0, "tests"); from fidelity_helpers import ensure_image; print(ensure_image())'
}
pinned_image="$(fidelity claude-code orchestrator-fidelity)"
newest_image="$(fidelity "$tag" "orchestrator-fidelity:drift-$claude-$codex")"
uv run --frozen --quiet python tests/shape_drift.py "$pinned_image" "$newest_image"
