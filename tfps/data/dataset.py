"""Training and evaluation input: file discovery, schema inference and tf.data pipelines.

Schema inference (feature shape, number of classes) and validation are plain NumPy so
that ``tfps local`` can refuse bad data before it starts any process. Only
``make_dataset`` imports TensorFlow (and the TFRecord check, which reads the records).
The checks of a CSV file's rows are in :mod:`tfps.data.csvcheck`, those of a TFRecord file's
records in :mod:`tfps.data.tfrecordcheck`; this module decides and combines.

Formats, chosen by file name:
  * ``*.csv``: a header row, one label column (``--label_column``), numeric features.
  * ``*.tfrecord``/``*.tfrecords``/``*.tfr``: ``tf.train.Example``; every key except the
    label is a feature, in sorted key order. Numeric features are concatenated into one
    float matrix; with a ``bytes_list`` key (a string column, one value per record) every
    key reaches the model by name in its own dtype: string, int64 (``int64_list``, exact)
    or float32.
  * ``*.npz``: arrays ``x`` (or ``features``) and ``y`` (or ``label``/``labels``).
  * MNIST IDX: ``*images-idx3-ubyte[.gz]`` with the matching ``*labels-idx1-ubyte[.gz]``.
"""

from __future__ import annotations

import bisect
import dataclasses
import glob
import gzip
import os
import struct

import numpy as np

from tfps.data import csvcheck, tfrecordcheck
from tfps.errors import ConfigError

CSV_SCAN_ROWS = 200_000   # rows scanned per CSV file to validate it and to infer the label type
#: Training data whose files (this worker's shard of them) take at most this much space is
#: decoded once and kept in memory; larger data is read and parsed again every epoch.
CACHE_MAX_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class Schema:
    fmt: str                       # csv | tfrecord | npz | idx
    files: tuple[str, ...]
    feature_shape: tuple[int, ...]
    num_classes: int               # 0 = regression
    feature_keys: tuple[str, ...] = ()   # csv columns / tfrecord keys, in order
    num_examples: int | None = None
    #: tfrecord: "float" or "int64" per key of feature_keys, then the label's
    tfrecord_kinds: tuple[str, ...] = ()
    #: the feature columns that hold text (ids such as ``68fd1e64``: CSV text, TFRecord
    #: bytes_list): read as strings, and then every column reaches the model by name (a
    #: dict), not as one float matrix
    string_columns: tuple[str, ...] = ()
    #: every column by name even without text (a model of named columns asked for it), so
    #: that int64 ids arrive exact rather than as float32
    named: bool = False
    #: CSV: (column, "file:line 'value'") of the first value of each text column that is
    #: not a number, for messages
    text_where: tuple[tuple[str, str], ...] = ()

    def describe_text(self) -> str:
        """The text columns, and where the first of them holds a value that is not a number:
        ``(user, ad), e.g. 'u1' in column 'user' at train.csv:2``, for messages."""
        listed = f"({', '.join(self.string_columns)})"
        at = dict(self.text_where)
        first = next((c for c in self.string_columns if c in at), None)
        return f"{listed}, e.g. {at[first]} in column {first!r}" if first else listed

    @property
    def by_name(self) -> bool:
        return bool(self.string_columns) or self.named

    def column_kinds(self) -> tuple[tuple[str, str], ...]:
        """(name, dtype) of each feature column when there is one value per named column:
        string for text, int64 for a TFRecord int64_list, float32 otherwise; else ()."""
        if self.fmt not in ("csv", "tfrecord") or len(self.feature_keys) != self.num_features:
            return ()
        text = set(self.string_columns)
        kinds = dict(zip(self.feature_keys, self.tfrecord_kinds)) if self.fmt == "tfrecord" else {}
        return tuple((k, "string" if k in text else "int64" if kinds.get(k) == "int64" else "float32")
                     for k in self.feature_keys)

    @property
    def num_features(self) -> int:
        return int(np.prod(self.feature_shape))


