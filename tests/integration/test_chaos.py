"""Twenty faults in one job (issue 51): the job recovers from each, and says so truthfully.

One ``tfps local --ps 2 --workers 2 --restarts 40`` job runs while a seeded injector
(tests/chaos.py) sends 20 faults at random times to random tasks, the chief included: 7
SIGKILLs of a task's training process (its ``tfps run --restarts`` supervisor starts it
again; every task is killed at least once) and 13 SIGSTOPs of half a second to two seconds,
then SIGCONT, 0.5-2 s apart. The job must end by itself, succeeded, with

* every kill it recovered from in results.json's ``restarts``, task by task;
* exactly one message, saying that it succeeded and how many failures it recovered from;
* no process of the cluster left;
* a model within 0.02 accuracy of the same job without faults (run beside it, unpaced);
* no kill that no fault caused: the job runs beside busy processes (3, at nice 19: they
  raise the load without taking CPU from the tests that run beside this one in ``make
  test``, whose load is the real one), and no timer of tfps (watchdog, start-up and sync
  timeouts, the restarted chief's probe, the stop window) ended or restarted a task: the
  supervisors saw exactly the kills that were sent, no task gave up, and no task was left
  for the launcher to end.

The steps are paced (tests/fixtures/paced_model.py, read from a file: 0.25 s a step, so at
most 8 steps/s for both workers) while the faults are sent, so that the job outlasts them
however fast a step is, and unpaced after the last one. Its cost (docs/benchmarks.md): about
2 minutes of wall time at a load average of 3-7, 2.5-3 minutes at 9-18, most of it waiting. The table of the faults
(seconds to recover, steps lost) goes to ``tests/integration/.chaos-table.txt`` and to the
terminal.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import time
from pathlib import Path

import chaos
import faults
import pytest
from integration_helpers import (
    _stat,
    assert_nothing_left,
    base_env,
    cluster_pids,
    launcher_ports,
    load_and_predict,
    load_csv,
    pids_with_cmdline,
    read_results,
    run_flags,
)

pytestmark = pytest.mark.integration

SEED = 51
PS, WORKERS = 2, 2
TASKS = [f"ps{i}" for i in range(PS)] + [f"worker{i}" for i in range(WORKERS)]
STEPS = 1200
#: Seven kills (each restart imports TensorFlow again: 10-20 s of a loaded 2-core machine)
#: and thirteen freezes, 0.5-2 s apart: faults overlap recoveries, as in a long job.
KILLS, STOPS = 7, 13
GAP_S, HOLD_S = (0.5, 2.0), (0.5, 2.0)
#: Busy processes beside the job, at nice 19 (``HOG_NICE``): they add to the load average
#: and take only CPU that nothing else wants.
HOG, HOG_NICE = 3, 19
HOG_CODE = f"import os\nos.nice({HOG_NICE})\nwhile True: pass"
#: What a task says when a timer of tfps ends it or gives up on another task.
TIMER_FIRED = (r"--startup_timeout|trained no step for|did not start within|not restarting it|"
               r"exiting now, without the final save|restoring the newest checkpoint|exited with .* while the job runs|"
               r"ending tasks that did not exit by themselves")
#: Each worker's step while the faults are sent: the job outlasts them (at most 8 steps/s
#: for both workers, STEPS / 8 = 150 s, against about 40 s of faults).
PACE_S = "0.25"
PACED_MODEL = "tests.fixtures.paced_model:model_fn"
TABLE_FILE = Path(__file__).with_name(".chaos-table.txt")
FLAGS = {**{f"ps{i}": f"--job_name=ps --task_index={i}" for i in range(PS)},
         **{f"worker{i}": f"--job_name=worker --task_index={i}" for i in range(WORKERS)}}


def training_process(ports: list[int], task: str) -> int | None:
    """The training process of ``task`` now: the child of its ``tfps run --restarts`` supervisor
    (both carry the task's flags on their command line)."""
    flags = FLAGS[task]
    mine = set(cluster_pids(ports))
    pids = [p for p in pids_with_cmdline(flags) if p in mine]
    children = [p for p in pids if (_stat(p) or ("", 0, 0))[1] in pids]
    return children[0] if len(children) == 1 else None


def accuracy(res: dict, demo_dir) -> float:
    from tfps.models import demo
    x, y = load_csv(demo.demo_globs("mlp", str(demo_dir))[1])
    out = load_and_predict(res["export_dir"], x)
    return float((out["classes"] == y).mean())


def job_flags(model_dir: Path, *extra) -> list[str]:
    return [f"--ps={PS}", f"--workers={WORKERS}",
            *run_flags(model_dir, "--checkpoint_secs", 2, "--log_steps", 20, "--sync_timeout", 120, *extra,
                       steps=STEPS)]


def recovered_at(log: chaos.StampedLog, f: chaos.Fault) -> float | None:
    """When the job was back from ``f``, from the launcher's prefixed lines."""
    if f.kind == chaos.STOP:   # any worker's progress after the SIGCONT
        found = log.first_after(f.at + f.hold_s, r"^\[worker\d+\] .*worker\d+: step \d+/")
    elif f.task.startswith("ps"):
        found = log.first_after(f.at, r"^\[worker0\] .*(lost its variables|restored checkpoint of step)")
    elif f.task == "worker0":
        found = log.first_after(f.at, r"^\[worker0\] .*(joined the live variables|restored checkpoint of step)")
    else:
        found = log.first_after(f.at, rf"^\[{f.task}\] .*{f.task}: first training step done")
    return None if found is None else round(found[0] - f.at, 1)


def test_twenty_faults_in_one_job(procs, tmp_path, demo_dir, webhook_server, request):
    hogs = [procs.start(f"hog{i}", [sys.executable, "-c", HOG_CODE]) for i in range(HOG)]
    pace = tmp_path / "pace"
    pace.write_text(PACE_S)
    model_dir = tmp_path / "model"
    t0 = time.monotonic()
    launcher = procs.tfps("tfps-local-chaos", "local", "--restarts", 40,
                          *job_flags(model_dir, "--model", PACED_MODEL),
                          env=base_env(APPRISE_URLS=webhook_server.url(), TFPS_TEST_STEP_SECS_FILE=str(pace)))
    ports = launcher_ports(launcher)
    log = chaos.StampedLog(launcher.output).start()

    def newest_step() -> int | None:
        return max(faults.progress_steps(launcher.output()), default=None)

    schedule = chaos.schedule(SEED, TASKS, KILLS, STOPS, GAP_S, HOLD_S)
    injector = chaos.Chaos(schedule, lambda task: training_process(ports, task), newest_step,
                           lambda: launcher.returncode is None)
    try:
        # The first checkpoint first: a ps lost before it has nothing to be refilled from.
        deadline = time.monotonic() + 300
        while not list(model_dir.glob("model.ckpt-*.index")):
            assert launcher.returncode is None and time.monotonic() < deadline, launcher.tail()
            time.sleep(0.2)
        # The same job without faults, unpaced, beside it while the faults are sent (the chaos
        # job then mostly sleeps or restarts; started any earlier, both jobs' start-ups would
        # share the CPU): the accuracy to match.
        clean = procs.tfps("tfps-local-clean", "local", *job_flags(tmp_path / "clean"))
        injector.start()
        injector.join(600)
        # Paced until the job is back from every kill (a worker killed last must train again
        # before the job ends to show it), then at full speed to its end.
        deadline = time.monotonic() + 300
        while launcher.returncode is None and time.monotonic() < deadline and any(
                recovered_at(log, f) is None for f in injector.sent if f.kind == chaos.KILL):
            time.sleep(0.5)
        pace.write_text("0")
        rc = launcher.wait(600)
    finally:
        for hog in hogs:
            hog.kill()
        log.stop()
        pace.write_text("0")
        sent = injector.sent
        res = read_results(model_dir) if (model_dir / "results.json").is_file() else {}
        _fill_table(schedule, log, res)
        faults.write_table(request.config, chaos.render(
            f"chaos: {PS} ps + {WORKERS} workers, {STEPS} steps, --checkpoint_secs 2, seed {SEED}, beside {HOG} "
            f"busy processes at nice {HOG_NICE}: {len(sent)} faults sent; job {time.monotonic() - t0:.0f} s, load average "
            f"{os.getloadavg()[0]:.1f}", schedule), TABLE_FILE)

    assert clean.wait(600) == 0, clean.tail()
    clean_acc = accuracy(read_results(tmp_path / "clean"), demo_dir)
    assert len(sent) == KILLS + STOPS, f"the job ended after {len(sent)} of {KILLS + STOPS} faults"
    assert rc == 0, launcher.tail(80)
    assert res["status"] == "succeeded", res.get("error")
    assert res["global_step"] >= STEPS and res["export_complete"] is True

    # Every kill was a real death that the supervisor saw, and results.json lists each one.
    kills = collections.Counter(f.task for f in sent if f.kind == chaos.KILL)
    restarted = collections.Counter(m.group(1) for m in re.finditer(
        r"^\[(\w+)\] .*the task process was killed by SIGKILL; starting it again", launcher.output(), re.M))
    assert restarted == kills, (restarted, kills)
    listed = collections.Counter(r["task"] for r in res["restarts"])
    assert listed == kills, f"results.json lists {dict(listed)} for the kills {dict(kills)}: {res['restarts']}"
    assert not res.get("lost_tasks"), res.get("lost_tasks")
    fired = [line for line in launcher.output().splitlines() if re.search(TIMER_FIRED, line)]
    assert not fired, "a timer ended or gave up on a task that no fault had hit:\n" + "\n".join(fired[:10])
    # A lost worker loses no trained step; nor does a lost chief, unless a ps had lost the
    # variables too (then its entry says so, and the steps are the ps's).
    for r in res["restarts"]:
        if r["task"] == "worker0" and not r.get("note"):
            assert (r.get("how"), r.get("steps_redone")) == ("joined", 0), r
        elif r["task"] == "worker1":
            assert r.get("steps_redone") == 0, r
    missed = [f"#{i + 1} {f.task} {f.kind}" for i, f in enumerate(schedule) if f.at is not None and f.recover_s is None]
    assert not missed, f"no recovery seen after {missed}"

    # One message, and it says the job recovered from every one of them.
    messages = webhook_server.bodies()
    assert len(messages) == 1, [m.get("title") for m in messages]
    assert "succeeded" in messages[0]["title"], messages[0]["title"]
    assert f"Recovered from {KILLS} failures:" in messages[0]["message"], messages[0]["message"]

    acc = accuracy(res, demo_dir)
    assert acc >= clean_acc - 0.02, f"accuracy {acc:.3f} after the faults, {clean_acc:.3f} without"
    assert_nothing_left(ports, launcher, clean)


def _fill_table(schedule: list[chaos.Fault], log: chaos.StampedLog, res: dict) -> None:
    """Seconds to recover (the launcher's lines) and steps lost (results.json) per fault."""
    by_task: dict[str, list[dict]] = collections.defaultdict(list)
    for r in res.get("restarts", []):
        by_task[r["task"]].append(r)
    for f in schedule:
        if f.at is None:
            continue
        f.recover_s = recovered_at(log, f)
        if f.kind == chaos.KILL and by_task[f.task]:
            r = by_task[f.task].pop(0)
            f.steps_lost = r.get("steps_redone")
            f.how = r.get("how") or ""
        elif f.kind == chaos.STOP:
            f.steps_lost = 0
