"""What docs/security.md promises, checked on real jobs: least privilege, secrets, firewall.

* A compose job's tasks run as the image's non-root user (uid 10001) with every capability
  dropped (an empty bounding set), no-new-privileges and a read-only root filesystem:
  from ``docker inspect`` of every task container and from inside every running task
  (``id -u``, ``/proc/*/status``). The same job's chief is SIGKILLed mid-job and comes back
  in its container (test_compose.py's restart path): the checks below hold across it.
* A notification password full of URL-special characters (``@ % ; /``, percent-encoded in
  the URL) reaches the chief as a compose secret (a file owned by uid 10001, mode 0400,
  mounted read-only) and, through it, a real SMTP server, and appears nowhere else: no
  container's environment, log or ``docker inspect`` output, no command line, no file
  on the job's volume, not the image, not the compose file or ``docker compose config``,
  not the message itself.
* The same for Ansible, from a Vault-encrypted ``group_vars/all/vault.yml``: the email
  arrives, and neither the ``-vvv`` output of deploy.yml nor ``docker inspect`` of the
  chief on its host holds the password; the chief's file is 0400, uid 10001, read-only.
* The Ansible firewall: while a job deployed by ansible/deploy.yml trains on the three
  hosts of conftest.py, a fourth machine on the same network (and this machine)
  cannot open a TCP connection to any TF port, while the cluster's own hosts can; a host
  rebooted mid-job comes back with its rules (netfilter-persistent) before its task does,
  and the job completes.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docblocks
import docker
import faults
import pytest
from composejob import CHIEF
from hardening import assert_hardened
from hosts import HOST_IMAGE
from plays import (
    ENCODED,
    IMAGE,
    LAYOUT,
    PASSWORD,
    PIECES,
    SMTP_USER,
    assert_ok,
    job_vars,
    no_containers_anywhere,
    paced,
    play_vars,
    recap,
)
from test_compose import (
    COMPOSE_FAULT,
    FAULT_CHECKPOINT,
    FAULT_STEPS,
    REPO,
    exit_codes,
    sigkill_and_recover,
    write_url_file,
)

pytestmark = pytest.mark.system

#: The image's user (Dockerfile: useradd --uid 10001; USER 10001:10001).
UID = 10001
SERVICES = ("ps0", "worker0", "worker1")
TASK_PORT = 2222
#: The notification password (plays.py): every character that trips URLs up, in pieces
#: distinctive enough to be searched for alone.
USER = SMTP_USER

#: Run inside a task container: its user, every process's ids, capabilities and command
#: line, and whether the task's TF server listens (port 2222 in state LISTEN).
SNAPSHOT = r"""
import json, os
procs = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/status") as fh:
            status = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        continue
    procs[pid] = {k: " ".join(status.get(k, "").split()) for k in
                  ("Name", "Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    procs[pid]["cmdline"] = cmdline
listening = False
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    if os.path.exists(table):
        with open(table) as fh:
            for line in fh.read().splitlines()[1:]:
                fields = line.split()
                listening |= fields[1].endswith(":%04X" % PORT) and fields[3] == "0A"
print(json.dumps({"procs": procs, "listening": listening}))
"""

#: Run on a host or a container with python3: TCP connects to host:port targets, in
#: parallel, each one "open", "timeout", "refused" or "error: ...".
PROBE = r"""
import concurrent.futures, json, socket, sys

def probe(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=float(sys.argv[1])).close()
        return "open"
    except socket.timeout:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return f"error: {e}"

targets = sys.argv[2:]
with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(dict(zip(targets, pool.map(probe, targets)))))
"""


def leaks(data: str | bytes | None) -> list[str]:
    """The forms of the password found in ``data`` (raw, encoded in any case, or a piece)."""
    if not data:
        return []
    text = data.decode("latin-1") if isinstance(data, bytes) else data
    found = [form for form in (PASSWORD, *PIECES) if form in text]
    if ENCODED.lower() in text.lower():
        found.append(ENCODED)
    return found


def caps(value: str) -> int:
    return int(value, 16)


@pytest.fixture
def auth_smtp_server(container_smtp_server):
    """conftest.py's SMTP server for containers, but offering AUTH for USER and PASSWORD.

    Reaching it proves the password arrived intact; a login is recorded in ``logins``.
    """
    with type(container_smtp_server)(container_smtp_server.address, auth=(USER, PASSWORD)) as server:
        yield server


def generate(directory: Path, image: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    """``tfps compose ... -o directory/docker-compose.yml``, run with ``env``."""
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tfps", "compose", "--image", image, "-o", str(directory / "docker-compose.yml"),
           *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def snapshot_running_tasks(job, timeout: float) -> dict[str, dict]:
    """Service -> SNAPSHOT of it and ``id -u``, taken once its tfps process runs and its TF
    server listens (so the job is running, not starting or ending)."""
    taken: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    command = ["sh", "-c", 'id -u && exec python3 -c "$0"', f"PORT = {TASK_PORT}\n{SNAPSHOT}"]
    while len(taken) < len(SERVICES):
        assert time.monotonic() < deadline, f"only {sorted(taken)} seen running in {timeout} s:\n{job.tail()}"
        for service in SERVICES:
            if service in taken:
                continue
            try:
                container = job.container(service)
                if container.status != "running":
                    if container.status == "exited":
                        pytest.fail(f"{service} exited before it was seen running:\n{job.tail()}")
                    continue
                code, out = container.exec_run(command)
            except (AssertionError, docker.errors.APIError):  # not created yet / stopped meanwhile
                continue
            if code != 0:
                continue
            uid, _, snap = out.decode("utf-8", "replace").partition("\n")
            snap = json.loads(snap)
            if snap["listening"] and any(" run " in p["cmdline"] and "tfps" in p["cmdline"]
                                         for p in snap["procs"].values()):
                taken[service] = {"id -u": uid.strip(), **snap}
        time.sleep(0.2)
    return taken


fault_table = faults.table_fixture(
    f"compose fault injection: 1 ps + 2 workers, {FAULT_STEPS} steps, a checkpoint every {FAULT_CHECKPOINT}; "
    "SIGKILL of the task's training process, started again in its container")


def test_compose_tasks_are_unprivileged_the_password_leaks_nowhere_and_a_killed_chief_comes_back(
        compose_job, tfps_image, auth_smtp_server, tmp_path, fault_table):
    """Requirements 1 and 2 on one compose job of 1 ps + 2 workers, whose chief's training
    process is SIGKILLed mid-job and started again in its container
    (test_compose.sigkill_and_recover): the one message still comes, and nothing leaks."""
    run_name = f"sec-{uuid.uuid4().hex[:8]}"
    url = auth_smtp_server.url(userinfo=f"{USER}:{ENCODED}")
    directory = tmp_path / "compose"
    directory.mkdir(parents=True)
    secret = write_url_file(directory / "notify_urls", url)
    # A user who has APPRISE_URLS in the shell generates the file: it must not end up in it.
    generated = generate(directory, tfps_image, "--ps", "1", "--workers", "2", "--train_steps", str(FAULT_STEPS),
                         "--log_steps", "20", "--final_save_timeout", "60",
                         "--run_name", run_name, "--notify_urls_file", str(secret),
                         env=dict(os.environ, APPRISE_URLS=url))
    job = compose_job(directory)

    t0 = time.monotonic()
    job.start()
    # Each task seen running first (no other docker exec meanwhile: an exec's own process,
    # root until it takes the container's user, would be in the list), then the chief killed.
    running = snapshot_running_tasks(job, timeout=480)
    victim, mode = COMPOSE_FAULT
    results = sigkill_and_recover(job, victim, mode, fault_table)
    print(f"compose job of {FAULT_STEPS} steps, its chief killed and back: {time.monotonic() - t0:.1f} s")
    assert exit_codes(job) == {"ps0": 0, "worker0": 0, "worker1": 0}
    assert results["job"] == run_name

    # -- 1. non-root, no extra capabilities ------------------------------------------
    containers = {s: job.container(s) for s in SERVICES}
    for service, container in containers.items():
        config, host = container.attrs["Config"], container.attrs["HostConfig"]
        assert config["User"].split(":")[0] == str(UID), (service, config["User"])
        assert not host.get("CapAdd"), (service, host.get("CapAdd"))
        assert_hardened(service, container.attrs)
        assert host.get("Privileged") is False, service
        assert not [o for o in host.get("SecurityOpt") or [] if "unconfined" in o], (service, host["SecurityOpt"])
        assert not host.get("Devices"), service
        assert "host" not in (host.get("NetworkMode"), host.get("PidMode"), host.get("IpcMode")), service
        assert not host.get("PortBindings"), f"{service} publishes {host['PortBindings']}: TF ports must stay closed"

    ids = f"{UID} {UID} {UID} {UID}"  # real, effective, saved, filesystem
    for service, snap in running.items():
        assert snap["id -u"] == str(UID), service
        procs = snap["procs"]
        assert procs["1"]["Name"] == "tini", (service, procs["1"])
        for pid, proc in procs.items():
            where = f"{service} pid {pid} ({proc['cmdline'][:80]})"
            assert proc["Uid"] == ids and proc["Gid"] == ids, (where, proc["Uid"], proc["Gid"])
            # cap_drop ALL: not even the bounding set holds a capability, and the process has
            # no effective, permitted or ambient capability at all.
            assert caps(proc["CapBnd"]) == 0, (where, proc["CapBnd"])
            assert caps(proc["CapEff"]) == caps(proc["CapPrm"]) == caps(proc["CapAmb"]) == 0, (where, proc)

    # -- 2. the password: delivered, and nowhere else ---------------------------------
    auth_smtp_server.wait_for(1, timeout=30)
    time.sleep(2)   # a second message (from the restarted chief) would come now
    faults.assert_one_success_message([str(m["Subject"]) for m in auth_smtp_server.messages], job=run_name)
    messages = [m for m in auth_smtp_server.messages if run_name in str(m["Subject"])]
    assert (USER, PASSWORD) in {(user, pw) for _, user, pw in auth_smtp_server.logins}, auth_smtp_server.logins

    chief_inspect = json.loads(subprocess.run(["docker", "inspect", containers[CHIEF].id], check=True,
                                              capture_output=True, text=True).stdout)[0]
    chief_env = chief_inspect["Config"]["Env"]
    # The chief needs the URL to send: it has it as a read-only file of its own user, mode
    # 0400 (a bind mount: the container sees the host file's owner and mode), and the
    # environment only names that file.
    assert "APPRISE_URLS_FILE=/run/secrets/notify_urls" in chief_env
    assert not [e for e in chief_env if e.startswith("APPRISE_URLS=")], chief_env
    mount = next(m for m in chief_inspect["Mounts"] if m["Destination"] == "/run/secrets/notify_urls")
    assert mount["Type"] == "bind" and mount["RW"] is False and mount["Source"] == str(secret), mount
    st = secret.stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o400, UID)
    for service in ("ps0", "worker1"):
        assert not any(m["Destination"].startswith("/run/secrets") for m in containers[service].attrs["Mounts"])
    chief_logs = containers[CHIEF].logs().decode("utf-8", "replace")
    assert "delivered to mailto://" in chief_logs and "****" in chief_logs, "no masked URL in the chief's log"

    # The scan finds the password in every form it can take.
    assert ENCODED in leaks(secret.read_text()) and PASSWORD in leaks(PASSWORD) and ENCODED in leaks(ENCODED.lower())
    assert leaks("mailto://ops:****@host.docker.internal") == []
    found: dict[str, list[str]] = {}

    def scan(where: str, data) -> None:
        if leaks(data):
            found[where] = leaks(data)

    for service, container in containers.items():
        scan(f"docker logs {service}", container.logs(stdout=True, stderr=True))
        inspect = subprocess.run(["docker", "inspect", container.id], check=True, capture_output=True, text=True).stdout
        scan(f"docker inspect {service}", inspect)
        attrs = container.attrs
        scan(f"{service} Path/Args/Cmd/Entrypoint", json.dumps(
            [attrs["Path"], attrs["Args"], attrs["Config"]["Cmd"], attrs["Config"]["Entrypoint"]]))
    for service, snap in running.items():
        for pid, proc in snap["procs"].items():
            scan(f"{service} pid {pid} command line", proc["cmdline"])
    scan("docker compose up output", job.log.read_bytes())
    scan("docker-compose.yml", (directory / "docker-compose.yml").read_text())
    scan("docker compose config", job.compose("config").stdout)
    scan("tfps compose output", generated.stdout + generated.stderr)
    volume = job.files("/data")
    assert "model/results.json" in volume and "model/export/saved_model.pb" in volume, sorted(volume)
    for name, content in volume.items():
        scan(f"volume /data/{name}", content)
    results = json.loads(volume["model/results.json"])
    assert results["status"] == "succeeded" and results["job"] == run_name
    for cmd in (["docker", "history", "--no-trunc", tfps_image], ["docker", "image", "inspect", tfps_image]):
        scan(" ".join(cmd[:-1]), subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    message = messages[0]
    scan("message headers", "\n".join(f"{k}: {v}" for k, v in message.items()))
    for part in message.walk():
        scan(f"message part {part.get_content_type()} {part.get_filename() or ''}", part.get_payload(decode=True))

    assert found == {}, f"the password leaked: {found}"
    # The scan looked at real data: the chief's log holds its progress lines and the
    # delivery line, and the volume holds the checkpoint, the export and the results.
    assert "step" in chief_logs and "delivered to" in chief_logs, chief_logs
    assert len(volume) > 5, sorted(volume)


# A deploy, a second one beside --check, the controller's looks, a job with a host's reboot
# in it, a stop and a cleanup: longer than the suite's 900 s per test on a busy 2-core machine.
@pytest.mark.timeout(1800)
def test_ansible_firewall_admits_only_the_cluster_also_after_a_reboot_and_a_rerun_changes_nothing(
        bare_metal, image_archive, network_smtp_server, run_playbook, paced_model_dir, tmp_path):
    """While a job deployed by deploy.yml (start only) trains:

    * deploy.yml again, and --check --diff, at the same time, change nothing (the check says
      so); the containers record what defines the job; tfps jobs, tfps logs and status.yml
      see it from the controller;
    * a fourth container on the hosts' network (and this machine, the network's gateway)
      cannot connect to any TF port; the cluster's hosts can; TensorBoard listens on the
      chief's host's loopback only;
    * the rules are saved for the next boot; worker1's host reboots mid-job: its task comes
      back by restart policy, its port is again closed to the outsider and open to the
      cluster, and it trains again.

    stop.yml ends the job with a final checkpoint and export and one message; cleanup.yml
    removes the rules, live and saved, and the job's files. (A changed job and tfps_replace:
    test_ansible.py's three-jobs test.)

    The job is long (its steps are fast) and ended by stop.yml, so that it is still running
    when the rebooted host's task comes back: a job that ended meanwhile closes its ports."""
    job = f"fw{uuid.uuid4().hex[:6]}"
    steps = 10_000_000
    inventory = bare_metal.inventory(tmp_path / "inventory", LAYOUT, group_vars={"all": job_vars(
        job, image_archive, network_smtp_server, tfps_train_steps=steps, tfps_checkpoint_steps=500,
        tfps_tensorboard=True, **paced(paced_model_dir))})
    plan = json.loads(subprocess.run([sys.executable, "-m", "tfps", "plan", "-i", str(inventory), "--format",
                                      "json"], check=True, capture_output=True, text=True, cwd=REPO).stdout)
    targets = {task["name"]: task["target"] for task in plan["tasks"]}
    ps_target, w1_target = targets["ps0"], targets["worker1"]
    host1, host2, host3 = bare_metal["host1"], bare_metal["host2"], bare_metal["host3"]
    assert ps_target == f"{host1.address}:{TASK_PORT}"
    assert w1_target == f"{host3.address}:{TASK_PORT}"

    outsider = bare_metal.client.containers.run(
        HOST_IMAGE, entrypoint=["sleep", "infinity"], name=f"{bare_metal.prefix}-outsider-{job}",
        network=bare_metal.network.name, labels={"tfps.system-test": bare_metal.prefix}, detach=True)
    cleanup = None
    try:
        outsider.reload()
        outsider_address = outsider.attrs["NetworkSettings"]["Networks"][bare_metal.network.name]["IPAddress"]
        assert outsider_address not in {h.address for h in bare_metal.hosts}

        t0 = time.monotonic()
        # Copying the image archive to three fresh hosts dominates: allow for a loaded machine.
        start = run_playbook("deploy.yml", inventory, {**play_vars(tmp_path), "tfps_wait": False}, timeout=1500)
        assert_ok(start, "deploy.yml (start only)")
        print(f"deploy.yml (start only): {start.seconds:.0f} s")
        assert any(c["changed"] for c in recap(start.output).values())
        chief = f"tfps-{job}-worker0"
        assert chief in host2.containers(f"tfps.job={job}")
        a_rerun_changes_nothing(host2, inventory, job, run_playbook, tmp_path)
        deadline = time.monotonic() + 180
        while "first training step done" not in host2.sh(f"docker logs {chief} 2>&1")[1]:
            assert time.monotonic() < deadline, host2.sh(f"docker logs {chief} 2>&1")[1][-3000:]
            time.sleep(1)
        the_controller_sees_it(host2, inventory, job, run_playbook, tmp_path)

        def probe(container, *wanted: str, timeout: float = 3.0) -> dict[str, str]:
            code, out = container.exec_run(["python3", "-c", PROBE, str(timeout), *wanted])
            assert code == 0, out.decode(errors="replace")
            return json.loads(out)

        # Members: the chief's host and worker1's host reach the ps.
        assert probe(host2.container, ps_target) == {ps_target: "open"}
        assert probe(host3.container, ps_target) == {ps_target: "open"}
        # The outsider reaches host1 (sshd answers) but none of the TF ports.
        ssh = f"{host1.address}:22"
        seen = probe(outsider, ssh, *targets.values())
        assert seen[ssh] == "open", seen
        for name, target in targets.items():
            assert seen[target] in ("timeout", "refused"), f"{name} at {target} from outside the cluster: {seen}"
        # Neither does this machine (the network's gateway, no cluster member).
        here = json.loads(subprocess.run([sys.executable, "-c", PROBE, "3", *targets.values()], check=True,
                                         capture_output=True, text=True).stdout)
        assert all(v in ("timeout", "refused") for v in here.values()), here
        # What refused the outsider is the job's DROP rule, and the job trains on.
        rules = host1.sh("iptables -S INPUT")[1]
        assert f'--dport {TASK_PORT} -m comment --comment "tfps {job} ps0" -j DROP' in rules, rules
        assert f"-s {outsider_address}/32" not in rules
        # The deployed tasks, like the compose ones, run as uid 10001 without extra privileges.
        fmt = "{{.State.Running}} {{.Config.User}} {{.HostConfig.Privileged}} {{.HostConfig.CapAdd}}"
        for host, name in ((host1, "ps0"), (host2, "worker0"), (host3, "worker1")):
            state = host.sh(f"docker inspect -f '{fmt}' tfps-{job}-{name}")[1].split()
            assert state == ["true", f"{UID}:{UID}", "false", "[]"], (name, state)
            # Every host saved its rules for the next boot (iptables-persistent's file).
            saved = host.sh("cat /etc/iptables/rules.v4")[1]
            assert f'--comment "tfps {job} {name}" -j DROP' in saved, (host.name, saved)
        print(f"job started and probed: {time.monotonic() - t0:.0f} s")

        # TensorBoard on the chief's host: published on that host's loopback only, reading
        # the job's summaries; the play said how to reach it.
        tensorboard = f"tfps-{job}-tensorboard"
        bindings = json.loads(host2.sh(f"docker inspect -f '{{{{json .HostConfig.PortBindings}}}}' {tensorboard}")[1])
        assert bindings == {"6006/tcp": [{"HostIp": "127.0.0.1", "HostPort": "6006"}]}, bindings
        assert f"ssh -N -L 6006:127.0.0.1:6006 root@{host2.address}" in start.output, start.output[-3000:]
        get = ("python3 -c \"import sys, urllib.request; "
               "sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:6006' + sys.argv[1], timeout=5).read().decode())\"")
        deadline = time.monotonic() + 120
        while True:
            code, runs = host2.sh(f"{get} /data/runs", check=False)
            if code == 0 and json.loads(runs):
                break
            assert time.monotonic() < deadline, f"TensorBoard shows no run: {runs[-2000:]}"
            time.sleep(2)
        page = host2.sh(f"{get} /")[1]
        assert "<title>TensorBoard</title>" in page, page[:2000]
        tb_target = f"{host2.address}:6006"
        assert probe(outsider, tb_target) == {tb_target: "refused"}

        # -- worker1's host reboots mid-job -----------------------------------------------
        worker1 = f"tfps-{job}-worker1"
        started = host3.sh(f"docker inspect {worker1} --format '{{{{.State.StartedAt}}}}'")[1].strip()
        trained = "first training step done"    # its log keeps the lines of the run before the reboot
        trained_before = host3.sh(f"docker logs {worker1} 2>&1")[1].count(trained)
        t_reboot = time.monotonic()
        host3.reboot()
        host3.container.reload()
        assert host3.container.attrs["NetworkSettings"]["Networks"][bare_metal.network.name]["IPAddress"] \
            == host3.address
        # Back by its restart policy, and its TF server answers the cluster again.
        deadline = time.monotonic() + 180
        while True:
            code, out = host3.sh(f"docker inspect {worker1} --format '{{{{.State.StartedAt}}}} {{{{.State.Running}}}}'",
                                 check=False)
            if (code == 0 and out.split()[0] != started and out.split()[1] == "true"
                    and probe(host2.container, w1_target) == {w1_target: "open"}):
                break
            assert time.monotonic() < deadline, f"{worker1} did not come back after the reboot: {out}"
            time.sleep(1)
        print(f"host3 rebooted, worker1 back: {time.monotonic() - t_reboot:.0f} s")
        # The rules were restored at boot (no play ran since): the outsider is dropped
        # (a timeout, not a refusal: the port listens), the members get through.
        rules = host3.sh("iptables -S INPUT")[1]
        assert f'--dport {TASK_PORT} -m comment --comment "tfps {job} worker1" -j DROP' in rules, rules
        assert f"-A INPUT -s {host2.address}/32 -p tcp -m tcp --dport {TASK_PORT}" in rules, rules
        ssh3 = f"{host3.address}:22"
        assert probe(outsider, ssh3, w1_target) == {ssh3: "open", w1_target: "timeout"}
        assert probe(host1.container, w1_target) == {w1_target: "open"}
        restored = host3.container.logs().decode(errors="replace")
        assert restored.count("15-ip4tables start") == 2, restored[-2000:]   # at each of the two boots
        # Through those rules the rebooted task reached the ps and the chief and trains again.
        deadline = time.monotonic() + 180
        while host3.sh(f"docker logs {worker1} 2>&1")[1].count(trained) <= trained_before:
            assert time.monotonic() < deadline, host3.sh(f"docker logs {worker1} 2>&1")[1][-3000:]
            time.sleep(1)

        # -- the job ends with a final save -----------------------------------------------
        # The Ansible tutorial's stop line (docs/tutorials/ansible.md), on this inventory.
        stop_line = next(argv[1:] for argv in docblocks.commands(
            "tutorials/ansible.md", "tests/system/test_ansible_inventory.py",
            paths={"inventory/mycluster": inventory}) if argv[:2] == ["tfps", "stop"])
        assert stop_line == ["stop", "-i", str(inventory)], stop_line
        stop = run_playbook("stop.yml", inventory, play_vars(tmp_path), timeout=900, command=stop_line)
        assert_ok(stop, "stop.yml after the reboot")
        print(f"stop.yml: {stop.seconds:.0f} s")
        results = json.loads((tmp_path / "results" / "latest" / "results.json").read_text())
        assert results["status"] == "stopped" and 0 < results["global_step"] < steps, results
        assert results["export_complete"] is True, results
        assert host2.exists(f"/srv/tfps/{job}/export/tfps_export.json")
        assert host2.sh(f"cat /srv/tfps/{job}/checkpoint")[1].count(f"model.ckpt-{results['global_step']}")
        no_containers_anywhere(bare_metal, job)
        # One message, stop.yml's, at the step of the final save.
        expected = [f"[tfps] job {job} stopped at step {results['global_step']}"]

        def mail() -> list[str]:
            return [str(m["subject"]) for m in network_smtp_server.received() if f"job {job}" in str(m["subject"])]
        deadline = time.monotonic() + 30
        while not mail() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert mail() == expected
    finally:
        outsider.remove(force=True)
        cleanup = run_playbook("cleanup.yml", inventory, {**play_vars(tmp_path), "tfps_cleanup_model_dir": True})
    assert_ok(cleanup, "cleanup.yml")
    print(f"cleanup.yml: {cleanup.seconds:.0f} s")
    no_containers_anywhere(bare_metal, job)
    assert not host2.exists(f"/srv/tfps/{job}")
    for host in bare_metal.hosts:
        assert f"tfps {job} " not in host.sh("iptables -S INPUT")[1], host.name
        assert f"tfps {job} " not in host.sh("cat /etc/iptables/rules.v4")[1], host.name


