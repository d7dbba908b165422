"""The CSV pre-check: every CSV file scanned before any process starts, its columns' types
decided, and its bad rows refused with their file and line.

``tfps.data.dataset.infer_schema`` scans each file (:func:`scan_csv`), decides which columns are text
over every scanned row of every file, and only then judges the values of the number columns
(:func:`judge_csv`). Plain Python and NumPy: no TensorFlow.
"""

from __future__ import annotations

import array
import csv
import dataclasses
import math
import re

import numpy as np

from tfps.errors import ConfigError


@dataclasses.dataclass
class CsvScan:
    """What the scan of one CSV file saw, before any value is judged: a column's type is
    decided over every scanned row (of every file) first, and only then are the values of
    the numeric columns judged (see :func:`judge_csv`)."""
    header: list[str]
    labels: np.ndarray
    rows: int
    #: the line of each scanned label (int64: a list of ints took 36 B a row)
    lines: np.ndarray
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


def csv_header(path: str) -> list[str]:
    """The column names of ``path``'s header row, a UTF-8 byte order mark dropped."""
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return [h.strip() for h in next(csv.reader(fh), [])]


def scan_csv(path: str, label_column: str, field: str, scan_rows: int) -> CsvScan:
    try:
        return _scan_csv_text(path, label_column, field, scan_rows)
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


def _scan_csv_text(path: str, label_column: str, field: str, scan_rows: int) -> CsvScan:
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
        labels, lines, rows = array.array("d"), array.array("q"), 0
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
            if rows < scan_rows:
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
    return CsvScan(header, np.frombuffer(labels, dtype=np.float64).copy(), rows,
                   np.frombuffer(lines, dtype=np.int64).copy(), text_at, nonfinite_at, empty_at)


def judge_csv(path: str, scan: CsvScan, text: set[str], field: str, decided_by: str | None) -> None:
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
        raise ConfigError(f"{path}:{line} has {shown(value)} in column {name!r}, which is a number column in "
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


def shown(value: str, limit: int = 40) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")

