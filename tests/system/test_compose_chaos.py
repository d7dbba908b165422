"""Chaos in a compose job (issue 51): containers killed and paused, the job recovers and says so.

The compose variant of tests/integration/test_chaos.py, small: one job of 1 ps + 2 workers
from ``tfps compose`` (the restart policy it writes, ``on-failure:3``), while the seeded
injector (tests/chaos.py) sends 10 faults to the task containers: 3 crashes (SIGKILL of the
container's PID 1: it exits 137 and Docker's restart policy starts it again; no supervisor saw
the death) and 7 ``docker pause`` of half a second to two seconds, then ``docker unpause``. Kills
go to ps0 and worker1 only: ``docker compose up --exit-code-from worker0`` ends the job at the
chief container's first exit (a killed chief process inside its container is
test_security.py's). The job must end by itself, succeeded, with every container exited 0,
each killed container started again by Docker as often as it was killed, every killed
task in results.json's ``restarts`` (each crash, unless two of one ps came before the job
recovered from the first: then one entry), exactly one message, and a model that still
predicts well.

Steps are paced (tests/fixtures/paced_model.py, from a file on the model directory's mount)
while the faults are sent, and unpaced once the job is back from the last kill.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from pathlib import Path

import chaos
import faults
import pytest
import yaml
from composejob import CHIEF, MODEL_DIR
from test_compose import assert_nothing_running, exit_codes, generate, write_url_file

from tfps.launch.compose import USER_MODEL_MOUNT

pytestmark = pytest.mark.system

SEED = 51
SERVICES = ["ps0", "worker0", "worker1"]
KILLED = ["ps0", "worker1"]
KILLS, STOPS = 3, 7
GAP_S, HOLD_S = (1.0, 3.0), (0.5, 2.0)
STEPS = 1200
PACE_S = "0.25"   # at most 8 steps/s for both workers: the job outlasts the faults
REPO = Path(__file__).resolve().parents[2]
TABLE_FILE = Path(__file__).with_name(".compose-chaos-table.txt")


def running(job, service: str):
    """The service's container when it runs and is not paused (a kill or pause may land)."""
    container = job.container(service)
    return container if container.status == "running" else None


def send(container, kind: str) -> None:
    """A kill is a crash of the whole container: SIGKILL of its PID 1 (tini) from this host, so
    that the container exits 137 by itself and its restart policy starts it again. ``docker
    kill`` would not do: Docker takes it for a manual stop and leaves the container down (a ps
    killed so ended its job after --sync_timeout, "ps0 does not answer")."""
    if kind == chaos.KILL:
        container.reload()
        os.kill(container.attrs["State"]["Pid"], signal.SIGKILL)
    else:
        container.pause()


def test_ten_container_faults_in_one_compose_job(compose_job, tfps_image, container_smtp_server, tmp_path, request):
    models = tmp_path / "models"
    models.mkdir()
    (models / "paced_model.py").write_text((REPO / "tests/fixtures/paced_model.py").read_text())
    pace = models / "pace"
    pace.write_text(PACE_S)
    directory = tmp_path / "compose"
    secret = write_url_file(tmp_path / "notify_urls", container_smtp_server.url())
    generate(directory, "--ps", "1", "--workers", "2", "--user_model_dir", str(models), "--model",
             "paced_model:model_fn", "--train_steps", str(STEPS), "--log_steps", "10", "--checkpoint_secs", "2",
             "--sync_timeout", "120", "--notify_urls_file", str(secret), image=tfps_image)
    compose_file = directory / "docker-compose.yml"
    spec = yaml.safe_load(compose_file.read_text())
    for service in SERVICES:   # every task reads the pace from the mounted file
        env = spec["services"][service].setdefault("environment", {})
        env["TFPS_TEST_STEP_SECS_FILE"] = f"{USER_MODEL_MOUNT}/pace"
    compose_file.write_text(yaml.safe_dump(spec, sort_keys=False))

    job = compose_job(directory)
    t0 = time.monotonic()
    job.start()
    schedule = chaos.schedule(SEED, SERVICES, KILLS, STOPS, GAP_S, HOLD_S, kill_tasks=KILLED)
    injector = chaos.Chaos(schedule, lambda service: running(job, service), lambda: job.chief_step(),
                           lambda: job._up.poll() is None, send=send, resume=lambda c: c.unpause())
    try:
        # The first checkpoint first: a ps lost before it has nothing to be refilled from.
        job.wait_for_step(20, timeout=480)
        injector.start()
        injector.join(300)
        # Paced until every killed container is back and the chief trained after the last
        # kill, then at full speed to the end.
        kills = collections.Counter(f.task for f in injector.sent if f.kind == chaos.KILL)
        deadline = time.monotonic() + 300
        while job._up.poll() is None and time.monotonic() < deadline:
            back = all(job.container(s).attrs["RestartCount"] >= n and job.container(s).status == "running"
                       for s, n in kills.items())
            if back and job.container("worker1").logs().decode(errors="replace").count(
                    "first training step done") >= 1 + kills["worker1"]:
                break
            time.sleep(1)
        step = job.chief_step()
        job.wait_for_step(step + 20, timeout=240)
    finally:
        pace.write_text("0")
    rc = job.wait(timeout=600)
    results = job.read_json(f"{MODEL_DIR}/results.json", CHIEF) if rc == 0 else {}
    by_task = collections.defaultdict(list)
    for r in results.get("restarts", []):
        by_task[r["task"]].append(r)
    for f in injector.sent:   # steps lost per fault, from results.json (a freeze loses none)
        r = by_task[f.task].pop(0) if f.kind == chaos.KILL and by_task[f.task] else {}
        f.steps_lost, f.how = (r.get("steps_redone"), r.get("how") or "") if f.kind == chaos.KILL else (0, "")
    faults.write_table(request.config, chaos.render(
        f"compose chaos: 1 ps + 2 workers, {STEPS} steps, seed {SEED}: {len(injector.sent)} faults; job "
        f"{time.monotonic() - t0:.0f} s, load average {os.getloadavg()[0]:.1f}", schedule), TABLE_FILE)

    assert len(injector.sent) == KILLS + STOPS, f"the job ended after {len(injector.sent)} faults"
    assert rc == 0, job.tail()
    assert exit_codes(job) == {"ps0": 0, "worker0": 0, "worker1": 0}
    for service in SERVICES:   # Docker's restart policy started each killed container again
        assert job.container(service).attrs["RestartCount"] == kills[service], service
    assert_nothing_running(job)
    assert results["status"] == "succeeded", results.get("error")
    assert results["global_step"] >= STEPS and results["export_complete"] is True
    # No supervisor saw a crashed container's death: the chief learns of it from the task itself
    # (a ps without variables, a worker's board naming a new start). Two crashes of one ps
    # before the chief's recovery from the first are one recovery, and one entry (docs/faults.md).
    listed = collections.Counter(r["task"] for r in results["restarts"])
    assert set(listed) == set(kills) and all(listed[t] <= n for t, n in kills.items()), \
        f"results.json lists {dict(listed)} for the kills {dict(kills)}: {results['restarts']}"
    container_smtp_server.wait_for(1, timeout=60)
    time.sleep(2)   # a second message would come now
    faults.assert_one_success_message([str(m["Subject"]) for m in container_smtp_server.messages])
    assert results["eval_metrics"]["accuracy"] >= 0.95, results["eval_metrics"]
