"""Training and evaluation input: file discovery, schema inference and tf.data pipelines.

Schema inference (feature shape, number of classes) and validation are plain NumPy so
that ``tfps local`` can refuse bad data before it starts any process. Only
``make_dataset`` imports TensorFlow.

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

import csv
import dataclasses
import glob
import gzip
import math
import os
import re
import struct

import numpy as np

from tfps.errors import ConfigError

#: Rows scanned per CSV file to validate it and to infer the label type.
CSV_SCAN_ROWS = 200_000
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


@dataclasses.dataclass
class _CsvScan:
    """What the scan of one CSV file saw, before any value is judged: a column's type is
    decided over every scanned row (of every file) first, and only then are the values of
    the numeric columns judged (see :func:`_judge_csv`)."""
    header: list[str]
    labels: np.ndarray
    rows: int
    lines: list[int]
    #: per column: the first value that is not a number (line, value): such a column is text
    text_at: dict[str, tuple[int, str]]
    #: per column: the first number that is NaN or infinite (line, value)
    nonfinite_at: dict[str, tuple[int, str]]
    #: per column: the line of the first empty cell
    empty_at: dict[str, int]


#: A CSV line as TensorFlow's DecodeCSV reads it (RFC 4180 on one line): each field either
#: holds no quote, or is wholly quoted with inner quotes doubled.
_DECODABLE_LINE = re.compile(r'(?:"(?:[^"]|"")*"|[^",]*)(?:,(?:"(?:[^"]|"")*"|[^",]*))*')
#: Cells are read whatever their size (the csv module's default limit is 131,072 characters).
_CSV_FIELD_LIMIT = 2**31 - 1


def _csv_header(path: str) -> list[str]:
    """The column names of ``path``'s header row, a UTF-8 byte order mark dropped."""
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return [h.strip() for h in next(csv.reader(fh), [])]


def _scan_csv(path: str, label_column: str, field: str) -> _CsvScan:
    try:
        return _scan_csv_text(path, label_column, field)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not a text CSV file (byte {e.start} is not UTF-8); give --{field} "
                          "CSV, TFRecord, .npz or IDX files", field) from None
    except csv.Error as e:
        raise ConfigError(f"{path} is not a CSV file that can be read ({e}); fix the file", field) from None


def _check_header(path: str, header: list[str], field: str) -> None:
    """Every column has a name of its own: an empty name cannot be served by an export,
    and of two columns of one name only one would reach the model."""
    seen: dict[str, int] = {}
    for i, name in enumerate(header, start=1):
        if not name:
            raise ConfigError(f"{path}: column {i} of the header has no name; name every column", field)
        if name in seen:
            raise ConfigError(f"{path}: the header names two columns {name!r} (columns {seen[name]} and {i}); "
                              "give every column a name of its own", field)
        seen[name] = i


