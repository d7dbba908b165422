"""The job's input as slices handed out in stream order: pure Python, no TensorFlow.

A *slice* is a file or a range of its rows. The chief numbers the slices of the job in
stream order (sorted path) and puts them on one queue on ps 0 (tfps.task.graph.slicequeue);
whichever worker asks next takes the next one. This module decides what the slices are:

* a finite ``--train_data``: every file cut into row ranges (:func:`plan_slices`);
* ``--follow``: the partitions that keep arriving under a glob (:class:`PartitionLister`),
  one slice per data file of a partition, each partition once it is complete.

It also keeps the slice manifest
(:class:`Manifest`) that a restarted followed job numbers its slices by.
Why and what the position guarantees: docs/explanation/continuous-training.md.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import struct

from tfps.errors import ConfigError

#: A directory partition is complete once it holds this marker (Spark, Hive, Hadoop).
SUCCESS = "_SUCCESS"
#: What a partition's data files may not start with: Hadoop's hidden and temporary names.
HIDDEN = ("_", ".")

@dataclasses.dataclass(frozen=True)
class Slice:
    """Rows [start, end) of ``path`` (data rows: a CSV's header is not counted), of ``partition``."""

    path: str
    start: int
    end: int
    partition: str = ""

    @property
    def rows(self) -> int:
        return self.end - self.start


# ----------------------------------------------------------------------- counting rows
def count_rows(path: str, fmt: str) -> int:
    """Data rows of one file as the slice reader reads them: CSV lines after the header,
    TFRecord records, npz examples."""
    if fmt == "csv":
        with open(path, "rb") as fh:
            lines = 0
            last = b"\n"
            for block in iter(lambda: fh.read(1 << 20), b""):
                lines += block.count(b"\n")
                last = block[-1:]
            if last != b"\n":
                lines += 1   # a last line without its newline
        return max(lines - 1, 0)
    if fmt == "tfrecord":
        n = 0
        with open(path, "rb") as fh:
            while True:
                head = fh.read(12)
                if len(head) < 12:
                    return n
                (length,) = struct.unpack("<Q", head[:8])
                fh.seek(length + 4, os.SEEK_CUR)
                n += 1
    if fmt == "npz":
        import numpy as np  # lazy: NumPy's import cost, in a module the CLI imports
        with np.load(path) as z:
            key = next(k for k in ("y", "label", "labels", *z.keys()) if k in z)
            return int(len(z[key]))
    raise ConfigError(f"{path}: the slice queue reads CSV, TFRecord and npz files; use --input_split static "
                      "for this format", "input_split")


def plan_slices(files, fmt: str, num_workers: int, batch_size: int) -> list[Slice]:
    """A finite ``--train_data`` as slices, in sorted path order: each file cut into row
    ranges of about ``total / (4 * workers)`` rows (at least one batch), so that every worker
    has several to take and a slow one takes fewer."""
    counts = [(f, count_rows(f, fmt)) for f in sorted(files)]
    total = sum(n for _, n in counts)
    size = max(batch_size, -(-total // max(4 * num_workers, 1)))
    out = []
    for f, n in counts:
        for start in range(0, n, size):
            out.append(Slice(f, start, min(start + size, n), f))
    return out


# ------------------------------------------------------------------------ partitions
def _is_glob(part: str) -> bool:
    return any(c in part for c in "*?[")


def matches(path: str, pattern: str) -> bool:
    """Whether ``path`` is matched by the glob ``pattern`` as glob matches it: ``*`` never
    crosses a ``/``."""
    a = os.path.normpath(os.path.abspath(os.path.expanduser(path))).split(os.sep)
    b = os.path.normpath(os.path.abspath(os.path.expanduser(pattern))).split(os.sep)
    return len(a) == len(b) and all(fnmatch.fnmatchcase(x, y) for x, y in zip(a, b))


def data_files(partition: str) -> list[str]:
    """The data files of a partition: the file itself, or a directory's files that are not
    hidden or temporary (``_SUCCESS``, ``.part-0.csv.crc``, ``_temporary``), sorted."""
    if not os.path.isdir(partition):
        return [partition]
    return sorted(os.path.join(partition, n) for n in os.listdir(partition)
                  if not n.startswith(HIDDEN) and os.path.isfile(os.path.join(partition, n)))


class PartitionLister:
    """The complete partitions under a glob, found incrementally and handed out once each,
    in sorted path order.

    A partition is a file or a directory the glob matches. A directory is complete once it
    holds ``_SUCCESS``; a file once it is there under its name, which it must reach by an
    atomic rename (written under a name the glob does not match, then renamed), and has kept
    its size for one poll (a file written in place under its final name is not read while
    it grows). Every ``poll`` stats the directories of the glob's levels and reads a
    directory again only when its modification time changed; a partition already handed
    out is never looked at again, so 10 000 past partitions cost no listing per poll.

    A partition that sorts before one already handed out arrived late: it is reported in
    ``late`` and not trained (the stream's order is the sorted path).
    """

    def __init__(self, pattern: str):
        self.pattern = os.path.normpath(os.path.abspath(os.path.expanduser(pattern)))
        parts = self.pattern.split(os.sep)
        first = next((i for i, p in enumerate(parts) if _is_glob(p)), len(parts) - 1)
        self.root = os.sep.join(parts[:first]) or os.sep
        self.levels = parts[first:]
        self.last: str | None = None                     # the newest partition handed out
        self._dirs: dict[str, tuple[int, list[str]]] = {}   # dir -> (mtime_ns, its names)
        self._sizes: dict[str, tuple[int, int]] = {}     # file -> (size, mtime_ns) at the last poll
        self.late: list[str] = []
        self._known: set[str] | None = None   # the partitions at or before ``last`` seen so far
        self.newest_complete: str | None = None

    def skip_to(self, last: str | None) -> None:
        """Resume after ``last`` (the newest partition a previous run listed)."""
        self.last = last

    def _names(self, directory: str) -> list[str]:
        try:
            mtime = os.stat(directory).st_mtime_ns
        except OSError:
            return []
        cached = self._dirs.get(directory)
        if cached and cached[0] == mtime:
            return cached[1]
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return []
        self._dirs[directory] = (mtime, names)
        return names

    def _candidates(self) -> list[str]:
        paths = [self.root]
        for depth, level in enumerate(self.levels):
            leaf = depth == len(self.levels) - 1
            found = []
            for d in paths:
                if not leaf and self.last is not None:
                    # a directory whose whole subtree sorts before the newest partition holds no new one
                    prefix = self.last.split(os.sep)[:len(d.split(os.sep))]
                    if d.split(os.sep) < prefix:
                        continue
                if _is_glob(level):
                    names = [n for n in self._names(d) if fnmatch.fnmatchcase(n, level) and not n.startswith(HIDDEN)]
                else:
                    names = [level] if os.path.exists(os.path.join(d, level)) else []
                for n in names:
                    p = os.path.join(d, n)
                    if leaf or os.path.isdir(p):
                        found.append(p)
            paths = found
        return sorted(paths)

    def _complete(self, path: str) -> bool:
        if os.path.isdir(path):
            return os.path.exists(os.path.join(path, SUCCESS))
        try:
            st = os.stat(path)
        except OSError:
            return False
        now = (st.st_size, st.st_mtime_ns)
        before = self._sizes.get(path)
        self._sizes[path] = now
        return before == now

    def poll(self) -> list[str]:
        """The partitions complete since the last poll, in order; each is returned once."""
        new = []
        first = self._known is None
        if first:
            self._known = set()
        blocked = False
        for p in self._candidates():
            if self.last is not None and p <= self.last:
                if p not in self._known:
                    self._known.add(p)
                    if not first and p not in new:
                        self.late.append(p)   # it appeared after a later partition was listed
                continue
            # Every pending file's size is recorded (by _complete), not only the first's: files
            # that landed together are complete together on the next poll, not one per poll.
            if not self._complete(p) or blocked:
                blocked = True   # the stream's order: nothing after a partition that is not complete yet
                continue
            new.append(p)
            self._known.add(p)
            self.last = p
            self._sizes.pop(p, None)
        if new:
            self.newest_complete = new[-1]
        return new


def check_until(until: str, pattern: str) -> str:
    """``--until``: a partition the glob matches, as an absolute path."""
    if not matches(until, pattern):
        raise ConfigError(f"{until!r} is not matched by --train_data {pattern!r}; name one partition of the "
                          "stream, such as the glob with its wildcards filled in", "until")
    return os.path.normpath(os.path.abspath(os.path.expanduser(until)))


def first_complete(pattern: str) -> list[str]:
    """The data files of the first complete partition (the followed job's schema is read
    from it); refused when none is complete yet."""
    lister = PartitionLister(pattern)
    lister.poll()   # a file partition is complete once seen unchanged on a second poll
    for p in lister._candidates():
        if os.path.isdir(p) and not os.path.exists(os.path.join(p, SUCCESS)):
            continue
        files = data_files(p)
        if files:
            return files
    raise ConfigError(f"--follow: no complete partition matches {pattern!r} yet (a directory needs {SUCCESS}); "
                      "the job reads its columns from the first one: start it once one has landed", "train_data")


class Manifest:
    """``model_dir/stream.jsonl``: every slice of a followed job by its number, written
    before the slice is queued, so that a restarted job gives each slice the same number
    (the checkpointed position counts slices) and lists only partitions after the last."""

    NAME = "stream.jsonl"

    def __init__(self, model_dir: str):
        self.path = os.path.join(model_dir, self.NAME)
        self.slices: list[Slice] = []
        self.partitions: list[str] = []
        self.skipped: list[dict] = []
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue   # a line cut by a kill: its partition is listed again
                    if "skipped" in rec:
                        self.skipped.append(rec)
                        self.partitions.append(rec["skipped"])
                        continue
                    self.partitions.append(rec["partition"])
                    self.slices.extend(Slice(p, a, b, rec["partition"]) for p, a, b in rec["slices"])

    @property
    def last(self) -> str | None:
        return self.partitions[-1] if self.partitions else None

    def add(self, partition: str, slices: list[Slice]) -> None:
        self._write({"partition": partition, "slices": [[s.path, s.start, s.end] for s in slices]})
        self.partitions.append(partition)
        self.slices.extend(slices)

    def skip(self, partition: str, why: str) -> None:
        rec = {"skipped": partition, "why": why}
        self._write(rec)
        self.partitions.append(partition)
        self.skipped.append(rec)

    def _write(self, rec: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
