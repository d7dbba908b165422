"""The loopback guard's own checks (issue 36 item 2): the kernel's table of this process's
listening sockets, read with real sockets, and the page protection the GOT patch restores.
The guard refusing a server that escaped the patch is tests/integration/test_loopback_guard.py."""

from __future__ import annotations

import ctypes
import ipaddress
import mmap
import socket
import subprocess
import sys

import pytest

from tfps.errors import ConfigError
from tfps.task.net import listening
from tfps.task.net.listening import is_loopback, open_addresses, parse_address, require_loopback_only
from tfps.task.net.loopback import _write_pointers, page_protection


def _listener(family, host):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen()
    return s


def _ipv6() -> bool:
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
        return True
    except OSError:
        return False


def test_the_reader_finds_this_process_s_listening_sockets_by_inode():
    wild, local = _listener(socket.AF_INET, "0.0.0.0"), _listener(socket.AF_INET, "127.0.0.1")
    wild_port = wild.getsockname()[1]
    bound_only = socket.socket()             # bound, not listening: no server
    bound_only.bind(("127.0.0.1", 0))
    # Another process's listener is not this process's, even on the same machine.
    other = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
                              "s.bind(('0.0.0.0', 0)); s.listen(); print(s.getsockname()[1], flush=True); "
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        other_port = int(other.stdout.readline())
        found = listening.listening()
        assert ("0.0.0.0", wild.getsockname()[1]) in found
        assert ("127.0.0.1", local.getsockname()[1]) in found
        assert all(port not in (bound_only.getsockname()[1], other_port) for _, port in found)
        assert open_addresses(wild.getsockname()[1]) == ["0.0.0.0"]
        assert open_addresses(local.getsockname()[1]) == []
        assert open_addresses(bound_only.getsockname()[1]) is None
        assert open_addresses(other_port) is None
        assert listening.addresses_on(other_port, other.pid) == ["0.0.0.0"]   # read by its pid
    finally:
        other.kill()
        other.wait()
        for s in (wild, local, bound_only):
            s.close()
    assert open_addresses(wild_port) is None   # closed: gone from the table


@pytest.mark.skipif(not _ipv6(), reason="no IPv6 on this host")
def test_the_reader_finds_ipv6_listeners_too():
    wild = _listener(socket.AF_INET6, "::")
    try:
        local = _listener(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no ::1 on this host")
    with wild, local:
        assert open_addresses(wild.getsockname()[1]) == ["::"]
        assert open_addresses(local.getsockname()[1]) == []


@pytest.mark.skipif(sys.byteorder != "little", reason="the kernel prints addresses in host byte order")
@pytest.mark.parametrize("field, expected", [
    ("0100007F:1F90", ("127.0.0.1", 8080)),
    ("00000000:0050", ("0.0.0.0", 80)),
    ("0200007F:5BA0", ("127.0.0.2", 23456)),
    ("00000000000000000000000001000000:0050", ("::1", 80)),
    ("00000000000000000000000000000000:1F90", ("::", 8080)),
    ("0000000000000000FFFF00000100007F:1F90", ("::ffff:127.0.0.1", 8080)),
])
def test_addresses_are_read_as_the_kernel_prints_them(field, expected):
    address, port = parse_address(field)
    assert (ipaddress.ip_address(address), port) == (ipaddress.ip_address(expected[0]), expected[1])


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.2", False), ("::ffff:10.0.0.2", False),
])
def test_what_counts_as_loopback(address, loopback):
    assert is_loopback(address) is loopback


def test_a_port_on_every_interface_is_refused_in_one_line():
    with _listener(socket.AF_INET, "0.0.0.0") as s:
        port = s.getsockname()[1]
        with pytest.raises(ConfigError) as e:
            require_loopback_only("ps0", f"127.0.0.1:{port}", port)
    assert str(e.value).startswith(f"ps_hosts: ps0 listens on 0.0.0.0 (every interface) port {port} although")
    assert "\n" not in str(e.value)


def test_a_port_on_loopback_passes_and_a_missing_one_is_refused():
    with _listener(socket.AF_INET, "127.0.0.1") as s:
        port = s.getsockname()[1]
        require_loopback_only("worker0", f"127.0.0.1:{port}", port, "worker_hosts")
    with pytest.raises(ConfigError, match="holds no listening socket on port"):
        require_loopback_only("worker0", f"127.0.0.1:{port}", port, "worker_hosts")


@pytest.mark.parametrize("prot", [mmap.PROT_READ, mmap.PROT_READ | mmap.PROT_WRITE])
def test_a_patched_page_gets_back_its_protection(prot):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = libc.mmap(None, mmap.PAGESIZE, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert page not in (None, ctypes.c_void_p(-1).value)
    try:
        assert page_protection(page) == prot
        _write_pointers([page + 8, page + 16], 0x1234)
        assert ctypes.c_void_p.from_address(page + 8).value == 0x1234
        assert ctypes.c_void_p.from_address(page + 16).value == 0x1234
        assert page_protection(page) == prot   # read-only again when it was
    finally:
        libc.munmap(page, mmap.PAGESIZE)
