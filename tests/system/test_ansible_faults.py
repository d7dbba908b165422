"""Faults on the test hosts (issue 51): five faults in one job deployed by deploy.yml, and a
Docker engine restarted under a running task (the two jobs run side by side, on host1+host2
and on host3, so that the second costs little more than the first). The hosts, the image
archive and the SMTP server are the session's (conftest.py)."""

from __future__ import annotations

import collections
import json
import re
import time
from pathlib import Path

import chaos
import faults
import hostchaos
import pytest
from plays import IMAGE, LAYOUT, assert_ok, job_vars, no_containers_anywhere, paced, play_vars, section
from test_ansible import IPTABLES_PLUGIN

#: Long enough that the first fault lands between the first and the last checkpoint (an
#: unpaced sync job trains a few hundred steps in seconds; see test_compose.py).
FAULT_STEPS = 900
FAULT_CHECKPOINT = 300
#: The fault job's layout: ps0 on host1, the chief and worker1 on host2, so that it runs
#: beside the engine-restart job, whose host3 loses its engine meanwhile.
FAULT_LAYOUT = {"ps": ["host1"], "worker": {"host2": {"tfps_workers": 2}}}
TASK_HOST = {"ps0": "host1", "worker0": "host2", "worker1": "host2"}
#: Five faults (issue 51), 1-3 s apart from a step between the first and the last checkpoint:
#: seed 52 crashes ps0, worker1 and the chief (SIGKILL of the container's PID 1 on its host;
#: Docker's restart policy starts it again) and then pauses the chief and ps0 for 1-2 s.
FAULT_SEED, FAULT_KILLS, FAULT_STOPS = 52, 3, 2
#: The same job without faults (1 ps + 2 workers, sync, batch 32, 900 steps of the MLP on the
#: demo data): eval accuracy 0.992 in each of two runs of `tfps local` on 2026-12-08.
CLEAN_ACCURACY = 0.98
FAULT_TABLE = Path(__file__).with_name(".ansible-chaos-table.txt")
#: The limit of both plays of this module: when it runs alone (``-k``), its deploys are the
#: session's first, which copy and load the image archive on the hosts: at a load of 30-50 the
#: play was killed at 600 s while it copied it (run_playbook's default).
PLAY_TIMEOUT = 1200


def _history(host, job: str) -> list[dict]:
    code, out = host.sh(f"cat /srv/tfps/{job}/history.jsonl", check=False)
    return faults.history(out) if code == 0 else []


def _recovered(records: list[dict], f) -> float | None:
    """Seconds from the fault until the chief recorded progress again (more than a second
    after the fault, or after the unpause): in a sync job no step is made without every task."""
    later = [r["time"] for r in records if r["time"] > f.wall + f.hold_s + 1]
    return round(min(later) - f.wall, 1) if later else None


