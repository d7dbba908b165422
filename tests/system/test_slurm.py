"""tfps slurm on a real Slurm cluster: Debian 12's slurm-wlm in three containers
(slurmcluster.py), jobs submitted by an unprivileged user with real sbatch, scancel and
scontrol.

One cluster for the module, four jobs, two at a time on the same nodes (each with its own
free ports): the completing job beside the job that is stopped, then the job that loses a
worker beside the job whose chief fails. Each pair takes about as long as its longer job.

- a 1 ps + 2 workers job on 3 nodes (--restarts 1) loses worker1 (rank 2, node 3) to a
  SIGKILL: the process is started again, rejoins, and the job ends COMPLETED 0:0 by itself,
  soon after the chief's results.json (the seconds between them are printed, not asserted),
  and well before its walltime; its SavedModel loads and scores; one "succeeded" message
  arrives; the job beside it, without --bind-interface, has its ps on every address;
- scancel of a running job (SIGTERM to every task at once, SIGKILL after KillWait) leaves
  the final checkpoint, a complete export, results.json "stopped" and one "stopped" message;
- tfps jobs --slurm and tfps logs --slurm show both jobs (Slurm's record, results.json, the
  progress, a task's prefixed lines), and tfps logs -f follows the stopped job's chief until it
  ends;
- a job without --restarts loses worker1 (the Slurm task itself) and goes on without it: async
  training ends COMPLETED 0:0, "succeeded", one message; its servers listen on eth0's address
  alone (--bind-interface eth0); its --sync_timeout (30 s) is how long its ps waits for the
  lost worker after the chief's final save (docs/slurm.md: else 120 s after the chief's exit);
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
import tempfile
import time
from pathlib import Path

import docblocks
import pytest
from servers import SMTPServer, wait_until
from slurmcluster import REPO, USER, SlurmCluster

pytestmark = pytest.mark.system

#: The walltime asked for (minutes): the jobs must end long before it.
WALLTIME_MIN = 30
#: Bounds of the waits below (they fail the test only when something hangs).
JOB_TIMEOUT = 600


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


#: The Slurm tutorial's submit line (docs/tutorials/slurm.md), from which every job here starts:
#: this test's layout (3 nodes), walltime and settings come after it, and argparse takes the last.
TUTORIAL = docblocks.commands("tutorials/slurm.md", "tests/system/test_slurm.py")[0]


def _submit(cluster, name: str, *args: str, env: str = "", layout: str = "--ps 1 --workers 2 --nodes 3") -> str:
    assert TUTORIAL[:2] == ["tfps", "slurm"] and "--submit" in TUTORIAL, TUTORIAL
    options = " ".join(shlex.quote(a) for a in args)
    proc = cluster.run(f"{env} {cluster.python} -m tfps {shlex.join(TUTORIAL[1:])} {layout} "
                       f"--time {WALLTIME_MIN} --final_save_timeout 60 --run_name {name} "
                       f"--model_dir /shared/jobs/{name} --notify_config /shared/jobs/notify.txt "
                       f"--submit {options}")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout
    return job_id


#: The paced model (0.05 s a step on each worker): the job still runs when a killed worker
#: comes back, and a stopped job runs until it is stopped.
PACED = ("--model", "tests.fixtures.paced_model:model_fn")
#: The completing job's steps: the chief alone takes over a minute for them, time for the
#: killed worker's new process to import TensorFlow and rejoin.
DONE_STEPS = 1500


def _paced_env(cluster) -> str:
    return f"PYTHONPATH={cluster.code} TFPS_TEST_STEP_SECS=0.05"


def _kill(cluster, node: str, pattern: str) -> int:
    """SIGKILL the one process of the lab user on ``node`` whose command line matches ``pattern``."""
    pids = cluster.sh(node, f"pgrep -u {USER} -f -- {shlex.quote(pattern)}", check=False).split()
    assert len(pids) == 1, (pattern, pids, cluster.sh(node, f"ps -u {USER} -o pid,args", check=False))
    cluster.sh(node, f"kill -KILL {pids[0]}", user=USER)
    return int(pids[0])


def _wait_worker1_trains(cluster, out: str) -> None:
    assert wait_until(lambda: re.search(r"^2: .* worker1: first training step", cluster.read(out), re.M),
                      timeout=JOB_TIMEOUT, interval=1), cluster.read(out)[-3000:]


@pytest.fixture(scope="module")
def jobs(cluster, smtp):
    """Two jobs, submitted at once on the same nodes: one that completes after losing worker1
    (restarted by --restarts 1), one that the test stops."""
    done = _submit(cluster, "slurm-done", "--train_steps", str(DONE_STEPS), *PACED, "--restarts", "1",
                   env=_paced_env(cluster))
    stopped = _submit(cluster, "slurm-stop", "--train_steps", "1000000", *PACED, env=_paced_env(cluster))
    _wait_worker1_trains(cluster, f"/shared/jobs/slurm-done.slurm/slurm-{done}.out")
    # The supervised child on node 3 (rank 2): its supervisor starts it again.
    _kill(cluster, cluster.names[2], r"-m tfps run .*--job_name worker --task_index 1 .*slurm-done")
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


def test_tfps_is_the_wheels_copy_in_a_venv_on_the_shared_volume(cluster):
    proc = cluster.run(f"cd / && {cluster.python} -c 'import tfps; print(tfps.__file__, tfps.__version__)'")
    where, version = proc.stdout.split()
    assert where.startswith(f"{cluster.VENV}/lib/") and where.endswith("/site-packages/tfps/__init__.py"), proc
    import tfps
    assert version == tfps.__version__
    # The checkout's sources are not on the nodes (its venv is, for TensorFlow: .venv/ inside it).
    assert not cluster.exists(str(REPO / "tfps")) and not cluster.exists(str(REPO / "tests"))


def test_bad_input_is_refused_in_one_line_and_nothing_is_submitted(cluster):
    before = cluster.sh(cluster.names[0], "squeue -h -o %i")
    proc = cluster.tfps("slurm --ps 1 --workers 2 --time 10 --model_dir /shared/jobs/bad --submit")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "ask for more time or lower --final-save-timeout" in proc.stderr
    assert proc.stdout == ""
    assert cluster.sh(cluster.names[0], "squeue -h -o %i") == before
    assert not cluster.exists("/shared/jobs/bad.slurm")


def test_a_killed_worker_is_restarted_and_the_job_completes_seconds_after_the_chief(cluster, jobs, smtp):
    job, stopped = jobs["done"], jobs["stopped"]
    info = cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, JOB_TIMEOUT)
    output = cluster.read(f"/shared/jobs/slurm-done.slurm/slurm-{job}.out")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    results_path = _volume_path(cluster, "/shared/jobs/slurm-done/results.json")
    results = json.loads(results_path.read_text())
    assert results["status"] == "succeeded"
    assert results["global_step"] >= DONE_STEPS
    assert results["slurm_job"] == job
    assert (_volume_path(cluster, "/shared/jobs/slurm-done/export") / "tfps_export.json").exists()
    # The roles and the free ports came from Slurm's variables, on three nodes.
    for rank, name in enumerate(("ps0", "worker0", "worker1")):
        assert f"rank {rank} is {name}" in output
    assert "the chief exited with 0" in output
    # worker1's process, killed by the fixture, was started again inside its Slurm task.
    assert re.search(r"^2: .* worker1: the task process was killed by SIGKILL; starting it again \(1/1\)$",
                     output, re.M), output[-3000:]
    # Ended by itself: seconds after the chief's results.json, long before the walltime.
    end = _when(info["EndTime"])
    chief_exit = _volume_path(cluster, f"/shared/jobs/slurm-done.slurm/rendezvous/{job}-0/chief.exit")
    ran = end - _when(info["StartTime"])
    print(f"\nSlurm job {job}: COMPLETED {end - results_path.stat().st_mtime:.0f} s after the chief's "
          f"results.json and {end - chief_exit.stat().st_mtime:.0f} s after the chief's exit (scontrol's EndTime, "
          f"whole seconds); it ran {ran:.0f} s of its {WALLTIME_MIN} min walltime")
    assert ran < WALLTIME_MIN * 60 - 90   # before the walltime's warning signal could have fired
    # The other job ran at the same time on the same nodes, each task on its own port, and
    # its ps, without --bind-interface, listens on every address.
    other = cluster.job(stopped)
    assert other["JobState"] == "RUNNING" and _when(other["StartTime"]) < end, other
    assert info["NodeList"] == other["NodeList"] == f"{cluster.prefix}-[1-3]", (info, other)
    rendezvous = {name: f"/shared/jobs/{name}.slurm/rendezvous/{j}-0" for name, j in
                  (("slurm-done", job), ("slurm-stop", stopped))}
    for rank, node in ((0, "node 1"), (2, "node 3")):
        ports = [json.loads(cluster.read(f"{d}/rank{rank}.json"))["port"] for d in rendezvous.values()]
        assert ports[0] != ports[1], (node, ports)
    ps = json.loads(cluster.read(f"{rendezvous['slurm-stop']}/rank0.json"))
    assert ps["host"] == cluster.names[0], ps
    assert _listening(cluster, cluster.names[0], ps["port"]) in (["0.0.0.0"], ["::"]), ps
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


def _table(cluster) -> dict[str, list[str]]:
    """tfps jobs --slurm as the lab user sees it: each row's columns by the job's name."""
    proc = cluster.tfps("jobs --slurm")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["JOB", "STATE", "STEP", "LOSS", "EXAMPLES/S", "STARTED", "ETA", "HOSTS"], proc.stdout
    return {line.split()[0]: line.split() for line in lines[1:]}


@pytest.fixture(scope="module")
def follow(cluster, jobs):
    """tfps logs --slurm -f of the stopped job's chief, started while the job runs."""
    out = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(["docker", "exec", "-u", "lab", "-w", "/shared/jobs", cluster.names[0],
                             cluster.python, "-m", "tfps", "logs", "--slurm", jobs["stopped"], "worker0", "-f",
                             "-n", "5"], stdout=out, stderr=subprocess.STDOUT, text=True)
    yield proc, out
    if proc.poll() is None:
        proc.kill()
    out.close()


