"""tfps slurm on a real Slurm cluster: Debian 12's slurm-wlm in three containers
(slurmcluster.py), jobs submitted by an unprivileged user with real sbatch, scancel and
scontrol.

One cluster for the module. The completing job and the job that is stopped run at the same
time on the same nodes (two jobs sharing nodes, each with its own free ports): together
they take about as long as one.

- a 1 ps + 2 workers job on 3 nodes ends COMPLETED 0:0 by itself, soon after the chief's
  results.json (the seconds between them are printed, not asserted), and well before its
  walltime; its SavedModel loads and scores; one "succeeded" message arrives;
- scancel of a running job (SIGTERM to every task at once, SIGKILL after KillWait) leaves
  the final checkpoint, a complete export, results.json "stopped" and one "stopped" message;
- a chief that fails (its loss goes NaN) fails the job: FAILED with tfps's exit code 1, one
  "FAILED" message;
- bad input is refused in one line and nothing is submitted.
"""

from __future__ import annotations

import datetime
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from servers import SMTPServer, wait_until
from slurmcluster import REPO, SlurmCluster

pytestmark = pytest.mark.system

#: The walltime asked for (minutes): the jobs must end long before it.
WALLTIME_MIN = 30
#: Bounds of the waits below (they fail the test only when something hangs).
JOB_TIMEOUT = 300


@pytest.fixture(scope="module")
def cluster(docker_client):
    c = SlurmCluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def smtp(cluster):
    gateway = subprocess.run(["docker", "network", "inspect", cluster.network, "-f",
                              "{{(index .IPAM.Config 0).Gateway}}"], capture_output=True, text=True,
                             check=True).stdout.strip()
    with SMTPServer(hostname=gateway) as server:
        cluster.run(f"echo {shlex.quote(server.url())} > /shared/jobs/notify.txt && chmod 600 /shared/jobs/notify.txt")
        yield server


def _submit(cluster, name: str, *args: str, env: str = "", layout: str = "--ps 1 --workers 2 --nodes 3") -> str:
    options = " ".join(shlex.quote(a) for a in args)
    proc = cluster.run(f"{env} {shlex.quote(sys.executable)} -m tfps slurm {layout} "
                       f"--time {WALLTIME_MIN} --final_save_timeout 60 --run_name {name} "
                       f"--model_dir /shared/jobs/{name} --notify_config /shared/jobs/notify.txt "
                       f"--submit {options}")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout
    return job_id


@pytest.fixture(scope="module")
def jobs(cluster, smtp):
    """Both jobs, submitted at once: one that completes, one that the test stops."""
    done = _submit(cluster, "slurm-done", "--train_steps", "200")
    stopped = _submit(cluster, "slurm-stop", "--train_steps", "1000000", "--model",
                      "tests.fixtures.paced_model:model_fn",
                      env=f"PYTHONPATH={shlex.quote(str(REPO))} TFPS_TEST_STEP_SECS=0.05")
    return {"done": done, "stopped": stopped}


def _when(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.timezone.utc).timestamp()


