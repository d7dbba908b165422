"""Which address a task on a loopback address listens on (issue 35 item 22: a cluster on
127.0.0.2 could not work, every server listened on 127.0.0.1). The real server start is in
tests/integration/test_loopback_server.py."""

from __future__ import annotations

import pytest

from tfps.task.net.loopback import bind_address, ensure_loopback_bind


@pytest.mark.parametrize("host, address", [
    ("127.0.0.1", "127.0.0.1"), ("127.0.0.2", "127.0.0.2"), ("127.1.2.3", "127.1.2.3"),
    ("localhost", "127.0.0.1"), ("[::1]", "127.0.0.1"), ("::1", "127.0.0.1"),
])
def test_a_loopback_task_listens_on_its_own_address(host, address):
    assert bind_address(host) == address


def test_only_a_loopback_address_is_accepted():
    with pytest.raises(ValueError, match="not a loopback address"):
        ensure_loopback_bind("10.0.0.2")
