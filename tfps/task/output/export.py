"""Final export and evaluation, from the last checkpoint, in a fresh local graph.

``hook.end()`` is skipped when training ends with an exception, and a graph built under
``replica_device_setter`` pins variables to ``/job:ps``; so the SavedModel is never
written from the training session. After the session closes, the chief rebuilds the
model in predict mode in a new graph on its own CPU, restores the checkpoint (which a
non-sharded saver wrote on the chief's own disk) and writes the SavedModel and its
completion marker into a temporary directory next to ``export_dir``, which then takes
the place of ``export_dir`` (:func:`switch_into_place`). The first export is one rename.
A later one swaps the two directories in one step (Linux ``renameat2`` with
``RENAME_EXCHANGE``: ext4, xfs, btrfs, tmpfs, Docker volumes), so a reader sees either
the previous complete export or the new one, at any instant. Where the filesystem
cannot swap directories (NFS, some FUSE filesystems), it falls back to two renames
(old out, new in): a reader between them finds no ``export_dir`` for that instant, never
a partial one. ``export_dir`` stays a plain directory either way (not a symlink), so
``docker cp`` and a copy of the model directory take the SavedModel itself. What a user
added to the previous export (anything but tfps's own files: ``saved_model.pb``,
``variables/``, ``assets/``, ``fingerprint.pb``, the marker) is carried into the new one
before the switch (hard links where possible), so it is never lost. A failed export
removes its temporary directory and leaves the previous export as it was.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
import time

from tfps.outcome.results import EXPORT_MARKER, EXPORT_OWN, export_complete  # noqa: F401 - what a finished export leaves
from tfps.task.output.checkpoint import glob_free_checkpoint

log = logging.getLogger("tfps")


def nonfinite_variables(checkpoint: str) -> list[str]:
    """Names of the checkpoint's floating-point variables that hold NaN or infinity.

    A job whose variables went non-finite has failed, whatever its loss said; and such a
    checkpoint must never be restored silently (the next run would fail the same way).
    Reads each variable once, on the chief, at the start and the end of a job.
    """
    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(glob_free_checkpoint(checkpoint))   # it globs too
    return sorted(name for name, dtype in reader.get_variable_to_dtype_map().items()
                  if dtype.is_floating and not np.isfinite(reader.get_tensor(name)).all())


def _restore(sess, checkpoint: str):
    import tensorflow as tf

    from tfps.layers import dynamic_embedding  # lazy: imports TensorFlow
    var_list = dynamic_embedding.saver_var_list(sess.graph)
    if var_list is not None:   # dynamic tables: their saveables; serving variables are fed, not restored
        serving = {id(v) for t in dynamic_embedding.tables(sess.graph) if t.serving
                   for v in (t.serving_keys, t.serving_values)}
        var_list = [v for v in var_list if id(v) not in serving]
    if var_list is None or var_list:   # a model whose only variables are served tables restores nothing else
        tf.compat.v1.train.Saver(var_list, sharded=False).restore(sess, glob_free_checkpoint(checkpoint))
    for init, feed in dynamic_embedding.serving_initializers(glob_free_checkpoint(checkpoint), sess.graph):
        sess.run(init, feed)


#: What TensorFlow accepts as an operation's name (``tf.Graph``'s own check).
_OP_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\-]*")


def input_op_name(column: str) -> str:
    """The name of the placeholder that serves ``column``: the column's own name when it is a
    valid TensorFlow name, else one made valid (``user id`` -> ``user_id``, ``_ad`` ->
    ``input_ad``). The signature still takes the column by its raw name (the signature's key),
    so a CSV header such as ``user id`` or ``ad:x`` trains and exports alike."""
    if _OP_NAME.fullmatch(column):
        return column
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", column)
    return name if _OP_NAME.fullmatch(name) else f"input{name}"


def export_saved_model(model_fn, params, checkpoint: str, export_dir: str, global_step: int) -> str:
    import tensorflow as tf
    export_dir = os.path.abspath(export_dir)
    parent = os.path.dirname(export_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{export_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_export(tf, model_fn, params, checkpoint, tmp, global_step)
        switch_into_place(tmp, export_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)   # a half-written export (a full disk, a stop) is not left behind
        raise
    return export_dir


def write_version(model_fn, params):
    """The writer of ``--export_every``'s versions (tfps.task.output.versions.Versions): a complete
    SavedModel of a checkpoint, its marker holding the version's metadata, into a new directory;
    ``threads`` bounds its TensorFlow thread pool (its own: a background export's threads
    inherit the low priority of the thread that starts them)."""
    def write(checkpoint: str, dest: str, global_step: int, extra: dict, threads: int | None = None) -> None:
        import tensorflow as tf
        _write_export(tf, model_fn, params, checkpoint, dest, global_step, extra, threads)
    return write


def _write_export(tf, model_fn, params, checkpoint: str, tmp: str, global_step: int,
                  extra: dict | None = None, threads: int | None = None) -> None:
    v1 = tf.compat.v1
    config = v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads,
                            use_per_session_threads=True) if threads else None
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device("/cpu:0"):
        # A Keras model serves under its own input names (keras_model.KerasModelFn.serving_inputs).
        named = getattr(model_fn, "serving_inputs", None)
        if named:
            features = {n: v1.placeholder(tf.as_dtype(dt), [None, *shape], name=input_op_name(n))
                        for n, (shape, dt) in named.items()}
        else:
            features = v1.placeholder(tf.float32, [None, *params.feature_shape], name="features")
        inputs = features if named else {"features": features}
        from tfps.layers import dynamic_embedding  # lazy: imports TensorFlow
        # Dynamic tables made for "predict" (serving=True) serve their live rows as plain variables.
        spec = model_fn(features, None, "predict", params)
        with v1.Session(graph=graph, config=config) as sess:
            _restore(sess, checkpoint)
            signature = v1.saved_model.predict_signature_def(inputs=inputs,
                                                            outputs=dict(spec.predictions))
            builder = v1.saved_model.Builder(tmp)
            builder.add_meta_graph_and_variables(
                sess, [v1.saved_model.tag_constants.SERVING],
                signature_def_map={"serving_default": signature}, strip_default_attrs=True,
                saver=v1.train.Saver(dynamic_embedding.saver_var_list(graph), sharded=True, allow_empty=True)
                if dynamic_embedding.tables(graph) else None)
            builder.save()
    with open(os.path.join(tmp, EXPORT_MARKER), "w") as fh:
        json.dump({**(extra or {}), "global_step": global_step, "checkpoint": checkpoint,
                   "completed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   "inputs": {n: [None, *t.shape.as_list()[1:]] for n, t in inputs.items()},
                   "outputs": sorted(spec.predictions)}, fh, indent=2)


#: renameat2(2): ``AT_FDCWD`` and the flag that swaps two existing paths.
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> bool:
    """Swap the directories ``a`` and ``b`` in one step; False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):   # not Linux, or a libc before glibc 2.28
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where the filesystem allows one (no space, no time), else a copy."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def carry_over(old: str, new: str) -> list[str]:
    """Put into ``new`` what a user added to the export in ``old`` (all but tfps's own files,
    :data:`tfps.outcome.results.EXPORT_OWN`); ``old`` keeps them too until it is removed.
    Returns the names carried."""
    try:
        names = sorted(os.listdir(old))
    except (FileNotFoundError, NotADirectoryError):
        return []
    carried = []
    for name in names:
        src, dst = os.path.join(old, name), os.path.join(new, name)
        if name in EXPORT_OWN or os.path.lexists(dst):
            continue
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)
        carried.append(name)
    return carried


