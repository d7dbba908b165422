"""Real servers on 127.0.0.1 for tests: an SMTP server and an HTTP webhook receiver.

Both run in the test process, listen on a free port, record what they receive, and
stop when the ``with`` block (or the fixture in ``conftest.py``) ends. Nothing here
mocks a library or a socket: notifications travel over real TCP connections.
"""

from __future__ import annotations

import email
import email.message
import email.policy
import http.server
import json
import socket
import threading
import time
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

LOCALHOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Also the way to get a "closed port" for delivery-failure tests.
    """
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


class _Server:
    """``with server:`` starts it and stops it; ``wait_for(n)`` waits for n things received."""

    def received(self) -> list:
        raise NotImplementedError

    def wait_for(self, count: int, timeout: float = 10.0) -> list:
        """What the server has received, once that is ``count`` items or ``timeout`` s have passed."""
        wait_until(lambda: len(self.received()) >= count, timeout)
        return self.received()

    def start(self):
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class SMTPServer(_Server):
    """An aiosmtpd server that keeps every message it accepts, parsed.

    Args:
        hostname: the address it listens on (loopback unless a test's containers or hosts
            must reach it).
        url_host: the host name in ``url()``, where clients reach it (``hostname`` unless
            given).
        auth: ``(user, password)`` that SMTP AUTH (PLAIN or LOGIN, offered without TLS,
            which is fine on loopback) accepts; any other login is refused with 535.
            ``None`` offers no AUTH. A client that skips AUTH is still served (requiring
            it without TLS makes aiosmtpd warn on every connection), so tests check
            ``logins`` to see that it authenticated.

    Attributes:
        messages: ``email.message.EmailMessage`` objects, in arrival order.
        envelopes: the matching aiosmtpd envelopes (``mail_from``, ``rcpt_tos``).
        logins: ``(mechanism, user, password)`` of every AUTH attempt, decoded.
    """

    sender = "tfps@example.com"
    recipient = "ops@example.com"

    def __init__(self, auth: tuple[str, str] | None = None, hostname: str = LOCALHOST, url_host: str | None = None):
        self.auth = auth
        self.address = hostname
        self.url_host = url_host or hostname
        self.port = free_port()
        self.messages: list[email.message.EmailMessage] = []
        self.envelopes: list[Any] = []
        self.logins: list[tuple[str, str, str]] = []
        kwargs: dict[str, Any] = {}
        if auth is not None:
            kwargs = dict(authenticator=self._authenticate, auth_require_tls=False)
        self._controller = Controller(self, hostname=hostname, port=self.port, **kwargs)

    # aiosmtpd handler hook
    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's name)
        raw = envelope.original_content or envelope.content
        self.envelopes.append(envelope)
        self.messages.append(email.message_from_bytes(raw, policy=email.policy.default))
        return "250 Message accepted for delivery"

    def _authenticate(self, server, session, envelope, mechanism, auth_data):
        user = auth_data.login.decode("utf-8", "replace")
        password = auth_data.password.decode("utf-8", "replace")
        self.logins.append((mechanism, user, password))
        return AuthResult(success=(user, password) == self.auth)

    def url(self, scheme: str = "mailto", userinfo: str = "", **params: str) -> str:
        """An apprise URL for this server; ``userinfo`` is inserted as written."""
        query = {"from": self.sender, "to": self.recipient, "mode": "insecure", **params}
        at = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{at}{self.url_host}:{self.port}?" + "&".join(f"{k}={v}" for k, v in query.items())

    def received(self) -> list[email.message.EmailMessage]:
        return self.messages

    def start(self) -> SMTPServer:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()


class _WebhookHandler(http.server.BaseHTTPRequestHandler):
    server: _HTTPServer

    def do_POST(self):  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        owner = self.server.owner
        owner.requests.append({"path": self.path, "headers": dict(self.headers), "raw": raw, "json": body})
        path = self.path.split("?")[0]
        status = owner.status.get(path, 200)
        reply = owner.replies.get(path, b"{}")
        if callable(reply):
            reply = reply(self)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format, *args):  # keep test output clean
        pass


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: WebhookServer


class WebhookServer(_Server):
    """A stdlib HTTP server that records every POST and answers 200 (or ``status[path]``).

    Attributes:
        requests: dicts with ``path``, ``headers``, ``raw`` (bytes) and ``json`` (parsed
            body, or None), in arrival order.
        status: path -> HTTP status to answer with, to simulate a failing receiver.
        replies: path -> response body (bytes, or a callable taking the request handler
            and returning bytes); ``{}`` by default.
    """

    def __init__(self):
        self.requests: list[dict[str, Any]] = []
        self.status: dict[str, int] = {}
        self.replies: dict[str, Any] = {}
        self._httpd = _HTTPServer((LOCALHOST, 0), _WebhookHandler)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="webhook-server", daemon=True)

    def url(self, path: str = "/hook", scheme: str = "json") -> str:
        return f"{scheme}://{LOCALHOST}:{self.port}{path}"

    def bodies(self, path: str | None = None) -> list[Any]:
        """Parsed JSON bodies received, optionally only those sent to ``path``."""
        return [r["json"] for r in self.requests if path is None or r["path"].split("?")[0] == path]

    def received(self) -> list[dict[str, Any]]:
        return self.requests

    def start(self) -> WebhookServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
