"""docker compose runs a tfps job on one machine and the job ends by itself.

Every test starts a real compose project (its own project name, network and volume)
from a file written by ``tfps compose`` (the first one from the committed
compose/docker-compose.yml itself), runs it with exactly the command the file's header
and the README give, and removes it with ``docker compose down -v`` afterwards.
Docker is read through the docker SDK and ``docker compose ps --format json``; files on
the job's volume are read from the stopped chief container (``get_archive``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import faults
import numpy as np
import pytest
from composejob import CHIEF, MODEL_DIR, UP, ComposeJob
from faults import Row
from hardening import assert_hardened

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "compose"
#: The image's user (Dockerfile: useradd --uid 10001).
UID = 10001
STOPPED = 143  # tfps.exitcodes.ExitCode.STOPPED_TERM: `docker compose stop` sends SIGTERM


def write_url_file(path: Path, *urls: str) -> Path:
    """A file of notification URLs as docs/security.md says: the image user's, mode 0400."""
    path.write_text("\n".join(urls) + "\n")
    os.chown(path, UID, UID)   # the tests run as root, as CI does
    path.chmod(0o400)
    return path


def generate(directory: Path, *args: str, image: str) -> None:
    """``tfps compose ... -o directory/docker-compose.yml`` through the real command line."""
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tfps", "compose", "--image", image, "-o",
           str(directory / "docker-compose.yml"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr


def exit_codes(job: ComposeJob) -> dict[str, int]:
    return {service: record["ExitCode"] for service, record in job.ps().items()}


def assert_nothing_running(job: ComposeJob) -> None:
    assert job.ps(all_=False) == {}, "containers still running after the job"
    running = [c.name for c in job.containers() if c.status not in ("exited", "dead", "created")]
    assert running == []


# --------------------------------------------------------------------------------------


def test_committed_file_runs_to_completion(compose_job, tfps_image, tmp_path):
    """(a) + (d): the committed docker-compose.yml, unchanged, ends by itself with exit 0.

    Every task container is hardened (CapDrop ALL, no-new-privileges, read-only rootfs,
    tmpfs /tmp, pids limit, rotating json-file logs), and the job still succeeds.

    The chief's checkpoint, SavedModel and results.json are on the volume, every container
    exited 0, and nothing is left running. The committed file sends no message (the URLs
    come only from a file given to `tfps compose --notify_urls_file`), so no task has any
    URL or URL file; the email through compose is checked by the fault tests and
    test_security.py.
    """
    directory = tmp_path / "compose"
    directory.mkdir()
    text = (COMPOSE_DIR / "docker-compose.yml").read_text()
    if tfps_image != "tfps:latest":
        # The committed file quotes the image name: replace it quoted or not, and check
        # that the job really runs the image under test.
        text = re.sub(r'image: "?tfps:latest"?', f'image: "{tfps_image}"', text)
        assert "tfps:latest" not in text
    (directory / "docker-compose.yml").write_text(text)
    job = compose_job(directory)

    t0 = time.monotonic()
    rc = job.run(timeout=400)
    elapsed = time.monotonic() - t0
    assert rc == 0, job.tail()

    assert exit_codes(job) == {"ps0": 0, "worker0": 0, "worker1": 0}
    assert_nothing_running(job)
    # Hardened (docs/security.md), and the job still succeeded: the volume stays writable.
    for service in ("ps0", "worker0", "worker1"):
        attrs = job.container(service).attrs
        assert_hardened(service, attrs)
        assert attrs["HostConfig"]["PidsLimit"] == 4096

    results = job.read_json(f"{MODEL_DIR}/results.json")
    assert results["status"] == "succeeded"
    assert results["exit_code"] == 0
    assert results["global_step"] >= results["train_steps"] == 1000
    assert results["export_complete"] is True
    assert results["cluster"] == {"ps": ["ps0:2222"], "worker": ["worker0:2222", "worker1:2222"]}
    assert results["host"] == CHIEF
    files = job.files(MODEL_DIR)
    step = results["global_step"]
    assert f"model.ckpt-{step}.index" in files and "checkpoint" in files
    assert "export/saved_model.pb" in files and "export/tfps_export.json" in files
    assert any(name.startswith("events.out.tfevents") for name in files), "no TensorBoard event file"

    # No notification settings at all: no URL and no URL file in any task.
    for service in ("ps0", "worker0", "worker1"):
        attrs = job.container(service).attrs
        assert not [e for e in attrs["Config"]["Env"] if e.startswith("APPRISE_URLS")], service
        assert not [m for m in attrs["Mounts"] if m["Destination"].startswith("/run/secrets")], service
    print(f"compose job of 1000 steps: {elapsed:.1f} s")


def tfps_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``tfps ARGS`` on this machine (the compose backend reads this machine's Docker engine)."""
    return subprocess.run([sys.executable, "-m", "tfps", *args], capture_output=True, text=True, timeout=timeout)


def test_stop_chief_writes_final_save_within_grace(compose_job, tfps_image, tmp_path):
    """(b) ``tfps stop --compose`` mid-run (the chief's container first, as ``docker compose stop
    worker0``): final checkpoint + export, status "stopped". Before it, ``tfps jobs --compose``
    lists the job running and ``tfps logs --compose`` shows the chief's lines (tfps.backends.compose).

    The model's export sleeps 12 s (tests/fixtures/slow_model.py), longer than Docker's
    default 10 s grace, so only the generated ``stop_grace_period`` lets it finish. The ps
    and the other worker then end by themselves (exit 0) through the chief's stop flag.
    """
    final_save_timeout = 60
    directory = tmp_path / "stop"
    generate(directory, "--ps", "1", "--workers", "2", "--user_model_dir", str(REPO / "tests" / "fixtures"),
             "--model", "slow_model:model_fn", "--train_steps", "200000", "--log_steps", "20",
             "--final_save_timeout", str(final_save_timeout), image=tfps_image)
    job = compose_job(directory)
    job.start()
    reached = job.wait_for_step(100, timeout=240)

    listed = tfps_cli("jobs", "--compose")
    assert listed.returncode == 0, listed.stderr
    row = next(line.split() for line in listed.stdout.splitlines() if line.startswith(job.project + " "))
    assert row[1] == "running", listed.stdout
    shown = tfps_cli("logs", "--compose", job.project, CHIEF, "-n", "5")
    lines = shown.stdout.splitlines()
    assert shown.returncode == 0 and 0 < len(lines) <= 5, (shown.stdout, shown.stderr)
    assert all(line.startswith(f"[{CHIEF}] ") for line in lines), lines

    t0 = time.monotonic()
    stopped = tfps_cli("stop", "--compose", "--job", job.project, timeout=final_save_timeout + 180)
    stop_s = time.monotonic() - t0
    assert stopped.returncode == 0, stopped.stderr
    assert "then the other tasks ended by themselves" in stopped.stdout, stopped.stdout
    rc = job.wait(timeout=120)

    from tfps.config import grace_period

    assert stop_s < grace_period(final_save_timeout), f"stop took {stop_s:.0f} s"
    assert rc == STOPPED, job.tail()
    codes = exit_codes(job)
    assert codes[CHIEF] == STOPPED, "the chief was killed instead of finishing its final save"
    assert codes["ps0"] == 0 and codes["worker1"] == 0, codes
    assert_nothing_running(job)
    assert job.container(CHIEF).attrs["RestartCount"] == 0, "a stopped chief must stay down"

    results = job.read_json(f"{MODEL_DIR}/results.json")
    assert results["status"] == "stopped"
    assert results["global_step"] >= reached
    assert results["export_complete"] is True
    assert results["times"]["final_save_s"] >= 12, results["times"]
    files = job.files(MODEL_DIR)
    assert f"model.ckpt-{results['global_step']}.index" in files
    assert "export/saved_model.pb" in files


#: Long enough that the kill lands between the first and the last checkpoint: an async job
#: trains several hundred steps a second here, about as many as pass while the chief's
#: step is read (docker exec) and the task killed.
FAULT_STEPS = 3000
FAULT_CHECKPOINT = 600          # the default: train_steps / 5


def task_process(container) -> int:
    """Host pid of the task's training process (the one the OOM killer would pick): the
    ``python -m tfps`` child of the container's ``tfps run --restarts`` supervisor."""
    top = container.top(ps_args="-o pid,args")
    pids = [int(row[0]) for row in top["Processes"] if "-m tfps run" in row[1]]
    assert len(pids) == 1, top["Processes"]
    return pids[0]


# What a container adds to a killed task: the task process starts again inside its container
# (`tfps run --restarts`), so `docker compose up --exit-code-from worker0` does not end the job
# at the chief's death; the email comes through the compose secret and the SavedModel from
# the job's volume. Every task restarted as plain processes is the integration matrix
# (tests/integration/test_faults.py, and test_chaos.py for async jobs); the ps and the chief of a sync job
# under `tfps run --restarts`, tests/integration/test_story.py; a killed chief of a sync job
# on a host, restarted by Docker's restart policy, test_ansible.py. In a container: the chief
# of an async job (worker1 may train the rest meanwhile; the restarted chief still joins,
# saves, exports and sends the one message), on the job of test_security.py's compose test
# (whose notification and least-privilege checks then also hold across the restart).
COMPOSE_FAULT = ("worker0", "async")


def sigkill_and_recover(job, victim: str, mode: str, fault_table: list) -> dict:
    """SIGKILL ``victim``'s training process (as the OOM killer would) at a random step
    between the first and the last checkpoint of the started ``job``
    (``FAULT_STEPS``/``FAULT_CHECKPOINT``): it starts again in its container, the job
    completes at its global step with every task exiting 0, no more than one checkpoint
    interval is redone, and the SavedModel, read from the chief's volume, loads and predicts.
    (Docker's restart policy alone would not do for the chief: `up --exit-code-from` ends
    the job at the chief container's first exit.) Returns results.json; the caller checks
    the one completion message."""
    target = faults.kill_target(FAULT_STEPS, FAULT_CHECKPOINT, margin=20)
    # A caller that looked at the job first (test_security.py) may find it past that step:
    # then a step soon after the current one, still before the last checkpoint.
    last = FAULT_STEPS - FAULT_CHECKPOINT - 20
    now = job.chief_step()
    assert now + 20 <= last, f"the chief was at step {now} before the kill could be placed (by step {last})"
    job.wait_for_step(max(target, now + 20), timeout=300)

    container = job.container(victim)
    assert container.status == "running"
    os.kill(task_process(container), signal.SIGKILL)
    t_kill = time.time()

    # Recovered: the chief logs progress again, stamped after the kill and its restart. The
    # step at the kill: the chief's last progress record from before it.
    kill_step, recover_s = None, None
    end = time.monotonic() + 240
    while recover_s is None and time.monotonic() < end and job._up.poll() is None:
        records = job.history()
        if records is not None:
            if kill_step is None:
                kill_step = faults.step_at(records, t_kill)
            recover_s = faults.recovered_after(records, t_kill)
        time.sleep(0.5)

    rc = job.wait(timeout=400)
    assert rc == 0, job.tail()
    assert kill_step is not None, "the chief's history could not be read after the kill"
    container.reload()
    # Started again inside its container (`tfps run --restarts`), so `up` never saw it exit.
    assert "the task process was killed by SIGKILL; starting it again (1/3)" in \
        container.logs().decode(errors="replace"), f"{victim} was not restarted"
    assert container.attrs["RestartCount"] == 0
    codes = exit_codes(job)
    assert codes == {"ps0": 0, "worker0": 0, "worker1": 0}, \
        f"exit codes {codes}\n" + "\n".join(job.container(s).logs(tail=40).decode(errors="replace")
                                            for s in codes if codes[s])
    assert_nothing_running(job)
    results = job.read_json(f"{MODEL_DIR}/results.json")
    assert results["status"] == "succeeded"
    assert results["global_step"] >= FAULT_STEPS
    assert results["export_complete"] is True

    # Steps redone: from the step at the kill back to the checkpoint the chief restored.
    chief_log = job.container(CHIEF).logs(since=int(t_kill)).decode(errors="replace")
    row = Row(victim, mode, "yes", recover_s, kill_step, faults.resumed_from(chief_log, victim == "worker1", kill_step, victim))
    fault_table.append(row)
    faults.assert_redone_at_most(row, FAULT_CHECKPOINT)
    victim_log = container.logs().decode(errors="replace")
    if victim == "worker1" and victim_log.count("first training step done") < 2:
        # The job ended before the restarted worker trained a step (async steps are fast):
        # the chief learns of a non-chief's restart from its board, which that process
        # never wrote. Its restart is in its own log (checked above); not in the story.
        assert [r["task"] for r in results["restarts"]] in ([], ["worker1"]), results["restarts"]
    else:
        faults.assert_story(results, victim, row, "killed by SIGKILL")

    # The SavedModel loads and predicts, read from the job's volume (the chief's container).
    import tensorflow as tf
    with tempfile.TemporaryDirectory(prefix="tfps-export-") as export:
        for name, data in job.files(f"{MODEL_DIR}/export", CHIEF).items():
            if data is not None:
                os.makedirs(os.path.join(export, os.path.dirname(name)), exist_ok=True)
                Path(export, name).write_bytes(data)
        serve = tf.saved_model.load(export).signatures["serving_default"]
        shape = [d or 4 for d in serve.structured_input_signature[1]["features"].shape.as_list()]
        out = serve(features=tf.constant(np.random.default_rng(0).normal(size=shape), tf.float32))
        faults.assert_predicts(json.dumps({k: v.numpy().shape[0] for k, v in out.items()}))
    return results


def test_gpu_example_is_valid_compose(compose_cli, tmp_path):
    """The committed GPU example passes ``docker compose config`` (no GPU needed) with one GPU per worker."""
    proc = subprocess.run(["docker", "compose", "-f", "docker-compose.gpu.yml", "config", "--format", "json"],
                          cwd=COMPOSE_DIR, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)
    services = config["services"]
    assert set(services) == {"ps0", "worker0", "worker1"}  # the tensorboard profile is off
    for index in (0, 1):
        devices = services[f"worker{index}"]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "device_ids": [str(index)], "capabilities": ["gpu"]}]
    assert "deploy" not in services["ps0"]