def _followed(follow) -> str:
    out = follow[1]
    out.seek(0)
    return out.read()


def test_tfps_jobs_and_logs_show_a_finished_and_a_running_job(cluster, jobs, follow):
    done, stopped = jobs["done"], jobs["stopped"]
    cluster.wait_state(done, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, JOB_TIMEOUT)
    out = f"/shared/jobs/slurm-stop.slurm/slurm-{stopped}.out"
    assert wait_until(lambda: "first training step" in cluster.read(out), timeout=JOB_TIMEOUT, interval=1)
    nodes = ",".join(cluster.names)

    def stepping() -> dict[str, list[str]] | None:
        rows = _table(cluster)
        return rows if int(rows["slurm-stop"][3].split("/")[0]) > 0 else None   # once its status.json has a step

    assert wait_until(stepping, timeout=60, interval=2)
    rows = stepping()
    finished = rows["slurm-done"]
    assert finished[:5] == ["slurm-done", f"({done})", "succeeded", "(COMPLETED", "0:0)"], finished
    step, total = finished[5].split("/")
    assert total == str(DONE_STEPS) and int(step) >= DONE_STEPS and float(finished[6]) >= 0 and finished[-1] == nodes, finished
    running = rows["slurm-stop"]
    assert running[1:3] == [f"({stopped})", "running"] and running[3].endswith("/1000000"), running
    assert running[-1] == nodes, running

    # A finished task's log: its rank's lines of the step output, prefixed as the Ansible side does.
    proc = cluster.tfps("logs --slurm slurm-done ps0 -n 3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[-1] == f"[slurm] tfps: Slurm job {done}: the chief exited with 0", lines
    # ... and the ps ended by itself: every worker, the restarted worker1 too, reported done.
    assert re.fullmatch(r"\[ps0\] \d\d:\d\d:\d\d I ps0: every worker is done; exiting", lines[-2]), lines
    proc = cluster.tfps(f"logs --slurm {done} worker1")   # by id, every line but TensorFlow's banner
    assert proc.returncode == 0 and f"rank 2 is worker1 on {cluster.names[2]}:" in proc.stdout.splitlines()[0]
    assert all(line.startswith(("[worker1] ", "[slurm] ")) for line in proc.stdout.splitlines()), proc.stdout
    proc = cluster.tfps("logs --slurm slurm-done worker2")
    assert proc.returncode == 2 and "no worker2; give ps0..ps0 or worker0..worker1" in proc.stderr
    # The running job's chief, followed: it prints as the chief writes (ended by the next test's scancel).
    assert wait_until(lambda: "[worker0] " in _followed(follow), timeout=60, interval=0.5), _followed(follow)
    assert follow[0].poll() is None, _followed(follow)


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
          f"{results_path.stat().st_mtime - cancelled_at:.1f} s after it (KillWait 150 s)")
    assert wait_until(lambda: _messages(smtp, "slurm-stop"), timeout=30)
    time.sleep(1)
    subjects = _messages(smtp, "slurm-stop")
    assert len(subjects) == 1 and "stopped" in subjects[0], subjects


