"""The Ansible backend (``tfps deploy``, ``-i INVENTORY``): containers on an inventory's hosts.

Starting and stopping run the packaged playbooks (``tfps.launch.playbook``: deploy.yml,
stop.yml, status.yml). ``tfps jobs -i`` and ``tfps logs -i`` run ``ansible/jobs.yml`` with
``ansible-playbook``: Ansible's own inventory, connection plugins, SSH settings and become,
not a second SSH client. The play writes what it read as JSON
(``ansible/filter_plugins/tfps_jobs.py``), and this module turns it into a table or a task's
log lines, prefixed as ``tfps local`` prefixes them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from tfps import logs, playbooks
from tfps.backends.protocol import Start, age, print_row, render
from tfps.cluster import Launch, Plan
from tfps.config import RunConfig
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.launch.playbook import ensure_collections, run_playbook
from tfps.outcome.results import eta_seconds
from tfps.playbooks import ansible_dir, ansible_playbook, playbook_env
from tfps.playbooks import playbook as packaged_playbook

#: tfps's Ansible directory (playbooks, role, ansible.cfg), package data.
ANSIBLE_DIR = ansible_dir()
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z) ?(.*)$")


def read_hosts(inventories: list[str], playbook_args: list[str] | None = None, job: str | None = None,
               task: str = "worker0", since: str = "", lines: int = 100, timeout: float = 300) -> dict:
    """Run ansible/jobs.yml on the inventory's ps and worker hosts; what it read, per host.
    ``playbook_args``: ansible-playbook's own options (``-e VARS``, ``--vault-id ID``, ...)."""
    playbook = packaged_playbook("jobs.yml")
    binary = ansible_playbook()
    with tempfile.TemporaryDirectory(prefix="tfps-jobs-") as tmp:
        out = os.path.join(tmp, "view.json")
        argv = [*binary, str(playbook), "-e", json.dumps({"tfps_jobs_out": out})]
        for source in inventories:
            argv += ["-i", os.path.abspath(source) if os.path.exists(source) else source]
        argv += list(playbook_args or [])
        if job is not None:
            argv += ["-e", json.dumps({"tfps_logs_job": job, "tfps_logs_task": task, "tfps_logs_since": since,
                                       "tfps_logs_lines": lines})]
        env = dict(playbook_env(), ANSIBLE_NOCOLOR="1")
        done = subprocess.run(argv, cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=timeout)
        if not os.path.exists(out):
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise ConfigError(f"ansible-playbook could not read the hosts (exit {done.returncode}):\n{tail}",
                              "inventory")
        with open(out) as fh:
            return json.load(fh)["hosts"]


def job_rows(hosts: dict, now: float | None = None) -> list[dict]:
    """One row per job found on the hosts: name, state, step/total, loss, examples/s,
    started, ETA, hosts. The chief's container says the state; its history the progress."""
    now = time.time() if now is None else now
    jobs: dict[str, dict] = {}
    for host, seen in sorted(hosts.items()):
        for c in seen.get("containers") or []:
            job = jobs.setdefault(c["job"], {"job": c["job"], "hosts": set(), "chief": None, "records": []})
            job["hosts"].add(host)
            if c.get("role") == "chief":
                job["chief"] = c
                job["records"] = (seen.get("history") or {}).get(c["name"], [])
    rows = []
    for name in sorted(jobs):
        j, chief = jobs[name], jobs[name]["chief"]
        total = int((chief or {}).get("train_steps") or RunConfig().train_steps)
        records = j["records"]
        newest = records[-1] if records else {}
        row = {"job": name, "state": "no chief" if chief is None else str(chief.get("state")),
               "step": f"{int(newest.get('step', 0))}/{total}",
               "loss": f"{newest['loss']:.4f}" if isinstance(newest.get("loss"), (int, float)) else "-",
               "examples/s": f"{newest['examples_per_sec']:.0f}" if newest.get("examples_per_sec") else "-",
               "started": age(now - chief["created"]) if chief and chief.get("created") else "-",
               "ETA": "-", "hosts": ",".join(sorted(j["hosts"]))}
        eta = eta_seconds(records[-1], records[-2], total) if len(records) > 1 else None
        if chief and chief.get("state") == "running" and eta is not None:
            row["ETA"] = f"{eta:.0f} s"
        if chief and chief.get("state") != "running":
            row["state"] = str(chief.get("status") or chief.get("state"))
        rows.append(row)
    return rows


