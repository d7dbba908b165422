"""Filters of the tfps role: formatting, and the data check. The plan itself comes from `tfps plan`."""

from __future__ import annotations


def tfps_plan_row(task):
    """One line of the plan table for a task of `tfps plan --format json`."""
    role = "chief" if task.get("chief") else task.get("job", "")
    gpu = "-" if task.get("gpu") is None else str(task["gpu"])
    return "%-9s %-18s %-22s %-6s %s" % (task["name"], task["host"], task["target"], gpu, role)


def tfps_fixed_ports_beside(plan, host):
    """Ports this job's other inventory entries on ``host``'s machine (same address) take from
    a tfps_base_port the inventory sets: tfps_ports chooses around them."""
    fixed = {h for h, v in (plan.get("hosts") or {}).items() if "tfps_base_port" in v}
    addresses = {t["address"].lower() for t in plan["tasks"] if t["host"] == host}
    return sorted(t["port"] for t in plan["tasks"]
                  if t["host"] != host and t["host"] in fixed and t["address"].lower() in addresses)


def tfps_chosen_ports(hostvars, hosts):
    """Inventory host -> the first TF port tfps_ports chose or found there (hosts where it
    could not run keep the plan's ports)."""
    chosen = {}
    for host in hosts:
        result = hostvars[host].get("tfps_ports") or {}
        if isinstance(result.get("base_port"), int):
            chosen[host] = result["base_port"]
    return chosen


def tfps_is_archive_image(images, archive_image):
    """Whether the image a host has under the tag (docker_image_info's ``images``) is the
    archive's image (the tfps_image_archive lookup's entry).

    Its id is the archive's config digest (classic image store) or one of its manifest or
    index digests (containerd image store). An archive without manifest digests (written by
    a Docker before 25) cannot say what id a containerd store gives it: there the layers
    (``RootFS.Layers``, the same on both stores) decide.
    """
    if not images:
        return False
    image = images[0]
    if image.get("Id") in [archive_image["id"]] + list(archive_image.get("digests") or []):
        return True
    layers = list(archive_image.get("layers") or [])
    return not archive_image.get("digests") and bool(layers) and (image.get("RootFS") or {}).get("Layers") == layers


def tfps_status_row(result):
    """One line of status.yml for a docker_container_info result of a task's container
    (looped over the plan's tasks: the container's name is the plan's, never rebuilt here)."""
    name = result.get("item", {}).get("container", "?")
    container = result.get("container") if result.get("exists") else None
    if not container:
        return "  %-28s not created" % name
    state = container.get("State", {})
    name = container.get("Name", name).lstrip("/")
    status = state.get("Status", "?")
    if status == "running":
        health = (state.get("Health") or {}).get("Status")
        detail = "since %s" % state.get("StartedAt", "?")[:19] + (", %s" % health if health else "")
    elif status in ("exited", "dead"):
        detail = "exit code %s at %s" % (state.get("ExitCode"), state.get("FinishedAt", "?")[:19])
        if state.get("OOMKilled"):
            detail += " (out of memory)"
    else:
        detail = ""
    restarts = container.get("RestartCount") or 0
    if restarts:
        detail += ", restarted %d time(s)" % restarts
    return "  %-28s %-10s %s" % (name, status, detail)


def tfps_data_mismatch(hosts, hostvars, what):
    """Problems of hand-placed training data: the worker ``hosts`` must hold the same files.

    Reads each host's ``tfps_data_files`` (check.yml's find of tfps_train_data, whose first
    result is the training data) and compares names (below the host's tfps_data_dir),
    sizes and, when found, sha256 with ``tfps.cluster.datasrc.compare_hosts``.
    """
    import posixpath

    from tfps.cluster.datasrc import compare_hosts

    listings = {}
    for host in hosts:
        found = (hostvars[host].get("tfps_data_files") or {}).get("results") or []
        if not found or "files" not in found[0]:
            continue
        base = str(hostvars[host].get("tfps_data_dir", "")).rstrip("/")  # hand-placed: tfps_data_path is it
        listings[host] = {posixpath.relpath(f["path"], base): {"size": f.get("size"), "sha256": f.get("checksum")}
                          for f in found[0]["files"]}
    return compare_hosts(listings, what)


def tfps_data_to_copy(results, files):
    """The data files of a stat loop (relative paths) whose sha256 on the host is not the
    controller's (``files``: relative path -> {"sha256", ...}): what the copy sends."""
    return [r["item"] for r in results if (r.get("stat") or {}).get("checksum") != files[r["item"]]["sha256"]]


def tfps_memory_problems(estimate, plan, host, meminfo="", ps_memory="", worker_memory=""):
    """Problems of a host's memory: its ps tasks' shares of the variables (the ``tfps_memory``
    action's ``estimate``) or the chief's export beyond what it has.

    ``meminfo``: the host's /proc/meminfo, base64 (a slurp's ``content``); its MemTotal is
    ``ansible_memtotal_mb`` (MemTotal // 1024). The rule is ``tfps.cluster.memory.host_problems``.
    """
    import base64
    import re

    from tfps.cluster.memory import host_problems

    if not estimate:
        return []
    text = base64.b64decode(meminfo).decode("ascii", "replace") if meminfo else ""
    found = re.search(r"^MemTotal:\s+(\d+)", text, re.M)
    memtotal_mb = int(found.group(1)) // 1024 if found else None
    return host_problems(estimate, plan, host, memtotal_mb, ps_memory, worker_memory)


def tfps_firewall_rules(tasks, job, addresses):
    """The iptables rules of a host's tasks for the tfps_firewall module, in the order they are
    kept: accept the host itself (lo) and each of the cluster's ``addresses`` on each task's TF
    port (inserted at the top), then drop the rest (appended, so that an address added to the
    cluster later is accepted before the drop). Each carries the comment ``tfps <job> <task>``."""
    def rule(task, **kw):
        return {"port": int(task["port"]), "comment": f"tfps {job} {task['name']}", **kw}
    return ([rule(t, in_interface="lo", jump="ACCEPT", action="insert") for t in tasks]
            + [rule(t, source=a, jump="ACCEPT", action="insert") for t in tasks for a in addresses]
            + [rule(t, jump="DROP", action="append") for t in tasks])


class FilterModule:
    def filters(self):
        return {"tfps_plan_row": tfps_plan_row, "tfps_status_row": tfps_status_row,
                "tfps_is_archive_image": tfps_is_archive_image,
                "tfps_data_mismatch": tfps_data_mismatch, "tfps_data_to_copy": tfps_data_to_copy,
                "tfps_memory_problems": tfps_memory_problems,
                "tfps_fixed_ports_beside": tfps_fixed_ports_beside, "tfps_chosen_ports": tfps_chosen_ports,
                "tfps_firewall_rules": tfps_firewall_rules}
