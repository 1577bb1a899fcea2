#!/usr/bin/env bash
# Run orchestrator; without credentials it rehearses the run with the simulated
# agent (--dry-run) so you can see the whole flow at no cost.
#   scripts/quickstart.sh "add a CONTRIBUTING.md" --repo ~/code/project
set -Eeuo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export UV_PYTHON_DOWNLOADS=never
extra=()
if [ -z "${ANTHROPIC_API_KEY:-}${CLAUDE_CODE_OAUTH_TOKEN:-}${OPENAI_API_KEY:-}" ] && ! grep -qsE '^(export )?(ANTHROPIC_API_KEY|CLAUDE_CODE_OAUTH_TOKEN)=.' .env; then
    echo "no credentials found: rehearsing with --dry-run (set ANTHROPIC_API_KEY or CLAUDE_CODE_OAUTH_TOKEN for real agents)" >&2
    extra+=(--dry-run)
fi
exec uv run --project "$root" orchestrator "$@" "${extra[@]}"