def test_tfps_logs_follow_ends_with_the_job_and_jobs_shows_it_stopped(cluster, jobs, follow):
    stopped = jobs["stopped"]
    if cluster.job(stopped).get("JobState") == "RUNNING":   # run alone, without the scancel test
        cluster.run(f"scancel {stopped}")
    cluster.wait_state(stopped, {"CANCELLED"}, JOB_TIMEOUT)
    assert follow[0].wait(timeout=60) == 0, _followed(follow)   # ended by itself once the job had
    followed = _followed(follow).splitlines()
    assert any(re.search(r"^\[worker0\] .* job slurm-stop stopped at", line) for line in followed), followed
    assert followed[-1] == f"[slurm] tfps: Slurm job {stopped}: the chief exited with 143", followed
    rows = _table(cluster)
    assert rows["slurm-stop"][1:5] == [f"({stopped})", "stopped", "(CANCELLED", "143:0)"], rows["slurm-stop"]
    assert rows["slurm-stop"][-3:-1] == ["ago", "-"]   # no ETA once stopped


#: The job that loses a worker: long enough that the kill, seconds after worker1's first
#: step, comes well before the end.
LOSE_STEPS = 1200


@pytest.fixture(scope="module")
def late_jobs(cluster, smtp):
    """Two jobs submitted at once after the first pair has ended (their start-up would take
    the cores that the stopped job's final save needs within KillWait): a 1 ps + 2 workers
    job that loses worker1 without --restarts, and a 1 ps + 1 worker job whose chief fails."""
    for job in ("slurm-done", "slurm-stop"):   # the first pair, when this module's tests ran it
        found = cluster.run(f"squeue -h -u {USER} -n {job} -o %i").stdout.split()
        for job_id in found:
            cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, JOB_TIMEOUT)
    lose = _submit(cluster, "slurm-lose", "--train_steps", str(LOSE_STEPS), *PACED, "--bind-interface", "eth0",
                   "--sync_timeout", "30", env=_paced_env(cluster))
    fail = _submit(cluster, "slurm-fail", "--train_steps", "1000", "--model", "tests.fixtures.bad_models:nan_loss",
                   env=f"PYTHONPATH={cluster.code}", layout="--ps 1 --workers 1 --nodes 2")
    return {"lose": lose, "fail": fail}


