#!/usr/bin/env bash
# Install the Ansible collections of tfps/ansible/requirements.yml into tfps/ansible/collections
# (where tfps/ansible/ansible.cfg looks for them), at exactly the pinned versions.
#
# Galaxy is not reachable from every network, PyPI usually is: the collections are taken
# from the `ansible` community package on PyPI, whose release below ships the pinned
# versions. Only the wheel is downloaded (no install, no dependencies), its sha256 is
# checked, and only the pinned collections are unpacked from it.
#
# Does nothing when the pinned versions are already there. Safe to run repeatedly and
# concurrently. PYTHON selects the interpreter (default: the repository's .venv).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
dest="$repo/tfps/ansible/collections"
requirements="$repo/tfps/ansible/requirements.yml"

# The `ansible` release that ships the versions pinned in requirements.yml.
ANSIBLE_RELEASE=12.3.0
ANSIBLE_WHEEL_SHA256=cd156f82fa87f7a899212b0efa9f7ca3a24d609212de9f78428a572eb01e5414

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

# name=version per line, from requirements.yml.
pins=$("$PYTHON" - "$requirements" <<'PY'
import sys, yaml
for c in yaml.safe_load(open(sys.argv[1]))["collections"]:
    print(f"{c['name']}={c['version']}")
PY
)
pins=$(echo $pins)   # one line: "a.b=1.0 c.d=2.0"

installed() {  # all pinned versions present?
    "$PYTHON" - "$dest" "$pins" <<'PY'
import json, os, sys
dest, pins = sys.argv[1], sys.argv[2].split()
for pin in pins:
    name, version = pin.split("=")
    ns, coll = name.split(".")
    path = os.path.join(dest, "ansible_collections", ns, coll, "MANIFEST.json")
    try:
        have = json.load(open(path))["collection_info"]["version"]
    except (OSError, ValueError, KeyError):
        sys.exit(1)
    if have != version:
        sys.exit(1)
PY
}

if installed; then
    echo "ansible collections: $pins (already in $dest)"
    exit 0
fi

mkdir -p "$dest"
exec 9>"$dest/.install.lock"
flock -w 600 9
if installed; then
    echo "ansible collections: $pins (already in $dest)"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "ansible==$ANSIBLE_RELEASE --hash=sha256:$ANSIBLE_WHEEL_SHA256" >"$work/req.txt"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    -r "$work/req.txt" -d "$work"

"$PYTHON" - "$work" "$dest" "$pins" <<'PY'
import glob, json, os, shutil, sys, zipfile
work, dest, pins = sys.argv[1], sys.argv[2], sys.argv[3].split()
wheel = zipfile.ZipFile(glob.glob(os.path.join(work, "ansible-*.whl"))[0])
names = wheel.namelist()
staging = os.path.join(work, "staging")
for pin in pins:
    name, version = pin.split("=")
    ns, coll = name.split(".")
    prefix = f"ansible_collections/{ns}/{coll}/"
    members = [n for n in names if n.startswith(prefix)]
    if not members:
        sys.exit(f"{name} is not in the ansible wheel; change ANSIBLE_RELEASE in {sys.argv[0]}")
    have = json.loads(wheel.read(prefix + "MANIFEST.json"))["collection_info"]["version"]
    if have != version:
        sys.exit(f"the ansible wheel ships {name} {have}, requirements.yml pins {version}: "
                 "pick the matching ANSIBLE_RELEASE")
    for member in members:
        wheel.extract(member, staging)
    target = os.path.join(dest, "ansible_collections", ns, coll)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.exists(target):
        shutil.rmtree(target)
    shutil.move(os.path.join(staging, "ansible_collections", ns, coll), target)
PY

if ! installed; then
    echo "ansible-collections: installation in $dest is incomplete" >&2
    exit 1
fi
echo "ansible collections: $pins (installed in $dest)"
