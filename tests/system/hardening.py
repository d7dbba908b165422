"""What docs/security.md promises of every task container, read from ``docker inspect``.

Compose and the Ansible role must both give each task: no capability (CapDrop ALL),
no-new-privileges, a read-only root filesystem with a tmpfs on /tmp, a pids limit, and
json-file logs that rotate.
"""

from __future__ import annotations


def assert_hardened(name: str, attrs: dict, *, max_size: str = "50m", max_file: str = "5") -> None:
    host = attrs["HostConfig"]
    assert [c.upper().removeprefix("CAP_") for c in host.get("CapDrop") or []] == ["ALL"], (name, host.get("CapDrop"))
    assert not host.get("CapAdd"), (name, host.get("CapAdd"))
    assert any(o in ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true")
               for o in host.get("SecurityOpt") or []), (name, host.get("SecurityOpt"))
    assert host.get("ReadonlyRootfs") is True, (name, host.get("ReadonlyRootfs"))
    assert "/tmp" in (host.get("Tmpfs") or {}), (name, host.get("Tmpfs"))
    assert isinstance(host.get("PidsLimit"), int) and host["PidsLimit"] > 0, (name, host.get("PidsLimit"))
    assert host.get("Privileged") is False, name
    log = host.get("LogConfig") or {}
    assert log.get("Type") == "json-file", (name, log)
    assert (log.get("Config") or {}).get("max-size") == max_size, (name, log)
    assert (log.get("Config") or {}).get("max-file") == max_file, (name, log)
