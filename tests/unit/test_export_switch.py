"""The export's switch into place: the new SavedModel takes export_dir's place, nothing is left over."""

from __future__ import annotations

import json
import os

import pytest

from tfps.task.output import export


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


def _tfps_export(path, step=1):
    os.makedirs(path / "variables")
    os.makedirs(path / "assets")
    (path / "saved_model.pb").write_text(f"model {step}")
    (path / "variables" / "variables.index").write_text(f"vars {step}")
    (path / "fingerprint.pb").write_text(f"fp {step}")
    (path / "tfps_export.json").write_text(json.dumps(
        {"global_step": step, "checkpoint": f"/m/model.ckpt-{step}", "completed_at": "2026-01-01T00:00:00+0000"}))


@pytest.mark.parametrize("exchange", [True, False], ids=["one-step swap", "two renames"])
def test_what_a_user_added_to_the_export_survives_the_next_one(tmp_path, monkeypatch, exchange):
    """Issue 35 #4: notes.txt and assets.extra/ in an export are kept; tfps's own files are replaced."""
    target = tmp_path / "export"
    _tfps_export(target, 100)
    (target / "notes.txt").write_text("my notes")
    (target / "assets.extra").mkdir()
    (target / "assets.extra" / "serving.cfg").write_text("batch: 8")
    (target / "link").symlink_to("notes.txt")
    (target / "variables" / "stray").write_text("tfps's own directory: replaced as a whole")
    _tfps_export(tmp_path / "export.tmp-1", 200)
    if not exchange:
        monkeypatch.setattr(export, "_exchange", lambda a, b: False)
    export.switch_into_place(str(tmp_path / "export.tmp-1"), str(target))
    assert sorted(os.listdir(target)) == ["assets", "assets.extra", "fingerprint.pb", "link", "notes.txt",
                                          "saved_model.pb", "tfps_export.json", "variables"]
    assert (target / "notes.txt").read_text() == "my notes"
    assert (target / "assets.extra" / "serving.cfg").read_text() == "batch: 8"
    assert os.readlink(target / "link") == "notes.txt"
    assert (target / "saved_model.pb").read_text() == "model 200"
    assert sorted(os.listdir(target / "variables")) == ["variables.index"]
    assert json.loads((target / "tfps_export.json").read_text())["global_step"] == 200
    assert sorted(os.listdir(tmp_path)) == ["export"]
    # and again: a second export keeps them as well
    _tfps_export(tmp_path / "export.tmp-2", 300)
    export.switch_into_place(str(tmp_path / "export.tmp-2"), str(target))
    assert (target / "notes.txt").read_text() == "my notes" and (target / "saved_model.pb").read_text() == "model 300"


def test_a_failed_export_leaves_no_temporary_directory_and_the_old_export_as_it_was(tmp_path, monkeypatch):
    target = tmp_path / "export"
    _tfps_export(target, 100)
    (target / "notes.txt").write_text("my notes")

    def half_written(tf, model_fn, params, checkpoint, tmp, step):
        os.makedirs(os.path.join(tmp, "variables"))
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(export, "_write_export", half_written)
    with pytest.raises(OSError):
        export.export_saved_model(None, None, "/m/model.ckpt-200", str(target), 200)
    assert sorted(os.listdir(tmp_path)) == ["export"]
    assert (target / "saved_model.pb").read_text() == "model 100" and (target / "notes.txt").exists()


@pytest.mark.parametrize("marker", ["{}", "[]", "not json", '{"global_step": "1", "checkpoint": "x"}'])
def test_a_marker_without_what_tfps_writes_is_not_a_tfps_export(tmp_path, marker):
    from tfps.errors import ConfigError
    from tfps.outcome import results
    d = tmp_path / "d"
    _tfps_export(d, 5)
    assert results.export_complete(str(d))
    results.check_export_dir(str(d), str(tmp_path / "m"))   # a tfps export with a user's file: accepted
    (d / "notes.txt").write_text("x")
    results.check_export_dir(str(d), str(tmp_path / "m"))
    (d / "tfps_export.json").write_text(marker)
    assert not results.export_complete(str(d))
    with pytest.raises(ConfigError) as e:
        results.check_export_dir(str(d), str(tmp_path / "m"))
    assert e.value.field == "export_dir" and "is not a tfps export" in str(e.value) and "notes.txt" in str(e.value)
    assert (d / "notes.txt").read_text() == "x"
