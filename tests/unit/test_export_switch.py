"""The export's switch into place: the new SavedModel takes export_dir's place, nothing is left over."""

from __future__ import annotations

import os

import pytest

from tfps.task import export


def _export(path, text):
    os.makedirs(path)
    (path / "tfps_export.json").write_text(text)


@pytest.mark.parametrize("exchange", [True, False], ids=["one-step swap", "two renames"])
def test_the_new_export_takes_the_place_of_the_old_one(tmp_path, monkeypatch, exchange):
    target = tmp_path / "export"
    _export(target, "old")
    _export(tmp_path / "export.tmp-1", "new")
    if not exchange:   # a filesystem that cannot swap directories (NFS)
        monkeypatch.setattr(export, "_exchange", lambda a, b: False)
    export.switch_into_place(str(tmp_path / "export.tmp-1"), str(target))
    assert (target / "tfps_export.json").read_text() == "new"
    assert not target.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["export"]


def test_the_swap_is_one_step_on_this_filesystem(tmp_path):
    """Linux swaps two directories with renameat2(RENAME_EXCHANGE) (ext4, xfs, tmpfs...)."""
    _export(tmp_path / "a", "a")
    _export(tmp_path / "b", "b")
    assert export._exchange(str(tmp_path / "a"), str(tmp_path / "b")), "no one-step swap on this filesystem"
    assert (tmp_path / "a" / "tfps_export.json").read_text() == "b"
    assert (tmp_path / "b" / "tfps_export.json").read_text() == "a"


def test_the_first_export_is_one_rename(tmp_path):
    _export(tmp_path / "export.tmp-1", "new")
    export.switch_into_place(str(tmp_path / "export.tmp-1"), str(tmp_path / "export"))
    assert sorted(os.listdir(tmp_path)) == ["export"]
