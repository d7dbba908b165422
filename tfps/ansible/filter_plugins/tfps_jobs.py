"""Filters of ansible/jobs.yml: what `tfps jobs` and `tfps logs` read from each host.

They keep only what tfps shows (names, labels, states, times, the model directory and
steps from the task's command, history records, log text): never a container's
environment, where credentials may be.
"""

from __future__ import annotations

import json
import re


def _flag(command: str, name: str) -> str | None:
    m = re.search(rf"--{name}[= ](\S+)", command or "")
    return m.group(1) if m else None


def tfps_chief_histories(containers) -> list[dict]:
    """The chiefs among ``containers`` (docker_host_info's verbose records) and where their
    history.jsonl is (the chief's model_dir is mounted at the same path on its host)."""
    out = []
    for c in containers or []:
        labels = c.get("Labels") or {}
        model_dir = _flag(c.get("Command", ""), "model_dir")
        if labels.get("tfps.role") == "chief" and model_dir:
            out.append({"container": (c.get("Names") or ["?"])[0].lstrip("/"), "history": f"{model_dir}/history.jsonl"})
    return out


def _records(text: str) -> list[dict]:
    out = []
    for line in (text or "").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue   # a line being written
    return out


def tfps_jobs_view(hostvars, hosts) -> dict:
    """``{"hosts": {host: {"error", "containers": [...], "history": {container: [records]},
    "logs": {container: text}}}}`` for tfps.backends.ansible."""
    view = {}
    for host in hosts:
        hv = hostvars.get(host) or {}
        info = hv.get("tfps_jobs_info") or {}
        entry = {"error": None, "containers": [], "history": {}, "logs": {}}
        if info.get("unreachable") or info.get("failed"):
            entry["error"] = " ".join(str(info.get("msg") or "no answer").split())[:300]
            if "censored" in entry["error"]:   # the task's no_log hides Ansible's reason
                entry["error"] = ("cannot be reached over SSH; check its address, ansible_user and SSH access "
                                  f"(`ansible -i INVENTORY {host} -m ping` shows Ansible's reason)"
                                  if "connect" in entry["error"].lower() or info.get("unreachable") else
                                  "the Docker engine could not be read (`ansible -i INVENTORY "
                                  f"{host} -m community.docker.docker_host_info -b` shows Ansible's reason)")
        for c in info.get("containers") or []:
            labels = c.get("Labels") or {}
            command = c.get("Command", "")
            entry["containers"].append({
                "name": (c.get("Names") or ["?"])[0].lstrip("/"), "job": labels.get("tfps.job"),
                "task": labels.get("tfps.task"), "role": labels.get("tfps.role"), "state": c.get("State"),
                "status": c.get("Status"), "created": c.get("Created"),
                "train_steps": _flag(command, "train_steps"), "model_dir": _flag(command, "model_dir")})
        for r in (hv.get("tfps_jobs_history") or {}).get("results") or []:
            if isinstance(r, dict) and "item" in r and not r.get("skipped"):
                entry["history"][r["item"]["container"]] = _records(r.get("stdout", ""))
        for r in (hv.get("tfps_logs_read") or {}).get("results") or []:
            if isinstance(r, dict) and "item" in r and not r.get("skipped"):
                name = (r["item"].get("Names") or ["?"])[0].lstrip("/")
                entry["logs"][name] = r.get("stdout", "") + ("\n" + r["stderr"] if r.get("stderr") else "")
        view[host] = entry
    return {"hosts": view}


class FilterModule:
    def filters(self):
        return {"tfps_chief_histories": tfps_chief_histories, "tfps_jobs_view": tfps_jobs_view}
