"""The parameter server task: serve variables until every worker says it is done.

Classic scripts call ``server.join()``, which never returns, so someone has to kill the
ps - possibly while the chief is still writing its final checkpoint. Here the ps dequeues
one token per worker from its own ``done`` queue and exits 0 when all have reported.
Once the chief (whose token comes after its final save) is done, the others get
``timeouts.ps_wait_after_chief`` (``--sync_timeout``) seconds more: a worker that died for
good cannot keep the ps alive. Then, or at a stop signal, the ps exits 0: the job's outcome
is the chief's.
On SIGTERM it keeps serving for ``grace_period(final_save_timeout)`` so the chief can
finish its final save; a second signal, or the end of that grace, stops it at once.

The tokens live in the ps process. A ps started again by ``tfps run --restarts`` (after the
OOM killer, say) would wait for workers that finished before it died and never report
again, so every ps keeps the workers it saw finish in its supervisor's state directory,
and a successor starts from them.
"""

from __future__ import annotations

import logging
import os
import time

from tfps import timeouts
from tfps.config import RunConfig
from tfps.exitcodes import ExitCode
from tfps.outcome import results
from tfps.task.monitor.board import ps_ledger_write
from tfps.task.runtime.donequeue import done_queue
from tfps.task.runtime.health import write_health
from tfps.task.runtime.session import session_config, start_server
from tfps.task.runtime.signals import StopSignal
from tfps.task.runtime.supervise import STATE_DIR_ENV
from tfps.task.runtime.watchdog import StartupBound

log = logging.getLogger("tfps")


def serve(task, cfg: RunConfig, stop: StopSignal) -> ExitCode:
    import tensorflow as tf
    v1 = tf.compat.v1

    bound = StartupBound(task.name, cfg.startup_timeout, f"starting its TensorFlow server on port {task.port}")
    server = start_server(task, cfg)
    write_health(task)
    log.info("ps%d serving on port %d; waiting for %d worker(s) to finish", task.index, task.port,
             task.num_workers)
    bound.phase = "opening the session of its own done queue"
    graph = tf.Graph()
    with graph.as_default():
        queue = done_queue(task.index, task.num_workers)
        # Dequeue only what is there: a dequeue cut short by a run timeout can still take a
        # token after the timeout and lose it, and a lost chief token keeps the ps up for good.
        size, dequeue = queue.size(), queue.dequeue()
        ledger = ps_ledger_write(task.index)   # the deaths of its earlier processes, for the chief
    record = _DoneRecord(task.index)
    seen = record.load()
    if seen:
        log.info("ps%d: worker(s) %s reported done to this task's previous process", task.index, sorted(seen))
    grace = timeouts.grace_period(cfg.final_save_timeout)
    linger = timeouts.ps_wait_after_chief(cfg)
    chief_done_at: float | None = time.monotonic() if 0 in seen else None
    with v1.Session(server.target, graph=graph, config=session_config(task, cfg)) as sess:
        sess.run([size, ledger])
        bound.disarm()
        while len(seen) < task.num_workers:
            if stop.requested and time.monotonic() - stop.first_at > grace:
                log.warning("ps%d stopped: %d s grace for the final save is over", task.index, grace)
                return stop.exit_code()
            if stop.requested and chief_done_at is not None:
                # The job's outcome is the chief's, and it is on disk: as when the wait below
                # runs out, a worker that never reported cannot make the ps's end a failure.
                log.info("ps%d: stop requested after the chief's final save; exiting", task.index)
                return ExitCode.OK
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
                record.save(seen)
                log.info("ps%d: worker %d is done (%d/%d)", task.index, worker, len(seen), task.num_workers)
    log.info("ps%d: every worker is done; exiting", task.index)
    return ExitCode.OK


class _DoneRecord:
    """The workers this ps saw finish, kept where its successor finds them (only under a
    supervising ``tfps run --restarts``: a process started anew otherwise belongs to a new job)."""

    def __init__(self, index: int):
        directory = os.environ.get(STATE_DIR_ENV)
        self.path = os.path.join(directory, f"ps{index}-done.json") if directory else None

    def load(self) -> set[int]:
        if self.path is None or not os.path.exists(self.path):
            return set()
        try:
            return {int(w) for w in results.read_json(self.path)["done"]}
        except (TypeError, KeyError, ValueError):
            log.warning("cannot read %s: waiting for every worker", self.path)
            return set()

    def save(self, seen: set[int]) -> None:
        if self.path is None:
            return
        try:
            results.write_json_atomic(self.path, {"done": sorted(seen)})
        except OSError as e:
            log.warning("cannot record the finished workers in %s: %s", self.path, e)