def switch_into_place(new: str, export_dir: str) -> None:
    """Make the complete export in ``new`` the ``export_dir`` (see the module docstring).

    What a user put into the previous export (``notes.txt``, ``assets.extra/``: anything but
    tfps's own files) is carried into ``new`` first, so it survives the switch.
    """
    carried = carry_over(export_dir, new)
    if carried:
        log.info("export: kept %s from the previous export in %s", ", ".join(carried), export_dir)
    if not os.path.lexists(export_dir):
        os.replace(new, export_dir)
    elif _exchange(new, export_dir):
        shutil.rmtree(new, ignore_errors=True)   # ``new`` now holds the previous export
    else:
        old = f"{export_dir}.old-{os.getpid()}"
        os.replace(export_dir, old)
        os.replace(new, export_dir)
        shutil.rmtree(old, ignore_errors=True)


#: The subdirectory of model_dir that holds the evaluation's TensorBoard run (next to the
#: chief's training summaries in model_dir itself), as Keras's TensorBoard callback writes
#: ``train`` and ``validation``: TensorBoard draws both runs' ``loss`` in one chart.
EVAL_RUN = "eval"


def write_eval_summaries(model_dir: str, step: int, metrics: dict[str, float]) -> str:
    """The evaluation's scalars at ``step``, under the training scalars' own names (``loss``,
    ``accuracy``, ...), as the ``eval`` run of ``model_dir``. Returns its directory."""
    import tensorflow as tf
    v1 = tf.compat.v1
    path = os.path.join(model_dir, EVAL_RUN)
    with tf.Graph().as_default():   # FileWriter is the graph-mode writer
        writer = v1.summary.FileWriter(path)
    try:
        writer.add_summary(v1.Summary(value=[v1.Summary.Value(tag=k, simple_value=float(v))
                                             for k, v in sorted(metrics.items())]), int(step))
        writer.flush()
    finally:
        writer.close()
    return path


