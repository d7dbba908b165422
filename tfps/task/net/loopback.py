"""Keep a TensorFlow server on loopback when its cluster address is a loopback address.

TensorFlow's gRPC server always binds the wildcard address; this module points
``libtensorflow_cc``'s GOT entry for ``bind`` at a function that keeps a wildcard bind on
the task's loopback address. It is not proof on its own: the caller checks the kernel's
sockets after the server starts (``tfps.task.net.listening``) and refuses to run otherwise.

Why and how (the GOT patch, what it rewrites, why it is not proof): docs/design/loopback.md.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import logging
import mmap
import os
import socket
import struct
import threading

from tfps.compat import TF_CC_LIBRARY

log = logging.getLogger("tfps")

#: The TensorFlow library whose gRPC server makes the bind call (its name is TensorFlow's
#: own, so it lives in tfps.compat, whose start-up check looks for it).
LIBRARY = TF_CC_LIBRARY

_lock = threading.Lock()
_installed: dict = {}

_BIND = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32, use_errno=True)
_libc = ctypes.CDLL(None, use_errno=True)
_real_bind = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32,
                              use_errno=True)(("bind", _libc))

_AF_INET, _AF_INET6 = socket.AF_INET, socket.AF_INET6


def is_loopback_host(host: str) -> bool:
    """Whether a cluster address's host part names this machine's loopback interface."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_address(host: str) -> str:
    """The IPv4 address a task whose cluster address has the loopback host ``host`` listens on.

    Its own address when that is an IPv4 loopback one (all of 127.0.0.0/8 is this machine's
    loopback, and a peer that connects to 127.0.0.2 finds no server on 127.0.0.1), else
    127.0.0.1 (``localhost``, and ``[::1]``, whose wildcard IPv6 bind gRPC cannot make here).
    """
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return "127.0.0.1"
    return str(address) if address.version == 4 and address.is_loopback else "127.0.0.1"


#: The address a wildcard IPv4 bind of TensorFlow is rewritten to (set by ensure_loopback_bind).
_bind_to = [socket.inet_aton("127.0.0.1")]


def _loopback_bind(fd: int, addr: int, length: int) -> int:
    family = ctypes.c_ushort.from_address(addr).value if addr and length >= 2 else -1
    if family == _AF_INET6 and length >= 24 and ctypes.string_at(addr + 8, 16) == bytes(16):
        ctypes.set_errno(errno.EADDRNOTAVAIL)   # [::]: let gRPC fall back to IPv4
        return -1
    if family == _AF_INET and length >= 16 and ctypes.string_at(addr + 4, 4) == bytes(4):
        buf = ctypes.create_string_buffer(ctypes.string_at(addr, length), length)
        ctypes.memmove(ctypes.addressof(buf) + 4, _bind_to[0], 4)
        rc = _real_bind(fd, ctypes.addressof(buf), length)
        ctypes.set_errno(ctypes.get_errno())
        return rc
    return _real_bind(fd, addr, length)


_callback = _BIND(_loopback_bind)   # kept alive for the life of the process