def _scan_csv_text(path: str, label_column: str, field: str) -> _CsvScan:
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    with open(path, newline="", encoding="utf-8-sig") as fh:   # utf-8-sig: a byte order mark is dropped
        raw = [""]   # the physical line of the row just read

        def physical(f):
            for line in f:
                raw[0] = line
                yield line

        reader = csv.reader(physical(fh))
        header = next(reader, None)
        if not header:
            raise ConfigError(f"{path} is empty; a CSV needs a header row and at least one data row", field)
        header = [h.strip() for h in header]
        _check_header(path, header, field)
        if label_column not in header:
            raise ConfigError(f"label column {label_column!r} is not in the header of {path} "
                              f"(columns: {', '.join(header)}); pass --label_column", "label_column")
        li = header.index(label_column)
        labels, lines, rows = [], [], 0
        text_at: dict[str, tuple[int, str]] = {}
        nonfinite_at: dict[str, tuple[int, str]] = {}
        empty_at: dict[str, int] = {}
        lineno = reader.line_num
        for row in reader:
            start, lineno = lineno + 1, reader.line_num
            if not row:
                continue
            if lineno != start:
                raise ConfigError(f"{path}:{start} has a quoted field that runs over {lineno - start + 1} lines; "
                                  "training reads one row a line: remove the line breaks inside quotes", field)
            if len(row) != len(header):
                raise ConfigError(f"{path}:{lineno} has {len(row)} columns, the header has {len(header)}; "
                                  "fix or remove that row", field)
            if rows < CSV_SCAN_ROWS:
                if '"' in raw[0] and not _DECODABLE_LINE.fullmatch(raw[0].rstrip("\r\n")):
                    raise ConfigError(f"{path}:{lineno} has a quote that is not RFC 4180 quoting (a field is "
                                      'either wholly quoted, "like ""this""", or holds no quote); fix that row',
                                      field)
                label = _number(row[li])
                if label is None:
                    raise ConfigError(f"{path}:{lineno}: the label {row[li].strip()!r} is not a number; labels must "
                                      "be numbers (class 0, 1, ... or a real value)", "label_column")
                for name, cell in zip(header, row):
                    if name in text_at:
                        continue   # a text column: its values are not judged
                    if not cell.strip():
                        empty_at.setdefault(name, lineno)
                        continue
                    v = _number(cell)
                    if v is None:
                        text_at[name] = (lineno, cell.strip())
                    elif not math.isfinite(v) and name not in nonfinite_at:
                        nonfinite_at[name] = (lineno, cell.strip())
                labels.append(label)
                lines.append(lineno)
            rows += 1
        if rows == 0:
            raise ConfigError(f"{path} has a header but no data rows", field)
    text_at.pop(label_column, None)
    return _CsvScan(header, np.asarray(labels), rows, lines, text_at, nonfinite_at, empty_at)


def _judge_csv(path: str, scan: _CsvScan, text: set[str], field: str, decided_by: str | None) -> None:
    """Refuse what ``scan`` saw in ``path``'s numeric columns (those not in ``text``): a value
    that is not a number (possible only when the types were decided elsewhere: by the
    training data, ``decided_by``), NaN or infinity, an empty cell. Text is never judged."""
    problems = []   # (line, kind, column, value): the first line's is refused
    for name in scan.header:
        if name in text:
            continue
        if name in scan.text_at:
            problems.append((*scan.text_at[name][:1], "text", name, scan.text_at[name][1]))
        if name in scan.nonfinite_at:
            problems.append((*scan.nonfinite_at[name][:1], "nonfinite", name, scan.nonfinite_at[name][1]))
        if name in scan.empty_at:
            problems.append((scan.empty_at[name], "empty", name, ""))
    if not problems:
        return
    line, kind, name, value = min(problems)
    if kind == "text":
        raise ConfigError(f"{path}:{line} has {_shown(value)} in column {name!r}, which is a number column in "
                          f"{decided_by}; the columns of both must hold the same kind of values", field)
    if kind == "nonfinite":
        raise ConfigError(f"{path}:{line} has a non-finite value ({value}) in column {name!r}; fix or remove "
                          "that row", field)
    raise ConfigError(f"{path}:{line} has an empty cell in the number column {name!r}; fill it in or remove "
                      "that row", field)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _shown(value: str, limit: int = 40) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


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


def _tfrecord_schema(path: str, label_column: str, field: str):
    from tfps.logs import tf_import_banner_dropped
    with tf_import_banner_dropped():   # the launcher's first import of TensorFlow, maybe
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


