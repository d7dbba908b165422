"""What the Ansible system tests share: the job settings of a test inventory, the play's
settings, reading a play's output, and the one finished job that several tests read
(``finished_job``, a session fixture of conftest.py made by :func:`deploy_finished_job`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
#: The tfps image the session fixtures build and save (see tests/system/conftest.py).
IMAGE = os.environ.get("TFPS_TEST_IMAGE", "tfps:latest")
PLAYBOOKS = ["deploy.yml", "stop.yml", "status.yml", "cleanup.yml"]
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
LAYOUT = {"ps": ["host1"], "worker": ["host2", "host3"]}  # ps0 on host1, chief on host2, worker1 on host3


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counts per host."""
    return {m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
            for m in RECAP.finditer(output)}


def job_vars(job: str, archive: Path, smtp=None, **extra) -> dict:
    """group_vars/all.yml of a test inventory: a tiny job from the image archive."""
    values = {
        "tfps_job_name": job,
        "tfps_train_steps": 300,
        "tfps_batch_size": 32,
        "tfps_checkpoint_steps": 100,
        "tfps_final_save_timeout": 60,
        "tfps_image": IMAGE,
        "tfps_image_archive": str(archive),
    }
    if smtp is not None:
        values["tfps_notify_urls"] = [smtp.url()]
    values.update(extra)
    return values


def paced(model_dir: Path, step_secs: float = 0.05) -> dict:
    """Job settings of a job that runs slowly on purpose: each worker step sleeps ``step_secs``
    (paced_model_dir of conftest.py), so that a job that only has to be running leaves the
    cores to the plays and the tests that look at it."""
    return {"tfps_model": "paced_model:model_fn", "tfps_user_model_dir": str(model_dir),
            "tfps_env": {"TFPS_TEST_STEP_SECS": str(step_secs)}}


def play_vars(tmp_path: Path, memory_check: bool = False) -> dict:
    """Settings of the play itself (not inventory: `tfps plan` checks only job settings).

    The memory estimate (TensorFlow building the model's graph on the controller, 10-20 s a
    play on a loaded machine) is off, except in the tests that pass ``memory_check=True``
    and show it on a real play: the first deploy (a user's tf.keras model) and the one with
    tfps_data_src (the data from the controller). The estimate itself is tested in
    tests/unit/test_memory_plan.py and tests/integration/test_local_memory_plan.py."""
    return {"tfps_results_dir": str(tmp_path / "results"), "tfps_wait_poll_interval": 10, "tfps_settle_timeout": 60,
            "tfps_memory_check": memory_check}


def section(output: str, task: str) -> str:
    """The lines of one task of the play's output."""
    match = re.search(rf"^TASK \[tfps : {re.escape(task)}\].*?$(.*?)(?=^TASK \[|^PLAY RECAP)", output, re.M | re.S)
    assert match, f"no task {task!r} in the output"
    return match.group(1)


def assert_ok(result, what: str) -> None:
    assert result.returncode == 0, f"{what} failed (log {result.log}):\n{result.output[-6000:]}"


def no_containers_anywhere(bare_metal, job: str) -> None:
    for host in bare_metal.hosts:
        assert host.containers(f"tfps.job={job}") == [], f"{host.name} has containers of job {job}"


# ------------------------------------------------------------------ the shared finished job
#: The notification password of the finished job (and of test_security.py's compose job):
#: every character that trips URLs up; its pieces are distinctive enough to be searched
#: for alone, so a URL that was cut apart and half-masked is found too.
#: The finished job's length and its versions (--export_every in global steps, --keep_exports):
#: long enough for a few versions while it trains, even on a loaded machine (300 steps of
#: its model train in 2 s here, as long as one export).
FINISHED_STEPS, FINISHED_EXPORT_EVERY, FINISHED_KEEP = 2000, 100, 3
SMTP_USER = "ops"
PASSWORD = "hunter7Qx@ploverK%Zw9rk;mirth4T/oxbow2U"
ENCODED = quote(PASSWORD, safe="")  # hunter7Qx%40ploverK%25Zw9rk%3Bmirth4T%2Foxbow2U
PIECES = ("hunter7Qx", "ploverK", "Zw9rk", "mirth4T", "oxbow2U")


@dataclass
class FinishedJob:
    """One job deployed by deploy.yml and trained to its end, its containers kept for the
    tests that read it (test_ansible.py: what a deploy leaves; test_security.py: where the
    vaulted password went)."""

    job: str
    result: object                      # the PlayResult of deploy.yml
    results_dir: Path                   # tfps_results_dir of the play
    image_id: str                       # the archive's image
    stale_image_id: str                 # what host3 held under the tag before the play
    messages: list = field(default_factory=list)   # what the SMTP server received
    logins: list = field(default_factory=list)     # (peer, user, password) of its AUTH logins