def _library_mapping() -> tuple[str, int] | None:
    """(path, load base) of TensorFlow's library in this process, from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and LIBRARY in os.path.basename(parts[5]) and int(parts[2], 16) == 0:
                return parts[5], int(parts[0].split("-")[0], 16)
    return None


#: ELF64 records, little-endian: a ``.dynsym`` symbol and a ``SHT_RELA`` relocation.
_SYM = [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")]
_RELA = [("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")]
#: JUMP_SLOT / GLOB_DAT on x86-64 (7, 6) and aarch64 (1026, 1025).
_GOT_TYPES = (6, 7, 1025, 1026)


def _got_offsets(path: str, symbol: str) -> list[int]:
    """Offsets (from the load base) of the GOT slots through which ``path`` calls ``symbol``.

    TensorFlow's library has about 900 000 relocations and 450 000 symbols: they are read
    as arrays (about 0.07 s in all), not one by one in Python (about 0.3 s, which every task
    paid at its start)."""
    import numpy as np
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
            return []   # only 64-bit little-endian ELF (x86-64, aarch64)
        shoff, = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        dynsym_index = next((i for i, s in enumerate(sections) if s[1] == 11), None)   # SHT_DYNSYM
        if dynsym_index is None:
            return []

        def body(s) -> bytes:   # a section's bytes (copied: no view may outlive the mapping)
            return elf[s[4]:s[4] + s[5]]

        dynsym, names = sections[dynsym_index], sections[sections[dynsym_index][6]]
        wanted = symbol.encode() + b"\0"
        # Where the name can start in the string table (a name may be the tail of a longer
        # one), found in the mapping itself: the table is tens of MB, not worth a copy.
        starts, end = [], names[4] + names[5]
        at = elf.find(wanted, names[4], end)
        while at >= 0:
            starts.append(at - names[4])
            at = elf.find(wanted, at + 1, end)
        if not starts:
            return []
        indexes = np.flatnonzero(np.isin(np.frombuffer(body(dynsym), dtype=_SYM)["name"], starts))
        found: list[int] = []
        for s in sections:
            if s[1] != 4 or s[6] != dynsym_index:   # SHT_RELA against .dynsym
                continue
            rela = np.frombuffer(body(s), dtype=_RELA)
            info = rela["info"]
            hit = np.isin(info & 0xFFFFFFFF, _GOT_TYPES) & np.isin(info >> np.uint64(32), indexes)
            found.extend(int(o) for o in rela["offset"][hit])
        return found


_PROT = {"r": 1, "w": 2, "x": 4}   # PROT_READ, PROT_WRITE, PROT_EXEC


def page_protection(address: int) -> int:
    """The protection (PROT_* bits) of the mapping holding ``address``, from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= address < end:
                return sum(bit for flag, bit in _PROT.items() if flag in perms[:3])
    raise OSError(errno.EFAULT, f"address {address:#x} is not mapped")


def _mprotect(page: int, prot: int) -> None:
    _libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if _libc.mprotect(ctypes.c_void_p(page), mmap.PAGESIZE, prot) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")


def _write_pointers(addresses: list[int], value: int) -> None:
    """Write ``value`` at each address, each page made writable for the write only.

    The GOT is read-only after the loader resolved it (RELRO): a page left writable would
    let any later memory bug of the process redirect TensorFlow's calls. Each page gets back
    the protection /proc/self/maps showed before, even when a write fails."""
    pages: dict[int, list[int]] = {}
    for address in addresses:   # an 8-byte slot, aligned: never across two pages
        pages.setdefault(address & ~(mmap.PAGESIZE - 1), []).append(address)
    for page, slots in pages.items():
        before = page_protection(page)
        _mprotect(page, before | _PROT["r"] | _PROT["w"])
        try:
            for address in slots:
                ctypes.c_void_p.from_address(address).value = value
        finally:
            _mprotect(page, before)


def ensure_loopback_bind(address: str = "127.0.0.1") -> bool:
    """Make TensorFlow's gRPC servers of this process listen on the loopback ``address`` only
    (:func:`bind_address` of the task's host).

    Call after TensorFlow is imported and before a server starts; idempotent. Returns
    whether the bind is now on loopback.
    """
    if not ipaddress.ip_address(address).is_loopback:
        raise ValueError(f"{address} is not a loopback address")
    return _ensure_bind(address)


#: Set by ``tfps slurm --bind_interface`` for a task (tfps.launch.slurm_step): the IPv4 address
#: of that interface on the task's node, which its TensorFlow server listens on alone.
BIND_ADDRESS_ENV = "TFPS_BIND_ADDRESS"


def ensure_address_bind(address: str) -> bool:
    """The same for one IPv4 address of this machine that is not loopback (an interface's, the
    cluster network's): TensorFlow's wildcard bind becomes a bind on ``address`` alone.
    Returns whether the patch is in place; the caller checks the kernel's sockets after the
    server starts, as for loopback."""
    ip = ipaddress.ip_address(address)
    if ip.version != 4 or ip.is_unspecified:
        raise ValueError(f"{address} is not one IPv4 address")
    return _ensure_bind(address)


def _ensure_bind(address: str) -> bool:
    with _lock:
        _bind_to[0] = socket.inet_aton(address)
        if "ok" in _installed:
            return _installed["ok"]
        ok = False
        try:
            where = _library_mapping()
            if where is not None:
                path, base = where
                slots = _got_offsets(path, "bind")
                _write_pointers([base + offset for offset in slots], ctypes.cast(_callback, ctypes.c_void_p).value)
                ok = bool(slots)
        except (OSError, ValueError, struct.error) as e:
            log.debug("could not route TensorFlow's bind to loopback: %s", e)
        _installed["ok"] = ok
        return ok