def _tfrecord_scan(files: list[str], label_column: str, keys: tuple[str, ...], kinds: tuple[str, ...],
                   widths: dict[str, int], field: str) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """The labels of the first CSV_SCAN_ROWS records (the number of classes needs all of
    them) and where each is, every scanned record checked against the first one: each
    feature present with as many values, one label, floats finite. Records are counted
    from 1 in each file."""
    import tensorflow as tf

    dtype = {"bytes": tf.string, "int64": tf.int64}
    names = [*keys, label_column]
    spec = {k: tf.io.VarLenFeature(dtype.get(kind, tf.float32)) for k, kind in zip(names, kinds)}
    parse = plain_function(lambda r: tf.io.parse_example(r, spec))
    labels: list[np.ndarray] = []
    where: list[tuple[str, str]] = []
    budget = CSV_SCAN_ROWS
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
                _tfrecord_find_mismatch(f, done, batch.numpy(), names, kinds, field)
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


def _tfrecord_find_mismatch(path: str, done: int, records, names: list[str], kinds: tuple[str, ...],
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
    where: list[tuple[str, str]] = []   # (file, place) of each scanned label, for messages
    strings: set[str] = set()
    text_where: list[tuple[str, str]] = []
    n = 0
    if fmt == "csv":
        scans = []
        for f in files:
            scan = _scan_csv(f, label_column, field)
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
            _judge_csv(f, scan, strings, field, decided_by)
            labels.append(scan.labels)
            where += [(f, f"line {n}") for n in scan.lines]
            n += scan.rows
        for c in sorted(strings & set(first_header), key=first_header.index):
            at = next(((f, scan.text_at[c]) for f, scan in zip(files, scans) if c in scan.text_at), None)
            if at:
                text_where.append((c, f"{_shown(at[1][1])} at {at[0]}:{at[1][0]}"))
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
            where += [(f, f"example {i}") for i in range(len(y))]
            n += len(x)
    else:
        keys, shape, kinds, strings, widths = _tfrecord_schema(files[0], label_column, field)
        strings = set(strings)
        scanned, where = _tfrecord_scan(files, label_column, keys, kinds, widths, field)
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
                 shard_index: int = 0, train: bool = True, seed: int = 7):
    """A batched ``tf.data.Dataset`` of (features, labels) for one worker's shard.

    Each worker reads its own files when there are at least as many files as workers,
    otherwise its own records. Training data repeats and is shuffled; eval data is one pass.
    """
    import tensorflow as tf

    by_file = len(schema.files) >= num_shards
    files = shard_files(schema.files, num_shards, shard_index)
    label_dtype = tf.int64 if schema.num_classes else tf.float32

    if schema.fmt == "csv":
        # The file's own order of columns (an evaluation file may order them otherwise):
        # each column is decoded as the schema's decision says (text or number), and the
        # features are given in the schema's order (the training data's), by name.
        header = _csv_header(files[0])
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

        lines = tf.data.Dataset.from_tensor_slices(files).interleave(
            plain_function(lambda f: tf.data.TextLineDataset(f).skip(1)), cycle_length=max(1, min(4, len(files))))
        if not by_file:
            lines = lines.shard(num_shards, shard_index)
        lines = lines.batch(1024)
        if train and _fits_in_memory(files, num_shards, by_file):
            # Decoded once, in batches of lines, then kept: later epochs parse nothing.
            ds = lines.map(plain_function(lambda b: parse(nonblank(b))), num_parallel_calls=tf.data.AUTOTUNE)
            ds = ds.unbatch().cache()
            return _shuffle_batch(ds, batch_size, train, seed + shard_index).prefetch(tf.data.AUTOTUNE)
        ds = _shuffle_batch(lines.map(nonblank).unbatch(), batch_size, train, seed + shard_index)
        return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    elif schema.fmt == "tfrecord":
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
    return _shuffle_batch(ds, batch_size, train, seed + shard_index).prefetch(tf.data.AUTOTUNE)


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


def _shuffle_batch(ds, batch_size: int, train: bool, seed: int):
    """Training data repeats, shuffled, in full batches; evaluation data is one pass."""
    if train:
        return ds.shuffle(2048, seed=seed, reshuffle_each_iteration=True).repeat().batch(batch_size,
                                                                                       drop_remainder=True)
    return ds.batch(batch_size)