@pytest.mark.system
@pytest.mark.timeout(1800)   # the session's first deploy, when run alone: see PLAY_TIMEOUT
def test_five_faults_on_the_hosts_and_the_job_completes(bare_metal, image_archive, network_smtp_server, run_playbook,
                                                        tmp_path, request, engine_restart):
    """Five faults in one sync job deployed by deploy.yml (tests/chaos.py's injector, hostchaos.py):
    the ps0, worker1 and chief containers crash and Docker's restart policy starts each again,
    the chief and ps0 are paused for a second or two. deploy.yml reports the job succeeded at
    its step; results.json lists the chief's crash and every crash the job recovered from on
    its own, none redoing more than a checkpoint interval; no timer of tfps fired; the
    SavedModel loads and predicts on the chief's host, as well as the job without faults; exactly one
    completion email arrives and no container is left. Per fault: seconds until the chief
    trained again, steps lost (table in the output). (The engine-restart job runs on host3
    meanwhile: test_engine_restart_... judges it.)"""
    import threading
    job = "faults"
    inventory = bare_metal.inventory(tmp_path / "inventory", FAULT_LAYOUT, group_vars={"all": job_vars(
        job, image_archive, network_smtp_server, tfps_train_steps=FAULT_STEPS,
        tfps_checkpoint_steps=FAULT_CHECKPOINT, tfps_sync_replicas=True, tfps_extra_args=["--log_steps=20"])})
    box: dict = {}
    deploy = threading.Thread(target=lambda: box.update(result=run_playbook(
        "deploy.yml", inventory, play_vars(tmp_path), timeout=PLAY_TIMEOUT)))
    deploy.start()
    chief_host = bare_metal["host2"]
    target = faults.kill_target(FAULT_STEPS, FAULT_CHECKPOINT, margin=20)
    # A look a second (a docker exec into the host, and the host's own): the first fault lands
    # up to a second of steps past the target, which is random anyway. No clock of the test's
    # own: the play's limit (run_playbook's timeout) bounds the wait; the first deploy of a
    # session copies the image archive to the hosts, minutes on a loaded machine.
    while max((r["step"] for r in _history(chief_host, job)), default=0) < target:
        assert deploy.is_alive(), box.get("result") and box["result"].output[-3000:]
        time.sleep(1)
    containers = {task: (bare_metal[host], f"tfps-{job}-{task}") for task, host in TASK_HOST.items()}
    schedule = chaos.schedule(FAULT_SEED, list(TASK_HOST), FAULT_KILLS, FAULT_STOPS, (1.0, 3.0), (1.0, 2.0))
    injector = chaos.Chaos(schedule, lambda task: hostchaos.find(*containers[task]),
                           lambda: max((r["step"] for r in _history(chief_host, job)), default=None),
                           deploy.is_alive, send=hostchaos.send, resume=hostchaos.resume)
    injector.start()
    injector.join(300)
    sent = injector.sent
    kills = collections.Counter(f.task for f in sent if f.kind == chaos.KILL)
    # Docker started each crashed container again, once per crash (and no other death): read
    # while the job runs (the play removes the containers at its end).
    restarts_seen: dict[str, int | None] = {}
    while deploy.is_alive():
        restarts_seen = {t: hostchaos.restart_count(*containers[t]) for t in TASK_HOST}
        if all((restarts_seen[t] or 0) >= kills[t] for t in TASK_HOST):
            break
        time.sleep(2)
    deploy.join(PLAY_TIMEOUT)
    result = box["result"]
    records = _history(chief_host, job)
    results = json.loads((tmp_path / "results" / "latest" / "results.json").read_text())
    by_task = collections.defaultdict(list)
    for r in results.get("restarts", []):
        by_task[r["task"]].append(r)
    for f in sent:   # steps lost per fault, from results.json (a freeze loses none)
        f.recover_s = _recovered(records, f)
        r = by_task[f.task].pop(0) if f.kind == chaos.KILL and by_task[f.task] else {}
        f.steps_lost, f.how = (r.get("steps_redone"), r.get("how") or "") if f.kind == chaos.KILL else (0, "")
    faults.write_table(request.config, chaos.render(
        f"Ansible faults: ps0 on host1, the chief and worker1 on host2, sync, {FAULT_STEPS} steps, a checkpoint "
        f"every {FAULT_CHECKPOINT}, seed {FAULT_SEED}: {len(sent)} faults (SIGKILL: a crash of the container; "
        f"SIGSTOP: docker pause); play {result.seconds:.0f} s", schedule) + chaos.summary(schedule), FAULT_TABLE)

    assert len(sent) == FAULT_KILLS + FAULT_STOPS, f"the job ended after {len(sent)} faults"
    assert_ok(result, "deploy.yml with five faults")
    assert restarts_seen == dict(kills) | {t: 0 for t in TASK_HOST if not kills[t]}, restarts_seen
    assert results["status"] == "succeeded" and results["global_step"] >= FAULT_STEPS
    assert results["export_complete"] is True
    assert re.search(rf"tfps-{job}-ps0 exit 0\b", result.output), result.output[-3000:]
    logs = {t: (tmp_path / "results" / "latest" / "logs" / f"{t}.log").read_text(errors="replace") for t in TASK_HOST}
    fired = [f"[{t}] {line}" for t, text in logs.items() for line in text.splitlines()
             if re.search(chaos.TIMER_FIRED, line)]
    assert not fired, "a timer ended or gave up on a task that no fault had hit:\n" + "\n".join(fired[:10])

    # Every crash of the chief is one attempt of it, and every crash the job recovered from on
    # its own is an entry; none redid more than a checkpoint interval, a lost worker nothing.
    listed = collections.Counter(r["task"] for r in results["restarts"])
    needed = chaos.must_be_listed(sent, "worker0")
    assert listed["worker0"] == kills["worker0"], f"results.json lists {dict(listed)} for {dict(kills)}"
    for task in ("ps0", "worker1"):
        assert needed[task] <= listed[task] <= kills[task], (task, dict(needed), results["restarts"])
    for r in results["restarts"]:
        assert (r.get("steps_redone") or 0) <= FAULT_CHECKPOINT, r
        if r["task"] == "worker1":
            assert r.get("steps_redone") in (0, None), r
    missed = [f"#{i + 1} {f.task} {f.kind}" for i, f in enumerate(schedule) if f.at is not None and f.recover_s is None]
    assert not missed, f"no recovery seen after {missed}"
    accuracy = results["eval_metrics"]["accuracy"]
    assert accuracy >= CLEAN_ACCURACY - 0.02, f"accuracy {accuracy:.3f} after the faults, {CLEAN_ACCURACY} without"

    # The SavedModel on the chief's host loads and predicts (a fresh container of the image).
    script = faults.predict_script("/m/export")
    out = chief_host.sh(f"docker run --rm --entrypoint python -v /srv/tfps/{job}:/m:ro {IMAGE} -c \"{script}\"")[1]
    faults.assert_predicts(out)

    network_smtp_server.wait_for(1, timeout=30)
    time.sleep(2)
    subjects = [str(m["subject"]) for m in network_smtp_server.messages if f"job {job} " in str(m["subject"])]
    faults.assert_one_success_message(subjects)
    no_containers_anywhere(bare_metal, job)