def _format_of(path: str) -> str:
    name = os.path.basename(path).lower()
    if name.endswith(".gz") and "idx" not in name:
        name = name[:-3]
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".tfrecord", ".tfrecords", ".tfr")):
        return "tfrecord"
    if name.endswith(".npz"):
        return "npz"
    if "idx3-ubyte" in name or "idx1-ubyte" in name:
        return "idx"
    raise ConfigError(f"{path}: unknown data format; use .csv, .tfrecord, .npz or MNIST idx files", "train_data")


#: ``train_data`` of the form ``@FILE`` names a file that lists the job's training files,
#: one path a line, in the order the workers shard them. Each worker then needs only its
#: own shard on its host: the Ansible role (``tfps_data_src``) copies each worker host just
#: the files its workers read and writes this list.
LIST_PREFIX = "@"


def shard_files(files, num_shards: int, shard_index: int) -> list[str]:
    """The files one worker reads of the job's sorted ``files``: the one sharding rule.

    With at least as many files as workers, worker i reads files i, i+n, i+2n...; with
    fewer, every worker reads every file (and then every n-th record of them).
    """
    files = list(files)
    return files[shard_index::num_shards] if len(files) >= num_shards else files


def companion_files(files) -> list[str]:
    """``files`` and what reading them also needs: the labels file of each MNIST images file."""
    out = []
    for f in files:
        out.append(f)
        if _format_of(f) == "idx":
            out.append(_idx_labels_path(f))
    return out


def _listed_files(list_file: str, field: str) -> list[str]:
    try:
        with open(list_file, encoding="utf-8") as fh:
            files = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    except OSError as e:
        raise ConfigError(f"cannot read the list of training files {list_file} ({e.strerror}); "
                          f"give {LIST_PREFIX}FILE with one data file a line", field) from None
    if not files:
        raise ConfigError(f"the list of training files {list_file} names no file", field)
    return sorted(files)


def find_files(pattern: str, field: str = "train_data", shard: tuple[int, int] | None = None) -> list[str]:
    """The sorted data files of ``pattern`` (a glob, or ``@FILE``, see LIST_PREFIX), checked.

    With a list and ``shard`` (num_shards, shard_index), only that worker's own files must
    be on this host; the whole list is returned, since the worker shards it.
    """
    if pattern.startswith(LIST_PREFIX):
        files = _listed_files(pattern[len(LIST_PREFIX):], field)
        present = shard_files(files, *shard) if shard else files
        for f in present:
            if not os.path.isfile(f):
                raise ConfigError(f"{f} is in the list {pattern[len(LIST_PREFIX):]} but not on this host; "
                                  "copy it there (the Ansible role does with tfps_data_src)", field)
    else:
        files = sorted(f for f in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(f))
        if os.path.isdir(pattern):
            raise ConfigError(f"{pattern!r} is a directory; give a glob such as {os.path.join(pattern, '*.csv')!r}",
                              field)
        if not files:
            raise ConfigError(f"no files match {pattern!r}; check the path (relative to {os.getcwd()}) and the glob",
                              field)
        present = files
    for f in present:
        if not os.access(f, os.R_OK):
            raise ConfigError(f"{f} is not readable by this user (uid {os.getuid()}); fix its permissions", field)
    if "idx" in {_format_of(f) for f in files}:
        files = [f for f in files if "idx1-ubyte" not in os.path.basename(f)]
    fmts = {_format_of(f) for f in files}
    if len(fmts) > 1:
        raise ConfigError(f"{pattern!r} matches files of several formats ({', '.join(sorted(fmts))}); use one", field)
    return files


