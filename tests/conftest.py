"""Shared pytest fixtures."""

from __future__ import annotations

import pytest
from servers import SMTPServer, WebhookServer  # tests/ is on sys.path: pytest puts this conftest's directory there


@pytest.fixture
def smtp_server(request):
    """A real SMTP server on 127.0.0.1 (aiosmtpd) that keeps parsed messages.

    Require AUTH with indirect parametrization:
    ``@pytest.mark.parametrize("smtp_server", [{"auth": ("user", "pw")}], indirect=True)``.
    """
    with SMTPServer(**getattr(request, "param", {})) as server:
        yield server


@pytest.fixture
def webhook_server():
    """A real HTTP server on 127.0.0.1 that records JSON POST bodies."""
    with WebhookServer() as server:
        yield server
