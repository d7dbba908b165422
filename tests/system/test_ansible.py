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


# The fault test (five faults on the hosts) and the engine-restart job that runs beside it:
# test_ansible_faults.py.
