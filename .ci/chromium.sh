#!/usr/bin/env bash
# Make sure Debian's chromium is installed, for the docs site's browser test
# (tests/integration/test_docs_browser.py: headless, no network, file:// pages).
# Does nothing but print its version when /usr/bin/chromium exists; otherwise runs
# apt-get update and installs it. Safe to run repeatedly and from several processes at once.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    exec sudo -E "$0" "$@"
fi

CHROMIUM=/usr/bin/chromium
LOCK=/var/lock/tfps-chromium.lock
export DEBIAN_FRONTEND=noninteractive

print_version() { "$CHROMIUM" --headless --no-sandbox --version 2>/dev/null || echo "chromium at $CHROMIUM"; }

if [ -x "$CHROMIUM" ]; then
    print_version
    exit 0
fi

exec 9>"$LOCK"
flock -w 900 9
# Another run may have installed it while we waited for the lock.
if [ -x "$CHROMIUM" ]; then
    print_version
    exit 0
fi

apt-get update -qq
# apt's own lock: another apt-get (the Docker set-up) may be running.
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
print_version
