"""One task of a cluster, from start to exit code: what ``tfps run`` runs.

``ps`` serves the variables until every worker is done; ``worker`` trains, and ``chief``
(worker 0) also checkpoints, exports and reports. ``lifecycle`` holds what they share
(signals, the "done" queues, session settings), ``setup`` what a job trains, ``hooks``
the MonitoredSession hooks, ``watchdog`` the startup bound, ``export`` the final
SavedModel, ``supervise`` the ``--restarts`` supervisor, ``board`` each worker's progress
on ps 0, ``watch`` the chief's stall and progress watch, ``rejoin`` the chief's session
creator that joins the live ps, ``steps`` an async worker's several steps per run. Only ``run_task`` and the
modules it loads import TensorFlow.
"""

from __future__ import annotations


def run_task(task, cfg, stop, started_wall: float | None = None):
    """Run this process's task (ps, worker or chief) and return its ExitCode."""
    if task.job == "ps":
        from trainer.task.ps import serve
        return serve(task, cfg, stop)
    if task.is_chief:
        from trainer.task.chief import Chief
        return Chief(task, cfg, stop, started_wall).run()
    from trainer.task.worker import Worker
    return Worker(task, cfg, stop, started_wall).run()
