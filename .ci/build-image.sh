#!/usr/bin/env bash
# Build the tfps image from the repository's Dockerfile as tfps:latest
# (or the tag given as $1). Extra arguments go to `docker build`, e.g.
#   .ci/build-image.sh tfps:gpu --build-arg TF_PACKAGE="tensorflow[and-cuda]==2.21.0"
# Relies on the build cache: an unchanged tree rebuilds in seconds.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
tag=${1:-tfps:latest}
shift $(( $# > 0 ? 1 : 0 ))

"$here/docker-up.sh" >/dev/null
"$here/base-images.sh"

args=()
# pip inside the build reaches PyPI only when it trusts this machine's CA bundle.
ca=/etc/ssl/certs/ca-certificates.crt
if [ -f "$ca" ]; then
    args+=(--secret "id=pip_cert,src=$ca")
fi

DOCKER_BUILDKIT=1 docker build "${args[@]}" -t "$tag" "$@" "$repo"
