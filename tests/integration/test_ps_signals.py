"""A ps on its own: SIGTERM does not end it (the chief may still be saving), a second one does."""

from __future__ import annotations

import signal
import time

import pytest

from integration_helpers import assert_nothing_left

pytestmark = pytest.mark.integration


def test_ps_keeps_serving_after_sigterm_and_exits_on_the_second(procs):
    from trainer.cluster import local_plan
    plan = local_plan(1, 2)
    ps = plan.tasks[0]
    # Its workers never start: the ps must not wait for them to answer before it can
    # react to signals.
    proc = procs.tfps("ps0", "run", *plan.task_ref(ps).to_flags(), "--tf_threads", "1", "--final_save_timeout", 60)
    proc.wait_for(r"ps0 serving on port %d" % ps.port, 60)
    time.sleep(1.0)
    proc.signal(signal.SIGTERM)
    proc.wait_for(r"received SIGTERM \(1\)", 10)
    time.sleep(3.0)
    assert proc.returncode is None, "the ps left during the final-save grace:\n" + proc.tail()
    proc.signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert proc.wait(15) == 130, proc.tail()          # ExitCode.STOPPED
    assert time.monotonic() - t0 < 5
    assert "second stop signal" in proc.output()
    assert_nothing_left([t.port for t in plan.tasks], proc)