def evaluate(model_fn, params, checkpoint: str, dataset) -> dict[str, float]:
    """Average loss and metrics of the checkpoint over one pass of ``dataset``.

    Dynamic tables read the checkpoint's live rows as the export serves them (a model_fn
    makes them with ``serving=True`` outside "train"; the Keras layer on training=False),
    not through a hash table restored into one local shard: the training's shards hold up
    to ``SHARD_SLACK`` times the table's capacity together, more than one shard of that
    capacity takes, and the evaluation must score what is served.
    """
    import numpy as np
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device("/cpu:0"):
        features, labels = v1.data.make_one_shot_iterator(dataset()).get_next()
        spec = model_fn(features, labels, "eval", params)
        fetch = {"loss": spec.loss, **spec.metrics, "_n": tf.shape(labels)[0]}
        # A binary classifier is also ranked over the whole set at once: AUC is not a mean
        # of per-batch values.
        scores = spec.predictions.get("probability")
        if scores is None and spec.predictions.get("probabilities") is not None \
                and spec.predictions["probabilities"].shape[-1] == 2:
            scores = spec.predictions["probabilities"][:, 1]
        ranked = {"_scores": scores, "_labels": labels} if scores is not None else {}
        # Stateful metrics (AUC, Precision, Recall): updated with every batch, read once at the end.
        streamed = {f"_update_{k}": update for k, (update, _, _) in spec.streaming.items()}
        state = [v for _, _, variables in spec.streaming.values() for v in variables]
        totals: dict[str, float] = {}
        count = 0
        seen_scores, seen_labels = [], []
        with v1.Session(graph=graph) as sess:
            _restore(sess, checkpoint)
            if state:
                sess.run(v1.variables_initializer(state))
            while True:
                try:
                    out = sess.run({**fetch, **ranked, **streamed})
                except tf.errors.OutOfRangeError:
                    break
                for k in streamed:
                    out.pop(k)
                if ranked:
                    seen_scores.append(np.asarray(out.pop("_scores")).reshape(-1))
                    seen_labels.append(np.asarray(out.pop("_labels")).reshape(-1))
                n = int(out.pop("_n"))
                count += n
                for k, v in out.items():
                    totals[k] = totals.get(k, 0.0) + float(np.asarray(v)) * n
            results = sess.run({k: result for k, (_, result, _) in spec.streaming.items()}) if count else {}
    metrics = {k: round(v / count, 6) for k, v in totals.items()} if count else {}
    metrics.update({k: round(float(np.asarray(v)), 6) for k, v in results.items()})
    if seen_scores:
        value = auc(np.concatenate(seen_scores), np.concatenate(seen_labels))
        if value is not None and "auc" not in results:   # a compiled keras.metrics.AUC keeps its own
            metrics["auc"] = round(value, 6)
    return metrics


def auc(scores, labels) -> float | None:
    """Area under the ROC curve of binary ``labels`` (0/1) ranked by ``scores``; ties share
    their mean rank. None when only one class occurs."""
    import numpy as np
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels).astype(np.int64)
    pos = labels == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores))
    # mean rank of each run of equal scores
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(scores)]])
    for a, b in zip(starts, ends):
        ranks[order[a:b]] = (a + b + 1) / 2.0
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
