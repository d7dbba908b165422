"""A task that can never start must fail the job within --startup_timeout, not hang it.

TensorFlow waits for a missing task without a bound ("CreateSession still waiting for
response from worker"). Two ways a ps never serves: nothing runs on its port (its
container cannot start: a bad image, a crash loop) and another program holds the port
(the ps could not bind it). In both, the chief must end with exit code 1 soon after
--startup_timeout, say which task does not answer and what to check, write a failed
results.json and send exactly one failure message.
"""

from __future__ import annotations

import socket
import time

import pytest
from integration_helpers import base_env, read_results, run_flags
from servers import free_port

pytestmark = pytest.mark.integration

TIMEOUT = 8


@pytest.mark.parametrize("ps_port", ["nothing listens", "another program holds it"])
def test_chief_fails_within_the_startup_timeout_and_says_why(ps_port, procs, tmp_path, smtp_server):
    model_dir = tmp_path / "model"
    port = free_port()
    squatter = None
    if ps_port == "another program holds it":
        squatter = socket.socket()
        squatter.bind(("127.0.0.1", port))
        squatter.listen(16)    # accepts connections and never speaks gRPC
    try:
        t0 = time.monotonic()
        chief = procs.tfps(
            "chief", "run", "--ps_hosts", f"127.0.0.1:{port}",
            "--worker_hosts", f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}",
            "--job_name", "worker", "--task_index", "0", "--startup_timeout", str(TIMEOUT),
            "--run_name", "never-starts", *run_flags(model_dir, steps=100),
            env=base_env(APPRISE_URLS=smtp_server.url()), separate_stderr=True)
        rc = chief.wait(120)
        took = time.monotonic() - t0
    finally:
        if squatter is not None:
            squatter.close()
    assert rc == 1, chief.tail()
    # Bounded: the timeout plus process start and the report, nowhere near a hang.
    assert TIMEOUT <= took < TIMEOUT + 60, took
    err = chief.stderr()
    assert f"worker0 did not train a step within {TIMEOUT} s of its start (--startup_timeout)" in err, err
    if ps_port == "nothing listens":
        assert f"ps0 (127.0.0.1:{port}) refuses connections (not running?)" in err, err
    else:
        assert (f"ps0 (127.0.0.1:{port}) accepts connections but is not a TensorFlow server "
                "(another program holds its port?)") in err, err
    assert "Check that every task of the cluster is running" in err

    res = read_results(model_dir)
    assert res["status"] == "failed" and res["exit_code"] == 1
    assert "--startup_timeout" in res["error"]["message"]
    mails = smtp_server.wait_for(1, timeout=30)
    time.sleep(1)
    assert len(smtp_server.messages) == 1, [m["subject"] for m in smtp_server.messages]
    subject = str(mails[0]["subject"])
    assert "job never-starts FAILED" in subject, subject
    assert "--startup_timeout" in mails[0].get_body(("plain",)).get_content()
