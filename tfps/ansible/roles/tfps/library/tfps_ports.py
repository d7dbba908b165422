#!/usr/bin/python
# Runs on each host of the job (not on the controller): the one place where a job's ports
# on a host are chosen and recorded, under a lock, so that two plays started at the same
# moment never pick the same ports.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tfps_ports
short_description: Choose, record or forget a tfps job's ports on a host
description:
  - Each tfps job on a host holds a reservation in /var/lib/tfps/ports.json, taken under
    an exclusive lock (/var/lib/tfps/.ports.lock): its inventory host's range of TF ports
    (one per task, consecutive) and, on the chief's host, TensorBoard's port.
  - I(state=reserved) keeps the job's reservation when it has one of the right size, and
    otherwise takes the lowest free range from I(first_port) up, free meaning reserved by no
    other job and listened on by nothing (/proc/net/tcp and tcp6). A fixed I(base) is
    recorded as given, and refused if another job holds one of its ports.
  - A reservation lives as long as its job has a container on the host's Docker engine. One
    without any container (a deploy that stopped in its checks) expires after I(ttl) seconds.
  - I(state=query) returns the job's reservation without changing anything; I(state=absent)
    forgets it (cleanup.yml).
options:
  job:
    description: The job's name (tfps_job_name).
    type: str
    required: true
  owner:
    description: The inventory host the TF ports are for (two inventory entries may share a machine).
    type: str
    required: true
  count:
    description: How many TF ports (tasks) the host needs; 0 for none.
    type: int
    default: 0
  base:
    description: The host's tfps_base_port when the inventory sets it; none to choose one.
    type: int
  avoid:
    description: Ports this job uses on the same machine through other inventory entries with a fixed base.
    type: list
    elements: int
    default: []
  first_port:
    description: The lowest TF port to choose.
    type: int
    default: 2222
  tensorboard:
    description: Reserve TensorBoard's port too (the chief's host with tfps_tensorboard).
    type: bool
    default: false
  tensorboard_port:
    description: tfps_tensorboard_port; 0 to choose one from I(tensorboard_first_port) up.
    type: int
    default: 0
  tensorboard_first_port:
    description: The lowest TensorBoard port to choose.
    type: int
    default: 6006
  state:
    description: reserved, query or absent.
    type: str
    choices: [reserved, query, absent]
    default: query
  state_dir:
    description: Where the reservations and their lock are kept.
    type: str
    default: /var/lib/tfps
  ttl:
    description: Seconds a reservation without any container of its job is kept.
    type: int
    default: 1800
  docker_socket:
    description: The Docker engine's socket, asked which jobs have containers.
    type: str
    default: /var/run/docker.sock
author: tfps
"""

RETURN = r"""
base_port:
  description: The first TF port of the host's tasks (none when the job has no reservation here).
  type: int
tensorboard_port:
  description: TensorBoard's port (with tensorboard).
  type: int
"""

import fcntl  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402

from ansible.module_utils.tfps_docker import engine_request  # noqa: E402

TENSORBOARD = "tensorboard"


class PortsError(Exception):
    """A reservation that cannot be made; the message says what to change."""


def listening_ports(paths=("/proc/net/tcp", "/proc/net/tcp6")) -> set[int]:
    """TCP ports something listens on, in this network namespace."""
    ports: set[int] = set()
    for path in paths:
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def jobs_with_containers(socket_path: str) -> set[str] | None:
    """The tfps jobs that have a container (any state) on the engine; None when it cannot be asked."""
    query = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"label": ["tfps.job"]})})
    try:
        status, body = engine_request(socket_path, f"/containers/json?{query}")
        if status != 200:
            return None
        return {(c.get("Labels") or {}).get("tfps.job") for c in json.loads(body)} - {None}
    except (OSError, ValueError, http.client.HTTPException):
        return None


def _ports(entry: dict) -> range:
    return range(entry["base"], entry["base"] + entry["count"])


def _span(base: int, count: int) -> str:
    return str(base) if count == 1 else f"{base}-{base + count - 1}"


def live(entries: list[dict], job: str, with_containers: set[str] | None, now: float, ttl: int) -> list[dict]:
    """The reservations still held: this job's, those of jobs with a container, and recent ones."""
    return [e for e in entries
            if e["job"] == job or with_containers is None or e["job"] in with_containers
            or now - e.get("time", 0) < ttl]


def choose(count: int, first: int, taken: set[int]) -> int:
    """The lowest base >= first whose ``count`` consecutive ports are all free."""
    base = first
    while base + count - 1 <= 65535:
        clash = [p for p in range(base, base + count) if p in taken]
        if not clash:
            return base
        base = max(clash) + 1
    raise PortsError(f"no {count} consecutive free port(s) from {first} up to 65535 on this host; "
                     "stop other jobs (cleanup.yml) or set tfps_base_port")


