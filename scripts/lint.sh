#!/usr/bin/env bash
# Lint and type-check the tree: ruff's rules, ruff's formatting and mypy, all
# configured in pyproject.toml. Runs all three so one run shows every finding;
# exits non-zero if any of them found something.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export UV_PYTHON_DOWNLOADS=never
status=0
echo "== ruff check" >&2
uv run ruff check . || status=1
echo "== ruff format --check (fix with: uv run ruff format .)" >&2
uv run ruff format --check . || status=1
echo "== mypy" >&2
uv run mypy || status=1
if [ "$status" != 0 ]; then
    echo "lint: findings above; fix them before the tests run" >&2
fi
exit "$status"