def _listening(cluster, node: str, port: int) -> list[str]:
    """The addresses that listen on ``port`` inside ``node`` (its /proc/net/tcp and tcp6)."""
    from tfps.task.net.listening import parse_address
    found = []
    for line in cluster.sh(node, "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null", check=False).splitlines():
        f = line.split()
        if len(f) > 3 and f[3] == "0A" and ":" in f[1] and f[1] != "local_address":
            address, p = parse_address(f[1])
            if p == port:
                found.append(address)
    return sorted(found)


def test_a_job_losing_a_worker_without_restarts_goes_on_and_binds_eth0_alone(cluster, smtp, late_jobs):
    """A 1 ps + 2 workers job loses worker1 (rank 2, node 3: the Slurm task itself) to a
    SIGKILL, as docs/slurm.md says: without --restarts nothing starts it again and the
    (async) job goes on without it, ending COMPLETED 0:0 with results.json "succeeded" and
    one "succeeded" message; its ps waits --sync_timeout (30 s) for the lost worker's token
    after the chief's final save. Its servers listen on eth0's address alone
    (--bind-interface eth0). The job whose chief fails runs beside it."""
    job = late_jobs["lose"]
    out = f"/shared/jobs/slurm-lose.slurm/slurm-{job}.out"
    _wait_worker1_trains(cluster, out)
    _kill(cluster, cluster.names[2], r"tfps\.launch\.slurm_step .*slurm-lose")   # nothing restarts it
    info = cluster.job(job)
    assert info["JobState"] == "RUNNING" and info["NodeList"] == f"{cluster.prefix}-[1-3]", info
    # --bind-interface eth0: the ps publishes node 1's eth0 address and listens there alone.
    ps = json.loads(cluster.read(f"/shared/jobs/slurm-lose.slurm/rendezvous/{job}-0/rank0.json"))
    eth0 = cluster.sh(cluster.names[0], "hostname -I").split()   # the node's only network: eth0
    assert ps["host"] in eth0, (ps, eth0)
    assert _listening(cluster, cluster.names[0], ps["port"]) == [ps["host"]]
    info = cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, JOB_TIMEOUT)
    output = cluster.read(out)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    results = json.loads(_volume_path(cluster, "/shared/jobs/slurm-lose/results.json").read_text())
    assert results["status"] == "succeeded" and results["global_step"] >= LOSE_STEPS, results
    assert (_volume_path(cluster, "/shared/jobs/slurm-lose/export") / "tfps_export.json").exists()
    assert wait_until(lambda: _messages(smtp, "slurm-lose"), timeout=30)
    subjects = _messages(smtp, "slurm-lose")
    assert len(subjects) == 1 and "succeeded" in subjects[0], subjects
    assert re.search(r"^srun: error: .*: task 2: Killed$", output, re.M), output[-3000:]
    assert "starting it again" not in output
    # The ps let the lost worker go after --sync_timeout, not after the launcher's 120 s.
    assert re.search(r"^0: .* ps0: the chief finished 30 s ago but worker\(s\) \[1\] never reported done",
                     output, re.M), output[-3000:]
    print(f"\nSlurm job {job}: COMPLETED {_when(info['EndTime']) - _when(info['StartTime']):.0f} s after its start")


def test_a_failed_chief_fails_the_job_with_its_exit_code(cluster, smtp, late_jobs):
    job = late_jobs["fail"]
    info = cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, JOB_TIMEOUT)
    output = cluster.read(f"/shared/jobs/slurm-fail.slurm/slurm-{job}.out")
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "1:0"), output[-3000:]
    assert "the chief exited with 1" in output
    results = json.loads(_volume_path(cluster, "/shared/jobs/slurm-fail/results.json").read_text())
    assert results["status"] == "failed" and "nan" in results["error"]["message"].lower()
    assert wait_until(lambda: _messages(smtp, "slurm-fail"), timeout=30)
    subjects = _messages(smtp, "slurm-fail")
    assert len(subjects) == 1 and "FAILED" in subjects[0], subjects
