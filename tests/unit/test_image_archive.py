"""The role's tfps_image_archive lookup: the image id of a `docker save` archive as each
image store shows it (classic: the config digest; containerd: a manifest or index digest)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "ansible" / "roles" / "tfps"
LAYER = "sha256:" + "1" * 64


def plugin(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, PLUGINS / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lookup(path: Path) -> list[dict]:
    return plugin("lookup_plugins/tfps_image_archive.py").LookupModule().run([str(path)])


def is_archive_image(images, archive_image) -> bool:
    return plugin("filter_plugins/tfps_filters.py").tfps_is_archive_image(images, archive_image)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def blob(files: dict, obj) -> str:
    data = json.dumps(obj).encode()
    files[f"blobs/sha256/{digest(data)[7:]}"] = data
    return digest(data)


def test_legacy_archive_gives_the_config_digest_and_no_manifest(tmp_path):
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [LAYER]}}).encode()
    files = {f"{digest(config)[7:]}.json": config,
             "manifest.json": json.dumps([{"Config": f"{digest(config)[7:]}.json", "RepoTags": ["t:1"],
                                           "Layers": []}]).encode()}
    assert lookup(write_tar(tmp_path / "a.tar", files)) == [
        {"id": digest(config), "digests": [], "layers": [LAYER], "tags": ["t:1"]}]


@pytest.mark.parametrize("nested", [False, True])
def test_oci_archive_gives_the_config_digest_and_the_manifest_digests(tmp_path, nested):
    """Docker 25+ writes OCI layout: index.json -> manifest (or an index of manifests) -> config."""
    files: dict[str, bytes] = {}
    config = blob(files, {"rootfs": {"type": "layers", "diff_ids": []}, "architecture": "amd64"})
    other = blob(files, {"rootfs": {"type": "layers", "diff_ids": []}, "architecture": "arm64"})
    manifest = blob(files, {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                            "config": {"digest": config}, "layers": []})
    arm = blob(files, {"schemaVersion": 2, "config": {"digest": other}, "layers": []})
    top = manifest
    if nested:
        top = blob(files, {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": [{"digest": manifest}, {"digest": arm}]})
    files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.index.v1+json" if nested else
         "application/vnd.oci.image.manifest.v1+json", "digest": top}]}).encode()
    files["manifest.json"] = json.dumps([{"Config": f"blobs/sha256/{config[7:]}", "RepoTags": ["t:2"],
                                          "Layers": []}]).encode()
    [image] = lookup(write_tar(tmp_path / "b.tar", files))
    assert image["id"] == config and image["tags"] == ["t:2"]
    assert image["digests"] == ([top, manifest] if nested else [manifest])
    assert arm not in image["digests"]


def test_a_host_has_the_archive_image_by_its_id_on_either_store():
    oci = {"id": "sha256:c0", "digests": ["sha256:1d", "sha256:3a"], "layers": [LAYER], "tags": ["t:1"]}
    assert is_archive_image([{"Id": "sha256:c0", "RootFS": {"Layers": [LAYER]}}], oci)      # classic store
    assert is_archive_image([{"Id": "sha256:3a", "RootFS": {"Layers": [LAYER]}}], oci)      # containerd store
    # Another image under the tag, even one with the same layers: an OCI archive names every id it can have.
    assert not is_archive_image([{"Id": "sha256:ff", "RootFS": {"Layers": [LAYER]}}], oci)
    assert not is_archive_image([], oci)


def test_an_old_archive_on_a_containerd_store_is_recognised_by_its_layers():
    legacy = {"id": "sha256:c0", "digests": [], "layers": [LAYER], "tags": ["t:1"]}
    assert is_archive_image([{"Id": "sha256:9e", "RootFS": {"Layers": [LAYER]}}], legacy)
    assert not is_archive_image([{"Id": "sha256:9e", "RootFS": {"Layers": ["sha256:" + "2" * 64]}}], legacy)
    assert not is_archive_image([{"Id": "sha256:9e", "RootFS": {"Layers": []}}], {**legacy, "layers": []})
