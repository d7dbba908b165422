"""Delta checkpoints (tfps.task.output.delta, tfps.task.output.delta_hook, tfps.layers.table_delta) in one process:
a full checkpoint + its deltas restore bit-identically to a full checkpoint of the same step,
on 2 shards and continued on 3; a delta that does not match its manifest is never applied."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from tfps.config.schema import RunConfig
from tfps.errors import ConfigError
from tfps.layers import dynamic_embedding as de
from tfps.layers import table_restore
from tfps.task.output import delta
from tfps.task.output.delta_hook import DeltaCheckpointHook

v1 = tf.compat.v1


def _session(graph):
    return v1.Session(graph=graph, config=v1.ConfigProto(inter_op_parallelism_threads=2,
                                                          intra_op_parallelism_threads=1))


def _build(shards: int):
    """Two tables (one counting admissions: its sketch is saved), a dense layer, Adagrad, eviction."""
    g = tf.Graph()
    with g.as_default():
        step = v1.train.get_or_create_global_step()
        ids = v1.placeholder(tf.int64, [None], name="ids")
        devices = ["/cpu:0"] * shards
        a = de.DynamicTable(4, devices=devices, name="emb", steps_to_live=10, capacity=4000)
        b = de.DynamicTable(3, devices=devices, name="cnt", min_count=2, capacity=4000)
        dense = v1.get_variable("dense", [4, 1], initializer=v1.ones_initializer())
        x = a.lookup(ids, training=True)
        y = b.lookup(ids * 7, training=True)
        loss = tf.reduce_sum(tf.matmul(x, dense)) + tf.reduce_sum(y * y)
        train = v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
        ops = {"ids": ids, "train": train, "evict": [a.evict_op(), b.evict_op()],
               "init": v1.global_variables_initializer()}
    return g, ops


def _train(sess, ops, rng, steps, lo, hi):
    for _ in range(steps):
        sess.run(ops["train"], {ops["ids"]: np.unique(rng.integers(lo, hi, 30))})
        sess.run(ops["evict"])


def _tensors(path) -> dict:
    """Every tensor of a checkpoint; a table's rows sorted by key (their order is the shards')."""
    reader = tf.train.load_checkpoint(path)
    out = {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}
    for t in ("emb", "cnt"):
        order = np.argsort(out[f"{t}/keys"])
        for n in list(out):
            if n.startswith(t + "/") and n != f"{t}/sketch":
                out[n] = out[n][order]
    return out


def _assert_identical(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for n in want:
        assert got[n].dtype == want[n].dtype and got[n].shape == want[n].shape, n
        assert np.array_equal(got[n], want[n]), n   # bit for bit (no tolerance)


def _job(tmp_path, corrupt=None):
    """Trains on 2 shards: full checkpoint, then 3 deltas with admissions, updates and evictions
    between them; a reference full checkpoint (another directory) at each delta's step."""
    model_dir, ref_dir = str(tmp_path / "model"), str(tmp_path / "ref")
    g, ops = _build(2)
    rng = np.random.default_rng(3)
    refs = []
    with g.as_default():
        hook = DeltaCheckpointHook(model_dir, secs=0, in_flight=0)
        hook.begin()
        saver, ref = table_restore.job_saver(g, None), v1.train.Saver(de.saver_var_list(g), sharded=False)
        local = v1.local_variables_initializer()   # the delta marks (the Scaffold's local_init_op)
    with _session(g) as sess:
        sess.run([ops["init"], local])
        _train(sess, ops, rng, 12, 0, 300)
        step = int(sess.run(v1.train.get_global_step(g)))
        hook.full_saved(saver.save(sess, os.path.join(model_dir, "model.ckpt"), global_step=step), step)
        for k, (lo, hi) in enumerate([(250, 320), (0, 40), (600, 640)]):   # new ids; old ones age out
            _train(sess, ops, rng, 8, lo, hi)
            manifest = hook.save(sess)
            assert manifest is not None and manifest["sequence"] == k + 1
            refs.append(ref.save(sess, os.path.join(ref_dir, "model.ckpt"), global_step=manifest["step"]))
    return model_dir, refs, hook