class EngineRestart:
    """The engine-restart job (test_engine_restart_...), driven in a thread of its own so that
    it runs while the fault test's job runs on the other hosts: its worker steps sleep,
    so most of its time is waiting. ``outcome()`` joins it and re-raises what went wrong."""

    JOB = "engine"
    # Long enough that the job still runs when worker1 is back: each worker step takes at
    # least 0.05 s, so the chief alone needs 150 s or more for the whole job (an engine
    # restart and worker1's return take well under a minute); both workers together about 75 s.
    STEPS = 3000

    def __init__(self, bare_metal, image_archive, run_playbook, paced_model_dir, workdir: Path):
        import threading
        self.bare_metal, self.run_playbook, self.workdir = bare_metal, run_playbook, workdir
        self.inventory = bare_metal.inventory(workdir / "inventory", LAYOUT, group_vars={"all": job_vars(
            self.JOB, image_archive, tfps_train_steps=self.STEPS, tfps_checkpoint_steps=1000,
            **paced(paced_model_dir))})
        self.result = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._drive()
        except BaseException as e:   # re-raised by outcome(), in the test
            self.error = e

    def _drive(self) -> None:
        import threading
        job, host3 = self.JOB, self.bare_metal["host3"]
        host3.sh("DEBIAN_FRONTEND=noninteractive apt-get remove -y -q iptables-persistent")
        assert host3.sh(f"test -e {IPTABLES_PLUGIN}", check=False)[0] != 0
        box: dict = {}
        deploy = threading.Thread(target=lambda: box.update(result=self.run_playbook(
            "deploy.yml", self.inventory, play_vars(self.workdir), timeout=PLAY_TIMEOUT)))
        deploy.start()
        container = f"tfps-{job}-worker1"
        logs = f"docker logs {container} 2>&1"
        # The play's own limit (run_playbook's timeout): the first deploy of a session copies the
        # image archive to the hosts before any task starts, minutes on a loaded machine.
        deadline = time.monotonic() + PLAY_TIMEOUT
        while "first training step done" not in host3.sh(logs, check=False)[1]:
            assert deploy.is_alive() and time.monotonic() < deadline, box.get("result") and box["result"].output[-3000:]
            time.sleep(1)
        started = host3.sh(f"docker inspect {container} --format '{{{{.State.StartedAt}}}}'")[1].strip()

        host3.sh("kill -TERM $(cat /var/run/docker.pid)")          # the engine restarts (host-init's loop)
        deadline = time.monotonic() + 120
        while True:
            code, out = host3.sh(f"docker inspect {container} --format '{{{{.State.StartedAt}}}} {{{{.State.Running}}}}'",
                                 check=False)
            if code == 0 and out.split()[0] != started and out.split()[1] == "true":
                break
            assert time.monotonic() < deadline, f"{container} did not come back after the engine restart: {out}"
            time.sleep(1)
        # worker1 trained again after the restart (its container's log holds both runs).
        deadline = time.monotonic() + 120
        while host3.sh(logs, check=False)[1].count("first training step done") < 2:
            assert deploy.is_alive() and time.monotonic() < deadline, "worker1 did not rejoin the job"
            time.sleep(1)
        deploy.join(600)
        self.result = box["result"]

    def outcome(self):
        self.thread.join(1500)
        assert not self.thread.is_alive(), "the engine-restart job did not end"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture(scope="module")