def reserve(entries: list[dict], job: str, requests: list[dict], listening: set[int], avoid: set[int],
            now: float) -> tuple[list[dict], dict[str, int]]:
    """Reservations after giving ``job`` each of ``requests`` ({owner, count, base or None,
    first}), and the base port each owner got. Entries of other jobs are never changed."""
    kept = list(entries)
    chosen: dict[str, int] = {}
    for request in requests:
        owner, count, fixed = request["owner"], request["count"], request.get("base")
        mine = next((e for e in kept if e["job"] == job and e["owner"] == owner), None)
        others = [e for e in kept if e is not mine]
        taken = {p for e in others for p in _ports(e)}
        if fixed is not None:
            for e in others:
                overlap = sorted(set(_ports(e)) & set(range(fixed, fixed + count)))
                if overlap and e["job"] != job:
                    raise PortsError(
                        f"port(s) {_span(fixed, count)} ({owner}) overlap port(s) {_span(e['base'], e['count'])} that "
                        f"job {e['job']} holds on this host; give {owner} another tfps_base_port, or leave "
                        "tfps_base_port out and the play chooses free ports")
            base = fixed
        elif mine is not None and mine["count"] == count and not (set(_ports(mine)) & taken):
            base = mine["base"]
        else:
            busy = taken | avoid | {p for p in listening if mine is None or p not in _ports(mine)}
            base = choose(count, request["first"], busy)
        if mine is not None:
            kept.remove(mine)
        kept.append({"job": job, "owner": owner, "base": base, "count": count, "time": now})
        chosen[owner] = base
    return kept, chosen


class Reservations:
    """ports.json under its lock: ``with Reservations(dir) as r: r.entries ...; r.save()``."""

    def __init__(self, state_dir: str):
        self.dir = state_dir
        self.path = os.path.join(state_dir, "ports.json")
        self.entries: list[dict] = []

    def __enter__(self):
        os.makedirs(self.dir, mode=0o755, exist_ok=True)
        self._lock = open(os.path.join(self.dir, ".ports.lock"), "a")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            with open(self.path) as fh:
                data = json.load(fh)
            self.entries = [e for e in data.get("reservations", []) if {"job", "owner", "base", "count"} <= set(e)]
        except FileNotFoundError:
            self.entries = []
        except ValueError:
            # A damaged file: what listens is still avoided, and the jobs' next deploys record again.
            self.entries = []
        return self

    def save(self) -> None:
        tmp = f"{self.path}.{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump({"reservations": self.entries}, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)

    def __exit__(self, *exc):
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()
        return False


def run(params: dict, check_mode: bool) -> dict:
    job, owner, state = params["job"], params["owner"], params["state"]
    with Reservations(params["state_dir"]) as res:
        before = [dict(e) for e in res.entries]
        if state == "absent":
            res.entries = [e for e in res.entries if e["job"] != job]
            changed = res.entries != before
            if changed and not check_mode:
                res.save()
            return {"changed": changed}
        if state == "query":
            mine = {e["owner"]: e["base"] for e in res.entries if e["job"] == job}
            return {"changed": False, "base_port": mine.get(owner), "tensorboard_port": mine.get(TENSORBOARD)}
        now = time.time()
        entries = live(res.entries, job, jobs_with_containers(params["docker_socket"]), now, params["ttl"])
        requests = []
        if params["count"] > 0:
            requests.append({"owner": owner, "count": params["count"], "base": params.get("base"),
                             "first": params["first_port"]})
        if params["tensorboard"]:
            requests.append({"owner": TENSORBOARD, "count": 1, "base": params["tensorboard_port"] or None,
                             "first": params["tensorboard_first_port"]})
        res.entries, chosen = reserve(entries, job, requests, listening_ports(), set(params["avoid"]), now)
        strip = [{k: v for k, v in e.items() if k != "time"} for e in res.entries]
        changed = strip != [{k: v for k, v in e.items() if k != "time"} for e in before]
        if not check_mode:
            res.save()
        return {"changed": changed, "base_port": chosen.get(owner), "tensorboard_port": chosen.get(TENSORBOARD)}


def main():
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            job=dict(type="str", required=True),
            owner=dict(type="str", required=True),
            count=dict(type="int", default=0),
            base=dict(type="int"),
            avoid=dict(type="list", elements="int", default=[]),
            first_port=dict(type="int", default=2222),
            tensorboard=dict(type="bool", default=False),
            tensorboard_port=dict(type="int", default=0),
            tensorboard_first_port=dict(type="int", default=6006),
            state=dict(type="str", choices=["reserved", "query", "absent"], default="query"),
            state_dir=dict(type="str", default="/var/lib/tfps"),
            ttl=dict(type="int", default=1800),
            docker_socket=dict(type="str", default="/var/run/docker.sock"),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode)
    except PortsError as exc:
        module.fail_json(msg=f"{module.params['owner']}: {exc}")
    except OSError as exc:
        where = module.params["state_dir"]
        module.fail_json(msg=f"{module.params['owner']}: cannot keep the job's ports in {where} ({exc})")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