def classes_of(labels: np.ndarray, where, num_classes: int | None) -> int:
    """The number of classes of ``labels``, or 0 for regression; bad labels are refused.

    Regression is chosen only by ``--num_classes 0``, never guessed from the labels. Class
    labels must be whole numbers from 0, below ``--num_classes`` when it is given; without
    it, at least two classes must occur and none may be skipped (``7`` among ``0..2`` is far
    more often a typo than five classes with no example). ``where(i)`` names label i's
    file and line.
    """
    if num_classes == 0 or labels.size == 0:
        return num_classes or 0
    bad = np.flatnonzero((labels < 0) | (np.mod(labels, 1) != 0))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"{where(i)}: label {labels[i]:g} is not a class number (0, 1, 2, ...); fix the "
                          "label, or pass --num_classes 0 to train a regression", "label_column")
    top = int(labels.max()) + 1
    if num_classes:
        if top > num_classes:
            i = int(np.argmax(labels))
            raise ConfigError(f"{where(i)}: label {labels[i]:g} is outside --num_classes {num_classes} (labels "
                              f"0..{num_classes - 1}); fix the label or raise --num_classes", "num_classes")
        return num_classes
    seen = np.unique(labels)
    if seen.size < 2:
        raise ConfigError(f"every label is {seen[0]:g}: a classifier needs examples of at least two classes; "
                          "fix the labels, or pass --num_classes 0 to train a regression", "label_column")
    if seen.size < top:
        missing = sorted(set(range(top)) - {int(v) for v in seen})
        i = int(np.argmax(labels))
        shown = ", ".join(str(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ConfigError(f"labels go up to {top - 1} ({where(i)}) but class(es) {shown} never occur; pass "
                          f"--num_classes {top} if that is right, or fix the labels", "num_classes")
    return top


def _load_npz(path: str, label_column: str, field: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path) as z:
            keys = list(z.keys())
            xk = next((k for k in ("x", "features") if k in z), None)
            yk = next((k for k in (label_column, "y", "label", "labels") if k in z), None)
            if xk is None or yk is None:
                raise ConfigError(f"{path} holds arrays {keys}; it needs 'x' (or 'features') and "
                                  f"'y' (or '{label_column}')", "label_column" if xk else field)
            x, y = z[xk].astype(np.float32), z[yk]
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not a readable .npz file ({e})", field) from None
    if len(x) == 0:
        raise ConfigError(f"{path} holds no examples", field)
    if len(x) != len(y):
        raise ConfigError(f"{path}: {len(x)} examples but {len(y)} labels", field)
    if x.ndim == 1:
        x = x[:, None]
    return x, y


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _idx_labels_path(images: str) -> str:
    d, b = os.path.split(images)
    cand = os.path.join(d, b.replace("images-idx3", "labels-idx1").replace("images.idx3", "labels.idx1"))
    if cand == images or not os.path.exists(cand):
        raise ConfigError(f"no labels file next to {images} (expected {cand})", "train_data")
    return cand


def load_idx(path: str) -> tuple[np.ndarray, np.ndarray]:
    def read(p: str) -> np.ndarray:
        with _open(p) as fh:
            data = fh.read()
        if len(data) < 8:
            raise ConfigError(f"{p} is too short to be an IDX file", "train_data")
        magic = struct.unpack(">I", data[:4])[0]
        ndim = magic & 0xFF
        if magic >> 8 != 0x08:
            raise ConfigError(f"{p} is not an unsigned-byte IDX file", "train_data")
        dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
        return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)

    x = read(path).astype(np.float32) / 255.0
    y = read(_idx_labels_path(path)).astype(np.int64)
    if x.ndim == 3:
        x = x[..., None]
    return x, y


class _Places:
    """Where each scanned label is, ``(file, "line 12")``, found when a message needs it:
    a file's numbers are kept as one int64 array. A tuple of strings per label (with the
    list of lines) took 185 B a CSV row, about 2 GB for 11.6 M rows, in every worker
    (bench/data_scan.py). TFRecord places stay a list: that scan stops at CSV_SCAN_ROWS
    records in all."""

    def __init__(self):
        self.starts: list[int] = []    # index of each part's first label
        self.parts: list[tuple] = []   # (file, word, numbers) or ("", "", [(file, place), ...])
        self.size = 0

    def add(self, file: str, word: str, numbers: np.ndarray) -> None:
        self.starts.append(self.size)
        self.parts.append((file, word, numbers))
        self.size += len(numbers)

    def extend(self, places: list[tuple[str, str]]) -> None:
        self.starts.append(self.size)
        self.parts.append(("", "", places))
        self.size += len(places)

    def __getitem__(self, i: int) -> tuple[str, str]:
        if not 0 <= i < self.size:
            raise IndexError(i)
        k = bisect.bisect_right(self.starts, i) - 1
        file, word, numbers = self.parts[k]
        at = numbers[i - self.starts[k]]
        return at if not word else (file, f"{word} {int(at)}")


def infer_schema(pattern: str, label_column: str = "label", num_classes: int | None = None,
                 field: str = "train_data", shard: tuple[int, int] | None = None,
                 text_columns=None, decided_by: str | None = None) -> Schema:
    """Validate the files behind ``pattern`` and infer their feature shape and classes.

    ``text_columns``: the CSV columns that are text, decided elsewhere (by the training
    data, named ``decided_by``, for the evaluation data); by default they are decided
    here, over the scanned rows of every file.

    ``pattern`` ``@FILE`` with ``shard`` (num_shards, shard_index): the schema comes from
    that worker's own files, the only ones on its host; ``Schema.files`` is the whole list.
    """
    every = find_files(pattern, field, shard)
    files = shard_files(every, *shard) if shard and pattern.startswith(LIST_PREFIX) else every
    fmt = _format_of(files[0])
    keys: tuple[str, ...] = ()
    labels: list[np.ndarray] = []
    where = _Places()   # (file, place) of each scanned label, for messages
    strings: set[str] = set()
    text_where: list[tuple[str, str]] = []
    n = 0
    if fmt == "csv":
        scans = []
        for f in files:
            scan = csvcheck.scan_csv(f, label_column, field, CSV_SCAN_ROWS)
            if scans and scan.header != scans[0].header:
                raise ConfigError(f"{f} has columns {scan.header}, {files[0]} has {scans[0].header}; all files "
                                  "must share one header", field)
            scans.append(scan)
        first_header = scans[0].header
        # The columns' types are decided over every scanned row of every file before any
        # value is judged: a column is text when any of its values is not a number (a hex id
        # such as 4e992287 reads as a float, infinite, but its column is text).
        if text_columns is None:
            strings = {c for scan in scans for c in scan.text_at}
        else:
            strings = set(text_columns)
        for f, scan in zip(files, scans):
            csvcheck.judge_csv(f, scan, strings, field, decided_by)
            labels.append(scan.labels)
            where.add(f, "line", scan.lines)
            n += scan.rows
        for c in sorted(strings & set(first_header), key=first_header.index):
            at = next(((f, scan.text_at[c]) for f, scan in zip(files, scans) if c in scan.text_at), None)
            if at:
                text_where.append((c, f"{csvcheck.shown(at[1][1])} at {at[0]}:{at[1][0]}"))
        keys = tuple(h for h in first_header if h != label_column)
        shape: tuple[int, ...] = (len(keys),)
        if not keys:
            raise ConfigError(f"{files[0]} has only the label column; it needs feature columns", field)
    elif fmt == "npz" or fmt == "idx":
        shape = None
        for f in files:
            x, y = _load_npz(f, label_column, field) if fmt == "npz" else load_idx(f)
            if shape is None:
                shape = tuple(x.shape[1:])
            elif tuple(x.shape[1:]) != shape:
                raise ConfigError(f"{f} has examples of shape {x.shape[1:]}, {files[0]} has {shape}", field)
            bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
            if bad.size:
                raise ConfigError(f"{f}: example {int(bad[0])} has a non-finite feature value; fix or remove it",
                                  field)
            labels.append(np.asarray(y, dtype=np.float64).reshape(len(y), -1)[:, 0])
            where.add(f, "example", np.arange(len(y)))
            n += len(x)
    else:
        keys, shape, kinds, strings, widths = tfrecordcheck.read_schema(files[0], label_column, field)
        strings = set(strings)
        scanned, records = tfrecordcheck.scan(files, label_column, keys, kinds, widths, field, CSV_SCAN_ROWS)
        where.extend(records)
        labels.append(scanned)
    all_labels = np.concatenate(labels) if labels else np.zeros(0)
    bad = np.flatnonzero(~np.isfinite(all_labels))
    if bad.size:
        f, place = where[int(bad[0])]
        raise ConfigError(f"{f}: {place} has a non-finite label; fix or remove it", field)
    classes = classes_of(all_labels, lambda i: f"{where[i][0]}:{where[i][1].removeprefix('line ')}"
                         if where[i][1].startswith("line ") else f"{where[i][0]} {where[i][1]}", num_classes)
    return Schema(fmt, tuple(every), tuple(int(s) for s in shape), classes, keys, n or None,
                  kinds if fmt == "tfrecord" else (), tuple(k for k in keys if k in strings),
                  text_where=tuple(text_where))


def match_eval(train: Schema, ev: Schema) -> Schema:
    """``ev`` (the evaluation data's schema) matched to the training columns by name.

    The evaluation data must have the training data's feature columns, in any order: they
    reach the model in the training order, each in the type the training data decided (the
    one decision: ``infer_schema(..., text_columns=train.string_columns)`` read ``ev``).
    A missing or an extra column is refused, naming it."""
    if ev.fmt != train.fmt or ev.fmt not in ("csv", "tfrecord"):
        return ev
    what = "columns" if ev.fmt == "csv" else "keys"
    missing = [k for k in train.feature_keys if k not in ev.feature_keys]
    extra = [k for k in ev.feature_keys if k not in train.feature_keys]
    if missing or extra:
        said = []
        if missing:
            said.append(f"lacks the training data's {what} {', '.join(map(repr, missing))}")
        if extra:
            said.append(f"has {what} the training data lacks: {', '.join(map(repr, extra))}")
        raise ConfigError(f"{ev.files[0]} {' and '.join(said)}; evaluation data needs the training data's feature "
                          f"{what} ({', '.join(train.feature_keys)}), by name, in any order", "eval_data")
    if ev.fmt == "tfrecord":
        return ev
    return dataclasses.replace(ev, feature_keys=train.feature_keys, string_columns=train.string_columns,
                               feature_shape=train.feature_shape)


# ----------------------------------------------------------------------------- tf.data
def plain_function(fn):
    """A tf.data function traced as written, without AutoGraph's rewrite of its source.

    tf.data converts every function it traces with AutoGraph (parse the source, transform
    it, compile it again): about 0.1 s of each task's start-up for the three functions of a
    CSV pipeline. These functions have no Python control flow over tensors, so the graph
    is the same without it.
    """
    import tensorflow as tf
    return tf.autograph.experimental.do_not_convert(fn)


def make_dataset(schema: Schema, label_column: str, batch_size: int, *, num_shards: int = 1,
                 shard_index: int = 0, train: bool = True, seed: int = 7, epochs: int | None = None):
    """A batched ``tf.data.Dataset`` of (features, labels) for one worker's shard.

    Each worker reads its own files when there are at least as many files as workers,
    otherwise its own records. Training data repeats and is shuffled; eval data is one pass.
    With ``epochs`` (``--epochs``) training data is read that many times, each pass in
    ``ceil(examples / batch_size)`` batches (the last one smaller), then ends.
    """
    import tensorflow as tf

    by_file = len(schema.files) >= num_shards
    files = shard_files(schema.files, num_shards, shard_index)
    label_dtype = tf.int64 if schema.num_classes else tf.float32

    if schema.fmt == "csv":
        # The file's own order of columns (an evaluation file may order them otherwise):
        # each column is decoded as the schema's decision says (text or number), and the
        # features are given in the schema's order (the training data's), by name.
        parse, nonblank = csv_parser(schema, label_column, files)

        lines = tf.data.Dataset.from_tensor_slices(files).interleave(
            plain_function(lambda f: tf.data.TextLineDataset(f).skip(1)), cycle_length=max(1, min(4, len(files))))
        if not by_file:
            lines = lines.shard(num_shards, shard_index)
        lines = lines.batch(1024)
        if train and _fits_in_memory(files, num_shards, by_file):
            # Decoded once, in batches of lines, then kept: later epochs parse nothing.
            ds = lines.map(plain_function(lambda b: parse(nonblank(b))), num_parallel_calls=tf.data.AUTOTUNE)
            ds = ds.unbatch().cache()
            return _shuffle_batch(ds, batch_size, train, seed + shard_index, epochs).prefetch(tf.data.AUTOTUNE)
        ds = _shuffle_batch(lines.map(nonblank).unbatch(), batch_size, train, seed + shard_index, epochs)
        return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    elif schema.fmt == "tfrecord":
        parse = tfrecord_parser(schema, label_column, files)
        ds = tf.data.TFRecordDataset(files)
        if not by_file:
            ds = ds.shard(num_shards, shard_index)
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        if train and _fits_in_memory(files, num_shards, by_file):
            ds = ds.cache()
    else:
        xs, ys = [], []
        for f in files:
            x, y = _load_npz(f, label_column, "train_data") if schema.fmt == "npz" else load_idx(f)
            xs.append(x)
            ys.append(np.asarray(y).reshape(len(y), -1)[:, 0])
        x, y = np.concatenate(xs), np.concatenate(ys)
        if not by_file:
            x, y = x[shard_index::num_shards], y[shard_index::num_shards]
        ds = tf.data.Dataset.from_tensor_slices((x.astype(np.float32), y.astype(label_dtype.as_numpy_dtype)))
    return _shuffle_batch(ds, batch_size, train, seed + shard_index, epochs).prefetch(tf.data.AUTOTUNE)



def csv_parser(schema: Schema, label_column: str, files: list[str]):
    """(parse, nonblank) of a CSV pipeline: a batch of lines -> (features, labels); the
    lines of a batch that are not blank."""
    import tensorflow as tf
    label_dtype = tf.int64 if schema.num_classes else tf.float32
    header = csvcheck.csv_header(files[0])
    keys = list(schema.feature_keys)
    strings = set(schema.string_columns)
    # A number column's empty cell is an error, never a silent 0.0 (the scan refuses it
    # with its line in the rows it reads; this catches the rest).
    defaults = [[""] if h in strings else tf.constant([], tf.float32) for h in header]

    @plain_function
    def parse(lines):
        # A whole batch of lines at once: one decode_csv per batch, not per example.
        by = dict(zip(header, tf.io.decode_csv(lines, record_defaults=defaults)))
        label = tf.cast(_finite(by[label_column], files), label_dtype)
        if strings:   # named columns, each in its own dtype
            return {k: by[k] if k in strings else _finite(by[k], files) for k in keys}, label
        x = tf.stack([by[k] for k in keys], axis=-1)
        return _finite(x, files), label

    @plain_function
    def nonblank(lines):
        # Blank lines are dropped a batch of lines at a time: one op per 1024 lines, where
        # a filter would call a function per line (half of a task's wait for its first batch).
        return tf.boolean_mask(lines, tf.strings.length(tf.strings.strip(lines)) > 0)

    return parse, nonblank


def tfrecord_parser(schema: Schema, label_column: str, files: list[str]):
    """One serialized tf.train.Example -> (features, label)."""
    import tensorflow as tf
    label_dtype = tf.int64 if schema.num_classes else tf.float32
    # Parse every key with the type it was written with (bytes, int64 or float list).
    kinds = schema.tfrecord_kinds or ("float",) * (len(schema.feature_keys) + 1)
    dtype = {"bytes": tf.string, "int64": tf.int64}
    label_spec = {label_column: tf.io.VarLenFeature(dtype.get(kinds[-1], tf.float32))}
    if schema.by_name:   # one value per key: a dict of columns, each in its own dtype
        spec = {k: tf.io.FixedLenFeature([], dtype.get(kind, tf.float32))
                for k, kind in zip(schema.feature_keys, kinds)}

        @plain_function
        def parse(record):
            ex = tf.io.parse_single_example(record, {**spec, **label_spec})
            label = tf.cast(_finite(tf.sparse.to_dense(ex.pop(label_column))[0], files), label_dtype)
            return {k: _finite(v, files) for k, v in ex.items()}, label
    else:
        spec = {k: tf.io.VarLenFeature(dtype.get(kind, tf.float32))
                for k, kind in zip(schema.feature_keys, kinds)}

        @plain_function
        def parse(record):
            ex = tf.io.parse_single_example(record, {**spec, **label_spec})
            x = tf.concat([tf.cast(tf.sparse.to_dense(ex[k]), tf.float32) for k in schema.feature_keys], axis=0)
            x.set_shape(schema.feature_shape)
            return _finite(x, files), tf.cast(_finite(tf.sparse.to_dense(ex[label_column])[0], files),
                                              label_dtype)
    return parse


def count_examples(schema: Schema, label_column: str, *, num_shards: int = 1, shard_index: int = 0) -> int:
    """The examples of one worker's shard of the training data, as :func:`make_dataset`
    reads them (the same files, records and blank lines dropped), without parsing them:
    a worker's pass over its data is ``ceil(examples / batch_size)`` steps (``--epochs``)."""
    import tensorflow as tf

    by_file = len(schema.files) >= num_shards
    files = shard_files(schema.files, num_shards, shard_index)
    if schema.fmt not in ("csv", "tfrecord"):
        total = 0
        for f in files:
            _, y = _load_npz(f, label_column, "train_data") if schema.fmt == "npz" else load_idx(f)
            total += len(y)
        return total if by_file else len(range(shard_index, total, num_shards))

    @plain_function
    def nonblank(lines):
        return tf.reduce_sum(tf.cast(tf.strings.length(tf.strings.strip(lines)) > 0, tf.int64))

    graph = tf.Graph()
    with graph.as_default():
        if schema.fmt == "csv":
            records = tf.data.Dataset.from_tensor_slices(files).interleave(
                plain_function(lambda f: tf.data.TextLineDataset(f).skip(1)),
                cycle_length=max(1, min(4, len(files))))
        else:
            records = tf.data.TFRecordDataset(files)
        if not by_file:
            records = records.shard(num_shards, shard_index)
        count = nonblank if schema.fmt == "csv" else plain_function(lambda b: tf.size(b, out_type=tf.int64))
        total = records.batch(4096).map(count).reduce(tf.constant(0, tf.int64), lambda a, n: a + n)
        with tf.compat.v1.Session(graph=graph) as sess:
            return int(sess.run(total))


def _finite(t, files: list[str]):
    """``t``, checked for NaN and infinity as it is read (once per batch of lines for CSV;
    the cached pipeline checks each example once). The scan before start checked the first
    CSV_SCAN_ROWS rows with their line numbers; this catches the rest."""
    import tensorflow as tf
    if not t.dtype.is_floating:
        return t   # integers cannot hold NaN
    shown = ", ".join(files[:3]) + (" ..." if len(files) > 3 else "")
    return tf.debugging.assert_all_finite(
        t, f"the training data holds a non-finite value (NaN or infinity) beyond the rows checked before "
           f"start, in {shown}; find it with grep -n -i -E 'nan|inf' and fix or remove that row")


def _fits_in_memory(files: list[str], num_shards: int, by_file: bool) -> bool:
    """Whether this shard's decoded examples may be kept in memory (``Dataset.cache()``).

    The size on disk bounds the decoded size from above for CSV (text is longer than
    float32) and roughly for TFRecord; a shard of records reads every file.
    """
    size = sum(os.path.getsize(f) for f in files)
    return (size if by_file else size / num_shards) <= CACHE_MAX_BYTES


def _shuffle_batch(ds, batch_size: int, train: bool, seed: int, epochs: int | None = None):
    """Training data repeats, shuffled, in full batches; evaluation data is one pass. With
    ``epochs``, training data is read that many times, each pass's last batch kept (smaller)."""
    if train and epochs:
        return ds.shuffle(2048, seed=seed, reshuffle_each_iteration=True).batch(batch_size).repeat(epochs)
    if train:
        return ds.shuffle(2048, seed=seed, reshuffle_each_iteration=True).repeat().batch(batch_size,
                                                                                       drop_remainder=True)
    return ds.batch(batch_size)
