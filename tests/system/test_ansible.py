"""The Ansible playbooks against real "bare-metal hosts": sshd + their own Docker engine.

Three host containers (hosts.py) on their own network play the machines of an
inventory; Ansible reaches them over SSH with a key made for the test, exactly as it
reaches real hosts. The tfps image reaches them as an image archive copied from the
controller (no registry), the completion email goes to a real SMTP server on this
machine, and every check of what happened on a host looks into that host itself.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import faults
import pytest
from hardening import assert_hardened
from plays import (
    ANSIBLE_DIR,
    FINISHED_KEEP,
    FINISHED_STEPS,
    IMAGE,
    LAYOUT,
    PLAYBOOKS,
    REPO,
    assert_ok,
    job_vars,
    no_containers_anywhere,
    paced,
    play_vars,
    section,
)
from versions_seen import check_versions


@pytest.mark.system
def test_lint_syntax_check(ansible_collections, tmp_path):
    """The playbooks and the role are ansible-lint (production profile) and yamllint clean."""
    bindir = Path(sys.executable).parent
    env = {"ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "PATH": f"{bindir}:/usr/bin:/bin",
           "HOME": str(tmp_path)}
    lint = subprocess.run([str(bindir / "ansible-lint"), "--offline", "--profile", "production", "--nocolor"],
                          cwd=ANSIBLE_DIR, env=env, text=True, capture_output=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Profile 'production' was required, and it passed" in lint.stdout + lint.stderr
    yamllint = subprocess.run([str(bindir / "yamllint"), "--strict", "."], cwd=ANSIBLE_DIR, env=env,
                              text=True, capture_output=True)
    assert yamllint.returncode == 0, yamllint.stdout + yamllint.stderr
    # Every playbook in one run of ansible-playbook (one start of Ansible, not four).
    check = subprocess.run([str(bindir / "ansible-playbook"), "-i", str(REPO / "inventory/example"),
                            "--syntax-check", *PLAYBOOKS], cwd=ANSIBLE_DIR, env=env, text=True, capture_output=True)
    assert check.returncode == 0, f"{PLAYBOOKS}: {check.stdout}{check.stderr}"
    assert [line.split()[-1] for line in check.stdout.splitlines() if line.startswith("playbook: ")] == PLAYBOOKS, \
        check.stdout


@pytest.mark.system
@pytest.mark.timeout(1800)   # the session's first deploy: the image archive goes to host3 over SSH
def test_deploy_trains_a_job_from_the_image_archive(bare_metal, finished_job):
    """deploy.yml: image archive copied and loaded where a host lacks its image (host3, which
    held a stale one under the tag; host1 and host2 already had it), job trained to the end in hardened
    containers (CapDrop ALL, no-new-privileges, read-only rootfs, pids and per-role limits,
    rotating logs), results and email delivered, checkpoint and export on the chief's host.
    The job exports versions while it trains (tfps_export_every, tfps_keep_exports): the
    chief's host holds the newest of them, at least two written while it trained, and
    results.json's export_dir names the last. The model is a user's tf.keras model as
    TensorFlow's tutorials write it (no line names tfps or tf_keras), copied to the hosts
    from tfps_user_model_dir. (The job is conftest's finished_job, whose vaulted
    notification URL test_security.py follows.)"""
    job, result, runs = finished_job.job, finished_job.result, finished_job.results_dir
    assert "SUCCEEDED at global step" in result.output
    # The controller estimated what the ps will hold from the user's model before anything started.
    assert "(estimated on the controller from the model's shapes)" in \
        section(result.output, "Show what each ps task will hold"), result.output[-4000:]

    # The archive went to the host that lacked its image, and only there; every host has the
    # archive's image now (no registry exists here).
    copied = section(result.output, "Copy the image archive to the host")
    assert "changed: [host3]" in copied and "changed: [host1]" not in copied and "changed: [host2]" not in copied, \
        copied[-3000:]
    for host in bare_metal.hosts:
        assert host.sh(f"docker image inspect {IMAGE} --format '{{{{.Id}}}}'")[1].strip() == finished_job.image_id
        assert not host.sh("ls /var/tmp/tfps-image-*.tar", check=False)[0] == 0, "archive left on " + host.name

    # results.json reached the controller and says the job succeeded.
    results = json.loads((runs / "latest" / "results.json").read_text())
    assert results["status"] == "succeeded"
    assert results["model"] == "tf_keras_models:sequential"
    assert results["global_step"] >= FINISHED_STEPS
    assert results["export_complete"] is True
    assert (runs / "latest" / "logs" / "worker0.log").read_text().strip()
    assert {p.name for p in (runs / "latest" / "logs").iterdir()} == {"ps0.log", "worker0.log", "worker1.log"}

    # Checkpoint and SavedModel are on the chief's host (host2), and only there.
    model_dir = f"/srv/tfps/{job}"
    chief_host = bare_metal["host2"]
    for path in ("checkpoint", "results.json"):
        assert chief_host.exists(f"{model_dir}/{path}"), f"host2 has no {model_dir}/{path}"
    # The export base path: versions written while the job trained, the newest kept.
    assert results["export_dir"].rstrip("/").split("/")[-2] == "export", results["export_dir"]
    listing = chief_host.sh(f"cd {model_dir}/export && find . -mindepth 1 -printf '%y %s %P\\n'")[1].splitlines()
    files = {name: (None if kind == "d" else chief_host.sh(f"cat {model_dir}/export/{name}")[1].encode()
                    if name.endswith("tfps_export.json") else b"x" * min(int(size), 1))
             for kind, size, name in (line.split(" ", 2) for line in listing)}
    check_versions(files, (runs / "latest" / "logs" / "worker0.log").read_text(), results, FINISHED_KEEP)
    assert chief_host.sh(f"ls {model_dir}/model.ckpt-*.index")[1].strip()
    for other in ("host1", "host3"):
        assert not bare_metal[other].exists(model_dir)

    # The TF ports accept only the cluster's hosts.
    rules = chief_host.sh("iptables -S INPUT")[1]
    assert f'--comment "tfps {job} worker0" -j DROP' in rules
    for host in bare_metal.hosts:
        assert f"-s {host.address}/32 -p tcp -m tcp --dport 2222" in rules

    # Exactly one completion email, sent by the chief through the real SMTP server.
    messages = finished_job.messages
    assert len(messages) == 1, [str(m["subject"]) for m in messages]
    assert "succeeded" in str(messages[0]["subject"])

    # Every task container was hardened (docs/security.md), with the limits of its role
    # and rotating logs, and the job above still succeeded.
    seen = []
    for host in bare_metal.hosts:
        for name in host.containers(f"tfps.job={job}"):
            attrs = json.loads(host.sh(f"docker inspect {name}")[1])[0]
            assert_hardened(f"{host.name}/{name}", attrs, max_size="20m", max_file="3")
            assert attrs["State"]["ExitCode"] == 0, (name, attrs["State"])
            limits = attrs["HostConfig"]
            assert limits["PidsLimit"] == 2048, name
            if attrs["Config"]["Labels"]["tfps.task"].startswith("worker"):
                assert (limits["Memory"], limits["NanoCpus"]) == (3 * 1024**3, 1_500_000_000), name
            else:
                assert (limits["Memory"], limits["NanoCpus"]) == (0, 0), name
            seen.append(name)
    assert sorted(seen) == [f"tfps-{job}-{t}" for t in ("ps0", "worker0", "worker1")]


def user_files(directory: Path, *names: str) -> Path:
    """A user's model directory holding only the named files of tests/fixtures (the whole of
    it would be dozens of files for the role to copy to every host)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text((REPO / "tests/fixtures" / name).read_text())
    return directory


