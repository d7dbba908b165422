"""Filters of the tfps role for starting a job's containers: what a refusal may show, and
what a job is (the settings recorded on its containers, and what a deploy would change).

The start task keeps ``no_log`` (its result holds each container's whole configuration,
``tfps_env`` included, where users put credentials), so Docker's own reason for refusing
a container would be hidden. These filters take from that result only what may be shown:
Docker's message, with every secret value masked, and which containers the task tried to start.
"""

from __future__ import annotations

#: What a masked secret looks like in a message.
HIDDEN = "<hidden>"


def _secret_values(secrets) -> list[str]:
    """Every string worth masking in ``secrets`` (a dict's values, a list, a string)."""
    if secrets is None:
        return []
    if isinstance(secrets, dict):
        values = list(secrets.values())
    elif isinstance(secrets, (list, tuple)):
        values = list(secrets)
    else:
        values = [secrets]
    out = []
    for v in values:
        if isinstance(v, (dict, list, tuple)):
            out.extend(_secret_values(v))
        elif v is not None and len(str(v)) >= 3:   # shorter values ("1", "on") would mask words
            out.append(str(v))
    return sorted(set(out), key=len, reverse=True)


def _item_results(started):
    if not isinstance(started, dict):
        return []
    return [r for r in started.get("results", []) if isinstance(r, dict)]


def _name(result) -> str:
    item = result.get("item")
    return str(item.get("container") if isinstance(item, dict) else item)


def tfps_refused(started, host, secrets=None) -> list[str]:
    """One line per container Docker refused to create or start: its name, the host and
    Docker's own message, with every value of ``secrets`` masked."""
    lines = []
    hidden = _secret_values(secrets)
    for r in _item_results(started):
        if not r.get("failed"):
            continue
        msg = " ".join(str(r.get("msg") or "no reason given").split())
        for value in hidden:
            msg = msg.replace(value, HIDDEN)
        lines.append(f"{host}: Docker did not start {_name(r)}: {msg}")
    return lines


def tfps_attempted(started) -> list[str]:
    """The containers that the start task created, started or tried to (to remove them
    again: one Docker created but could not start is left behind as "created")."""
    return [_name(r) for r in _item_results(started) if not r.get("skipped")]




# ---------------------------------------------------------------- a job's settings

def tfps_settings_label(settings) -> str:
    """The container label that records what defines the job (base64 JSON: a label is a
    string, and a JSON-looking one could be templated back into a dict)."""
    import base64
    import json
    return base64.b64encode(json.dumps(settings, sort_keys=True).encode()).decode()


def tfps_recorded_settings(hostvars, hosts, record_file=None) -> dict | None:
    """The settings recorded on the job's existing containers (the chief's first), from the
    check phase's ``tfps_containers`` of every host; else those of the record on the chief's
    host (``record_file``, a slurp result of tfps_settings_record); None when neither has any."""
    import base64
    import binascii
    import json
    found = []
    for host in hosts:
        containers = (hostvars.get(host) or {}).get("tfps_containers") or {}
        for name, info in containers.items():
            label = (((info or {}).get("Config") or {}).get("Labels") or {}).get("tfps.settings")
            if label:
                try:
                    found.append((not str(name).startswith("worker0"), json.loads(base64.b64decode(label))))
                except (ValueError, binascii.Error):
                    continue
    if found:
        return min(found, key=lambda f: f[0])[1]
    try:
        record = json.loads(base64.b64decode((record_file or {}).get("content") or ""))
    except (ValueError, binascii.Error):
        return None
    return record if isinstance(record, dict) and record else None


def tfps_settings_changes(recorded, settings) -> list[str]:
    """``setting: old -> new`` for each setting that differs (JSON values); [] when nothing
    is recorded (a new job, or containers of a tfps that did not record settings). The same
    comparison as ``tfps local`` and the chief make with the record in model_dir."""
    from tfps.cluster.settings import changes
    return changes(recorded, settings)


class FilterModule:
    def filters(self):
        return {"tfps_refused": tfps_refused, "tfps_attempted": tfps_attempted,
                "tfps_settings_label": tfps_settings_label, "tfps_recorded_settings": tfps_recorded_settings,
                "tfps_settings_changes": tfps_settings_changes}
