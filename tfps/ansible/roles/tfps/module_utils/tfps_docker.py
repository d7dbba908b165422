# The role's modules' one way to ask a host's Docker engine something: an HTTP request over
# its unix socket with the standard library alone (no requests, no Docker SDK on the host).
# Ansible ships it with each module of the role that imports it; in the collection,
# galaxy/build.py points those imports at the collection's plugins/module_utils.

from __future__ import annotations

import http.client
import socket

#: Seconds to connect to the engine, and to wait for each of its answers.
TIMEOUT = 10
#: Bytes sent at a time when a request's body is a file (an image archive).
BLOCK = 1 << 20


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection over a unix socket (the Docker engine's)."""

    def __init__(self, path: str, timeout: float = TIMEOUT):
        super().__init__("localhost", timeout=timeout, blocksize=BLOCK)
        self._path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def engine_request(socket_path: str, path: str, method: str = "GET", body=None, headers=None,
                   timeout: float = TIMEOUT) -> tuple[int, bytes]:
    """``method path`` of the engine at ``socket_path`` (``body``: bytes or a file to send):
    its status and body. Raises OSError or http.client.HTTPException when the engine cannot
    be asked."""
    conn = UnixHTTPConnection(socket_path, timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