def _volume_path(cluster, path: str) -> Path:
    """``path`` under /shared, as this machine sees the volume."""
    mount = subprocess.run(["docker", "volume", "inspect", cluster.volume, "-f", "{{.Mountpoint}}"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return Path(mount) / Path(path).relative_to("/shared")


def _messages(smtp, job: str) -> list[str]:
    return [str(m["subject"]) for m in smtp.received() if f"job {job}" in str(m["subject"])]


def test_bad_input_is_refused_in_one_line_and_nothing_is_submitted(cluster):
    before = cluster.sh(cluster.names[0], "squeue -h -o %i")
    proc = cluster.tfps("slurm --ps 1 --workers 2 --time 10 --model_dir /shared/jobs/bad --submit")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "ask for more time or lower --final-save-timeout" in proc.stderr
    assert proc.stdout == ""
    assert cluster.sh(cluster.names[0], "squeue -h -o %i") == before
    assert not cluster.exists("/shared/jobs/bad.slurm")


def test_a_job_completes_seconds_after_the_chief(cluster, jobs, smtp):
    job = jobs["done"]
    info = cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, JOB_TIMEOUT)
    output = cluster.read(f"/shared/jobs/slurm-done.slurm/slurm-{job}.out")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    results_path = _volume_path(cluster, "/shared/jobs/slurm-done/results.json")
    results = json.loads(results_path.read_text())
    assert results["status"] == "succeeded"
    assert results["global_step"] >= 200
    assert results["slurm_job"] == job
    # The roles and the free ports came from Slurm's variables, on three nodes.
    for rank, name in enumerate(("ps0", "worker0", "worker1")):
        assert f"rank {rank} is {name}" in output
    assert "the chief exited with 0" in output
    # Ended by itself: seconds after the chief's results.json, long before the walltime.
    end = _when(info["EndTime"])
    chief_exit = _volume_path(cluster, f"/shared/jobs/slurm-done.slurm/rendezvous/{job}-0/chief.exit")
    ran = end - _when(info["StartTime"])
    print(f"\nSlurm job {job}: COMPLETED {end - results_path.stat().st_mtime:.0f} s after the chief's "
          f"results.json and {end - chief_exit.stat().st_mtime:.0f} s after the chief's exit (scontrol's EndTime, "
          f"whole seconds); it ran {ran:.0f} s of its {WALLTIME_MIN} min walltime")
    assert ran < WALLTIME_MIN * 60 - 90   # before the walltime's warning signal could have fired
    # The SavedModel loads and scores.
    import numpy as np
    import tensorflow as tf
    export = _volume_path(cluster, "/shared/jobs/slurm-done/export")
    model = tf.saved_model.load(str(export))
    serve = model.signatures["serving_default"]
    spec = next(iter(serve.structured_input_signature[1].values()))
    out = serve(**{next(iter(serve.structured_input_signature[1])):
                   tf.constant(np.zeros([4, *spec.shape[1:]], spec.dtype.as_numpy_dtype))})
    assert all(np.all(np.isfinite(v.numpy())) for v in out.values())
    assert wait_until(lambda: _messages(smtp, "slurm-done"), timeout=30)
    subjects = _messages(smtp, "slurm-done")
    assert len(subjects) == 1 and "succeeded" in subjects[0], subjects
    body = next(m for m in smtp.received() if "job slurm-done" in str(m["subject"])).get_body(("plain",))
    assert re.search(rf"^Slurm job +{job}\r?$", body.get_content(), re.M)


def test_scancel_gives_the_final_save_and_a_stopped_job(cluster, jobs, smtp):
    job = jobs["stopped"]
    out = f"/shared/jobs/slurm-stop.slurm/slurm-{job}.out"
    assert wait_until(lambda: "first training step" in cluster.read(out), timeout=JOB_TIMEOUT, interval=1), \
        cluster.read(out)[-3000:]
    cancelled_at = time.time()
    cluster.run(f"scancel {job}")
    results_path = _volume_path(cluster, "/shared/jobs/slurm-stop/results.json")

    def stopped() -> bool:
        try:
            return json.loads(results_path.read_text())["status"] == "stopped"
        except (OSError, ValueError, KeyError):
            return False

    assert wait_until(stopped, timeout=90, interval=0.5), cluster.read(out)[-3000:]
    # Every task has gone by Slurm's SIGKILL after KillWait at the latest (later on a loaded machine).
    cluster.wait_state(job, {"CANCELLED"}, JOB_TIMEOUT)
    results = json.loads(results_path.read_text())
    model_dir = results_path.parent
    step = results["global_step"]
    assert (model_dir / f"model.ckpt-{step}.index").exists(), sorted(p.name for p in model_dir.iterdir())
    assert (model_dir / "export" / "tfps_export.json").exists()   # the export's completion marker
    print(f"\nSlurm job {job}: scancel; results.json 'stopped' at step {step} "
          f"{results_path.stat().st_mtime - cancelled_at:.1f} s after it (KillWait 90 s)")
    assert wait_until(lambda: _messages(smtp, "slurm-stop"), timeout=30)
    time.sleep(1)
    subjects = _messages(smtp, "slurm-stop")
    assert len(subjects) == 1 and "stopped" in subjects[0], subjects


def test_a_failed_chief_fails_the_job_with_its_exit_code(cluster, smtp):
    # After the other jobs (they run first, in this file's order): its start-up would take the
    # cores that the stopped job's final save needs within KillWait.
    job = _submit(cluster, "slurm-fail", "--train_steps", "1000", "--model", "tests.fixtures.bad_models:nan_loss",
                  env=f"PYTHONPATH={shlex.quote(str(REPO))}", layout="--ps 1 --workers 1 --nodes 2")
    info = cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, JOB_TIMEOUT)
    output = cluster.read(f"/shared/jobs/slurm-fail.slurm/slurm-{job}.out")
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "1:0"), output[-3000:]
    assert "the chief exited with 1" in output
    results = json.loads(_volume_path(cluster, "/shared/jobs/slurm-fail/results.json").read_text())
    assert results["status"] == "failed" and "nan" in results["error"]["message"].lower()
    assert wait_until(lambda: _messages(smtp, "slurm-fail"), timeout=30)
    subjects = _messages(smtp, "slurm-fail")
    assert len(subjects) == 1 and "FAILED" in subjects[0], subjects