def archive_image_id(archive: Path) -> str:
    """The id of the image in a ``docker save`` archive (its manifest's config blob): the
    image the hosts get, even where this machine's tag has moved on since (a rebuild)."""
    with tarfile.open(archive) as tar:
        config = json.load(tar.extractfile("manifest.json"))[0]["Config"]
    return "sha256:" + config.rsplit("/", 1)[-1].removesuffix(".json")


def deploy_finished_job(bare_metal, archive: Path, run_playbook, workdir: Path, smtp) -> FinishedJob:
    """deploy.yml -vvv of job "airgap" on fresh hosts, to its end, with:

    * the image from the archive (no registry) where a host lacks it: host3 holds a stale,
      different image under tfps's tag beforehand, so the play copies and loads the archive
      there; host1 and host2 already hold the archive's image (loaded from it beforehand,
      as a site's earlier deploy would have left it), so the play copies nothing to them;
    * a user's tf.keras model as TensorFlow's tutorials write it, from tfps_user_model_dir;
    * hardening options: tfps_pids_limit, per-role limits, log rotation; containers kept;
    * the notification URL (with PASSWORD, needing SMTP AUTH at ``smtp``) in a
      Vault-encrypted group_vars/all/vault.yml;
    * versions while it trains (tfps_export_every, tfps_keep_exports: FINISHED_*);
    * the memory estimate on.
    """
    job = "airgap"
    bin_dir = Path(sys.executable).parent
    image_id = archive_image_id(archive)
    host3 = bare_metal["host3"]
    # host1 and host2 get the archive's image without the play: a plain `docker load` into
    # their engines (gigabytes less over SSH, and no checksums of them on either side).
    loads = []
    for host in (bare_metal["host1"], bare_metal["host2"]):
        with open(archive, "rb") as tar:   # each load reads the file from its own descriptor
            loads.append(subprocess.Popen(["docker", "exec", "-i", host.container.name, "docker", "load", "-q"],
                                          stdin=tar, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [load.communicate()[0] for load in loads]
    assert all(load.returncode == 0 for load in loads), outputs
    host3.sh(f"tar -cf - --files-from /dev/null | docker import - {IMAGE}")   # an empty image under the tag
    stale = host3.sh(f"docker image inspect {IMAGE} --format '{{{{.Id}}}}'")[1].strip()
    assert stale.startswith("sha256:") and stale != image_id
    # What a user has: a directory with their model file (tests/fixtures whole would be 36
    # files for the role to copy to every host, minutes on a loaded machine).
    user_models = workdir / "usermodels"
    user_models.mkdir()
    (user_models / "tf_keras_models.py").write_text((REPO / "tests/fixtures/tf_keras_models.py").read_text())
    hardening = {"tfps_remove_containers": False, "tfps_pids_limit": 2048, "tfps_worker_memory": "3g",
                 "tfps_worker_cpus": 1.5, "tfps_log_max_size": "20m", "tfps_log_max_file": 3}
    model = {"tfps_model": "tf_keras_models:sequential", "tfps_user_model_dir": str(user_models),
             "tfps_train_steps": FINISHED_STEPS, "tfps_export_every": FINISHED_EXPORT_EVERY,
             "tfps_keep_exports": FINISHED_KEEP}

    inventory = bare_metal.inventory(workdir / "inventory", LAYOUT)
    group_vars = inventory / "group_vars" / "all"
    group_vars.mkdir(parents=True)
    (group_vars / "main.yml").write_text(json.dumps(job_vars(job, archive, **hardening, **model)))
    vault = group_vars / "vault.yml"
    vault.write_text(json.dumps({"tfps_notify_urls": [smtp.url(userinfo=f"{SMTP_USER}:{ENCODED}")]}))
    password_file = workdir / "vault-pass"
    password_file.write_text("correct horse battery staple\n")
    subprocess.run([str(bin_dir / "ansible-vault"), "encrypt", "--vault-password-file", str(password_file),
                    str(vault)], check=True, capture_output=True, text=True)
    assert vault.read_text().startswith("$ANSIBLE_VAULT;")
    assert not [form for form in (PASSWORD, ENCODED, *PIECES) if form in vault.read_text()]

    result = run_playbook("deploy.yml", inventory, play_vars(workdir, memory_check=True), timeout=1500,
                          args=["-vvv", "--vault-password-file", str(password_file)])
    print(f"deploy.yml -vvv (image archive copied to host3, job trained): {result.seconds:.0f} s")
    assert_ok(result, "deploy.yml -vvv")
    messages = [m for m in smtp.wait_for(1, timeout=30) if f"job {job}" in str(m["Subject"])]
    return FinishedJob(job, result, workdir / "results", image_id, stale, messages, list(smtp.logins))