def test_full_plus_deltas_restore_bit_identically_on_2_shards_and_continued_on_3(tmp_path):
    model_dir, refs, hook = _job(tmp_path)
    first, later = hook.saved[0]["tables"]["emb"], hook.saved[1]["tables"]["emb"]
    assert first["live_keys"] and later["evicted"], hook.saved   # each kind of delta ran, with evictions
    assert 0 < later["rows"] < len(_tensors(refs[1])["emb/keys"])   # only the touched rows

    restored = delta.consolidate(model_dir)
    assert restored == os.path.join(model_dir, f"model.ckpt-{hook.saved[-1]['step']}")
    _assert_identical(_tensors(restored), _tensors(refs[-1]))
    assert not os.listdir(os.path.join(model_dir, delta.DELTAS))   # covered by the written full one

    # Continued on 3 shards: restore, save again; identical to the reference restored the same way.
    def resaved(path, where):
        g3, ops3 = _build(3)
        with g3.as_default():
            saver = table_restore.job_saver(g3, path)
        with _session(g3) as sess:
            saver.restore(sess, path)
            return saver.save(sess, str(tmp_path / where / "model.ckpt"), global_step=1)
    _assert_identical(_tensors(resaved(restored, "three")), _tensors(resaved(refs[-1], "three_ref")))


def test_a_truncated_delta_is_not_applied_and_the_restore_stops_at_the_last_good_one(tmp_path, caplog):
    model_dir, refs, hook = _job(tmp_path)
    bad = delta.delta_dir(model_dir, hook.base, 2)
    with open(os.path.join(bad, delta.TABLES), "r+b") as f:
        f.truncate(100)
    with caplog.at_level(logging.INFO, logger="tfps"):
        restored = delta.consolidate(model_dir)
    _assert_identical(_tensors(restored), _tensors(refs[0]))   # full + delta 1
    lines = [r.getMessage() for r in caplog.records if "delta" in r.getMessage()]
    assert len(lines) == 1 and "delta 2 of" in lines[0] and "tables.npz is 100 bytes" in lines[0] and \
        f"restoring step {hook.saved[0]['step']}" in lines[0], lines


def test_a_delta_whose_files_do_not_match_its_manifest_is_refused(tmp_path):
    model_dir, refs, hook = _job(tmp_path)
    path = delta.delta_dir(model_dir, hook.base, 1)
    with open(os.path.join(path, delta.TABLES), "r+b") as f:   # same size, one byte flipped
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(delta.BadDelta, match="does not match its checksum"):
        delta.check(path, hook.base, 1)
    with pytest.raises(delta.BadDelta, match="names model.ckpt-12 delta 1"):
        delta.check(path, hook.base, 2)
    os.remove(os.path.join(path, delta.MANIFEST))
    with pytest.raises(delta.BadDelta, match="no manifest"):
        delta.check(path, hook.base, 1)
    assert delta.consolidate(model_dir) == hook.base   # nothing applied: the full checkpoint as it was


def test_delta_checkpoint_secs_is_a_positive_integer_and_reaches_every_task():
    assert "--delta_checkpoint_secs=60" in RunConfig(delta_checkpoint_secs=60).validate().to_args()
    with pytest.raises(ConfigError) as e:
        RunConfig(delta_checkpoint_secs=0).validate()
    assert e.value.field == "delta_checkpoint_secs"
    from tfps.cluster.variables import launch_from_vars
    _, launch = launch_from_vars({"tfps_delta_checkpoint_secs": "60"})
    assert "--delta_checkpoint_secs=60" in launch.run_args


def test_config_compose_and_slurm_pass_delta_checkpoint_secs_on(tmp_path):
    from tfps import cli, cli_tools
    from tfps.config import from_args
    from tfps.launch import compose, slurm
    from tfps.task import entry
    job = tmp_path / "job.yaml"
    job.write_text("delta_checkpoint_secs: 60\n")
    parser = cli.build_parser()
    assert from_args(parser.parse_args(cli_tools.expand_config(["local", "--config", str(job)], parser))) \
        .delta_checkpoint_secs == 60
    text = compose.render(parser.parse_args(cli.normalize_argv(["compose", "--delta-checkpoint-secs", "30"])))
    assert text.count("--delta_checkpoint_secs=30") >= 2, text
    argv = slurm.run_argv(parser.parse_args(["slurm", "--delta_checkpoint_secs", "45"]), {"model_dir": "/shared/m"})
    assert from_args(entry.build_parser().parse_args(argv)).delta_checkpoint_secs == 45