def list_jobs(inventories: list[str], playbook_args: list[str] | None = None, read=read_hosts) -> tuple[str, bool]:
    """(the table, whether every host was read)."""
    hosts = read(inventories, playbook_args)
    errors = {h: v["error"] for h, v in hosts.items() if v.get("error")}
    return render(job_rows(hosts), errors), not errors


def log_lines(hosts: dict, task: str) -> tuple[list[str], str]:
    """(the task's log lines prefixed ``[task] ``, the newest line's timestamp) from read_hosts."""
    entries = _entries(hosts, task)
    return [line for _, line in entries], max((stamp for stamp, _ in entries), default="")


def _entries(hosts: dict, task: str) -> list[tuple[str, str]]:
    """(docker's timestamp, the line prefixed ``[task] ``) of each log line, each container once."""
    out, done = [], set()
    for seen in hosts.values():
        for name, text in (seen.get("logs") or {}).items():
            if name in done:   # one engine under two inventory names (inventory/local)
                continue
            done.add(name)
            for line in text.splitlines():
                m = _TIMESTAMP.match(line)
                stamp, body = (m.group(1), m.group(2)) if m else ("", line)
                if not logs.is_tf_noise(body):   # TensorFlow's import banner, as tfps local drops it
                    out.append((stamp, f"[{task}] {body}"))
    return out


def not_found(hosts: dict, job: str, task: str) -> str | None:
    """Why no log of ``task`` was found when some hosts could not be read (unreachable, no Docker):
    one line naming them with the reason, grouped by reason (the task may well be on one of them).
    None when every host was read: the task is on none of them."""
    unread: dict[str, list[str]] = {}
    for host, seen in sorted(hosts.items()):
        if seen.get("error"):
            unread.setdefault(str(seen["error"]).replace(f" {host} ", " HOST "), []).append(host)
    if not unread:
        return None
    read = [h for h, seen in sorted(hosts.items()) if not seen.get("error")]
    why = "; ".join(f"{', '.join(names)} could not be read: {reason}" for reason, names in unread.items())
    if not read:
        return f"task {task} of job {job!r} could not be looked for, no host was read: {why}"
    return f"task {task} of job {job!r} is on none of the hosts that were read ({', '.join(read)}); {why}"


def show_logs(inventories: list[str], job: str, task: str, follow: bool, lines: int = 100,
              playbook_args: list[str] | None = None, out=sys.stdout, poll: float = 2.0,
              read=read_hosts) -> bool | str:
    """Print the task's log (its last ``lines``), and with ``follow`` what it writes next until
    the container stops: True. When no host has the task's container: False, or :func:`not_found`'s
    line when some hosts could not be read. ``read``: :func:`read_hosts`, or what it read once."""
    hosts = read(inventories, playbook_args, job=job, task=task, lines=lines)
    if not any(v.get("containers") for v in hosts.values()):
        return not_found(hosts, job, task) or False
    text, last = log_lines(hosts, task)
    for line in text:
        print(line, file=out, flush=True)
    while follow:
        running = any(c.get("state") == "running" for v in hosts.values() for c in v.get("containers") or [])
        if not running:
            break
        time.sleep(poll)
        hosts = read(inventories, playbook_args, job=job, task=task, since=last or "0s")
        entries = _entries(hosts, task)
        # --since is inclusive: the line of the last timestamp comes again.
        for stamp, line in entries:
            if stamp > last:
                print(line, file=out, flush=True)
        last = max([last] + [stamp for stamp, _ in entries])
    return True


# --------------------------------------------------------------------------- the backend

def playbook_args(ns) -> list[str]:
    """ansible-playbook's own options from tfps's: -e, vault identities and password files."""
    out = [a for extra in ns.extra_vars for a in ("-e", extra)]
    out += [a for ident in ns.vault_id for a in ("--vault-id", ident)]
    return out + [a for path in ns.vault_password_file for a in ("--vault-password-file", path)]


