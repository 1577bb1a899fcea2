#!/usr/bin/env bash
# The test command: set up everything, lint and type-check (scripts/lint.sh),
# then run the whole suite (unit, real git, real Docker with the simulated
# agent, and the real `orchestrator` command).
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export UV_PYTHON_DOWNLOADS=never
# Findings of ruff or mypy fail the run before any test starts: they are cheap
# to see and a red lint is as much a failure as a red test.
bash scripts/lint.sh
# Docker was just set up: a Docker test that cannot run is a failure, not a skip.
export ORCHESTRATOR_TESTS_REQUIRE_DOCKER=1
set +e
uv run pytest -q -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" = 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$status"
