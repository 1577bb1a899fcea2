# Default agent image for orchestrator (spec name: claude-code).
#
#   docker build -t claude-code .
#   docker build -t claude-code --build-arg BASE_IMAGE=orchestrator-base:bookworm .
#
# scripts/setup-docker.sh builds it with a locally made base image when Docker
# Hub is unreachable and copies the host's extra CA certificates into
# docker/extra-ca/ first. Layers are ordered for caching: apt, CA certs, npm,
# user setup, then the small COPYs last.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
# Empty means the pin in docker/cli-versions.env; scripts/cli-drift.sh passes
# "latest" to see what a newer release prints.
ARG CLAUDE_CODE_VERSION=
ARG CODEX_VERSION=

ENV LANG=C.UTF-8 \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    GIT_SSL_CAINFO=/etc/ssl/certs/ca-certificates.crt \
    DISABLE_AUTOUPDATER=1 \
    DISABLE_TELEMETRY=1 \
    npm_config_update_notifier=false \
    npm_config_fund=false \
    npm_config_audit=false

# 1. System packages (largest, slowest-changing layer).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        ca-certificates git python3 nodejs npm procps tini \
 && rm -rf /var/lib/apt/lists/*

# 2. Optional extra CA certificates (e.g. an intercepting proxy's). Only *.crt
#    files in docker/extra-ca/ are picked up; the directory may be empty.
COPY docker/extra-ca/ /usr/local/share/ca-certificates/orchestrator-extra/
RUN find /usr/local/share/ca-certificates/orchestrator-extra -type f ! -name '*.crt' -delete \
 && update-ca-certificates

# 3. The agent CLIs, at the exact versions pinned in docker/cli-versions.env
#    (a build argument overrides a pin): an unpinned install would give every
#    build whatever the registry released that day.
COPY docker/cli-versions.env /usr/local/share/orchestrator/cli-versions.env
RUN claude="${CLAUDE_CODE_VERSION}" codex="${CODEX_VERSION}" \
 && . /usr/local/share/orchestrator/cli-versions.env \
 && npm install -g "@anthropic-ai/claude-code@${claude:-$CLAUDE_CODE_VERSION}" "@openai/codex@${codex:-$CODEX_VERSION}" \
 && npm cache clean --force \
 && rm -rf /root/.npm /tmp/*

# 4. Non-root agent user (Claude Code refuses --dangerously-skip-permissions as root).
RUN if ! getent group 1000 >/dev/null; then groupadd -g 1000 node; fi \
 && if ! getent passwd 1000 >/dev/null; then useradd -m -u 1000 -g 1000 -d /home/node -s /bin/bash node; fi \
 && mkdir -p /home/node /workspace \
 && chown 1000:1000 /home/node /workspace \
 && git config --system safe.directory '*' \
 && git config --system init.defaultBranch main

# 5. Small, frequently changing files last. The simulated agent runs from a
#    package byte-compiled here (a checkout's __pycache__ is dropped first): the
#    root filesystem is read-only at run time, so Python could not cache it, and
#    compiling it would cost every run ~9 ms.
#    `-S`: it needs nothing outside the standard library.
COPY docker/sim_agent /usr/local/lib/orchestrator-sim-agent/sim_agent
RUN rm -rf /usr/local/lib/orchestrator-sim-agent/sim_agent/__pycache__ \
 && python3 -m compileall -q /usr/local/lib/orchestrator-sim-agent \
 && printf '%s\n' '#!/usr/bin/python3 -S' 'import sys' \
        'sys.path.insert(0, "/usr/local/lib/orchestrator-sim-agent")' \
        'from sim_agent.main import entry' 'entry()' > /usr/local/bin/orchestrator-sim-agent \
 && chmod 0755 /usr/local/bin/orchestrator-sim-agent

USER node
ENV HOME=/home/node
WORKDIR /workspace

# tini as PID 1 forwards SIGTERM to the child and reaps zombies, so
# `docker stop` returns at once instead of waiting for the kill timeout.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["sleep", "infinity"]
