"""Which addresses this process listens on, read from the kernel, not assumed (issue 36).

``tfps.task.net.loopback`` points one GOT slot of TensorFlow's library at a loopback bind. That
patch can miss while reporting success: were gRPC's ``bind`` to move to another library,
the slot patched would be a dead one and the server would listen on every interface. So a
task whose cluster address is loopback checks the result instead of trusting the patch:
after its server starts, it reads the sockets it holds (``/proc/self/fd`` links
``socket:[INODE]``) in the kernel's tables of TCP sockets (``/proc/net/tcp`` and ``tcp6``),
and refuses to go on if its port is listening anywhere but on loopback
(:func:`require_loopback_only`).
"""

from __future__ import annotations

import ipaddress
import os
import struct

from tfps.errors import ConfigError

#: /proc/net/tcp's state of a listening socket (TCP_LISTEN).
_LISTEN = "0A"
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def socket_inodes(pid: int | str = "self") -> set[int]:
    """The inodes of the sockets that process ``pid`` holds open (its fds ``socket:[N]``)."""
    found: set[int] = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            link = os.readlink(f"{fd_dir}/{fd}")
        except OSError:   # closed since the listing
            continue
        if link.startswith("socket:["):
            found.add(int(link[8:-1]))
    return found


def parse_address(field: str) -> tuple[str, int]:
    """``("127.0.0.1", 8080)`` from a /proc/net/tcp address ``0100007F:1F90``.

    The kernel prints an address as 32-bit words in the host's byte order (one word for
    IPv4, four for IPv6) and the port in network order, all in hex."""
    addr, port = field.rsplit(":", 1)
    raw = b"".join(struct.pack("=I", int(addr[i:i + 8], 16)) for i in range(0, len(addr), 8))
    return str(ipaddress.ip_address(raw)), int(port, 16)


def listening(pid: int | str = "self") -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process ``pid`` holds.

    Raises OSError when the tables cannot be read (no /proc)."""
    inodes = socket_inodes(pid)
    found = []
    for table in _TABLES:
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    f = line.split()
                    if len(f) > 9 and f[3] == _LISTEN and int(f[9]) in inodes:
                        found.append(parse_address(f[1]))
        except FileNotFoundError:
            if table.endswith("6"):   # a kernel without IPv6
                continue
            raise
    return found


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, and an IPv4-mapped loopback (::ffff:127.0.0.1)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def addresses_on(port: int, pid: int | str = "self") -> list[str]:
    """The addresses on which process ``pid`` listens on ``port`` (empty when it does not)."""
    return sorted({address for address, p in listening(pid) if p == port})


def open_addresses(port: int, pid: int | str = "self") -> list[str] | None:
    """The addresses other than loopback on which ``pid`` listens on ``port`` ([] when it
    listens on loopback only); None when it does not listen on ``port`` at all."""
    addresses = addresses_on(port, pid)
    if not addresses:
        return None
    return [a for a in addresses if not is_loopback(a)]


def require_loopback_only(name: str, target: str, port: int, field: str = "ps_hosts") -> None:
    """Refuse (ConfigError, one line, exit code 2) unless this process's server on ``port``
    listens on loopback only: checked after the server started, whatever the loopback
    patch reported. A port that cannot be found among this process's sockets is refused
    too: what cannot be checked is not assumed closed."""
    try:
        found = open_addresses(port)
    except OSError as e:
        raise ConfigError(f"{name} cannot check that its TensorFlow server on {target} listens on loopback only: "
                          f"{e.strerror or e}; give the task the address of an interface that the hosts' "
                          "firewall protects", field) from None
    if found is None:
        raise ConfigError(f"{name} cannot check that its TensorFlow server on {target} listens on loopback only: "
                          f"this process holds no listening socket on port {port}; give the task the address of "
                          "an interface that the hosts' firewall protects", field)
    if found:
        raise ConfigError(f"{name} listens on {', '.join(_shown(a) for a in found)} port {port} although its "
                          f"address {target} is loopback: this TensorFlow build escaped tfps's loopback bind, and "
                          "its port would run any graph sent from the network; give the task the address of an "
                          "interface that the hosts' firewall protects", field)


def _shown(address: str) -> str:
    if address in ("0.0.0.0", "::"):
        return f"{address} (every interface)"
    return address


def require_address_only(name: str, target: str, port: int, address: str, field: str = "bind_interface") -> None:
    """Refuse (one line, exit 2) unless this process's server on ``port`` listens on ``address``
    alone (``tfps slurm --bind_interface``): checked in the kernel's table after the start."""
    try:
        found = addresses_on(port)
    except OSError as e:
        raise ConfigError(f"{name} cannot check that its TensorFlow server on {target} listens on {address} only: "
                          f"{e.strerror or e}; drop --bind-interface or run where /proc/net/tcp is readable",
                          field) from None
    if found != [address]:
        shown = ", ".join(_shown(a) for a in found) or "no address"
        raise ConfigError(f"{name} listens on {shown} port {port}, not on {address} alone: this TensorFlow build "
                          "escaped tfps's bind; drop --bind-interface (the cluster's network then protects the "
                          "port, docs/security.md)", field)
