"""The startup watchdog's port probe (tfps.task.runtime.watchdog.probe_task), on real sockets.

A TF server answers the HTTP/2 preface with a SETTINGS frame; another program holding the
port accepts and says nothing (or something else); a closed port refuses. IPv6 addresses
come bracketed, as in a cluster spec.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tfps.task.runtime.watchdog import probe_patiently, probe_task

SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"   # an empty HTTP/2 SETTINGS frame


def serve_once(family: int, host: str, reply: bytes | None, delay: float = 0.0,
               connections: int = 1) -> tuple[int, threading.Thread]:
    """A listener that reads the client's preface and answers ``reply`` (None: silence) after
    ``delay`` seconds, for ``connections`` connections one after the other."""
    srv = socket.socket(family)
    srv.bind((host, 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def run():
        with srv:
            for _ in range(connections):
                conn, _ = srv.accept()
                with conn:
                    conn.settimeout(5)
                    try:
                        conn.recv(64)
                        time.sleep(delay)
                        if reply is not None:
                            conn.sendall(reply)
                        conn.recv(64)   # until the client closes (or gives up on silence)
                    except OSError:
                        pass   # the probe closes as soon as it has its answer
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return port, t


def free_port(family: int, host: str) -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("family,host,target", [
    (socket.AF_INET, "127.0.0.1", "127.0.0.1:{}"),
    (socket.AF_INET6, "::1", "[::1]:{}"),
])
def test_probe_tells_a_tf_server_from_another_program_and_a_closed_port(family, host, target):
    port, t = serve_once(family, host, SETTINGS)
    assert probe_task(target.format(port), timeout=2) == "answers"
    t.join(5)
    port, t = serve_once(family, host, None)
    assert probe_task(target.format(port), timeout=1).startswith("accepts connections but is not a TensorFlow server")
    t.join(5)
    port, t = serve_once(family, host, b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert probe_task(target.format(port), timeout=2).startswith("accepts connections but is not")
    t.join(5)
    assert probe_task(target.format(free_port(family, host)), timeout=1) != "answers"


def test_a_task_slow_to_answer_under_load_is_not_lost():
    """Issue 51: at a load of 10x the cores a TensorFlow server took seconds to answer the
    watchdog's 2 s probe, and a live task counted as lost. The probe asks a silent task again,
    patiently: it answers, and nothing is ended; one silent for good still does not answer."""
    port, t = serve_once(socket.AF_INET, "127.0.0.1", SETTINGS, delay=1.0, connections=2)
    assert probe_patiently(f"127.0.0.1:{port}", timeout=0.3, patience=5) == "answers"
    t.join(10)
    port, t = serve_once(socket.AF_INET, "127.0.0.1", None, connections=2)
    assert probe_patiently(f"127.0.0.1:{port}", timeout=0.3, patience=1).startswith("accepts connections")
    t.join(10)
