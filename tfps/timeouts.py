"""Every timeout of a job, in one place: derived from ``final_save_timeout`` or named here once.

The final save is what a stop must never cut (docs/explanation/job-end.md), so every
wait that could cut it derives from the one setting ``final_save_timeout`` through
:func:`grace_period`. The other timeouts bound waits that cannot cut the final save
(polls, end-of-job RPCs); they are named here so that a reader finds them all together
and sees why each has its value. Pure Python, no TensorFlow.
"""

from __future__ import annotations

# ---------------------------------------------------------------- the settings' defaults

#: Default seconds the chief may spend on its final checkpoint + export (``--final_save_timeout``,
#: the role's ``tfps_final_save_timeout``; a unit test keeps the two equal). Generous on
#: purpose: cutting a final save loses the whole job's last interval, waiting longer costs nothing.
DEFAULT_FINAL_SAVE_TIMEOUT = 1800
#: Shortest accepted final_save_timeout: below this even a small model's export can be cut.
MIN_FINAL_SAVE_TIMEOUT = 30
#: Default ``--sync_timeout``: how long a step, or a ps waiting for workers, may wait for a lost task.
DEFAULT_SYNC_TIMEOUT = 300.0
#: Default ``--stall_timeout``: seconds without progress before the "stalled" message.
DEFAULT_STALL_TIMEOUT = 900.0

# ---------------------------------------------------------------- derived from final_save_timeout

#: Seconds added on top of final_save_timeout for process start/stop around the save.
GRACE_MARGIN = 30


def grace_period(final_save_timeout: float) -> int:
    """Seconds an orchestrator must wait after SIGTERM before it may SIGKILL a task.

    Used for compose ``stop_grace_period`` and docker ``stop_timeout`` (tfps/launch/compose.py)
    and for the ps's wait after SIGTERM (tfps/task/ps.py): the ps holds the variables
    that the chief's final save reads. The Ansible role takes it from the plan (each task's
    ``stop_timeout``, tfps/cluster/plan.py).
    """
    return int(final_save_timeout) + GRACE_MARGIN


# ---------------------------------------------------------------- derived from sync_timeout

def step_timeout_ms(cfg) -> int:
    """A worker's TensorFlow operation timeout (``operation_timeout_in_ms``).

    A step that waits longer than this (a sync step missing a worker that never comes
    back, a dead ps) fails the job with a clear error instead of hanging forever.
    Default: ``--sync_timeout`` (300 s).
    """
    return int(cfg.sync_timeout * 1000)


#: The bound of a training run that reads from the slice queue (tfps.task.graph.slicequeue): it may
#: wait for the next slice as long as a followed stream is quiet; a lost task is found by the
#: watchdog within --sync_timeout (tfps.task.runtime.watchdog), and a stop ends the wait within seconds.
QUEUE_RUN_TIMEOUT_MS = 7 * 24 * 3600 * 1000


def ps_wait_after_chief(cfg) -> float:
    """Seconds a ps waits for the other workers' "done" tokens once the chief's has come.

    The chief's token means the final save is on disk; a worker that died for good must
    not keep the ps alive beyond this. Default: ``--sync_timeout`` (300 s).
    """
    return float(cfg.sync_timeout)


# ---------------------------------------------------------------- named once

#: ``MonitoredSession(stop_grace_period_secs=...)``. It only bounds joining queue-runner
#: threads at close(); the final checkpoint is written before that (CheckpointSaverHook.end)
#: and the export after it, so a short value cuts nothing and keeps a stuck sync queue from
#: stalling the end of the job.
SESSION_CLOSE_GRACE_SECS = 3

