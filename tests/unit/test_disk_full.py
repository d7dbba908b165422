"""A full disk as the chief meets it (tfps.task.runtime.diskfull): TensorFlow's and Python's forms,
the one line, and what a failed save leaves removed; results files leave no temporary."""

from __future__ import annotations

import errno
import json
import os

import pytest
import tensorflow as tf

from tfps.outcome import results
from tfps.task.runtime import diskfull

#: SaveV2's message on a full disk, as TensorFlow 2.21 raised it in the chief (one worker's save).
SAVE_V2 = ("Graph execution error:\n\nDetected at node 'save/SaveV2' defined at (most recent call last):\n"
           "    File \"<string>\", line 7, in <module>\nNode: 'save/SaveV2'\n"
           "/data/m/model.ckpt-58.data-00000-of-00001.tempstate17385787567918992341; No space left on device\n"
           "\t [[{{node save/SaveV2}}]]")
SHARDED = ("From /job:worker/replica:0/task:0:\n/data/m/model.ckpt-7_temp/part-00000-of-00001.data-00000-of-00001"
           ".tempstate856; No space left on device")


@pytest.mark.parametrize("error", [
    tf.errors.ResourceExhaustedError(None, None, SAVE_V2),
    tf.errors.UnknownError(None, None, SHARDED),
    OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/m/results.json"),
])
def test_both_forms_of_a_full_disk_are_known(error):
    assert diskfull.is_disk_full(error)
    wrapped = RuntimeError("the session closed")   # raised while handling it: found in the chain
    wrapped.__context__ = error
    assert diskfull.is_disk_full(wrapped)


@pytest.mark.parametrize("error", [
    tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[1024,1024]"),
    OSError(errno.EACCES, "Permission denied"),
    ValueError("no space here"),
])
def test_other_errors_are_not_a_full_disk(error):
    assert not diskfull.is_disk_full(error)


def test_the_checkpoint_and_its_step_are_read_from_the_message():
    e = tf.errors.ResourceExhaustedError(None, None, SAVE_V2)
    assert diskfull.written_path(e).endswith("model.ckpt-58.data-00000-of-00001.tempstate17385787567918992341")
    assert diskfull.what_was_written(e, 3) == "the checkpoint of step 58"
    assert diskfull.what_was_written(tf.errors.UnknownError(None, None, SHARDED), 3) == "the checkpoint of step 7"
    history = OSError(errno.ENOSPC, "No space left on device", "/data/m/history.jsonl")
    assert diskfull.what_was_written(history, 3) == "history.jsonl"


def test_one_line_names_the_disk_its_room_and_the_need(tmp_path):
    full = diskfull.disk_full(tf.errors.ResourceExhaustedError(None, None, SAVE_V2), str(tmp_path),
                              "the checkpoint of step 58", 12.3 * 2**20)
    text = str(full)
    assert "\n" not in text
    assert text.startswith(f"the disk of {tmp_path} is full (") and " free of " in text
    assert text.endswith("while writing the checkpoint of step 58, which needs about 12.3 MiB: free space there "
                         "or give --model_dir on a larger disk")
    assert diskfull.is_disk_full(full) and isinstance(full.__cause__, tf.errors.ResourceExhaustedError)
    assert [diskfull.size_text(n) for n in (0, 512, 2 * 2**20, 1.5 * 2**30)] == ["0 B", "512 B", "2.0 MiB", "1.5 GiB"]


def test_a_failed_saves_temporaries_are_removed_and_nothing_else(tmp_path):
    keep = ["checkpoint", "model.ckpt-3.index", "model.ckpt-3.data-00000-of-00001", "model.ckpt-3.meta",
            "results.json", "notes_temp.txt"]
    for name in keep + ["model.ckpt-58.data-00000-of-00001.tempstate123"]:
        (tmp_path / name).write_text("x")
    (tmp_path / "model.ckpt-58_temp").mkdir()
    (tmp_path / "model.ckpt-58_temp" / "part-00000-of-00001.index.tempstate9").write_text("x")
    assert sorted(diskfull.remove_save_temporaries(str(tmp_path))) == [
        "model.ckpt-58.data-00000-of-00001.tempstate123", "model.ckpt-58_temp"]
    assert sorted(os.listdir(tmp_path)) == sorted(keep)
    assert diskfull.checkpoint_bytes(str(tmp_path / "model.ckpt-3")) == 3


def test_write_json_atomic_leaves_no_temporary_when_its_write_fails(tmp_path, monkeypatch):
    def dump(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(json, "dump", dump)
    with pytest.raises(OSError):
        results.write_json_atomic(str(tmp_path / "x.json"), {"a": 1})
    assert os.listdir(tmp_path) == []


def test_checkpoint_bytes_of_no_checkpoint_is_zero(tmp_path):
    assert diskfull.checkpoint_bytes(None) == 0
    assert diskfull.checkpoint_bytes(str(tmp_path / "missing" / "model.ckpt-1")) == 0
