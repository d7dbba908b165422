"""The TFRecord pre-check: the schema read from a file's first ``tf.train.Example``, and the
scanned records checked against it before any process starts (each feature present with as
many values and the same type, one label, floats finite), refusals naming file and record.
"""

from __future__ import annotations

import numpy as np

from tfps.errors import ConfigError


def read_schema(path: str, label_column: str, field: str):
    import tensorflow as tf  # protobuf parsing of one record

    try:
        first = next(iter(tf.data.TFRecordDataset([path]).take(1)), None)
    except tf.errors.OpError as e:
        raise ConfigError(f"{path} is not a readable TFRecord file ({e.message.splitlines()[0]})", field) from None
    if first is None:
        raise ConfigError(f"{path} holds no records", field)
    ex = tf.train.Example.FromString(first.numpy())
    feats = ex.features.feature
    if label_column not in feats:
        raise ConfigError(f"label key {label_column!r} is not in {path} (keys: {', '.join(sorted(feats))}); "
                          "pass --label_column", "label_column")
    keys, width, strings = [], 0, []
    for k in sorted(feats):
        if k == label_column:
            continue
        kind = feats[k].WhichOneof("kind")
        if kind is None:
            raise ConfigError(f"{path}: feature {k!r} holds no value list; give it a bytes_list, int64_list "
                              "or float_list", field)
        if kind == "bytes_list":
            if len(feats[k].bytes_list.value) != 1:
                raise ConfigError(f"{path}: feature {k!r} holds {len(feats[k].bytes_list.value)} byte strings in "
                                  "its first record; a string column holds exactly one per record", field)
            strings.append(k)
        keys.append(k)
        width += len(getattr(feats[k], kind).value)
    kinds = tuple((feats[k].WhichOneof("kind") or "float_list").replace("_list", "") for k in [*keys, label_column])
    if kinds[-1] == "bytes":
        raise ConfigError(f"{path}: label {label_column!r} holds bytes; it must be a number", "label_column")
    if strings and width != len(keys):
        many = [k for k in keys if len(getattr(feats[k], feats[k].WhichOneof("kind")).value) != 1]
        raise ConfigError(f"{path}: with string columns ({', '.join(strings)}) every feature is a column of one "
                          f"value per record, and {', '.join(repr(k) for k in many)} hold(s) several; split "
                          "them into one key each", field)
    widths = {k: len(getattr(feats[k], feats[k].WhichOneof("kind")).value) for k in keys}
    return tuple(keys), (width,), kinds, tuple(strings), widths


def scan(files: list[str], label_column: str, keys: tuple[str, ...], kinds: tuple[str, ...],
         widths: dict[str, int], field: str, scan_rows: int) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """The labels of the first ``scan_rows`` records (the number of classes needs all of
    them) and where each is, every scanned record checked against the first one: each
    feature present with as many values, one label, floats finite. Records are counted
    from 1 in each file."""
    import tensorflow as tf

    dtype = {"bytes": tf.string, "int64": tf.int64}
    names = [*keys, label_column]
    spec = {k: tf.io.VarLenFeature(dtype.get(kind, tf.float32)) for k, kind in zip(names, kinds)}
    # traced as written, without AutoGraph (as tfps.data.dataset.plain_function)
    parse = tf.autograph.experimental.do_not_convert(lambda r: tf.io.parse_example(r, spec))
    labels: list[np.ndarray] = []
    where: list[tuple[str, str]] = []
    budget = scan_rows
    for f in files:
        if budget <= 0:
            break
        first = len(where)   # records of f before this batch, below
        batches = iter(tf.data.TFRecordDataset([f]).take(budget).batch(4096))
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except tf.errors.OpError as e:
                raise ConfigError(f"{f} is not a readable TFRecord file ({e.message.splitlines()[0]})",
                                  field) from None
            done = len(where) - first
            try:
                ex = parse(batch)
            except (tf.errors.OpError, ValueError) as e:
                _find_mismatch(f, done, batch.numpy(), names, kinds, field)
                raise ConfigError(f"cannot read the records of {f} ({str(e).splitlines()[0]}); every record "
                                  "needs the first record's features, of the same types", field) from None
            n = int(batch.shape[0])
            problems = []   # (record in batch, kind, key, detail): the first record's is refused
            for k, kind in zip(names, kinds):
                rows = ex[k].indices[:, 0].numpy()
                counts = np.bincount(rows, minlength=n)
                want = 1 if k == label_column else widths[k]
                off = np.flatnonzero(counts != want)
                if off.size:
                    i = int(off[0])
                    problems.append((i, "missing" if counts[i] == 0 else "length", k, int(counts[i]), want))
                if kind == "float":
                    values = ex[k].values.numpy()
                    bad = np.flatnonzero(~np.isfinite(values))
                    if bad.size:
                        problems.append((int(rows[bad[0]]), "nonfinite", k, float(values[bad[0]]), 0))
            if problems:
                i, problem, k, got, want = min(problems)
                rec = done + i + 1
                what = "the label" if k == label_column else "feature"
                if problem == "missing" and k == label_column:
                    raise ConfigError(f"{f}: record {rec} has no label {k!r}; every record needs one", field)
                if problem == "missing":
                    raise ConfigError(f"{f}: record {rec} lacks feature {k!r}, which the first record has; every "
                                      "record needs every feature", field)
                if problem == "length":
                    raise ConfigError(f"{f}: record {rec} holds {got} values in {what} {k!r}, the first record "
                                      f"{want}; every record needs as many", field)
                raise ConfigError(f"{f}: record {rec} has a non-finite value ({got:g}) in {what} {k!r}; fix or "
                                  "remove that record", field)
            labels.append(ex[label_column].values.numpy().astype(np.float64))
            where += [(f, f"record {done + i + 1}") for i in range(n)]
        budget -= len(where) - first
    return (np.concatenate(labels) if labels else np.zeros(0)), where


def _find_mismatch(path: str, done: int, records, names: list[str], kinds: tuple[str, ...],
                   field: str) -> None:
    """Refuse the first of ``records`` that holds a feature in another type than the first
    record did (``parse_example`` only says that some record does)."""
    import tensorflow as tf

    for i, raw in enumerate(records):
        try:
            feats = tf.train.Example.FromString(raw).features.feature
        except Exception:   # noqa: BLE001 - protobuf's DecodeError, by any of its implementations
            raise ConfigError(f"{path}: record {done + i + 1} is not a tf.train.Example", field) from None
        for k, kind in zip(names, kinds):
            if k in feats:
                has = (feats[k].WhichOneof("kind") or "no").replace("_list", "")
                if has != kind:
                    raise ConfigError(f"{path}: record {done + i + 1} holds {k!r} as {has} values, the first "
                                      f"record as {kind}; every record needs the same types", field)