#: Non-chief workers check this often whether the chief has initialised the model
#: (``MonitoredTrainingSession`` hard-codes 30 s).
JOIN_POLL_SECS = 0.05
#: ... and this often whether the chief gave up before it ever did (the stop flag).
GIVE_UP_POLL_SECS = 0.5
#: How long a non-chief worker waits for the chief to initialise the model (TF's default).
CHIEF_WAIT_SECS = 7200
#: A worker reads the chief's stop flag (on ps 0) at most this often.
FLAG_READ_SECS = 0.25
#: An async worker runs as many steps per session.run as take about this long (at most
#: --log_steps): a stop is still honoured within about this time (tfps.task.graph.steps).
STEPS_PER_RUN_SECS = 0.25
#: Bound on sending tokens / flags at the end; the ps may already be gone.
END_RPC_TIMEOUT_MS = 10_000
#: The whole end RPC, session creation included: TensorFlow waits for a ps that has gone
#: without a bound ("CreateSession still waiting"), so the call is abandoned after this.
END_RPC_BOUND_SECS = 20.0
#: How long a non-chief waits, at its end, for its watch for the job's end to leave TensorFlow
#: (tfps.task.runtime.signals.left_in_tensorflow); a watch still in a call then is abandoned.
END_WATCH_JOIN_SECS = 1.0
#: Bound on a worker's board write outside a step (at session start and end, tfps.task.monitor.board).
BOARD_WRITE_TIMEOUT_MS = 5_000
#: After its done token the chief waits at most this long for the ps tasks to exit (well
#: inside the grace that follows a stop request).
PS_EXIT_WAIT_SECS = 20.0
#: How often the ps looks at the size of its "done" queue, so that it notices stop signals.
PS_DONE_POLL_SECS = 0.5
#: The startup watchdog's probe of another task's port (connect and first answer).
PROBE_TIMEOUT_SECS = 2.0
#: ... and its second probe of a task that held its port but said nothing in that time: a
#: TensorFlow server on a host at a load of 10x its cores can take seconds to answer, and
#: is alive. Only a task silent for this long too counts as not answering.
PROBE_PATIENT_SECS = 30.0
#: Milliseconds one probe of the ps's variables by a restarted chief may take; a probe that
#: gets no answer is asked again (a ps frozen, starting again, or slow on a loaded machine:
#: restoring the checkpoint over variables the ps may still hold would roll the job back)
#: until ``--sync_timeout`` has passed; only then does the chief restore, and says so. Also
#: the bound on each run of its drain of old sync tokens (tfps.task.runtime.rejoin).
REJOIN_PROBE_TIMEOUT_MS = 10_000
#: After its final save the chief looks this often whether a ps still listens, each look
#: bounded by PS_EXIT_CONNECT_SECS (within PS_EXIT_WAIT_SECS in all).
PS_EXIT_POLL_SECS = 0.2
PS_EXIT_CONNECT_SECS = 1.0
#: A worker writes its progress board (on ps 0) at most this often (tfps.task.monitor.board).
BOARD_PUBLISH_SECS = 1.0
#: The chief's progress watch reads the workers' boards this often, each read bounded by
#: WATCH_READ_TIMEOUT_MS (tfps.task.monitor.watch).
WATCH_POLL_SECS = 2.0
WATCH_READ_TIMEOUT_MS = 5_000
#: --epochs: the chief, done with its data, reads the other workers' boards this often until
#: each has read its own (tfps.task.chief).
EPOCHS_WAIT_POLL_SECS = 0.5
#: A sync worker whose last step still waits for a token this long after the global step
#: reached train_steps closes the token queue itself, which ends its wait (tfps.task.worker).
SYNC_END_GRACE_SECS = 10.0
#: How often a sync worker reads the global step to see that the job has reached its end.
SYNC_END_POLL_SECS = 2.0
#: ``tfps healthcheck`` (the image's HEALTHCHECK): bound on connecting to the task's port.
HEALTHCHECK_CONNECT_SECS = 3.0
#: One attempt to deliver a notification (apprise's per-request timeout, tfps.notify.notifier).
NOTIFY_ATTEMPT_SECS = 15.0

#: Signals that come within this many seconds of the first are the same stop: ``timeout``, CI
#: runners and process managers signal a process and then its group, and a terminal's Ctrl-C
#: reaches the whole foreground group, milliseconds apart. Only a signal after this window is
#: a deliberate second one, which stops at once (tfps.task.runtime.signals.StopWindow).
STOP_WINDOW_SECS = 2.0

#: After the chief exits 0, how long the other tasks get to exit on their own before they
#: are stopped: ``tfps local``, and the Ansible role's default ``tfps_settle_timeout``
#: (ansible/roles/tfps/defaults/main.yml; a unit test keeps the two equal). They normally
#: exit within seconds; a sync worker may first have to time out a step.
SETTLE_SECS = 120.0
#: ``tfps local``: how long tasks get to exit after a failed chief, or after being told to stop.
LOCAL_STOP_WAIT_SECS = 10.0

#: ``tfps local``: how often the launcher looks at its tasks while the chief runs, and while
#: it waits for tasks to exit.
LOCAL_WATCH_POLL_SECS = 0.2
LOCAL_EXIT_POLL_SECS = 0.1
#: ``tfps local``: how long a task's output is still copied after it exited, and how long the
#: launcher waits for tasks after SIGKILL.
LOCAL_OUTPUT_DRAIN_SECS = 5.0
LOCAL_KILL_WAIT_SECS = 5.0

#: ``tfps local``: after a task died mid-job, the chief's watchdog ends the job within
#: --sync_timeout; the launcher stops the chief itself this long after that, should it not.
LOST_TASK_GRACE_SECS = 30.0


#: ``tfps run --restarts``: pause before a killed task process is started again.
RESTART_DELAY_SECS = 1.0
