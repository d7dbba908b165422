"""A chief that refuses its input after the cluster has started still ends the whole job.

In containers every task starts at once, so when the chief finds bad input (here: a
model_dir that belongs to another job) the ps and the other workers are already waiting
for it. The chief raises the stop flag and sends its done token; the waiting worker gives
up at once instead of waiting hours for a model that will never be initialised, and the
ps exits by itself. The other job's files are left untouched. A chief whose model_dir a
running job holds (its lock, tfps.outcome.lock) refuses it the same way, whatever started it.
"""

from __future__ import annotations

import json

import pytest
from integration_helpers import assert_nothing_left, run_flags
from test_restarts import start_cluster

pytestmark = pytest.mark.integration


def test_chief_refusing_model_dir_ends_every_task(procs, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    other = {"run_name": "someone-else", "model": "cnn", "feature_shape": [12, 12, 1], "num_classes": 3,
             "hidden_units": "64,32"}
    (model_dir / "tfps_run.json").write_text(json.dumps(other))
    (model_dir / "results.json").write_text('{"status": "succeeded", "job": "someone-else"}')
    tasks, _, ports = start_cluster(procs, model_dir, steps=200)

    assert tasks["worker0"].wait(120) == 2
    assert "model_dir: " in tasks["worker0"].output() and "belongs to another job" in tasks["worker0"].output()
    # The non-chief gave up because the chief did, well before any long timeout.
    assert tasks["worker1"].wait(60) == 1, tasks["worker1"].tail()
    assert "the chief gave up before training started" in tasks["worker1"].output()
    assert tasks["ps0"].wait(60) == 0, tasks["ps0"].tail()
    # The other job's record is untouched and nothing of this job was written there.
    assert json.loads((model_dir / "results.json").read_text())["job"] == "someone-else"
    assert json.loads((model_dir / "tfps_run.json").read_text()) == other
    assert not (model_dir / "checkpoint").exists()
    assert_nothing_left(ports, *tasks.values())


#: The lock of the job that holds the ``locked`` chief's model_dir.
LOCK_RECORD = {"pid": 31, "host": "node2", "by": "the chief of Slurm job 12 (tfps slurm)", "job": "first"}


@pytest.fixture(scope="module")
def lone_chiefs(module_procs, tmp_path_factory) -> dict:
    """The two chiefs whose ps is never started, side by side (each waits out its bounded end
    RPCs: about 25 s, most of it waiting, so both take as long as one): ``gone``, whose
    model_dir belongs to another job, and ``locked``, whose model_dir's lock another live job
    holds (this fixture, standing in for a chief on another node, until both have exited).
    name -> (its process, its exit code, its model_dir)."""
    import fcntl

    from tfps import timeouts
    from tfps.cluster import free_ports, local_plan
    from tfps.outcome import lock
    root = tmp_path_factory.mktemp("lone-chiefs")
    ports = free_ports(4)   # two 1 ps + 1 worker plans that cannot share a port
    dirs = {name: root / name / "model" for name in ("gone", "locked")}
    for d in dirs.values():
        d.mkdir(parents=True)
    (dirs["gone"] / "tfps_run.json").write_text(json.dumps({"run_name": "someone-else", "model": "mlp"}))
    with open(dirs["locked"] / lock.LOCK_FILE, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        json.dump(LOCK_RECORD, held)
        held.flush()
        started = {}
        for i, (name, model_dir) in enumerate(dirs.items()):
            plan = local_plan(1, 1, ports=ports[2 * i:2 * i + 2])
            chief = next(t for t in plan.tasks if t.name == "worker0")   # its ps is never started
            started[name] = module_procs.tfps(f"worker0-{name}", "run", *plan.task_ref(chief).to_flags(),
                                              *run_flags(model_dir, steps=50))
        rcs = {name: proc.wait(timeouts.END_RPC_BOUND_SECS + 90) for name, proc in started.items()}
    return {name: (started[name], rcs[name], dirs[name]) for name in dirs}


def test_chief_whose_ps_has_gone_still_exits(lone_chiefs):
    """The chief's last RPCs (raise the stop flag, its done token) go to a ps that is gone.

    TensorFlow waits without a bound for a session's tasks when it creates the session, so
    a chief whose ps exited (or was told "done" by a stray worker) used to hang after its
    report. Each end RPC is bounded as a whole; after the first finds no ps, the next is
    not tried; the process exits with the job's code."""
    from tfps import timeouts
    proc, rc, _ = lone_chiefs["gone"]
    assert rc == 2, proc.tail()
    out = proc.output()
    assert "belongs to another job" in out
    assert f"could not ask the other workers to stop: no ps answered within {timeouts.END_RPC_BOUND_SECS:.0f} s" \
        in out, out[-3000:]
    assert "did not tell the ps it is done: no ps answered before" in out, out[-3000:]


def test_a_chief_whose_model_dir_a_running_job_holds_refuses_and_writes_nothing(lone_chiefs):
    """Whatever started it (compose, the Ansible role, a Slurm step: here ``tfps run`` as a container
    runs it), a chief refuses a model_dir whose lock another live job holds (here the test,
    standing in for a chief on another node), in one line naming that job, and writes nothing there.
    One process (its ps never started), beside the chief of the test above."""
    from tfps.outcome import lock
    proc, rc, model_dir = lone_chiefs["locked"]
    assert rc == 2, proc.tail()
    refusals = [line for line in proc.output().splitlines() if line.startswith("tfps: error: ")]
    assert refusals == [f"tfps: error: model_dir: {model_dir} is in use by job 'first' (the chief of Slurm job 12 "
                        "(tfps slurm), pid 31 on node2); wait until it ends (or stop it), or give this run another "
                        "--model_dir"], proc.tail()
    assert sorted(p.name for p in model_dir.iterdir()) == [lock.LOCK_FILE]   # no record, no checkpoint
    assert json.loads((model_dir / lock.LOCK_FILE).read_text()) == LOCK_RECORD
