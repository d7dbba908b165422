"""Filters of the tfps role over the result of starting the task containers.

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


class FilterModule:
    def filters(self):
        return {"tfps_refused": tfps_refused, "tfps_attempted": tfps_attempted}
