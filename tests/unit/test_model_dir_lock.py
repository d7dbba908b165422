"""One running job per model_dir (``tfps.outcome.lock``): a second start is refused in one line
naming the running job, and a lock file whose holder has died never blocks.

The running job is played by a lock taken on its own open file (as another process's would
be: ``flock`` locks of two open files conflict, in one process too). The whole path through
``tfps local`` is tests/integration/test_adversarial.py's
``test_a_second_job_into_a_running_jobs_model_dir_is_refused``."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

from tfps.errors import ConfigError
from tfps.outcome import lock, results


@pytest.fixture
def running_job(tmp_path):
    """A model_dir whose lock another holder has taken; released at the end."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    fh = open(model_dir / lock.LOCK_FILE, "w")
    fcntl.flock(fh, fcntl.LOCK_EX)
    json.dump({"pid": 4242, "host": "box1", "by": "tfps local", "job": "first", "since": "2026-12-07T18:00:00Z"}, fh)
    fh.flush()
    yield str(model_dir)
    fh.close()


def test_a_second_job_is_refused_in_one_line_naming_the_running_one(running_job):
    with pytest.raises(ConfigError) as info:
        lock.acquire(running_job, "second", "tfps local")
    message = str(info.value)
    assert info.value.field == "model_dir" and "\n" not in message
    assert "in use by job 'first' (tfps local, pid 4242 on box1, since 2026-12-07T18:00:00Z)" in message
    assert "another --model_dir" in message
    with pytest.raises(ConfigError, match="in use by job 'first'"):
        lock.check_free(running_job)
    # The refused start wrote nothing: the running job's record is as it was.
    assert json.loads(open(lock.lock_path(running_job)).read())["job"] == "first"


def test_a_lock_file_of_a_dead_process_does_not_block(tmp_path):
    model_dir = str(tmp_path / "model")
    os.makedirs(model_dir)
    with open(lock.lock_path(model_dir), "w") as fh:   # left by a holder that died (no lock on it)
        json.dump({"pid": 999999, "host": "gone", "by": "tfps local", "job": "old"}, fh)
    lock.check_free(model_dir)
    assert lock.holder(model_dir) is None
    try:
        assert lock.acquire(model_dir, "new", "tfps local") is True
        record = lock.holder(model_dir)    # now held: the file names this process
        assert record["pid"] == os.getpid() and record["job"] == "new" and record["by"] == "tfps local"
        assert lock.acquire(model_dir, "new", "tfps local") is False   # held already: nothing more
    finally:
        lock.release(model_dir)
    assert lock.holder(model_dir) is None


def test_taking_the_lock_creates_model_dir_and_the_lock_file_is_not_a_users_file(tmp_path):
    model_dir = str(tmp_path / "new" / "model")
    try:
        lock.acquire(model_dir, "job", "tfps local")
        assert results.check_model_dir(model_dir, {"name": "job"}) is None   # still a fresh model_dir
    finally:
        lock.release(model_dir)


def test_a_chief_under_its_own_launchers_lock_goes_on(tmp_path, monkeypatch):
    model_dir = str(tmp_path / "model")
    os.makedirs(model_dir)
    import socket
    with open(lock.lock_path(model_dir), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        json.dump({"pid": os.getppid(), "host": socket.gethostname(), "by": "tfps local", "job": "j"}, fh)
        fh.flush()
        assert lock.acquire(model_dir, "j", "a chief") is False    # its parent holds it
        monkeypatch.setattr(lock, "_ancestors", lambda: set())
        with pytest.raises(ConfigError, match="in use by job 'j'"):
            lock.acquire(model_dir, "j", "a chief")


def test_the_chief_names_who_started_it(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert "Slurm job 77" in lock.chief_holder()
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("TFPS_HOST", "h1")
    assert "Ansible deploy on h1" in lock.chief_holder()
