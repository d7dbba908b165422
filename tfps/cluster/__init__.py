"""The cluster: who runs what where (pure Python; never imports TensorFlow).

    spec.py       ClusterSpec, TaskRef (classic flags and TF_CONFIG), host:port parsing
    plan.py       Task, Plan, Launch: task numbering, ports, GPUs, what starts each task
    single_host.py every task on this machine, on free ports (tfps local, compose, tests)
    variables.py  the tfps_* variables (the role's argument_specs) and the job settings
    settings.py   what defines a job, its record in model_dir, and what a new start would change
    inventory.py  the plan from Ansible's own view of an inventory (needs ansible-core)
    memory.py     memory you can plan: the estimate's figures, tfps local's and the role's checks of a
                  host's memory, the dynamic tables' budgets (the estimate itself: tfps.launch.estimate)
    datasrc.py    data on the controller: which files each worker's host gets (tfps_data_src)
    gpu.py        judging a host's GPU smoke run (nvidia-smi) against the image's CUDA; the GPU ids
                  of --gpus, checked against this machine's nvidia-smi, and each local task's GPU env
"""

from tfps.cluster.plan import (
    DEFAULT_BASE_PORT,
    LAYOUT_VARS,
    Launch,
    Plan,
    Task,
    container_name,
    plan_from_hosts,
)
from tfps.cluster.single_host import free_ports, local_plan
from tfps.cluster.spec import JOBS, PS, WORKER, ClusterSpec, TaskRef, join_target, split_target

__all__ = [
    "DEFAULT_BASE_PORT", "JOBS", "LAYOUT_VARS", "PS", "WORKER", "ClusterSpec", "Launch", "Plan", "Task",
    "TaskRef", "container_name", "free_ports", "join_target", "local_plan", "plan_from_hosts", "split_target",
]
