#!/bin/sh
# Install Debian's headless Chromium for the browser tests if it is missing.
# Idempotent: does nothing when a chromium binary is already present. Needs root (or sudo) and
# the Debian package mirror; the browser test skips with a clear reason when this fails.
set -eu
for c in "${CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
    if [ -n "$c" ] && [ -x "$c" ]; then
        echo "chromium present: $c"
        exit 0
    fi
done
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
        echo "chromium missing and not root (no sudo): install it with: apt-get install chromium" >&2
        exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium missing and apt-get unavailable: install Chromium and set CHROMIUM=/path/to/it" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
echo "chromium installed: $(command -v chromium)"
