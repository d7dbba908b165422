"""A followed stream (``--follow``) under ``tfps local --ps 2 --workers 2``, with partitions
written while the job runs.

Rows are counted through the model: ``tfps_stream/examples`` (every step adds its batch's
examples, in the checkpoint) and the done marks of the slices (``tfps_stream/marks``). Each
partition here is one file of ROWS rows, one slice.

The continuous-training tutorial (docs/tutorials/continuous-training.md) is walked here too,
every command as the page gives it, by the walk that writes its output blocks
(docs/gen_outputs.py ``walk_stream``).

Cost (2 cores, shared): the followed job with a frozen worker about 45 s; the kill, stop
and rerun job about 90 s (three starts); the malformed partition job about 20 s; the
tutorial about 90 s (1 ps + 2 workers, two starts, 30000 rows).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import docblocks
import numpy as np
import pytest
from integration_helpers import _cmdline, _stat, base_env, poll, read_results, run_flags

pytestmark = pytest.mark.integration

ROWS, BATCH = 48, 16


def write_partition(root: Path, name: str, seed: int, success: bool = True, bad_line: int | None = None,
                    pause: float = 0.0) -> int:
    """``root/name/part-0.csv`` (ROWS rows), then ``_SUCCESS``; the file is written in two
    halves ``pause`` seconds apart (half-written while the job lists). Returns its rows."""
    d = root / name
    d.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, 3))
    lines = [f"{a:.4f},{b:.4f},{c:.4f},{int(a + b > 0)}\n" for a, b, c in x]
    if bad_line is not None:
        lines[bad_line - 2] = "0.1,oops,0.3,1\n"   # file line bad_line (the header is line 1)
    with open(d / "part-0.csv", "w") as fh:
        fh.write("a,b,c,label\n" + "".join(lines[:ROWS // 2]))
        fh.flush()
        time.sleep(pause)
        fh.write("".join(lines[ROWS // 2:]))
    if success:
        (d / "_SUCCESS").touch()
    return ROWS


def tasks(launcher_pid: int) -> dict[str, int]:
    found = {}
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        st = _stat(pid)
        if st and st[1] == launcher_pid:
            cmd = _cmdline(pid)
            for job in ("ps", "worker"):
                for i in range(2):
                    if f"--job_name={job} --task_index={i}" in cmd:
                        found[f"{job}{i}"] = pid
    return found


def stream_state(model_dir: Path) -> tuple[int, set[int], int]:
    """(examples, the slices done, position) of the newest checkpoint. The position is read
    from the done marks, as a restored job reads it (the saved variable may lag them)."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(model_dir))
    marks = reader.get_tensor("tfps_stream/marks")
    done = {int(m) - 1 for m in marks if m > 0}
    position = int(reader.get_tensor("tfps_stream/position"))
    assert all(k in done for k in range(position))   # the saved position never runs ahead of the marks
    while position in done:
        position += 1
    return int(reader.get_tensor("tfps_stream/examples")), done, position


def manifest(model_dir: Path) -> list[dict]:
    import json
    path = model_dir / "stream.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def flags(model_dir: Path, stream: Path, *extra: str) -> list[str]:
    return ["--ps", "2", "--workers", "2", *run_flags(model_dir, "--train_data", f"{stream}/dt=*",
                                                      "--follow", "--batch_size", BATCH, *extra)]