def container_lifetimes(host, since: float) -> dict[str, list[float]]:
    """[first start, last death] of each container of the host's engine since ``since``
    (``docker events``): when the tasks of jobs ran, after the play removed their containers."""
    _, out = host.sh(f"docker events --since {int(since)} --until {int(time.time()) + 1} --filter type=container "
                     "--filter event=start --filter event=die "
                     "--format '{{.TimeNano}} {{.Action}} {{.Actor.Attributes.name}}'")
    spans: dict[str, list[float]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        t, action, name = int(parts[0]) / 1e9, parts[1], parts[2]
        span = spans.setdefault(name, [float("inf"), float("-inf")])
        if action == "start":
            span[0] = min(span[0], t)
        else:
            span[1] = max(span[1], t)
    return spans


@pytest.mark.system
@pytest.mark.timeout(1800)   # three deploys at once, then two more plays; a loaded CI machine is slow
def test_three_jobs_at_once_get_their_own_ports_and_each_ends_its_own_way(bare_metal, image_archive,
                                                                          network_smtp_server, run_playbook,
                                                                          tmp_path):
    """Three deploys started at the same moment, no tfps_base_port anywhere: each host gives
    each job its own ports, the jobs' tasks run beside each other, and each job ends its
    own way and sends only its own message:

    * alpha, tfps's own training, succeeds. A re-deploy of it with more steps is refused,
      naming the change; with tfps_replace it goes on from its checkpoint to the new step
      count, on the same ports, and the first attempt's results stay beside the second's.
    * classic: a user's classic ps/worker script (tfps_script) runs unchanged; its ps never
      exits, so the play stops it once the chief is done, and the job counts as succeeded.
    * nanlog: its loss turns NaN, so the play fails; the logs keep only the last
      tfps_log_lines lines of every task, and the chief's whole log is fetched as well.
    """
    since = time.time() - 1
    models = user_files(tmp_path / "usermodels", "classic_replica.py", "bad_models.py")
    marker = "/srv/tfps/classic/classic_done.json"
    settings = {
        "alpha": job_vars("alpha", image_archive, network_smtp_server, tfps_train_steps=200,
                          tfps_checkpoint_steps=100),
        "classic": job_vars("classic", image_archive, tfps_script="classic_replica.py",
                            tfps_user_model_dir=str(models)),
        "nanlog": job_vars("nanlog", image_archive, network_smtp_server, tfps_model="bad_models:nan_loss",
                           tfps_user_model_dir=str(models), tfps_restart_policy="no"),
    }
    jobs = list(settings)
    inventories = {job: bare_metal.inventory(tmp_path / job / "inventory", LAYOUT, group_vars={"all": settings[job]})
                   for job in jobs}
    plays = {job: play_vars(tmp_path / job) for job in jobs}
    plays["classic"]["tfps_script_args"] = ["--train_steps=100", f"--marker={marker}"]
    plays["nanlog"]["tfps_log_lines"] = 2
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {job: pool.submit(run_playbook, "deploy.yml", inventories[job], plays[job]) for job in jobs}
        done = {job: f.result() for job, f in futures.items()}

    # alpha succeeded, with its own message.
    alpha = done["alpha"]
    assert_ok(alpha, "deploy.yml of alpha")
    assert "job alpha SUCCEEDED" in alpha.output
    results = json.loads((tmp_path / "alpha" / "results" / "latest" / "results.json").read_text())
    assert results["global_step"] >= 200 and results["job"] == "alpha" and results["status"] == "succeeded"

    # classic: the script ran unchanged, and the play ended its ps, which ran `server.join()` forever.
    classic = done["classic"]
    assert_ok(classic, "deploy.yml with tfps_script")
    assert "job classic SUCCEEDED" in classic.output
    assert "worker 0: done at global step" in classic.output
    assert json.loads(bare_metal["host2"].sh(f"cat {marker}")[1])["global_step"] > 50  # async: the last step it saw
    assert re.search(r"tfps-classic-ps0 exit (0|143)", classic.output), classic.output[-3000:]

    # nanlog failed; the tail of every log and the chief's whole log reached the controller.
    nanlog = done["nanlog"]
    assert nanlog.returncode != 0, nanlog.output[-4000:]
    assert "job nanlog FAILED" in nanlog.output, nanlog.output[-4000:]
    failed = json.loads((tmp_path / "nanlog" / "results" / "latest" / "results.json").read_text())
    assert failed["status"] == "failed" and failed["error"]["type"] == "FloatingPointError", failed
    logs = tmp_path / "nanlog" / "results" / "latest" / "logs"
    assert {p.name for p in logs.iterdir()} == {"ps0.log", "worker0.log", "worker1.log", "worker0.full.log"}

    def log_lines(path):   # tfps's own lines ("HH:MM:SS L ..."), without the file's stream headers
        return [line for line in path.read_text().splitlines() if re.match(r"\d\d:\d\d:\d\d [A-Z] ", line)]

    tail = log_lines(logs / "worker0.log")
    whole = log_lines(logs / "worker0.full.log")
    assert 0 < len(tail) <= 2, tail
    assert len(whole) > len(tail), (whole, tail)
    assert any("diverged" in line for line in whole), whole
    # The whole log starts where the chief started: its first lines are not in the tail.
    assert whole[0] not in tail
    assert re.search(rf"{re.escape(str(tmp_path / 'nanlog' / 'results'))}/\d{{8}}T\d{{6}}Z/logs/worker0\.full\.log "
                     r"\(whole\)", nanlog.output), nanlog.output[-3000:]
    assert not bare_metal["host2"].sh("ls /var/tmp/tfps-nanlog-*.full.log", check=False)[0] == 0, \
        "full log left on host2"
    for job in ("classic", "nanlog"):
        no_containers_anywhere(bare_metal, job)

    # Each host gave each job its own ports, and the jobs' tasks ran at the same time.
    def ports(output: str) -> dict[str, int]:
        """Each task's port, from the plan the play shows."""
        return {m[1]: int(m[2]) for m in re.finditer(r"(ps0|worker[01])\s+host\d\s+\S+:(\d+)", output)}
    first_ports = {job: ports(done[job].output) for job in jobs}
    for job in jobs:
        assert set(first_ports[job]) == {"ps0", "worker0", "worker1"}, (job, first_ports)
    for task in ("ps0", "worker0", "worker1"):
        assert len({first_ports[job][task] for job in jobs}) == 3, first_ports
    assert {first_ports[job]["ps0"] for job in jobs} == {2222, 2223, 2224}, first_ports
    assert results["cluster"]["ps"][0].endswith(f":{first_ports['alpha']['ps0']}")
    spans = container_lifetimes(bare_metal["host1"], since)
    ps_spans = {job: spans.get(f"tfps-{job}-ps0") for job in jobs}
    assert all(ps_spans.values()), (ps_spans, spans)
    # Each job's ps0 ran while another job's did. (Not all three at one moment: on a loaded
    # machine the plays reach their start phases up to a minute apart, and one CI-like run
    # had alpha's ps0 end 0.6 s before nanlog's started, both beside classic's.)
    def overlap(a, b) -> bool:
        return a[0] < b[1] and b[0] < a[1]
    for job in jobs:
        assert any(overlap(ps_spans[job], ps_spans[other]) for other in jobs if other != job), \
            f"job {job}'s ps0 ran beside no other job's: {ps_spans}"

    # Each job that notifies sent one message, its own.
    expected = {"alpha": "succeeded", "nanlog": "failed"}
    deadline = time.monotonic() + 30
    subjects: list[str] = []
    while time.monotonic() < deadline:
        subjects = [str(m["subject"]) for m in network_smtp_server.received()]
        if all(any(f"job {job} {word}" in s.lower() for s in subjects) for job, word in expected.items()):
            break
        time.sleep(0.5)
    for job, word in expected.items():
        mine = [s for s in subjects if f"job {job} " in s]
        assert len(mine) == 1 and word in mine[0].lower(), (job, subjects)
    assert not [s for s in subjects if "job classic " in s], subjects

    # More steps for alpha: refused, the change named, nothing touched.
    more = {**plays["alpha"], "tfps_train_steps": 300}
    refused = run_playbook("deploy.yml", inventories["alpha"], more)
    assert refused.returncode != 0, refused.output[-3000:]
    assert ("Job alpha already runs (or ran) with other settings, so nothing was changed: "
            "tfps_train_steps: 200 -> 300.") in refused.output, refused.output[-3000:]
    # tfps_replace: on from the checkpoint to 300 steps, on the ports the job holds.
    replaced = run_playbook("deploy.yml", inventories["alpha"], {**more, "tfps_replace": True})
    assert_ok(replaced, "deploy.yml -e tfps_replace=true")
    assert "job alpha SUCCEEDED" in replaced.output
    assert ports(replaced.output) == first_ports["alpha"]
    again = json.loads((tmp_path / "alpha" / "results" / "latest" / "results.json").read_text())
    assert again["global_step"] >= 300 and again["status"] == "succeeded", again
    log = (tmp_path / "alpha" / "results" / "latest" / "logs" / "worker0.log").read_text()
    restored = re.search(r"restored checkpoint of step (\d+)", log)
    assert restored and int(restored.group(1)) >= 200, log[-3000:]
    attempts = sorted(p for p in (tmp_path / "alpha" / "results").iterdir() if p.name != "latest")
    assert len(attempts) == 2, attempts
    assert json.loads((attempts[0] / "results.json").read_text())["global_step"] == results["global_step"]

    cleanup = run_playbook("cleanup.yml", inventories["alpha"], {**plays["alpha"], "tfps_cleanup_model_dir": True})
    assert_ok(cleanup, "cleanup.yml")
    no_containers_anywhere(bare_metal, "alpha")
    assert '"alpha"' not in bare_metal["host1"].sh("cat /var/lib/tfps/ports.json")[1]


#: Inventories the plan refuses (no host is contacted), and what the play says.
BAD_PLANS = {
    "no ps group": ({"pss": ["host1"], "worker": ["host2", "host3"]},
                    "the inventory has no 'ps' group; put the host(s) that run parameter servers in a group named "
                    "ps; it has a group 'pss': rename it to 'ps'"),
    "duplicate ports": ({"ps": ["host1-ps"], "worker": ["host1", "host2"]},
                        "ps0 (host 'host1-ps') and worker0 (host 'host1') both use"),
}
#: Problems of the hosts themselves, all in one inventory: the check phase collects every
#: host's problems before it stops, so one play must name each of them.
BAD_HOSTS = {
    "GPU ids on a host without GPUs": "host3: worker1 need GPU(s) 0, but its Docker engine has no nvidia runtime",
    "unreachable host": "host1-gone (ADDRESS) cannot be reached over SSH",
    "port in use": "host3: port 2299 of worker1 is in use on 127.0.0.1",
    "no firewall that survives a reboot": "host3: tfps_firewall is on, but nothing there keeps firewall rules across a "
                                          "reboot (no iptables-persistent, no running firewalld or ufw)",
    "hand-placed data differs": "host3: its training data (/input/train-*.csv in tfps_data_dir) differs from "
                                "host2's: lacks train-2.csv; train-1.csv differs from host2's (sha256)",
}
#: iptables-persistent's part of netfilter-persistent: without it, nothing restores iptables rules at boot.
IPTABLES_PLUGIN = "/usr/share/netfilter-persistent/plugins.d/15-ip4tables"


def nothing_reached_the_hosts(bare_metal, result, job: str) -> None:
    """No container, no model directory, no copied archive."""
    assert "Start the task containers" not in result.output
    assert "Copy the image archive to the host" not in result.output
    no_containers_anywhere(bare_metal, job)


@pytest.mark.system
@pytest.mark.parametrize("case", list(BAD_PLANS))
def test_bad_inventory_fails_in_the_plan(case, bare_metal, image_archive, run_playbook, tmp_path):
    """An inventory the plan cannot be made of fails before any host is checked, saying what is wrong."""
    job = "bad" + re.sub(r"[^a-z]", "", case)[:12]
    layout, message = BAD_PLANS[case]
    inventory = bare_metal.inventory(tmp_path / "inventory", layout, {"all": job_vars(job, image_archive)})
    result = run_playbook("deploy.yml", inventory, play_vars(tmp_path))
    assert result.returncode != 0, result.output[-3000:]
    assert message in result.output, result.output[-4000:]
    nothing_reached_the_hosts(bare_metal, result, job)


@pytest.mark.system
def test_bad_hosts_fail_in_the_check_phase_all_named_in_one_play(bare_metal, image_archive, run_playbook, tmp_path):
    """Hosts with problems fail the check phase before anything starts, and one play names
    every problem of every host: worker1's host3 asks for a GPU its engine cannot give, has
    worker1's port taken by something else, nothing that keeps firewall rules across a
    reboot, and other hand-placed training data than host2's; worker2's host cannot be
    reached over SSH."""
    job = "badhosts"
    host3 = bare_metal["host3"]
    data_dir = f"/srv/tfps-data/{job}"
    for host in ("host2", "host3"):
        for i in range(3):
            if host == "host3" and i == 2:
                continue
            value = 9 if (host == "host3" and i == 1) else i    # same size, other content
            bare_metal[host].sh(f"mkdir -p {data_dir} && printf 'f0,label\\n{value},0\\n' > {data_dir}/train-{i}.csv")
    layout = {"ps": ["host1"], "worker": {
        "host2": {},
        "host3": {"tfps_gpus": [0], "tfps_base_port": 2299},
        # host1's address, where no sshd listens on port 2 (its own port, so the plan is sound).
        "host1-gone": {"ansible_port": 2, "tfps_base_port": 2400},
    }}
    inventory = bare_metal.inventory(tmp_path / "inventory", layout, {"all": job_vars(
        job, image_archive, tfps_data_dir=data_dir, tfps_train_data="/input/train-*.csv", tfps_data_checksums=True)})
    # Something else listens on worker1's port until the play is done (killed below; it ends by
    # itself after half an hour at the latest, however slow the play).
    host3.container.exec_run(
        ["sh", "-c", "echo $$ >/tmp/listener.pid; exec python3 -c 'import socket, time; s = socket.socket(); "
                     "s.bind((\"0.0.0.0\", 2299)); s.listen(); time.sleep(1800)'"], detach=True)
    try:
        deadline = time.monotonic() + 10
        while "2299" not in host3.sh("ss -ltn", check=False)[1]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # host3 has netfilter-persistent, but not iptables-persistent's plugin.
        host3.sh(f"mv {IPTABLES_PLUGIN} /root/15-ip4tables")
        result = run_playbook("deploy.yml", inventory, play_vars(tmp_path))
    finally:
        host3.sh("kill $(cat /tmp/listener.pid)", check=False)
        host3.sh(f"test -e {IPTABLES_PLUGIN} || mv /root/15-ip4tables {IPTABLES_PLUGIN}", check=False)
        for host in bare_metal.hosts:
            host.sh(f"rm -rf {data_dir}")
    assert result.returncode != 0, result.output[-3000:]
    assert "Nothing was started. Fix these problems and run the play again:" in result.output, result.output[-4000:]
    for case, message in BAD_HOSTS.items():
        message = message.replace("ADDRESS", bare_metal["host1"].address)
        assert message in result.output, f"{case}: no {message!r} in\n{result.output[-4000:]}"
    nothing_reached_the_hosts(bare_metal, result, job)


@pytest.mark.system
def test_image_that_cannot_be_pulled_starts_nothing_and_sends_the_failure(bare_metal, image_archive,
                                                                          network_smtp_server, run_playbook,
                                                                          tmp_path):
    """A tfps image no host can get (a typo, an unreachable registry) ends the play before
    any task starts, says which hosts and why, and sends the failure message."""
    job = "noimage"
    image = "127.0.0.1:5999/tfps:missing"      # a registry nobody runs
    inventory = bare_metal.inventory(tmp_path / "inventory", LAYOUT, group_vars={"all": job_vars(
        job, image_archive, network_smtp_server, tfps_image=image, tfps_image_archive="")})
    result = run_playbook("deploy.yml", inventory, play_vars(tmp_path))
    assert result.returncode != 0, result.output[-3000:]
    assert f"Nothing was started: host1: cannot pull {image}" in result.output, result.output[-4000:]
    for host in ("host2", "host3"):
        assert f"{host}: cannot pull {image}" in result.output
    assert "check tfps_image and the host's access to its registry" in result.output
    assert "Start the task containers" not in result.output
    no_containers_anywhere(bare_metal, job)
    messages = [m for m in network_smtp_server.wait_for(1, timeout=30) if f"job {job}" in str(m["subject"])]
    assert len(messages) == 1, [str(m["subject"]) for m in network_smtp_server.messages]
    assert "FAILED" in str(messages[0]["subject"]).upper()
    assert f"cannot pull {image}" in messages[0].get_body(("plain",)).get_content()


@pytest.mark.system
def test_a_container_docker_refuses_shows_dockers_reason_and_leaves_nothing(bare_metal, image_archive, run_playbook,
                                                                            tmp_path):
    """Docker refuses the ps container (a memory limit below its minimum) while the workers'
    containers start on the other hosts: the play shows Docker's own reason, never the
    secret in tfps_env (the start task keeps no_log), and removes what it started."""
    job = "refused"
    secret = f"tok-{uuid.uuid4().hex}"
    inventory = bare_metal.inventory(tmp_path / "inventory", LAYOUT, group_vars={"all": job_vars(
        job, image_archive, tfps_ps_memory="1m", tfps_env={"TRAINING_API_TOKEN": secret})})
    result = run_playbook("deploy.yml", inventory, play_vars(tmp_path))
    assert result.returncode != 0, result.output[-3000:]
    assert f"host1: Docker did not start tfps-{job}-ps0: " in result.output, result.output[-4000:]
    assert "Minimum memory limit allowed is 6MB" in result.output, result.output[-4000:]
    assert f"Nothing of job {job} was left running" in result.output
    assert secret not in result.output
    no_containers_anywhere(bare_metal, job)


#: Long enough that the kill lands between the first and the last checkpoint (an async job
#: trains several hundred steps a second; see test_compose.py).
FAULT_STEPS = 900
FAULT_CHECKPOINT = 300
#: The killed-task job's layout: ps0 on host1, the chief and worker1 on host2, so that it runs
#: beside the engine-restart job, whose host3 loses its engine meanwhile.
FAULT_LAYOUT = {"ps": ["host1"], "worker": {"host2": {"tfps_workers": 2}}}
TASK_HOST = {"ps0": "host1", "worker0": "host2", "worker1": "host2"}


ansible_fault_table = faults.table_fixture(
    f"Ansible fault injection: 2 hosts (ps0; chief and worker1), {FAULT_STEPS} steps, a checkpoint every "
    f"{FAULT_CHECKPOINT}; SIGKILL of the task's process on its host, back by restart policy")


def _history(host, job: str) -> list[dict]:
    code, out = host.sh(f"cat /srv/tfps/{job}/history.jsonl", check=False)
    return faults.history(out) if code == 0 else []


#: The Ansible fault: the chief in sync mode, the hardest case for deploy.yml's wait (the
#: chief's restart also loses the token queue's reader). Every task in both modes, restarted
#: as plain processes: tests/integration/test_faults.py; an async chief restarted inside its
#: container: test_compose.py; a non-chief worker's restart on its host is covered by
#: test_engine_restart_mid_job_... (worker1's whole engine restarts).
ANSIBLE_FAULTS = [("worker0", "sync")]


@pytest.mark.system
@pytest.mark.parametrize(("victim", "mode"), ANSIBLE_FAULTS, ids=[f"{v}-{m}" for v, m in ANSIBLE_FAULTS])
def test_killed_task_on_a_host_comes_back_and_the_job_completes(victim, mode, bare_metal, image_archive,
                                                                network_smtp_server, run_playbook, tmp_path,
                                                                ansible_fault_table, engine_restart):
    """A task's process is SIGKILLed on its host at a random step between the first and the
    last checkpoint: Docker's restart policy brings it back, deploy.yml reports the job
    succeeded at its step, at most one checkpoint interval is redone, the SavedModel loads
    and predicts on the chief's host, and exactly one completion email arrives. (The engine-restart job runs on host3
    meanwhile: test_engine_restart_... judges it.)"""
    import threading
    job = f"f{victim}{mode}"
    inventory = bare_metal.inventory(tmp_path / "inventory", FAULT_LAYOUT, group_vars={"all": job_vars(
        job, image_archive, network_smtp_server, tfps_train_steps=FAULT_STEPS,
        tfps_checkpoint_steps=FAULT_CHECKPOINT, tfps_sync_replicas=mode == "sync",
        tfps_extra_args=["--log_steps=20"])})
    box: dict = {}
    deploy = threading.Thread(target=lambda: box.update(result=run_playbook("deploy.yml", inventory,
                                                                             play_vars(tmp_path))))
    deploy.start()
    chief_host, host = bare_metal["host2"], bare_metal[TASK_HOST[victim]]
    target = faults.kill_target(FAULT_STEPS, FAULT_CHECKPOINT, margin=20)
    deadline = time.monotonic() + 300
    # A look a second (a docker exec into the host, and the host's own): the kill lands up to
    # a second of steps past the target, which is random anyway.
    while max((r["step"] for r in _history(chief_host, job)), default=0) < target:
        assert deploy.is_alive() and time.monotonic() < deadline, box.get("result") and box["result"].output[-3000:]
        time.sleep(1)
    container = f"tfps-{job}-{victim}"
    pid = host.sh(f"docker inspect {container} --format '{{{{.State.Pid}}}}'")[1].strip()
    host.sh(f"kill -KILL {pid}")
    t_kill = time.time()
    # The step at the kill: the chief's last progress record from before it.
    kill_step = faults.step_at(_history(chief_host, job), t_kill)
    assert kill_step is not None, "the chief's history could not be read at the kill"

    recover_s = None
    while recover_s is None and deploy.is_alive() and time.monotonic() < deadline + 240:
        recover_s = faults.recovered_after(_history(chief_host, job), t_kill)   # from the records' times
        time.sleep(2)
    deploy.join(600)
    result = box["result"]
    assert_ok(result, f"deploy.yml with {victim} killed")
    results = json.loads((tmp_path / "results" / "latest" / "results.json").read_text())
    assert results["status"] == "succeeded" and results["global_step"] >= FAULT_STEPS
    assert results["export_complete"] is True
    assert re.search(rf"tfps-{job}-ps0 exit 0\b", result.output), result.output[-3000:]

    # The chief's log (saved by the play) across the restart: what it restored after the kill.
    chief_log = (tmp_path / "results" / "latest" / "logs" / "worker0.log").read_text(errors="replace")
    after = faults.log_since_step(chief_log, kill_step) if victim != "worker0" else chief_log
    row = faults.Row(victim, mode, "yes", recover_s, kill_step,
                     faults.resumed_from(after, victim == "worker1", kill_step, victim))
    ansible_fault_table.append(row)
    faults.assert_redone_at_most(row, FAULT_CHECKPOINT)
    # Docker's restart policy started the container again: nobody saw how the task died.
    faults.assert_story(results, victim, row, None)

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
    it runs while the killed-task test's job runs on the other hosts: its worker steps sleep,
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
            "deploy.yml", self.inventory, play_vars(self.workdir))))
        deploy.start()
        container = f"tfps-{job}-worker1"
        logs = f"docker logs {container} 2>&1"
        # The play's own limit (run_playbook's timeout): the first deploy of a session copies the
        # image archive to the hosts before any task starts, minutes on a loaded machine.
        deadline = time.monotonic() + 600
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
    """The engine-restart job, started by the first test that asks for it (the killed-task
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
@pytest.mark.timeout(1800)   # the job runs beside the killed-task test's job
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
