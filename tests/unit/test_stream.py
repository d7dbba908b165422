"""The followed input's pure parts: durations, the partition lister, slices, the manifest, the marks."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from tfps.config import RunConfig
from tfps.config.durations import parse_duration
from tfps.data import stream
from tfps.errors import ConfigError
from tfps.task.graph import slicequeue


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400), ("45", 45),
                                           (" 1.5m ", 90), (30, 30)])
def test_durations_read_as_seconds(text, seconds):
    assert parse_duration(text, "follow_idle") == seconds


@pytest.mark.parametrize("text", ["10 minutes", "m", "1w", "-5m", ""])
def test_a_bad_duration_is_one_line_naming_the_field(text):
    with pytest.raises(ConfigError) as e:
        RunConfig(train_data="s/*.csv", follow=True, follow_idle=text).validate()
    assert e.value.field == "follow_idle" and "90s, 10m or 2h" in str(e.value)


def test_the_stall_timeout_reads_durations():
    assert RunConfig(stall_timeout="10m").validate().stall_timeout == 600


@pytest.mark.parametrize("given, field", [
    (dict(follow=True), "follow"),
    (dict(train_data="@list.txt", follow=True), "follow"),
    (dict(train_data="s/*.csv", follow=True, sync_replicas=True), "follow"),
    (dict(train_data="s/*.csv", follow=True, epochs=2), "follow"),
    (dict(train_data="s/*.csv", until="s/a.csv"), "until"),
    (dict(train_data="s/*.csv", follow_idle="1m"), "follow_idle"),
    (dict(train_data="s/dt=*/hour=*", follow=True, until="s/dt=1"), "until"),
    (dict(train_data="s/*.csv", input_split="queue", sync_replicas=True), "input_split"),
    (dict(train_data="s/*.csv", input_split="halves"), "input_split"),
])
def test_stream_options_that_do_not_go_together_are_refused(given, field):
    with pytest.raises(ConfigError) as e:
        RunConfig(**given).validate()
    assert e.value.field == field


def test_a_followed_job_ignores_train_steps_and_until_names_a_partition(tmp_path):
    cfg = RunConfig(train_data=f"{tmp_path}/dt=*/hour=*", follow=True, train_steps=10,
                    until=f"{tmp_path}/dt=2/hour=03").validate()
    assert cfg.train_steps > 10**15


def _csv(path, rows, header="a,b,label"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(header + "\n" + "".join(f"{i},{i},{i % 2}\n" for i in range(rows)))


def test_directory_partitions_count_once_they_hold_success_in_order_each_once(tmp_path):
    lister = stream.PartitionLister(f"{tmp_path}/dt=*/hour=*")
    _csv(f"{tmp_path}/dt=1/hour=01/part-0.csv", 3)
    assert lister.poll() == []   # no _SUCCESS yet: not read
    open(f"{tmp_path}/dt=1/hour=01/_SUCCESS", "w").close()
    _csv(f"{tmp_path}/dt=1/hour=02/part-0.csv", 3)
    open(f"{tmp_path}/dt=1/hour=02/_SUCCESS", "w").close()
    assert lister.poll() == [f"{tmp_path}/dt=1/hour=01", f"{tmp_path}/dt=1/hour=02"]
    assert lister.poll() == []   # each once
    _csv(f"{tmp_path}/dt=2/hour=01/part-0.csv", 3)
    _csv(f"{tmp_path}/dt=2/hour=02/part-0.csv", 3)
    open(f"{tmp_path}/dt=2/hour=02/_SUCCESS", "w").close()
    assert lister.poll() == []   # the stream waits for hour 01, the next in order
    open(f"{tmp_path}/dt=2/hour=01/_SUCCESS", "w").close()
    assert lister.poll() == [f"{tmp_path}/dt=2/hour=01", f"{tmp_path}/dt=2/hour=02"]
    assert stream.data_files(f"{tmp_path}/dt=2/hour=01") == [f"{tmp_path}/dt=2/hour=01/part-0.csv"]


def test_a_file_counts_once_renamed_into_the_glob_and_unchanged_for_a_poll(tmp_path):
    lister = stream.PartitionLister(f"{tmp_path}/part-*.csv")
    _csv(f"{tmp_path}/.part-0001.csv.tmp", 5)   # being written: a name the glob does not match
    assert lister.poll() == []
    os.rename(f"{tmp_path}/.part-0001.csv.tmp", f"{tmp_path}/part-0001.csv")
    assert lister.poll() == []   # seen once: complete when unchanged on the next poll
    assert lister.poll() == [f"{tmp_path}/part-0001.csv"]
    with open(f"{tmp_path}/part-0002.csv", "w") as fh:   # written in place: growing
        fh.write("a,b,label\n")
        fh.flush()
        assert lister.poll() == []
        fh.write("1,1,1\n")
        fh.flush()
        assert lister.poll() == []
    assert lister.poll() == [f"{tmp_path}/part-0002.csv"]


def test_files_that_land_together_are_listed_together(tmp_path):
    """A stream landing faster than the chief polls is listed a poll after it landed, whole:
    before, the lister took one new file partition per poll (the stream bench's partitions,
    2.3 a second, fell 100 s behind)."""
    lister = stream.PartitionLister(f"{tmp_path}/part-*.csv")
    names = [f"{tmp_path}/part-{i:04d}.csv" for i in range(5)]
    for name in names:
        _csv(name, 3)
    assert lister.poll() == []   # each seen once
    assert lister.poll() == names
    _csv(f"{tmp_path}/part-0006.csv", 3)
    _csv(f"{tmp_path}/part-0005.csv.partial", 3)   # not matched: does not hold the stream
    assert lister.poll() == []
    assert lister.poll() == [f"{tmp_path}/part-0006.csv"]


def test_a_late_partition_is_reported_not_trained(tmp_path):
    lister = stream.PartitionLister(f"{tmp_path}/dt=*")
    for d in ("dt=1", "dt=3"):
        _csv(f"{tmp_path}/{d}/part-0.csv", 2)
        open(f"{tmp_path}/{d}/_SUCCESS", "w").close()
    assert lister.poll() == [f"{tmp_path}/dt=1", f"{tmp_path}/dt=3"]
    _csv(f"{tmp_path}/dt=2/part-0.csv", 2)
    open(f"{tmp_path}/dt=2/_SUCCESS", "w").close()
    assert lister.poll() == [] and lister.late == [f"{tmp_path}/dt=2"]


def test_a_poll_reads_no_directory_again_that_did_not_change(tmp_path, monkeypatch):
    for day in range(20):
        for hour in range(5):
            d = f"{tmp_path}/dt={day:02d}/hour={hour:02d}"
            _csv(f"{d}/part-0.csv", 1)
            open(f"{d}/_SUCCESS", "w").close()
    lister = stream.PartitionLister(f"{tmp_path}/dt=*/hour=*")
    assert len(lister.poll()) == 100
    listed = []
    real = os.listdir
    monkeypatch.setattr(stream.os, "listdir", lambda p: listed.append(p) or real(p))
    assert lister.poll() == []
    assert listed == []   # no directory changed: none is read again
    d = f"{tmp_path}/dt=19/hour=05"
    _csv(f"{d}/part-0.csv", 1)
    open(f"{d}/_SUCCESS", "w").close()
    assert lister.poll() == [d]
    assert listed == [f"{tmp_path}/dt=19"]   # only the day that changed


def test_resuming_after_the_manifest_lists_only_later_partitions(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    m = stream.Manifest(str(model))
    m.add(f"{tmp_path}/dt=1", [stream.Slice(f"{tmp_path}/dt=1/p.csv", 0, 4, f"{tmp_path}/dt=1")])
    m.skip(f"{tmp_path}/dt=2", "bad row")
    again = stream.Manifest(str(model))
    assert again.last == f"{tmp_path}/dt=2" and len(again.slices) == 1 and again.skipped[0]["why"] == "bad row"
    assert again.slices[0] == stream.Slice(f"{tmp_path}/dt=1/p.csv", 0, 4, f"{tmp_path}/dt=1")


def test_until_must_be_matched_by_the_glob(tmp_path):
    assert stream.check_until(f"{tmp_path}/dt=1/hour=02", f"{tmp_path}/dt=*/hour=*") == f"{tmp_path}/dt=1/hour=02"
    with pytest.raises(ConfigError, match="is not matched by --train_data"):
        stream.check_until(f"{tmp_path}/dt=1", f"{tmp_path}/dt=*/hour=*")


def test_rows_are_counted_in_each_format(tmp_path):
    _csv(f"{tmp_path}/a.csv", 7)
    with open(f"{tmp_path}/b.csv", "w") as fh:
        fh.write("a,label\n1,0\n2,1")   # no newline at the end
    rec = tmp_path / "c.tfrecord"
    with open(rec, "wb") as fh:
        for payload in (b"abc", b"", b"defgh"):
            fh.write(struct.pack("<Q", len(payload)) + b"\0" * 4 + payload + b"\0" * 4)
    np.savez(tmp_path / "d.npz", x=np.zeros((9, 2)), y=np.zeros(9))
    assert stream.count_rows(f"{tmp_path}/a.csv", "csv") == 7
    assert stream.count_rows(f"{tmp_path}/b.csv", "csv") == 2
    assert stream.count_rows(str(rec), "tfrecord") == 3
    assert stream.count_rows(f"{tmp_path}/d.npz", "npz") == 9


def test_a_finite_input_is_cut_into_ordered_row_ranges_that_cover_every_row_once(tmp_path):
    _csv(f"{tmp_path}/b.csv", 50)
    _csv(f"{tmp_path}/a.csv", 101)
    slices = stream.plan_slices([f"{tmp_path}/b.csv", f"{tmp_path}/a.csv"], "csv", num_workers=2, batch_size=8)
    assert [s.path for s in slices] == sorted(s.path for s in slices)
    for f, n in ((f"{tmp_path}/a.csv", 101), (f"{tmp_path}/b.csv", 50)):
        rows = [r for s in slices if s.path == f for r in range(s.start, s.end)]
        assert rows == list(range(n))
    assert len(slices) >= 8


def test_the_position_moves_over_done_marks_only():
    marks = np.zeros(slicequeue.RING, np.int64)
    for k in (0, 1, 3):
        marks[k % slicequeue.RING] = k + 1
    assert slicequeue.advance(0, marks, 10) == 2
    marks[2] = 3
    assert slicequeue.advance(2, marks, 10) == 4
    assert slicequeue.advance(0, marks, 3) == 3   # never past what is listed
    # a slice one ring later reuses the cell: its mark is higher, and the earlier slice stays done
    marks[5 % slicequeue.RING] = 5 + slicequeue.RING + 1
    assert slicequeue.done(marks, 5) and not slicequeue.done(marks, 5 + 2 * slicequeue.RING)


def test_a_claim_names_its_worker_only_for_its_own_slice():
    claims = np.zeros(slicequeue.RING, np.int64)
    claims[7] = 7 * slicequeue.CLAIM_BASE + 2   # worker 1 took slice 7
    assert slicequeue.claimed_by(claims, 7) == 1
    assert slicequeue.claimed_by(claims, 7 + slicequeue.RING) is None
    assert slicequeue.claimed_by(claims, 8) is None
