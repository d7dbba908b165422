#!/usr/bin/env bash
# Make sure a Docker engine, Compose v2 and Buildx are usable on this (Debian 12) machine.
# Does nothing but print versions when all three already answer; otherwise installs what
# is missing (engine from Debian 12, compose/buildx from Debian 13) and starts dockerd.
# Safe to run repeatedly and from several processes at once.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    exec sudo -E "$0" "$@"
fi

LOCK=/var/lock/tfps-docker-up.lock
APT_DIR=/var/cache/tfps-apt           # private apt state for the trixie packages
DOCKERD_LOG=/var/log/dockerd.log
export DEBIAN_FRONTEND=noninteractive

engine_ok()  { docker info >/dev/null 2>&1; }
compose_ok() { docker compose version >/dev/null 2>&1; }
buildx_ok()  { docker buildx version >/dev/null 2>&1; }

print_versions() {
    docker version --format 'docker client {{.Client.Version}}, engine {{.Server.Version}}'
    docker compose version
    docker buildx version
}

if engine_ok && compose_ok && buildx_ok; then
    print_versions
    exit 0
fi

exec 9>"$LOCK"
flock -w 900 9
# Another run may have finished the job while we waited for the lock.
if engine_ok && compose_ok && buildx_ok; then
    print_versions
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v iptables >/dev/null 2>&1; then
    apt-get update -q || echo "docker-up: apt-get update reported errors, trying anyway" >&2
    apt-get install -y -q docker.io iptables
fi

# Compose v2 and Buildx are not packaged for Debian 12; Debian 13's builds only need
# libc6 >= 2.34. A separate sources list and apt state keep trixie out of the system's apt.
want=()
compose_ok || want+=(docker-compose)
buildx_ok || want+=(docker-buildx)
if [ "${#want[@]}" -gt 0 ]; then
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/debs"
    echo 'deb http://deb.debian.org/debian trixie main' >"$APT_DIR/trixie.list"
    apt_trixie=(apt-get -q -o Dir::Etc::SourceList="$APT_DIR/trixie.list"
                -o Dir::Etc::SourceParts=/dev/null
                -o Dir::State::Lists="$APT_DIR/lists" -o Dir::Cache="$APT_DIR/cache")
    "${apt_trixie[@]}" update
    rm -f "$APT_DIR"/debs/*.deb
    # Let apt's unprivileged download user write there (avoids an "unsandboxed" warning).
    if id _apt >/dev/null 2>&1; then chown _apt "$APT_DIR/debs"; fi
    # `apt-get download` writes into the current directory.
    (cd "$APT_DIR/debs" && "${apt_trixie[@]}" download "${want[@]}")
    dpkg -i "$APT_DIR"/debs/*.deb
fi

if ! engine_ok; then
    if ! pgrep -x dockerd >/dev/null; then
        # After a reboot, containerd's pid file from the last boot may name a new, unrelated
        # process: dockerd would then wait for a containerd that never answers.
        pidfile=/var/run/docker/containerd/containerd.pid
        if [ -f "$pidfile" ] && [ "$(ps -o comm= -p "$(cat "$pidfile")" 2>/dev/null)" != containerd ]; then
            rm -f "$pidfile"
        fi
        # setsid: dockerd must outlive this script; 9>&- so it does not hold the lock.
        setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null 9>&- &
    fi
    for _ in $(seq 60); do
        engine_ok && break
        sleep 1
    done
    if ! engine_ok; then
        echo "docker-up: dockerd did not answer within 60 s; end of $DOCKERD_LOG:" >&2
        tail -n 30 "$DOCKERD_LOG" >&2
        exit 1
    fi
fi

print_versions
