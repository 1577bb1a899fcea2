#!/bin/sh
# Run as root while building docker/Dockerfile.environment on the user's image:
# add only what is missing, so the user's toolchain stays as it is.
set -eu
if ! ldd --version 2>&1 | grep -qiE 'glibc|gnu libc'; then
    echo "orchestrator-environment: this image has no glibc (musl/Alpine?); the agent CLIs need a Debian- or Ubuntu-based image" >&2
    exit 3
fi
missing=""
command -v git >/dev/null 2>&1 || missing="$missing git"
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
command -v update-ca-certificates >/dev/null 2>&1 || missing="$missing ca-certificates"
command -v ps >/dev/null 2>&1 || missing="$missing procps"
if [ -n "$missing" ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "orchestrator-environment: this image lacks$missing and has no apt-get to install them; use a Debian- or Ubuntu-based image" >&2
        exit 3
    fi
    # The extra CA certificates are not trusted yet: apt's own https sources
    # would fail behind an intercepting proxy, plain http ones work.
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    rm -rf /var/lib/apt/lists/*
fi
find /usr/local/share/ca-certificates/orchestrator-extra -type f ! -name '*.crt' -delete 2>/dev/null || true
update-ca-certificates >/dev/null 2>&1 || true
# Agents run as `node`, uid 1000. Devcontainer and language images often have
# a uid-1000 user of their own (vscode, ubuntu, node): `node` becomes a second
# name for that uid, so files keep one owner whichever name is used.
if ! getent group 1000 >/dev/null; then groupadd -g 1000 node; fi
if ! getent passwd node >/dev/null; then
    if getent passwd 1000 >/dev/null; then
        useradd -o -u 1000 -g 1000 -M -d /home/node -s /bin/sh node
    else
        useradd -u 1000 -g 1000 -M -d /home/node -s /bin/sh node
    fi
elif [ "$(id -u node)" != 1000 ]; then
    echo "orchestrator-environment: the image's user node has uid $(id -u node), not 1000" >&2
    exit 3
fi
mkdir -p /home/node /workspace
chown 1000:1000 /home/node /workspace
git config --system safe.directory '*'
git config --system init.defaultBranch main
