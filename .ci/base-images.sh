#!/usr/bin/env bash
# Build the local base images that no registry can provide here:
#   debian:bookworm-slim  plain minbase bookworm made with debootstrap, configured like the
#                         official image, so `FROM debian:bookworm-slim` builds unchanged;
#   tfps-host:bookworm-3    a "bare-metal host" for system tests (sshd + its own dockerd +
#                         python3 for Ansible + iptables-persistent), built on top of it.
# An image whose tag already exists is left alone. Safe to run repeatedly and concurrently.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    exec sudo -E "$0" "$@"
fi

MIRROR=http://deb.debian.org/debian
WORK=/var/cache/tfps-images
LOCK=/var/lock/tfps-base-images.lock
export DEBIAN_FRONTEND=noninteractive

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

if have_image debian:bookworm-slim && have_image tfps-host:bookworm-3; then
    exit 0
fi

"$(dirname "$0")/docker-up.sh" >/dev/null
mkdir -p "$WORK"
exec 9>"$LOCK"
flock -w 1800 9

rootfs=
unmount_tree() {
    # debootstrap mounts proc/sys (and in a container binds /dev) inside the tree and a
    # failed run can leave them there: never delete through such a mount.
    for m in dev/pts dev proc sys; do
        if mountpoint -q "$rootfs/$m"; then umount -l "$rootfs/$m"; fi
    done
}
cleanup() {
    [ -n "$rootfs" ] && [ -d "$rootfs" ] || return 0
    unmount_tree
    rm -rf --one-file-system "$rootfs"
}
trap cleanup EXIT

if ! have_image debian:bookworm-slim; then
    command -v debootstrap >/dev/null 2>&1 || {
        apt-get update -q || true
        apt-get install -y -q --no-install-recommends debootstrap
    }
    rootfs=$(mktemp -d "$WORK/bookworm-slim.XXXXXX")
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR"
    unmount_tree

    # What the official image adds to a minbase tree (debuerreotype): full sources with
    # updates and security, the apt/dpkg settings for containers, no daemon starts.
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'CONF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CONF
    echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
    echo 'Acquire::GzipIndexes "true";' >"$rootfs/etc/apt/apt.conf.d/docker-gzip-indexes"
    echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$rootfs/etc/apt/apt.conf.d/docker-autoremove-suggests"
    printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
    chmod 755 "$rootfs/usr/sbin/policy-rc.d"
    # "slim": no docs, man pages or translations, now and in later installs.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'CONF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
CONF
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "${rootfs:?}"/usr/share/{groff,info,linda,lintian/overrides,locale,man}/*
    rm -rf --one-file-system "${rootfs:?}"/var/lib/apt/lists/* "${rootfs:?}"/var/cache/apt/* \
        "${rootfs:?}"/var/log/*.log "${rootfs:?}"/var/cache/debconf/*-old "${rootfs:?}"/tmp/* \
        "${rootfs:?}"/dev/*
    # debootstrap copied this machine's files; Docker provides its own at run time.
    : >"$rootfs/etc/resolv.conf"
    echo localhost >"$rootfs/etc/hostname"

    tar --numeric-owner -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' \
        --message 'debootstrap --variant=minbase bookworm' \
        - debian:bookworm-slim
    cleanup
    rootfs=
fi

if ! have_image tfps-host:bookworm-3; then
    # Built on the local base (shares its layer, no second debootstrap). Run it as described
    # in docs: --cap-add ALL --cap-drop SYS_RESOURCE, seccomp/apparmor unconfined, cgroup
    # bind mount and a volume on /var/lib/docker; the default command starts sshd + dockerd.
    docker build -t tfps-host:bookworm-3 - <<'DOCKERFILE'
FROM debian:bookworm-slim
RUN echo 'iptables-persistent iptables-persistent/autosave_v4 boolean false' | debconf-set-selections \
 && echo 'iptables-persistent iptables-persistent/autosave_v6 boolean false' | debconf-set-selections \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      openssh-server docker.io iptables iptables-persistent python3 python3-requests sudo procps iproute2 \
      ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh
EXPOSE 22
# A restart of the host container is the host's reboot: a new network namespace, so no
# firewall rule survives it, as none survives a real reboot. Its boot path is the one of a
# Debian host: netfilter-persistent restores the saved rules (/etc/iptables/rules.v4)
# before the network and the engine start (netfilter-persistent.service runs before
# network-pre.target, docker.service after network-online.target). Unlike a real host's,
# this one's nat table also holds the outer engine's DNS rules (127.0.0.11, new ports at
# every start): they are put back after the restore, which would replace them with the
# saved ones of the last boot; the inner engine makes its own nat rules again anyway.
# The engine runs under a loop, as under systemd's Restart=: a test can restart a host's
# engine mid-job (kill -TERM the dockerd) and its containers come back by restart policy.
RUN printf '%s\n' '#!/bin/sh' \
      'iptables-save -t nat >/run/outer-nat' \
      '/usr/sbin/netfilter-persistent start >&2 || exit 1' \
      'iptables-restore -T nat </run/outer-nat' \
      'mkdir -p /run/sshd && /usr/sbin/sshd || exit 1' \
      'trap '"'"'kill -TERM $pid 2>/dev/null; wait $pid; exit 0'"'"' TERM INT' \
      'while :; do dockerd & pid=$!; wait $pid; echo "host-init: dockerd exited ($?); starting it again" >&2; sleep 1; done' \
      >/usr/local/sbin/host-init && chmod 755 /usr/local/sbin/host-init
CMD ["/usr/local/sbin/host-init"]
DOCKERFILE
fi
