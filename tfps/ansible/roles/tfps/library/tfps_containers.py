#!/usr/bin/python
# Runs on a host of the job: the state of some of the job's containers, asked of the Docker
# engine's socket with the standard library alone, and (with wait) waiting there for them to
# exit. deploy.yml's wait runs it once per look: a docker_container_info look imported
# requests and the Docker modules' client on the host and took about 0.6 s of CPU there,
# this one a small fraction of that, and an exit is seen within half a second instead of at
# the next look.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tfps_containers
short_description: Look at (and wait for) a tfps job's containers on a host
description:
  - Asks the host's Docker engine, over its socket, for each named container's state
    (C(docker inspect)), and returns it.
  - With I(wait) above 0, keeps looking (every half second) until no named container is
    running, or I(wait) seconds have passed. An engine that does not answer for a while
    (restarting) is asked again until then.
  - With I(history), also returns the last two records of that history.jsonl (a tfps job's
    progress), read when the module returns.
  - Changes nothing.
options:
  names:
    description: The containers (or give I(tasks)).
    type: list
    elements: str
  tasks:
    description:
      - Tasks of the job's plan, each with its C(container); returned in I(results) with their
        container's state, shaped like a loop of docker_container_info over them (C(item),
        C(exists), C(container)), so one module run replaces one per task.
    type: list
    elements: dict
  wait:
    description: Seconds to wait on the host for every named container to have exited (or not to exist); 0 looks once.
    type: float
    default: 0
  history:
    description: A history.jsonl on the host whose last two records are returned; empty for none.
    type: str
    default: ""
  docker_socket:
    description: The Docker engine's socket.
    type: str
    default: /var/run/docker.sock
author: tfps
"""

RETURN = r"""
containers:
  description: Each name's C(docker inspect) result, or null when there is no such container.
  type: dict
  returned: always
running:
  description: The names whose container is running (or restarting, or paused) at the end.
  type: list
  returned: always
records:
  description: The last two parsed records of I(history), oldest first (fewer before there are two).
  type: list
  returned: always
results:
  description: With I(tasks), one per task, as a loop of docker_container_info registers them (item, exists, container).
  type: list
  returned: when tasks is given
"""

import http.client  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402

from ansible.module_utils.tfps_docker import engine_request  # noqa: E402

#: States in which a container is done: it will not run again unless something starts it.
ENDED = ("exited", "dead")
#: Seconds between two looks while waiting.
INTERVAL = 0.5


class EngineError(Exception):
    """The engine could not be asked (no socket, restarting, an error answer)."""


def inspect(socket_path: str, name: str) -> dict | None:
    """``docker inspect`` of one container; None when the engine has no such container."""
    try:
        status, body = engine_request(socket_path, f"/containers/{urllib.parse.quote(name, safe='')}/json")
    except (OSError, http.client.HTTPException) as e:
        raise EngineError(f"the Docker engine at {socket_path} does not answer: {e}") from e
    if status == 404:
        return None
    if status != 200:
        raise EngineError(f"the Docker engine at {socket_path} answered {status}: "
                          f"{body[:300].decode(errors='replace').strip()}")
    try:
        return json.loads(body)
    except ValueError as e:
        raise EngineError(f"the Docker engine at {socket_path} answered something that is not JSON: {e}") from e


def running(containers: dict) -> list[str]:
    """The names whose container has not ended."""
    return [name for name, c in containers.items()
            if c is not None and ((c.get("State") or {}).get("Status") or "exited") not in ENDED]


def look(socket_path: str, names: list[str], wait: float, sleep=time.sleep, clock=time.monotonic) -> dict:
    """Each name's inspect result, after waiting up to ``wait`` seconds for none to be running.
    Raises EngineError when the engine could not be asked at the end."""
    end = clock() + max(wait, 0.0)
    while True:
        try:
            containers = {name: inspect(socket_path, name) for name in names}
            error = None
        except EngineError as e:
            containers, error = {}, e
        if error is None and not running(containers):
            return containers
        if clock() + INTERVAL > end:
            if error is not None:
                raise error
            return containers
        sleep(INTERVAL)


def last_records(path: str, count: int = 2) -> list[dict]:
    """The last ``count`` whole JSON records of a JSON-lines file (a line being written is skipped)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(size - 65536, 0))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    records = []
    for line in tail.splitlines()[-(count + 1):]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records[-count:]


def main():
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type="list", elements="str"),
            tasks=dict(type="list", elements="dict"),
            wait=dict(type="float", default=0),
            history=dict(type="str", default=""),
            docker_socket=dict(type="str", default="/var/run/docker.sock"),
        ),
        required_one_of=[("names", "tasks")],
        mutually_exclusive=[("names", "tasks")],
        supports_check_mode=True,
    )
    p = module.params
    names = p["names"] or [str(t.get("container")) for t in p["tasks"]]
    try:
        containers = look(p["docker_socket"], names, p["wait"])
    except EngineError as e:
        module.fail_json(msg=str(e))
    result = dict(changed=False, containers=containers, running=running(containers),
                  records=last_records(p["history"]) if p["history"] else [])
    if p["tasks"] is not None:
        result["results"] = [{"item": t, "exists": containers[name] is not None, "container": containers[name]}
                             for t, name in zip(p["tasks"], names)]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
