#!/usr/bin/env bash
# Run the fidelity suite (tests/test_fidelity.py: the REAL claude and codex CLIs
# against a scripted API) on agent images built with given CLI versions, then
# print one table: a row per test, a column per version pair.
#
#   scripts/cli-matrix.sh                          # current versions, then claude 2.0.8 / codex 0.63.0
#   scripts/cli-matrix.sh current 2.1.330/0.169.0  # any pairs: CLAUDE/CODEX npm versions, or "current"
#
# Each pair becomes the image orchestrator-cli-matrix:<claude>-<codex> (built
# from the top-level Dockerfile with the build args CLAUDE_CODE_VERSION /
# CODEX_VERSION in place of the pins) and, on top of it, its fidelity image.
# "current" uses the existing claude-code image (the pinned versions).
# Needs what scripts/setup-docker.sh prepares (a base image, Docker). Results
# and logs go to ${MATRIX_DIR:-/tmp/orchestrator-cli-matrix}.
# Exit status: 0 when every pair passed every test, else 1.
set -Eeuo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${MATRIX_DIR:-/tmp/orchestrator-cli-matrix}"
mkdir -p "$OUT"
export UV_PYTHON_DOWNLOADS=never

if [ "$#" = 0 ]; then
    set -- current 2.0.8/0.63.0
fi

# shellcheck source=scripts/cli-image.sh
. "$REPO_ROOT/scripts/cli-image.sh"

columns=()
for pair in "$@"; do
    if [ "$pair" = current ]; then
        image=claude-code
        docker image inspect "$image" >/dev/null 2>&1 || { echo "cli-matrix: $image missing; run scripts/setup-docker.sh" >&2; exit 1; }
    else
        case "$pair" in
            */*) claude="${pair%%/*}"; codex="${pair#*/}" ;;
            *) echo "cli-matrix: '$pair' is not CLAUDE/CODEX (e.g. 2.0.8/0.63.0) or 'current'" >&2; exit 2 ;;
        esac
        image="orchestrator-cli-matrix:$claude-$codex"
        build_cli_image "$claude" "$codex" "$image" "$OUT" || { columns+=("$pair|build failed|"); continue; }
    fi
    claude_v="$(docker run --rm "$image" claude --version 2>/dev/null | head -n 1 | cut -d' ' -f1)"
    codex_v="$(docker run --rm "$image" codex --version 2>/dev/null | head -n 1 | awk '{print $NF}')"
    label="claude ${claude_v:-?} / codex ${codex_v:-?}"
    xml="$OUT/results-${claude_v:-x}-${codex_v:-x}.xml"
    echo "cli-matrix: fidelity suite on $label" >&2
    (cd "$REPO_ROOT" && FIDELITY_BASE="$image" FIDELITY_IMAGE="orchestrator-fidelity:matrix-${claude_v:-x}-${codex_v:-x}" \
        uv run pytest -q -p no:cacheprovider tests/test_fidelity.py --junitxml="$xml" >"$xml.log" 2>&1) || true
    columns+=("$label|$xml")
done

python3 - "${columns[@]}" <<'EOF'
import sys
import xml.etree.ElementTree as ET

cols, rows, failed = [], {}, False
for arg in sys.argv[1:]:
    label, xml = arg.split("|", 1)
    cols.append(label)
    if not xml or xml == "build failed|":
        rows.setdefault("(image build)", {})[label] = "FAIL"
        failed = True
        continue
    try:
        cases = ET.parse(xml).getroot().iter("testcase")
    except (OSError, ET.ParseError):
        rows.setdefault("(suite did not run)", {})[label] = "FAIL"
        failed = True
        continue
    for case in cases:
        name = case.get("name")
        if case.find("skipped") is not None:
            verdict = "skip"
        elif case.find("failure") is not None or case.find("error") is not None:
            verdict, failed = "FAIL", True
        else:
            verdict = "pass"
        rows.setdefault(name, {})[label] = verdict
width = max([len(r) for r in rows] + [4])
print("| " + "test".ljust(width) + " | " + " | ".join(cols) + " |")
print("|" + "-" * (width + 2) + "|" + "|".join("-" * (len(c) + 2) for c in cols) + "|")
for name in sorted(rows):
    print("| " + name.ljust(width) + " | " + " | ".join(rows[name].get(c, "-").ljust(len(c)) for c in cols) + " |")
sys.exit(1 if failed else 0)
EOF