def engine_restart(bare_metal, image_archive, run_playbook, paced_model_dir, tmp_path_factory):
    """The engine-restart job, started by the first test that asks for it (the fault
    test, whose job runs on host1 and host2 meanwhile) and judged by
    test_engine_restart_mid_job_...; its containers are removed at the module's end."""
    driver = EngineRestart(bare_metal, image_archive, run_playbook, paced_model_dir,
                           tmp_path_factory.mktemp("engine"))
    yield driver
    driver.thread.join(1500)
    for host in bare_metal.hosts:
        for name in host.containers(f"tfps.job={EngineRestart.JOB}"):
            host.sh(f"docker rm -f {name}", check=False)


@pytest.mark.system
@pytest.mark.timeout(1800)   # the job runs beside the fault test's job
def test_engine_restart_mid_job_brings_the_task_back_and_the_job_completes(bare_metal, engine_restart):
    """The Docker engine of worker1's host restarts mid-job (as an upgrade does): the engine
    stops worker1's container, starts it again by its restart policy, worker1 rejoins, and the
    job completes at its global step. worker1's host is a fresh server without
    iptables-persistent: the play installs it there alone (tfps_firewall)."""
    job, steps, workdir = EngineRestart.JOB, EngineRestart.STEPS, engine_restart.workdir
    host3 = bare_metal["host3"]
    result = engine_restart.outcome()
    assert_ok(result, "deploy.yml with an engine restart")
    installed = section(result.output, "Install iptables-persistent, which keeps the firewall rules across a reboot")
    assert "changed: [host3]" in installed and "changed: [host2]" not in installed, installed
    assert host3.sh(f"test -x {IPTABLES_PLUGIN}", check=False)[0] == 0
    assert f'--comment "tfps {job} worker1"' in host3.sh("cat /etc/iptables/rules.v4")[1]
    # While it waited, the play showed where the job stood, once per look that found it further on.
    progress = re.findall(rf"host2: job {job} step (\d+)/{steps} \(\d+%\) \| loss [\d.]+ \| \d+ examples/s \| ETA \d+ s",
                          result.output)
    assert len(progress) >= 2 and int(progress[-1]) > int(progress[0]), result.output[-4000:]
    results = json.loads((workdir / "results" / "latest" / "results.json").read_text())
    assert results["status"] == "succeeded" and results["global_step"] >= steps
    assert results["export_complete"] is True
    # The ps waited for worker1 and left by itself (not stopped by deploy.yml after the
    # chief): the SIGTERM of the engine's stop did not count as worker1 being done.
    assert re.search(rf"tfps-{job}-ps0 exit 0\b", result.output), result.output[-3000:]
    ps_log = (workdir / "results" / "latest" / "logs" / "ps0.log").read_text(errors="replace")
    assert "ps0: every worker is done" in ps_log, ps_log[-3000:]
    no_containers_anywhere(bare_metal, job)
