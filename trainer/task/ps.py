"""The parameter server task: serve variables until every worker says it is done.

Classic scripts call ``server.join()``, which never returns, so someone has to kill the
ps - possibly while the chief is still writing its final checkpoint. Here the ps dequeues
one token per worker from its own ``done`` queue and exits 0 when all have reported.
Once the chief (whose token comes after its final save) is done, the others get
``timeouts.ps_wait_after_chief`` (``--sync_timeout``) seconds more: a worker that died for
good cannot keep the ps alive.
On SIGTERM it keeps serving for ``grace_period(final_save_timeout)`` so the chief can
finish its final save; a second signal, or the end of that grace, stops it at once.
"""

from __future__ import annotations

import logging
import time

from trainer import timeouts
from trainer.config import RunConfig
from trainer.exitcodes import ExitCode
from trainer.task.lifecycle import StopSignal, cluster_spec, done_queue, session_config, write_health

log = logging.getLogger("tfps")


def serve(task, cfg: RunConfig, stop: StopSignal) -> ExitCode:
    import tensorflow as tf
    v1 = tf.compat.v1

    server = tf.distribute.Server(cluster_spec(task), job_name="ps", task_index=task.index,
                                  config=session_config(task, cfg), start=True)
    write_health(task)
    log.info("ps%d serving on port %d; waiting for %d worker(s) to finish", task.index, task.port,
             task.num_workers)
    graph = tf.Graph()
    with graph.as_default():
        queue = done_queue(task.index, task.num_workers)
        # Dequeue only what is there: a dequeue cut short by a run timeout can still take a
        # token after the timeout and lose it, and a lost chief token keeps the ps up for good.
        size, dequeue = queue.size(), queue.dequeue()
    seen: set[int] = set()
    grace = timeouts.grace_period(cfg.final_save_timeout)
    linger = timeouts.ps_wait_after_chief(cfg)
    chief_done_at: float | None = None
    with v1.Session(server.target, graph=graph, config=session_config(task, cfg)) as sess:
        while len(seen) < task.num_workers:
            if stop.count >= 2:
                log.warning("second stop signal: ps%d exits now", task.index)
                return ExitCode.STOPPED
            if stop.requested and time.monotonic() - stop.first_at > grace:
                log.warning("ps%d stopped: %d s grace for the final save is over", task.index, grace)
                return ExitCode.STOPPED
            if stop.requested and chief_done_at is not None:
                log.warning("ps%d stopped after the chief's final save", task.index)
                return ExitCode.STOPPED
            if chief_done_at is not None and time.monotonic() - chief_done_at > linger:
                missing = sorted(set(range(task.num_workers)) - seen)
                log.warning("ps%d: the chief finished %.0f s ago but worker(s) %s never reported done "
                            "(dead?); exiting anyway", task.index, linger, missing)
                return ExitCode.OK
            if int(sess.run(size)) == 0:
                time.sleep(timeouts.PS_DONE_POLL_SECS)
                continue
            worker = int(sess.run(dequeue))   # this ps is the queue's only reader: it returns at once
            if worker == 0 and chief_done_at is None:
                chief_done_at = time.monotonic()   # the final save is on disk: nothing more to protect
            if worker not in seen:
                seen.add(worker)
                log.info("ps%d: worker %d is done (%d/%d)", task.index, worker, len(seen), task.num_workers)
    log.info("ps%d: every worker is done; exiting", task.index)
    return ExitCode.OK
