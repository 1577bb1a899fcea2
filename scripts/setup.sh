#!/usr/bin/env bash
# Set up orchestrator on a fresh Linux machine: uv, the Python environment, the
# Docker engine and the agent images. Idempotent: a second run takes seconds.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export UV_PYTHON_DOWNLOADS=never

if ! command -v uv >/dev/null 2>&1; then
    echo "==> installing uv"
    python3 -m pip install --quiet uv
fi
if [ "$(id -u)" = 0 ] && ! command -v tmux >/dev/null 2>&1; then
    # tmux drives the terminal (pty) tests of the dashboard
    echo "==> installing tmux"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null
fi
if [ "$(id -u)" = 0 ] && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
    # headless Chromium loads the HTML run report in the tests (Debian's build:
    # a test tool's own browser download cannot be fetched on these machines)
    echo "==> installing chromium and chromium-driver"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
if [ "$(id -u)" = 0 ] && ! { command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; } ; then
    # a private sshd on 127.0.0.1 is the ssh:// Docker host of the multi-host tests
    echo "==> installing openssh-server and openssh-client"
    # The package would start a machine-wide sshd on port 22; the tests start their own
    # on 127.0.0.1 only, so service starts are refused while it installs.
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null
    if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
echo "==> Python environment (uv sync)"
uv sync --frozen --quiet
# The project's own modules are an editable install: where PYTHONDONTWRITEBYTECODE
# is set (as on these machines) every orchestrator process would compile them
# from source again, about a quarter of a CPU-second each.
uv run --frozen python -m compileall -q -j 0 orchestrator strategies runner_plugins tui >/dev/null
echo "==> Docker engine and images"
bash scripts/setup-docker.sh
echo "==> ready: uv run orchestrator --help"