def a_rerun_changes_nothing(chief_host, inventory, job: str, run_playbook, tmp_path) -> None:
    """deploy.yml again, and --check --diff, at the same time on the running job: both change
    nothing, the check says that nothing would change, and the chief is the same container."""
    running_id = chief_host.sh(f"docker inspect -f '{{{{.Id}}}}' tfps-{job}-worker0")[1].strip()
    nowait = {**play_vars(tmp_path), "tfps_wait": False}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        again = pool.submit(run_playbook, "deploy.yml", inventory, nowait)
        check = pool.submit(run_playbook, "deploy.yml", inventory, play_vars(tmp_path), args=["--check", "--diff"])
        second, checked = again.result(), check.result()
    print(f"deploy.yml again while the job runs: {second.seconds:.0f} s")
    assert_ok(second, "deploy.yml (again)")
    counts = recap(second.output)
    assert set(counts) >= {"host1", "host2", "host3"}
    assert all(c["changed"] == 0 for c in counts.values()), counts
    assert not re.search(r"^changed:", second.output, re.M)
    assert_ok(checked, "deploy.yml --check on a running job")
    counts = recap(checked.output)
    assert set(counts) == {"host1", "host2", "host3"}
    assert all(c["changed"] == 0 for c in counts.values()), counts
    assert f"--check: host2 already runs tfps-{job}-worker0: nothing would change" in checked.output
    assert chief_host.sh(f"docker inspect -f '{{{{.Id}}}}' tfps-{job}-worker0")[1].strip() == running_id
    assert f"job {job} step" not in checked.output and "RETRYING" not in checked.output
    assert not (tmp_path / "results" / "latest" / "results.json").exists()
    # The containers record what defines the job (settings.yml compares a new deploy with it).
    label = chief_host.sh(f"docker inspect -f '{{{{index .Config.Labels \"tfps.settings\"}}}}' tfps-{job}-worker0")[1]
    recorded = json.loads(base64.b64decode(label.strip()))
    assert (recorded["tfps_train_steps"], recorded["tfps_batch_size"]) == (10_000_000, 32), recorded
    assert recorded["layout"] == "ps0@host1 worker0@host2 worker1@host3", recorded