def test_default_file_settings_as_compose_reads_them(compose_cli, tmp_path):
    """What compose makes of the committed file: grace, restart policy, no URLs anywhere;
    and of a file generated with --notify_urls_file: a secret of the chief only, whose
    URL `docker compose config` does not show."""
    (tmp_path / "docker-compose.yml").write_text((COMPOSE_DIR / "docker-compose.yml").read_text())
    (tmp_path / ".env").write_text("APPRISE_URLS='json://host.docker.internal:8080/hook'\n")   # read by nobody
    proc = subprocess.run(["docker", "compose", "--profile", "tensorboard", "config", "--format", "json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    from tfps.config import DEFAULT_FINAL_SAVE_TIMEOUT, grace_period

    grace = grace_period(DEFAULT_FINAL_SAVE_TIMEOUT)
    for name in ("ps0", "worker0", "worker1"):
        s = services[name]
        assert s["stop_grace_period"] in (f"{grace}s", f"{grace // 60}m{grace % 60}s"), s["stop_grace_period"]
        assert s["restart"] == "on-failure:3"
        assert s["user"] == "10001:10001"
        assert s["volumes"][0]["source"] == "tfps-data" and s["volumes"][0]["target"] == "/data"
        assert "ports" not in s, "TF ports must not be published"
        assert "init" not in s
    # A .env beside the file reaches no task's environment.
    for name in ("ps0", "worker0", "worker1"):
        assert not [k for k in services[name]["environment"] if k.startswith("APPRISE_URLS")], name
        assert "secrets" not in services[name], name
    assert "hook" not in proc.stdout
    tb = services["tensorboard"]
    assert tb["ports"][0]["host_ip"] == "127.0.0.1"
    assert tb["volumes"][0]["read_only"] is True
    # The documented command is the one the header gives.
    assert f"#   docker compose {shlex.join(UP)}" in (COMPOSE_DIR / "docker-compose.yml").read_text()

    with_urls = tmp_path / "with-urls"
    with_urls.mkdir()
    urls = write_url_file(with_urls / "notify_urls", "mailto://ops:hunter2222@host.docker.internal?from=t@example.com")
    generate(with_urls, "--notify_urls_file", str(urls), image="tfps:latest")
    proc = subprocess.run(["docker", "compose", "config", "--format", "json"], cwd=with_urls, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)
    assert config["secrets"]["notify_urls"]["file"] == str(urls)
    chief = config["services"]["worker0"]
    assert [(s["source"], s["target"]) for s in chief["secrets"]] == [("notify_urls", "notify_urls")]
    assert chief["environment"]["APPRISE_URLS_FILE"] == "/run/secrets/notify_urls"
    for name in ("ps0", "worker1"):
        assert "secrets" not in config["services"][name] and "APPRISE_URLS_FILE" not in config["services"][name]["environment"]
    assert "hunter2222" not in proc.stdout