def check_inventory(ns) -> dict:
    """Refuse, as ``tfps plan`` does and before any play starts, an inventory the play cannot run
    on: a source that does not exist, one Ansible cannot parse, no hosts in ps or worker, bad
    ``tfps_*`` variables. (Without it, ansible-playbook warns, matches no host and exits 0.)
    The plan's data when it can."""
    from tfps.cluster.inventory import load_view, plan_from_view  # lazy: imports NumPy and PyYAML
    return plan_from_view(*load_view(ns.inventory, extra_vars=ns.extra_vars, vault_ids=ns.vault_id,
                                     vault_password_files=ns.vault_password_file,
                                     playbook_dir=str(playbooks.ansible_dir())))


def read_installed(inventories: list[str], playbook_args: list[str] | None = None, **kwargs) -> dict:
    """:func:`read_hosts`, once the Ansible collections the play needs are there (installed once)."""
    ensure_collections()
    return read_hosts(inventories, playbook_args, **kwargs)


class AnsibleBackend:
    """Containers on an inventory's hosts: the packaged playbooks and ansible/jobs.yml.

    ``read`` reads the hosts (:func:`read_installed`); tests give it what a play read."""

    name = "ansible"
    option = "-i INVENTORY"

    def __init__(self, ns, read=None):
        self.ns = ns
        self.inventories: list[str] = list(ns.inventory or [])
        self.args = playbook_args(ns)
        self.read = read or read_installed

    @classmethod
    def from_args(cls, ns) -> AnsibleBackend:
        return cls(ns)

    def dry_run(self, plan: Plan, launch: Launch) -> list[Start]:
        """Each task's container on its host and the command it runs (``tfps plan -i`` shows the same)."""
        data = plan.to_json(launch)
        return [Start(t["name"], f"{t['container']} on {t['host']}",
                      tuple(t["entrypoint"] or ["tfps"]) + tuple(t["argv"])) for t in data["tasks"]]

    def play(self, command: str, checked: bool = False) -> int:
        """The command's playbook (deploy, stop, status, cleanup) on the inventory, once it is checked."""
        if not checked:
            check_inventory(self.ns)
        return run_playbook(command, self.inventories, self.args, check=getattr(self.ns, "check", False),
                            diff=getattr(self.ns, "diff", False), extra=getattr(self.ns, "playbook_options", None))

    def submit(self, ns) -> int:
        """``tfps deploy``: deploy.yml."""
        return self.play("deploy")

    def jobs(self) -> tuple[str, bool]:
        return list_jobs(self.inventories, self.args, read=self.read)

    def status(self, job: str | None) -> int:
        """No job: status.yml on the inventory's job (``tfps status -i``). A job: its row, from jobs.yml."""
        if job is None:
            return self.play("status")
        hosts = self.read(self.inventories, self.args)
        row = next((r for r in job_rows(hosts) if r["job"] == job), None)
        if row is not None:
            return print_row(row)
        unread = sorted(h for h, v in hosts.items() if v.get("error"))
        if unread:   # as tfps logs -i: the job may be on a host that was not read, exit 1
            print(f"tfps: error: job {job!r} is on none of the hosts that were read; {', '.join(unread)} could "
                  "not be read (`tfps jobs -i ...` says why)", file=sys.stderr, flush=True)
            return ExitCode.TRAINING_FAILED
        raise ConfigError(f"no tfps job {job!r} on the inventory's hosts; `tfps jobs -i ...` lists them", "job")

    def logs(self, job: str, task: str, follow: bool, lines: int) -> int:
        shown = show_logs(self.inventories, job, task, follow, lines, self.args, read=self.read)
        if shown is True:
            return ExitCode.OK
        if shown:   # hosts that could not be read: as tfps jobs -i, exit 1
            print(f"tfps: error: {shown}", file=sys.stderr, flush=True)
            return ExitCode.TRAINING_FAILED
        raise ConfigError(f"no host of the inventory has task {task} of job {job!r}; `tfps jobs -i ...` "
                          "lists the jobs there", "job")

    def stop(self, job: str | None) -> int:
        """stop.yml on the inventory's job (chief first, then collect); a ``job`` must be that job."""
        if job is not None:
            name = check_inventory(self.ns)["job"]["name"]
            if job != name:
                raise ConfigError(f"no tfps job {job!r} in this inventory, whose job is {name!r}; tfps stop -i stops "
                                  "the job its inventory names (tfps_job_name); `tfps jobs -i ...` lists them", "job")
        return self.play("stop", checked=job is not None)


BACKEND = AnsibleBackend
