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
CASES = {"refused": "nothing listens", "squatted": "another program holds it"}


def test_chief_fails_within_the_startup_timeout_and_says_why(procs, tmp_path, smtp_server):
    """Both cases at once (their chiefs wait out the same timeout side by side), each with its
    own run name, model_dir and ps port; one SMTP server gets both jobs' messages."""
    squatter = socket.socket()
    chiefs, ports, took = {}, {}, {}
    try:
        for case, ps_port in CASES.items():
            ports[case] = port = free_port()
            if ps_port == "another program holds it":
                squatter.bind(("127.0.0.1", port))
                squatter.listen(16)    # accepts connections and never speaks gRPC
            chiefs[case] = procs.tfps(
                f"chief-{case}", "run", "--ps_hosts", f"127.0.0.1:{port}",
                "--worker_hosts", f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}",
                "--job_name", "worker", "--task_index", "0", "--startup_timeout", str(TIMEOUT),
                "--run_name", f"never-starts-{case}", *run_flags(tmp_path / case / "model", steps=100),
                env=base_env(APPRISE_URLS=smtp_server.url()), separate_stderr=True)
        rcs = {}
        end = time.monotonic() + 120
        while len(rcs) < len(chiefs) and time.monotonic() < end:
            for case, chief in chiefs.items():
                if case not in rcs and chief.returncode is not None:
                    rcs[case], took[case] = chief.returncode, time.monotonic() - chief.started
            time.sleep(0.1)
        for case, chief in chiefs.items():
            rcs.setdefault(case, chief.wait(0))   # fails: still running after 120 s
    finally:
        squatter.close()

    for case, ps_port in CASES.items():
        chief, port = chiefs[case], ports[case]
        assert rcs[case] == 1, f"{ps_port}:\n{chief.tail()}"
        # Bounded: the timeout plus process start and the report, nowhere near a hang.
        assert TIMEOUT <= took[case] < TIMEOUT + 60, (ps_port, took[case])
        err = chief.stderr()
        assert f"worker0 did not train a step within {TIMEOUT} s of its start (--startup_timeout)" in err, err
        if ps_port == "nothing listens":
            assert f"ps0 (127.0.0.1:{port}) refuses connections (not running?)" in err, err
        else:
            assert (f"ps0 (127.0.0.1:{port}) accepts connections but is not a TensorFlow server "
                    "(another program holds its port?)") in err, err
        assert "Check that every task of the cluster is running" in err, err

        res = read_results(tmp_path / case / "model")
        assert res["status"] == "failed" and res["exit_code"] == 1, (ps_port, res)
        assert "--startup_timeout" in res["error"]["message"], (ps_port, res["error"])

    # Both chiefs have exited: the messages are all there is (the server records one before it
    # answers the sender). Exactly one per job.
    mails = smtp_server.wait_for(2, timeout=30)
    subjects = [str(m["subject"]) for m in mails]
    assert len(mails) == 2, subjects
    for case in CASES:
        mine = [m for m in mails if f"job never-starts-{case} " in str(m["subject"])]
        assert len(mine) == 1 and f"job never-starts-{case} FAILED" in str(mine[0]["subject"]), subjects
        assert "--startup_timeout" in mine[0].get_body(("plain",)).get_content()
