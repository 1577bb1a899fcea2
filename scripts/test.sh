#!/usr/bin/env bash
# The test command: set up everything, lint and type-check (scripts/lint.sh),
# then run the whole suite (unit, real git, real Docker with the simulated
# agent, and the real `orchestrator` command).
#
# bash scripts/test.sh --quick is the edit-test loop's tier: lint and every
# test that needs no Docker and is not a torture test (marker "slow"), on both
# cores. It needs only uv, no Docker engine and no images.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export UV_PYTHON_DOWNLOADS=never
# pytest keeps each test module with its asserts rewritten in tests/__pycache__
# (tests/conftest.py); a clean checkout has none, and every worker would rewrite
# all of them at once (a collection takes 11 CPU-seconds instead of 4.5). One collection beside the lint,
# which leaves the other CPU idle, writes them first.
lint_beside_a_collection() {
    uv run --frozen pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 &
    local collect=$! status=0
    bash scripts/lint.sh || status=$?
    wait "$collect" || true  # a module that cannot be collected fails the test run itself, with its error
    return "$status"
}
if [ "${1:-}" = "--quick" ]; then
    shift
    uv sync --frozen --quiet
    uv run --frozen python -m compileall -q -j 0 orchestrator strategies runner_plugins tui >/dev/null
    lint_beside_a_collection
    set +e
    uv run pytest -q -p no:cacheprovider -m "not docker and not slow" -n 2 "$@"
    status=$?
    set -e
    [ "$status" = 5 ] && { echo "pytest collected no tests: that is a failure here" >&2; exit 1; }
    exit "$status"
fi
bash scripts/setup.sh
# Findings of ruff or mypy fail the run before any test starts: they are cheap
# to see and a red lint is as much a failure as a red test.
lint_beside_a_collection
# Docker was just set up: a Docker test that cannot run is a failure, not a skip.
export ORCHESTRATOR_TESTS_REQUIRE_DOCKER=1
# The Kubernetes backend's tests run against a real cluster built from Debian's
# source package (about 9 minutes the first time on a fresh machine, kept in
# /var/cache/orchestrator-k8s; docs/test-cluster.md). It is stopped, by pid,
# when the tests end.
# A cluster that was already running (a developer's) is left running.
stop_k8s=:
if ! bash scripts/setup-k8s.sh status 2>/dev/null | grep -q '^kube-apiserver: running'; then
    stop_k8s='bash scripts/setup-k8s.sh stop >/dev/null 2>&1 || true'
    # ours to stop: the tests stop it as soon as their last Kubernetes test is done
    export ORCHESTRATOR_TEST_K8S_STOP_AFTER=1
fi
bash scripts/setup-k8s.sh start
trap "$stop_k8s" EXIT
export ORCHESTRATOR_TESTS_REQUIRE_K8S=1
# Most Docker tests spend their time waiting on containers, git and the engine,
# not on this machine's CPUs, so they run side by side on six workers. The
# private engine's tests share a dockerd per worker (tests/conftest.py), and
# the few tests that bound the product's own time run alone afterwards.
# A test that fails side by side runs again alone, and both results are printed:
# so far every failure that only six workers' load brought out was a test's
# timing or a product bug (the README lists them), and each is fixed once seen;
# many failing at once is a broken change, and nothing is run again.
# ORCHESTRATOR_TEST_WORKERS=1 runs one test at a time (twice as long).
workers="${ORCHESTRATOR_TEST_WORKERS:-6}"
RERUN_AT_MOST=5
failures="$(mktemp)"
trap 'rm -f "$failures"; eval "$stop_k8s"' EXIT
set +e
# the slowest tests are printed at the end: docs/reliability.md lists them with their reasons
ORCHESTRATOR_TEST_FAILURES="$failures" uv run pytest -q -p no:cacheprovider -n "$workers" --dist loadgroup \
    -m "not exclusive" --durations=25 "$@"
status=$?
mapfile -t failed < <(sort -u "$failures")
if [ "$status" = 1 ] && [ "$workers" != 1 ] && [ "${#failed[@]}" -ge 1 ] && [ "${#failed[@]}" -le "$RERUN_AT_MOST" ]; then
    echo "== ${#failed[@]} test(s) failed side by side; running them again, one at a time:"
    printf '   %s\n' "${failed[@]}"
    uv run pytest -q -p no:cacheprovider "${failed[@]}"
    status=$?
    if [ "$status" = 0 ]; then
        echo "== they passed alone: failures under six workers' load only, listed above. Fix each"
        echo "   (a timing bound or a race in the test or the product); they do not fail this run."
    fi
fi
uv run pytest -q -p no:cacheprovider -m exclusive "$@"
alone=$?
set -e
if [ "$status" = 5 ] && [ "$alone" = 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    exit 1
fi
[ "$status" = 5 ] && status=0
[ "$alone" = 5 ] && alone=0
[ "$status" != 0 ] && exit "$status"
exit "$alone"
