# -*- coding: utf-8 -*-
"""Lookup plugin: the image id and tags inside a `docker save` archive on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
name: tfps_image_archive
short_description: image id and tags of a docker save archive
description:
  - Reads manifest.json of an archive written by C(docker save) (legacy or OCI layout)
    without unpacking it, so that the play can tell whether a host already has the
    image before copying gigabytes to it.
  - Returns one dict per image in the archive, with C(id) (sha256:...) and C(tags).
options:
  _terms:
    description: Path of the archive on the controller.
    required: true
"""

RETURN = r"""
_raw:
  description: One dict per image, with C(id) and C(tags).
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
            except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
                raise AnsibleLookupError(
                    f"{path} is not an image archive written by `docker save` ({exc}); "
                    "create one with: docker save IMAGE -o FILE"
                ) from exc
            for entry in manifest:
                images.append({"id": _image_id(entry["Config"]), "tags": entry.get("RepoTags") or []})
        return images