def test_a_followed_stream_trains_each_complete_partition_once_and_a_frozen_worker_takes_fewer(procs, tmp_path):
    stream, model = tmp_path / "stream", tmp_path / "model"
    good = write_partition(stream, "dt=00", 0)
    launcher = procs.tfps("follow", "local", *flags(model, stream, "--follow_idle", "10s", "--sync_timeout", "6",
                                                    "--skip_bad_partitions"))
    poll(lambda: manifest(model), 240, "the first partition listed", launcher)   # the chief's feeder runs
    pids = tasks(launcher.pid)
    written = []

    def writer():
        for i in range(1, 8):
            time.sleep(1.0)
            if i == 3:   # a malformed row: skipped whole (--skip_bad_partitions)
                write_partition(stream, f"dt={i:02d}", i, bad_line=7)
            else:
                written.append(write_partition(stream, f"dt={i:02d}", i, pause=1.5 if i == 5 else 0.0))
        write_partition(stream, "dt=99", 99, success=False)   # never complete: never read

    thread = threading.Thread(target=writer)
    thread.start()
    # worker1 freezes once a few partitions are listed: the other worker takes the rest
    poll(lambda: len(manifest(model)) >= 3, 60, "three partitions listed", launcher)
    os.kill(pids["worker1"], signal.SIGSTOP)
    try:
        thread.join()
        # the job ends without it (its results are written while it is still frozen)
        poll(lambda: (model / "results.json").exists(), 180, "the job's results", launcher)
    finally:
        os.kill(pids["worker1"], signal.SIGCONT)
    assert launcher.wait(120) == 0, launcher.tail()
    good += sum(written)
    res = read_results(model)
    assert res["status"] == "succeeded" and res["ended_by"] == "follow_idle", res.get("error")
    s = res["stream"]
    assert s["position"] == 7 and s["partition"].endswith("dt=07") and s["behind"] == 0, s   # 8 listed, 1 skipped
    assert [p["partition"] for p in s["skipped"]] == [f"{stream}/dt=03"]
    assert "part-0.csv:7" in s["skipped"][0]["error"], s["skipped"]
    examples, done, _ = stream_state(model)
    # every row of every complete, well-formed partition once; a requeued slice of the frozen
    # worker may have been partly trained by it first
    assert good <= examples <= good + ROWS * len(s.get("requeued", [])), (examples, good, s)
    assert done >= set(range(7))
    by = s["slices_by_worker"]
    assert by["worker0"] > by["worker1"], by
    listed = [r.get("partition") or r.get("skipped") for r in manifest(model)]
    assert listed == sorted(listed) and f"{stream}/dt=99" not in listed
    out = launcher.output()
    assert "newest complete" in out and "behind" in out


def test_kill_the_chief_then_stop_then_rerun_resume_after_the_checkpoint(procs, tmp_path):
    stream, model = tmp_path / "stream", tmp_path / "model"
    rows = {0: write_partition(stream, "dt=00", 0)}
    argv = flags(model, stream, "--until", f"{stream}/dt=05", "--checkpoint_steps", "3")

    def add(i: int) -> None:
        rows[i] = write_partition(stream, f"dt={i:02d}", i)

    # 1. kill -9 the chief mid-stream
    first = procs.tfps("follow-1", "local", *argv)
    poll(lambda: manifest(model), 240, "the first partition listed", first)
    add(1)
    add(2)
    poll(lambda: len(manifest(model)) >= 3 and os.path.exists(model / "checkpoint"), 60, "3 partitions", first)
    time.sleep(1.0)
    os.kill(tasks(first.pid)["worker0"], signal.SIGKILL)
    assert first.wait(120) != 0
    e1, done1, p1 = stream_state(model)

    # 2. the same command again: it resumes after the checkpointed position; then a stop
    second = procs.tfps("follow-2", "local", *argv)
    second.wait_for(r"restored checkpoint of step", 240)
    add(3)
    poll(lambda: len(manifest(model)) >= 4, 60, "4 partitions", second)
    time.sleep(1.0)
    second.signal(signal.SIGINT)
    assert second.wait(120) not in (0, None), second.tail()
    assert read_results(model)["status"] == "stopped"
    e2, done2, p2 = stream_state(model)
    assert p2 >= p1 and done2 >= done1
    listed = {k: r for k, r in enumerate(r for r in manifest(model) if "partition" in r)}
    # nothing done at the kill's checkpoint was trained again; what was not done, was (some
    # slices may have been in flight at the stop: counted, not marked)
    newly = sum(rows[k] for k in done2 - done1)
    assert newly <= e2 - e1 <= newly + 2 * 2 * ROWS, (e1, e2, done1, done2)

    # 3. and again: it trains to --until dt=05 and succeeds; dt=06 comes after it
    third = procs.tfps("follow-3", "local", *argv)
    add(4)
    add(5)
    add(6)
    assert third.wait(240) == 0, third.tail()
    res = read_results(model)
    assert res["status"] == "succeeded" and res["ended_by"] == "until", res.get("error")
    e3, done3, p3 = stream_state(model)
    assert p3 == 6 and done3 >= set(range(6)) and 6 not in done3
    # exact: every slice not done at the stop's checkpoint once, none done there again
    assert e3 - e2 == sum(rows[k] for k in range(6) if k not in done2), (e2, e3, done2)
    assert len(listed) >= 4


