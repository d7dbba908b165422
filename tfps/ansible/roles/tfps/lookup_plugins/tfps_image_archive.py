"""Lookup plugin: the image id and tags inside a `docker save` archive on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
name: tfps_image_archive
short_description: image id and tags of a docker save archive
description:
  - Reads manifest.json of an archive written by C(docker save) (legacy or OCI layout)
    without unpacking it, so that the play can tell whether a host already has the
    image before copying gigabytes to it.
  - Returns one dict per image in the archive, with C(id) (sha256 digest of the image's
    config, its id on the classic image store), C(digests) (the manifest and index digests
    of an OCI archive, one of which is its id on the containerd image store), C(layers)
    (the diff ids of its layers, as C(RootFS.Layers) shows them on either store) and C(tags).
options:
  _terms:
    description: Path of the archive on the controller.
    required: true
"""

RETURN = r"""
_raw:
  description: One dict per image, with C(id), C(digests), C(layers) and C(tags).
  type: list
  elements: dict
"""

import json
import tarfile

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


def _image_id(config: str) -> str:
    # Legacy layout: "<hex>.json"; OCI layout (Docker 25+): "blobs/sha256/<hex>".
    name = config.rsplit("/", 1)[-1]
    if name.endswith(".json"):
        name = name[: -len(".json")]
    return f"sha256:{name}"


_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


def _blob(archive: tarfile.TarFile, digest: str):
    member = archive.extractfile(f"blobs/{digest.replace(':', '/', 1)}")
    return json.load(member) if member is not None else None


def _manifest_digests(archive: tarfile.TarFile) -> dict[str, list[str]]:
    """Config digest -> the digests of the manifests (and the indexes above them) that
    point at it, from an OCI archive's index.json; empty for a legacy archive."""
    try:
        member = archive.extractfile("index.json")
        index = json.load(member) if member is not None else {}
    except (KeyError, ValueError):
        return {}
    found: dict[str, list[str]] = {}

    def walk(descriptors, parents):
        for desc in descriptors or []:
            digest = desc.get("digest")
            if not digest:
                continue
            try:
                blob = _blob(archive, digest)
            except (KeyError, ValueError):
                continue
            if not isinstance(blob, dict):
                continue
            if desc.get("mediaType") in _INDEX_TYPES or "manifests" in blob:
                walk(blob.get("manifests"), parents + [digest])
            elif "config" in blob:
                config = blob["config"].get("digest")
                if config:
                    found.setdefault(config, [])
                    found[config] += [d for d in parents + [digest] if d not in found[config]]

    walk(index.get("manifests"), [])
    return found


def _layers(path: str, config: str) -> list[str]:
    """The diff ids of the image's layers, from its config in the archive (empty if unreadable)."""
    try:
        with tarfile.open(path, mode="r:*") as archive:
            member = archive.extractfile(config)
            return list(json.load(member)["rootfs"]["diff_ids"]) if member is not None else []
    except (OSError, tarfile.TarError, KeyError, ValueError, TypeError):
        return []


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        images = []
        for path in terms:
            try:
                with tarfile.open(path, mode="r:*") as archive:
                    member = archive.extractfile("manifest.json")
                    if member is None:
                        raise KeyError("manifest.json")
                    manifest = json.load(member)
                    digests = _manifest_digests(archive)
            except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
                raise AnsibleLookupError(
                    f"{path} is not an image archive written by `docker save` ({exc}); "
                    "create one with: docker save IMAGE -o FILE"
                ) from exc
            for entry in manifest:
                image_id = _image_id(entry["Config"])
                images.append({"id": image_id, "digests": digests.get(image_id, []),
                               "layers": _layers(path, entry["Config"]), "tags": entry.get("RepoTags") or []})
        return images