def the_controller_sees_it(chief_host, inventory, job: str, run_playbook, tmp_path) -> None:
    """tfps jobs, tfps logs and status.yml see the running job from the controller, through
    the inventory (all at once: none of them changes anything)."""
    env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"))
    tfps = [sys.executable, "-m", "tfps"]

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*tfps, *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        looks = [pool.submit(cli, "jobs", "-i", str(inventory)),
                 pool.submit(cli, "logs", "-i", str(inventory), job, "-n", "20"),
                 pool.submit(cli, "logs", "-i", str(inventory), "nosuchjob"),
                 pool.submit(run_playbook, "status.yml", inventory, play_vars(tmp_path))]
        follow = subprocess.Popen([*tfps, "logs", "-i", str(inventory), job, "ps0", "-n", "1", "-f"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        try:
            first = follow.stdout.readline()
            assert first.startswith("[ps0] "), first
        finally:
            follow.terminate()
            follow.wait(30)
        listed, shown, missing, status = (look.result() for look in looks)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    row = next((line.split() for line in listed.stdout.splitlines() if line.startswith(f"{job} ")), None)
    assert row is not None, listed.stdout
    assert row[1] == "running" and re.fullmatch(r"\d+/10000000", row[2]) and int(row[2].split("/")[0]) > 0, row
    assert row[-1] == "host1,host2,host3", row
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert any(re.match(r"\[worker0\] \S+ I worker0: step \d+/10000000", line) for line in shown.stdout.splitlines()), \
        shown.stdout[-2000:]
    assert missing.returncode == 2 and "no host of the inventory has task worker0 of job 'nosuchjob'" in missing.stderr
    assert_ok(status, "status.yml")
    assert re.search(rf"tfps-{job}-worker0\s+running", status.output)


# The job is conftest's finished_job: a fresh cluster gets the image archive on all three
# hosts first (gigabytes over SSH) when this test is the first to ask for it.
@pytest.mark.timeout(1800)
def test_ansible_vault_urls_reach_the_chief_as_a_file_and_leak_nowhere(bare_metal, finished_job):
    """deploy.yml at -vvv with the URL (password full of URL-special characters) in a
    Vault-encrypted group_vars/all/vault.yml: the email arrives through the real SMTP
    server, the chief read the URL from a 0400 file of uid 10001 mounted read-only, and
    the password is neither in the play's output nor in `docker inspect` of any task.

    The same deploy covers one image everywhere: host3 held a stale, different image
    under tfps's tag; the play gave it the archive's image, every task ran that image,
    and results.json and the message record its id. (The job also is the one whose
    deploy test_ansible.py checks.)"""
    job, result, image_id = finished_job.job, finished_job.result, finished_job.image_id
    host3 = bare_metal["host3"]
    assert finished_job.stale_image_id.startswith("sha256:") and finished_job.stale_image_id != image_id
    assert "SUCCEEDED at global step" in result.output
    # Really -vvv: connection details and task results are in the output.
    assert "ESTABLISH SSH CONNECTION" in result.output and "SSH: EXEC" in result.output
    messages = finished_job.messages
    assert len(messages) == 1 and "succeeded" in str(messages[0]["Subject"]), [str(m["Subject"]) for m in messages]
    assert (USER, PASSWORD) in {(user, pw) for _, user, pw in finished_job.logins}, finished_job.logins

    found = {}
    if leaks(result.output):
        found["deploy.yml -vvv output"] = leaks(result.output)
    for path in finished_job.results_dir.rglob("*"):
        if path.is_file() and leaks(path.read_bytes()):
            found[f"collected {path.name}"] = leaks(path.read_bytes())

    host2 = bare_metal["host2"]
    chief = f"tfps-{job}-worker0"
    for host, name in ((bare_metal["host1"], "ps0"), (host2, "worker0"), (bare_metal["host3"], "worker1")):
        inspect = host.sh(f"docker inspect tfps-{job}-{name}")[1]
        if leaks(inspect):
            found[f"docker inspect {name} on {host.name}"] = leaks(inspect)
    attrs = json.loads(host2.sh(f"docker inspect {chief}")[1])[0]
    assert "APPRISE_URLS_FILE=/run/secrets/notify_urls" in attrs["Config"]["Env"]
    assert not [e for e in attrs["Config"]["Env"] if e.startswith("APPRISE_URLS=")]
    mount = next(m for m in attrs["Mounts"] if m["Destination"] == "/run/secrets/notify_urls")
    assert mount["Type"] == "bind" and mount["RW"] is False, mount
    # The bind mount shows the container the host file itself: its owner, its mode.
    assert host2.sh(f"stat -c '%a %u %g' {mount['Source']}")[1].split() == ["400", str(UID), str(UID)]
    assert leaks(host2.sh(f"cat {mount['Source']}")[1]), "the chief's file holds the URL"
    # ... as the container's user sees it, through the same read-only mount.
    seen = host2.sh(f"docker run --rm --user {UID}:{UID} --entrypoint sh "
                    f"--mount type=bind,source={mount['Source']},target=/run/secrets/notify_urls,readonly {IMAGE} "
                    "-c 'stat -c \"%a %u\" /run/secrets/notify_urls; test -r /run/secrets/notify_urls && echo readable; "
                    "echo x 2>/dev/null >> /run/secrets/notify_urls || echo read-only'")[1].split()
    assert seen == ["400", str(UID), "readable", "read-only"], seen
    assert found == {}, f"the password leaked: {found}"

    # One image everywhere: host3's tag now names the archive's image, every task ran it.
    assert host3.sh(f"docker image inspect {IMAGE} --format '{{{{.Id}}}}'")[1].strip() == image_id
    for host, name in ((bare_metal["host1"], "ps0"), (host2, "worker0"), (host3, "worker1")):
        assert host.sh(f"docker inspect tfps-{job}-{name} --format '{{{{.Image}}}}'")[1].strip() == image_id, name
    results = json.loads((finished_job.results_dir / "latest" / "results.json").read_text())
    assert results["status"] == "succeeded" and results["image"] == image_id
    body = next(part.get_payload(decode=True).decode() for part in messages[0].walk()
                if part.get_content_type() == "text/plain")
    assert image_id in body, body