def test_a_malformed_partition_stops_the_job_with_its_path_and_line(procs, tmp_path):
    stream, model = tmp_path / "stream", tmp_path / "model"
    write_partition(stream, "dt=00", 0)
    launcher = procs.tfps("follow-bad", "local", "--ps", "1", "--workers", "1",
                          *run_flags(model, "--train_data", f"{stream}/dt=*", "--follow", "--batch_size", BATCH))
    poll(lambda: manifest(model), 240, "the first partition listed", launcher)
    write_partition(stream, "dt=01", 1, bad_line=9)
    write_partition(stream, "dt=02", 2)
    rc = launcher.wait(120)
    assert rc not in (0, 2), launcher.tail()
    res = read_results(model)
    assert res["status"] == "failed"
    assert f"{stream}/dt=01/part-0.csv:9" in res["error"]["message"], res["error"]
    examples, done, position = stream_state(model)
    assert examples == ROWS and done == {0} and position == 1   # dt=00 only: nothing of dt=01 or after it


def _shape(line: str) -> str:
    """A line's words, its numbers, paths and times left out: what stays from run to run."""
    return re.sub(r"\S*/\S*|-?\d[\d.,e+:-]*", "_", line).strip()


def test_the_continuous_training_tutorial_runs_as_written(tmp_path):
    """Every command of docs/tutorials/continuous-training.md, as the page gives it, at its own
    scale (30000 rows in 6 partitions; one TF thread a task and smaller tables after the page's
    flags): the job follows the stream, takes a partition landed while it runs, stops on
    Ctrl-C with the stream's position in its checkpoint, resumes with --until and ends by
    itself; and the page's output blocks are what such a walk prints."""
    sys.path.insert(0, str(docblocks.DOCS))
    import gen_outputs
    walk = gen_outputs.walk_stream(tmp_path, base_env(), timeout=300,
                                   extra=("--tf_threads", "1", "--log_steps", "20", "--hash_buckets", "65536"))
    hour = f"{tmp_path}/stream/dt=2026-12-07/hour="
    # Step 2, stopped by Ctrl-C: hours 00 to 02 trained, 03 listed (landed by step 3 while it ran).
    assert walk.stopped_rc == 130, walk.stopped[-3000:]
    first = walk.stopped_results
    assert first["status"] == "stopped" and first["stream"]["position"] >= 3, first.get("stream")
    assert first["stream"]["newest"] == hour + "03", first["stream"]
    # Step 4: the same model_dir goes on after the checkpointed position and ends by --until.
    assert walk.resumed_rc == 0, walk.resumed[-3000:]
    assert "restored checkpoint of step" in walk.resumed and "the stream resumes after slice" in walk.resumed
    res = walk.results
    assert res["status"] == "succeeded" and res["ended_by"] == "until", res.get("error")
    s = res["stream"]
    assert s["partition"] == hour + "05" and s["behind"] == 0 and s["position"] == 6, s
    # every row once; the slice in flight at the stop (hour 03, 5000 rows) may have trained twice
    assert 30000 <= s["examples"] <= 35000, s
    # progressive validation: the resumed window (hours 04 and 05), scored before training
    assert res["progressive"]["examples"] >= 10000 and res["progressive"]["auc"] > 0.6, res["progressive"]
    assert (tmp_path / "runs" / "stream" / "export" / "saved_model.pb").is_file()
    # Step 5 printed the outcome.
    assert walk.read.splitlines()[0] == "succeeded until", walk.read
    # The page shows what this walk printed: the same lines, numbers, paths and times aside.
    for key in ("continuous-training-chief", "continuous-training", "continuous-training-results"):
        out = gen_outputs.OUTPUTS[key]
        page = gen_outputs.blocks(out.page)[key]
        printed = out.keep(walk)
        assert [_shape(x) for x in page.splitlines()] == [_shape(x) for x in printed.splitlines()], \
            f"{key} changed: run python docs/gen_outputs.py --only {key}\n{printed}"
