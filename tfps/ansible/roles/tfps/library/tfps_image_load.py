#!/usr/bin/python
# Runs on a host of the job: loads the image archive image.yml copied there into the host's
# Docker engine and deletes it, under a lock that every play on the host takes. Several
# deploys onto a host that lacks the image (several jobs started at once) copy the archive
# to the same file: one loads it and deletes it, the others then find it gone (their
# image is there) instead of loading a file that is being deleted under them.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tfps_image_load
short_description: Load a copied image archive into the host's Docker engine, once per host at a time
description:
  - Takes an exclusive lock (C(.tfps-image-load.lock) in the archive's directory, left there) that
    every run of this module on the host shares, then checks the archive's sha256, loads it
    through the engine's socket (C(docker load)) and deletes it.
  - An archive that is no longer there when the lock is taken was loaded and deleted by another
    play meanwhile; nothing is done (I(gone) is true). Whether the host has the image is for
    the play to check afterwards, as after a load.
options:
  path:
    description: The archive on the host.
    type: path
    required: true
  sha256:
    description: The sha256 the archive must have (the controller's copy); empty to skip the check.
    type: str
    default: ""
  timeout:
    description: Seconds to wait for each of the engine's answers (a load of gigabytes takes minutes).
    type: float
    default: 900
  docker_socket:
    description: The Docker engine's socket.
    type: str
    default: /var/run/docker.sock
author: tfps
"""

RETURN = r"""
loaded:
  description: What the engine says it loaded (C(Loaded image) lines), empty when nothing was loaded.
  type: list
  returned: always
gone:
  description: Whether the archive was no longer there (another play loaded and deleted it).
  type: bool
  returned: always
"""

import fcntl  # noqa: E402
import hashlib  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.tfps_docker import engine_request  # noqa: E402

LOCK_NAME = ".tfps-image-load.lock"


class LoadError(Exception):
    """The archive cannot be loaded; the message says why and what to do."""


def engine_messages(body: bytes) -> list[dict]:
    """The JSON objects of a ``docker load`` answer (a stream of them, separated by newlines or not)."""
    text, out, at = body.decode("utf-8", errors="replace"), [], 0
    decoder = json.JSONDecoder()
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return out
        try:
            obj, at = decoder.raw_decode(text, at)
        except ValueError:
            out.append({"error": text[at:at + 300].strip()})
            return out
        if isinstance(obj, dict):
            out.append(obj)


def load(path: str, sha256: str, socket_path: str, timeout: float) -> dict:
    """Under the host's lock: the archive at ``path`` checked, loaded and deleted. Returns
    ``{"changed", "loaded", "gone"}``; raises LoadError."""
    directory = os.path.dirname(os.path.abspath(path))
    lock = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            return {"changed": False, "loaded": [], "gone": True}
        with fh:
            digest = hashlib.sha256()
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
            if sha256 and digest.hexdigest() != sha256.lower():
                raise LoadError(f"the copy {path} has sha256 {digest.hexdigest()}, the original {sha256}: "
                                f"check the disk space in {directory} and run the play again")
            size = fh.tell()
            fh.seek(0)
            try:
                status, body = engine_request(socket_path, "/images/load?quiet=1", method="POST", body=fh,
                                              headers={"Content-Type": "application/x-tar",
                                                       "Content-Length": str(size)}, timeout=timeout)
            except (OSError, http.client.HTTPException) as e:
                raise LoadError(f"the Docker engine at {socket_path} did not load {path}: {e}") from e
        messages = engine_messages(body)
        errors = [m.get("errorDetail", {}).get("message") or m.get("error") for m in messages
                  if m.get("error") or m.get("errorDetail")]
        if status != 200 or errors:
            raise LoadError(f"the Docker engine at {socket_path} refused {path} ({status}): "
                            f"{'; '.join(map(str, errors)) or body[:300].decode(errors='replace').strip()}")
        lines = [line.strip() for m in messages for line in str(m.get("stream", "")).splitlines()]
        loaded = [line.split(":", 1)[1].strip() for line in lines if line.startswith(("Loaded image:",
                                                                                          "Loaded image ID:"))]
        if not loaded:
            raise LoadError(f"the Docker engine at {socket_path} loaded no image from {path} "
                            f"(it answered {body[:300].decode(errors='replace').strip()!r}): is it an image archive?")
        os.unlink(path)
        return {"changed": True, "loaded": loaded, "gone": False}
    finally:
        os.close(lock)   # releases the lock


def main():
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            sha256=dict(type="str", default=""),
            timeout=dict(type="float", default=900),
            docker_socket=dict(type="str", default="/var/run/docker.sock"),
        ),
        supports_check_mode=False,
    )
    p = module.params
    try:
        result = load(p["path"], p["sha256"], p["docker_socket"], p["timeout"])
    except (LoadError, OSError) as e:
        module.fail_json(msg=str(e))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
