"""Issue 35 #10: a model_dir whose name holds glob characters ([ ] * ? \\) finds its checkpoints.

TensorFlow globs a checkpoint's path in tf.train.latest_checkpoint, Saver.restore and the
Saver's removal of old checkpoints: ``exp[lr=0.01]`` read as a character class found no
checkpoint ("no checkpoint was written"), and nothing was exported. Real checkpoints, written
by TensorFlow, into such directories.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tfps import compat
from tfps.task.output import export
from tfps.task.output.checkpoint import checkpoint_step, glob_free_checkpoint, glob_free_dir

tf = pytest.importorskip("tensorflow")
v1 = tf.compat.v1

NAMES = ["exp[lr=0.01]", "a*b", "q?x", "br]ack", "back\\slash", "all[*?]\\x"]


def _train(model_dir: str, steps=(1, 2, 3), keep: int = 2) -> None:
    graph = tf.Graph()
    with graph.as_default():
        step = v1.train.get_or_create_global_step()
        w = v1.get_variable("w", initializer=np.float32(1.5))
        saver = v1.train.Saver(max_to_keep=keep, save_relative_paths=True)   # as the chief's (worker.py)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for s in steps:
                sess.run(step.assign(s))
                sess.run(w.assign(float(s)))
                saver.save(sess, os.path.join(model_dir, "model.ckpt"), global_step=s)


@pytest.fixture(autouse=True)
def literal():
    compat.literal_checkpoint_directories()
    compat.literal_checkpoint_directories()   # idempotent: one wrapper, however often a task calls it


@pytest.mark.parametrize("name", NAMES)
def test_checkpoints_in_a_directory_named_with_glob_characters_are_found_restored_and_rotated(tmp_path, name):
    model_dir = str(tmp_path / name / "run")
    os.makedirs(model_dir)
    _train(model_dir, keep=2)
    newest = tf.train.latest_checkpoint(model_dir)
    assert newest == os.path.join(model_dir, "model.ckpt-3") and checkpoint_step(newest) == 3
    assert v1.train.checkpoint_exists(newest)
    # the Saver removed the oldest (max_to_keep=2): its pattern model.ckpt-1.data-????? matched
    assert sorted(f for f in os.listdir(model_dir) if f.endswith(".index")) == ["model.ckpt-2.index",
                                                                                 "model.ckpt-3.index"]
    graph = tf.Graph()
    with graph.as_default():
        w = v1.get_variable("w", initializer=np.float32(0.0))
        with v1.Session() as sess:
            export._restore(sess, newest)   # the export's and evaluation's restore (RestoreV2 globs PREFIX.index)
            assert sess.run(w) == 3.0
            v1.train.Saver().restore(sess, glob_free_checkpoint(newest))
    # the chief's restore at a resume: TensorFlow's SessionManager in the session creator tfps uses
    from tfps.task.runtime.hooks import RestoreLoggingChiefSessionCreator
    graph = tf.Graph()
    with graph.as_default():
        v1.train.get_or_create_global_step()
        w = v1.get_variable("w", initializer=np.float32(0.0))
        creator = RestoreLoggingChiefSessionCreator(
            scaffold=v1.train.Scaffold(saver=v1.train.Saver(sharded=False, save_relative_paths=True)),
            checkpoint_dir=model_dir)
        with creator.create_session() as sess:
            assert sess.run(w) == 3.0
    assert export.nonfinite_variables(newest) == []   # the chief's check of the final variables
    assert tf.train.load_checkpoint(glob_free_checkpoint(newest)).get_tensor("w") == 3.0


def test_the_directory_is_quoted_and_the_checkpoint_pattern_kept():
    assert compat.escape_glob_directory("/r/exp[lr=0.01]/model.ckpt-1.data-?????-of-?????") == \
        "/r/exp\\[lr=0.01\\]/model.ckpt-1.data-?????-of-?????"
    assert compat.escape_glob_directory("/r/a*b?\\/m") == "/r/a\\*b\\?\\\\/m"
    assert compat.escape_glob_directory("model.ckpt-1*") == "model.ckpt-1*"
    assert compat.escape_glob_directory("/plain/dir/x") == "/plain/dir/x"


def test_a_plain_directory_is_given_to_tensorflow_as_it_is(tmp_path):
    assert glob_free_dir(str(tmp_path)) == str(tmp_path)
    odd = tmp_path / "exp[lr=0.01]"
    odd.mkdir()
    alias = glob_free_dir(str(odd))
    assert not set("[]*?\\") & set(alias) and os.path.samefile(alias, odd)
    assert glob_free_dir(str(odd)) == alias   # one descriptor per directory
