"""docker compose follows a stream (issue 48 item 5): partitions land in a directory of this
machine while the job runs, and every container reads it read-only through ``--data_dir``.

One partition is there when the job starts (its columns are the job's); three more are
written while it trains, each file in two halves with a pause (half-written while the chief
lists) and complete once its ``_SUCCESS`` is there. ``--until`` the last one ends the job
succeeded, every row trained once: the examples counted through the model
(``tfps_stream/examples``, results.json's ``stream``) are the rows written. The stream's
mount is read-only in every task container.

Cost (2 cores, shared): 1 ps + 1 worker, 12 steps of 16 examples. Measured 2026-12-08 at load
25-50 (other engineers' jobs): 397 s, of which 304 s until the chief's first step (TensorFlow
starting in two containers on an overloaded machine) and 35 s from it to the job's end.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from composejob import CHIEF, MODEL_DIR, ComposeJob
from test_compose import exit_codes, generate

pytestmark = pytest.mark.system

ROWS, BATCH, PARTITIONS = 48, 16, 4


def write_partition(root, name: str, seed: int, pause: float = 0.0) -> None:
    """``root/name/part-0.csv`` (ROWS rows) written in two halves ``pause`` s apart, then ``_SUCCESS``."""
    d = root / name
    d.mkdir(mode=0o755)
    x = np.random.default_rng(seed).normal(size=(ROWS, 3))
    lines = [f"{a:.4f},{b:.4f},{c:.4f},{int(a + b > 0)}\n" for a, b, c in x]
    with open(d / "part-0.csv", "w") as fh:
        fh.write("a,b,c,label\n" + "".join(lines[:ROWS // 2]))
        fh.flush()
        time.sleep(pause)
        fh.write("".join(lines[ROWS // 2:]))
    os.chmod(d / "part-0.csv", 0o644)
    (d / "_SUCCESS").touch(mode=0o644)


@pytest.fixture
def follow_job(docker_client, compose_cli, tfps_image, tmp_path):
    stream = tmp_path / "stream"
    stream.mkdir()
    stream.chmod(0o755)   # the image's user (uid 10001) reads it
    write_partition(stream, "dt=00", 0)
    generate(tmp_path / "job", "--ps", "1", "--workers", "1", "--data_dir", str(stream),
             "--train_data", "/input/dt=*", "--follow", "--until", f"/input/dt={PARTITIONS - 1:02d}",
             "--batch_size", str(BATCH), "--tf_threads", "1", "--log_steps", "2", "--stall_timeout", "0",
             image=tfps_image)
    job = ComposeJob(docker_client, tmp_path / "job", "docker-compose.yml")
    yield job, stream
    job.down()
    assert job.containers() == [], f"{job.project}: containers left after down"


def test_a_compose_job_follows_a_read_only_stream_written_while_it_runs(follow_job):
    job, stream = follow_job
    job.start()
    end = time.monotonic() + 900   # a loaded machine: TensorFlow's start in a container took 5 min at load 50
    while "first training step done" not in job.tail(100000):
        assert time.monotonic() < end, f"the chief never trained:\n{job.tail()}"
        assert job._up.poll() is None, f"the job ended before training:\n{job.tail()}"
        time.sleep(0.5)
    for i in range(1, PARTITIONS):
        write_partition(stream, f"dt={i:02d}", i, pause=1.0)
    rc = job.wait(600)
    assert rc == 0, job.tail()
    assert exit_codes(job) == {"ps0": 0, "worker0": 0}
    res = job.read_json(f"{MODEL_DIR}/results.json")
    assert res["status"] == "succeeded" and res.get("ended_by") == "until", res.get("error")
    # Every row once: the examples the model counted are the rows written, in one slice a partition.
    assert res["stream"]["examples"] == PARTITIONS * ROWS, res["stream"]
    assert res["stream"]["position"] == PARTITIONS, res["stream"]
    log = job.tail(100000)
    for i in range(1, PARTITIONS):   # each landed while the job ran, and was listed by the chief
        assert f"partition /input/dt={i:02d}: 1 file(s), {ROWS} row(s)" in log, log[-3000:]
    for service in ("ps0", CHIEF):   # the stream is mounted read-only in every task
        mounts = {m["Destination"]: m for m in job.container(service).attrs["Mounts"]}
        assert mounts["/input"]["RW"] is False and mounts["/input"]["Source"] == str(stream), mounts["/input"]
