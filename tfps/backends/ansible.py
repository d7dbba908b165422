"""``tfps jobs`` and ``tfps logs``: the tfps jobs on an inventory's hosts, seen from the controller.

Both run ``ansible/jobs.yml`` with ``ansible-playbook``: Ansible's own inventory, connection
plugins, SSH settings and become, not a second SSH client. The play writes what it read as
JSON (``ansible/filter_plugins/tfps_jobs.py``), and this module turns it into a table or a
task's log lines, prefixed as ``tfps local`` prefixes them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from tfps import logs
from tfps.config import RunConfig
from tfps.errors import ConfigError
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


def _age(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


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
               "started": _age(now - chief["created"]) if chief and chief.get("created") else "-",
               "ETA": "-", "hosts": ",".join(sorted(j["hosts"]))}
        eta = eta_seconds(records[-1], records[-2], total) if len(records) > 1 else None
        if chief and chief.get("state") == "running" and eta is not None:
            row["ETA"] = f"{eta:.0f} s"
        if chief and chief.get("state") != "running":
            row["state"] = str(chief.get("status") or chief.get("state"))
        rows.append(row)
    return rows


def render(rows: list[dict], errors: dict[str, str]) -> str:
    cols = ["job", "state", "step", "loss", "examples/s", "started", "ETA", "hosts"]
    lines = []
    if rows:
        width = {c: max(len(c.upper()), *(len(r[c]) for r in rows)) for c in cols}
        lines.append("  ".join(c.upper().ljust(width[c]) for c in cols).rstrip())
        lines += ["  ".join(r[c].ljust(width[c]) for c in cols).rstrip() for r in rows]
    else:
        lines.append("no tfps job on these hosts")
    lines += [f"{host}: not read: {error}" for host, error in sorted(errors.items())]
    return "\n".join(lines)


def list_jobs(inventories: list[str], playbook_args: list[str] | None = None) -> tuple[str, bool]:
    """(the table, whether every host was read)."""
    hosts = read_hosts(inventories, playbook_args)
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
              playbook_args: list[str] | None = None, out=sys.stdout, poll: float = 2.0) -> bool | str:
    """Print the task's log (its last ``lines``), and with ``follow`` what it writes next until
    the container stops: True. When no host has the task's container: False, or :func:`not_found`'s
    line when some hosts could not be read."""
    hosts = read_hosts(inventories, playbook_args, job=job, task=task, lines=lines)
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
        hosts = read_hosts(inventories, playbook_args, job=job, task=task, since=last or "0s")
        entries = _entries(hosts, task)
        # --since is inclusive: the line of the last timestamp comes again.
        for stamp, line in entries:
            if stamp > last:
                print(line, file=out, flush=True)
        last = max([last] + [stamp for stamp, _ in entries])
    return True
