"""A local cluster started task by task, as the restart tests start it.

The cases of a task SIGKILLed mid-run and started again with the same command line (a
killed non-chief worker that rejoins and trains past the step its predecessor died at; a
killed chief that joins the live variables of the ps and redoes nothing) are
tests/integration/test_faults.py's ``worker1-sync`` and ``chief-backup`` (in an async job:
tests/integration/test_chaos.py). ``start_cluster`` stays here for the tests that start such a cluster.
"""

from __future__ import annotations

from pathlib import Path

from integration_helpers import Proc, Processes, base_env, run_flags

LOG_STEPS = 10


def start_cluster(procs: Processes, model_dir: Path, *extra: str, steps: int, chief_env: dict | None = None):
    """1 ps + 2 workers (``tfps run`` each, classic flags); returns (tasks, each task's argv, ports)."""
    from tfps.cluster import local_plan
    plan = local_plan(1, 2)
    argv = {}
    tasks: dict[str, Proc] = {}
    for t in plan.tasks:
        argv[t.name] = ["run", *plan.task_ref(t).to_flags(),
                        *run_flags(model_dir, "--log_steps", LOG_STEPS, *extra, steps=steps)]
        env = base_env(**chief_env) if chief_env and t.name == "worker0" else None
        tasks[t.name] = procs.tfps(t.name, *argv[t.name], env=env)
    ports = [t.port for t in plan.tasks]
    return tasks, argv, ports
