"""The cluster plan: which task runs on which host, on which port, with which GPU.

Every part of tfps (the tfps, ``tfps plan``, ``tfps local``, ``tfps compose``, the
Ansible role) takes its task numbering from here and from nowhere else. Two
implementations of "worker 3 is the second GPU of host b" drift apart, and a drifted
cluster spec does not fail loudly: it hangs in "CreateSession still waiting for
response from worker".

:func:`plan_from_hosts` turns the hosts of the ``ps`` and ``worker`` groups and each
host's variables, as Ansible resolved them, into a :class:`Plan`; reading an inventory
is Ansible's job (:mod:`tfps.cluster.inventory`). :class:`Launch` says how every task
is started, and :meth:`Plan.to_json` gives each consumer (the role, compose) the
container name, argv, stop timeout and environment of every task, so that none of them
re-derives these.

Pure Python: never imports TensorFlow or Ansible.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfps.cluster.spec import (
    JOBS,
    PS,
    WORKER,
    ClusterSpec,
    TaskRef,
    _check_port,
    join_target,
    task_name,
)
from tfps.errors import ConfigError

#: Port of a host's first task when the inventory does not set ``tfps_base_port``.
#: 2222 is the port TensorFlow's examples and Kubeflow's TFJob use.
DEFAULT_BASE_PORT = 2222
#: Where a classic script (``tfps_script``) and user model modules appear in a container.
USER_MODEL_MOUNT = "/opt/usermodels"
#: Where the chief's container finds the notification config file (compose --notify_config,
#: Ansible tfps_notify_config).
NOTIFY_CONFIG_MOUNT = "/etc/tfps/notify.yml"
#: Environment variable naming a file of notification URLs (tfps.notify.urls reads it), and
#: where a task container finds that file (compose's secret, the Ansible role's mount).
ENV_URLS_FILE = "APPRISE_URLS_FILE"
URLS_FILE_MOUNT = "/run/secrets/notify_urls"
#: Where the training data directory appears in a container, read-only (compose
#: ``--data_dir``, Ansible ``tfps_data_dir``): ``--train_data /input/train.csv`` works in both.
DATA_MOUNT = "/input"
#: Task containers run with a read-only root filesystem (docs/security.md); these tmpfs
#: mounts are the only places outside the model directory and volumes they can write.
CONTAINER_TMPFS = ("/tmp",)
#: What writes below $HOME by default is sent to the tmpfs instead: the demo data cache
#: (XDG_CACHE_HOME) and matplotlib's config/cache directory (the loss plot).
CONTAINER_ENV = {"XDG_CACHE_HOME": "/tmp/.cache", "MPLCONFIGDIR": "/tmp/.config/matplotlib"}
#: Most processes and threads a task container may have (docker --pids-limit): TF's
#: thread pools and gRPC need a few hundred on a large host; a fork bomb stops here.
DEFAULT_PIDS_LIMIT = 4096


#: The job's TensorBoard container (Ansible ``tfps_tensorboard``), named like its tasks'.
TENSORBOARD = "tensorboard"


def container_name(job_name: str, task: Task | str) -> str:
    """``tfps-<job>-worker0``: the task's container on its host (Ansible); ``task`` may
    also be the name of the job's other container, :data:`TENSORBOARD`.

    The role takes every container name from the plan's JSON (each task's ``container``,
    ``job.tensorboard_container``) and never builds one itself.
    """
    return f"tfps-{job_name}-{task if isinstance(task, str) else task.name}"


@dataclass(frozen=True)
class Launch:
    """How every task of one job is started: the same options for all of them.

    ``run_args`` are the ``tfps run`` options (:meth:`tfps.config.RunConfig.to_args`,
    the one builder of run flags); ``script`` runs a user's classic script instead,
    which takes the classic flags.
    """

    name: str  #: the job's name (``tfps_job_name``, ``--run_name``)
    run_args: tuple[str, ...] = ()
    stop_timeout: int = 0  #: seconds between SIGTERM and SIGKILL: grace_period(final_save_timeout)
    script: str | None = None  #: file in the user model directory, run instead of ``tfps run``
    script_args: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict, compare=False)  #: plain data shown as the plan's "job"

    def entrypoint(self) -> list[str] | None:
        """The container entrypoint; None keeps the image's (tini + tfps)."""
        if self.script:
            return ["/usr/bin/tini", "--", "python", f"{USER_MODEL_MOUNT}/{self.script}"]
        return None

    def argv(self, ref: TaskRef) -> list[str]:
        """The container command of one task."""
        if self.script:
            return ref.to_flags() + list(self.script_args)
        return ["run", *self.run_args]

    def env(self, task: Task, ref: TaskRef) -> dict[str, str]:
        """The task's environment (never a secret: the role adds those itself)."""
        env = {"TFPS_HOST": task.host, "TFPS_TASK": task.name, **CONTAINER_ENV}
        if not self.script:
            env["TF_CONFIG"] = ref.to_tf_config()
        return env


# --------------------------------------------------------------------------- plan types


@dataclass(frozen=True)
class Task:
    """One task of the plan: a TF server that one container or process runs."""

    host: str  #: inventory hostname (where Ansible starts it)
    address: str  #: what peers connect to: tfps_address, else ansible_host, else host
    job: str  #: "ps" or "worker"
    index: int
    port: int
    gpu: str | None = (
        None  #: GPU id of a GPU worker: its container's device request; under tfps local, CUDA_VISIBLE_DEVICES
    )

    @property
    def is_chief(self) -> bool:
        """Worker 0 is the chief: it initialises, checkpoints, exports and notifies."""
        return self.job == WORKER and self.index == 0

    @property
    def name(self) -> str:
        """``worker0``: how tfps names the task in logs, files, containers and compose services."""
        return task_name(self.job, self.index)

    @property
    def target(self) -> str:
        return join_target(self.address, self.port)


@dataclass(frozen=True)
class Plan:
    """Every task of one job, ps tasks first, then workers, each by index."""

    tasks: tuple[Task, ...]
    cluster: ClusterSpec

    @classmethod
    def from_tasks(cls, tasks: list[Task] | tuple[Task, ...]) -> Plan:
        """Order the tasks, derive the cluster and reject two tasks on one address:port."""
        for task in tasks:
            if task.job not in JOBS:
                raise ConfigError(
                    f"task {task.name} has job {task.job!r}; use ps or worker",
                    "job_name",
                )
        ordered = sorted(tasks, key=lambda t: (JOBS.index(t.job), t.index))
        for job in JOBS:
            indices = [t.index for t in ordered if t.job == job]
            if indices != list(range(len(indices))):
                raise ConfigError(
                    f"{job} task indices are {indices}; they must be 0..{len(indices) - 1}",
                    job,
                )
            if not indices:
                raise ConfigError(f"the plan has no {job} task; add at least one", job)
        seen: dict[tuple[str, int], Task] = {}
        for task in ordered:
            _check_port(
                task.port, "tfps_base_port", f"{task.name} on host {task.host!r}"
            )
            key = (task.address.lower(), task.port)
            if key in seen:
                other = seen[key]
                fix = (
                    f"give host {task.host!r} another tfps_base_port"
                    if other.host != task.host
                    else "use distinct ports"
                )
                raise ConfigError(
                    f"{other.name} (host {other.host!r}) and {task.name} (host {task.host!r}) "
                    f"both use {task.target}; {fix} so that their port ranges do not overlap",
                    "tfps_base_port",
                )
            seen[key] = task
        cluster = ClusterSpec(
            tuple(t.target for t in ordered if t.job == PS),
            tuple(t.target for t in ordered if t.job == WORKER),
        )
        return cls(tuple(ordered), cluster)

    @property
    def chief(self) -> Task:
        return self.task(WORKER, 0)

    def task(self, job: str, index: int) -> Task:
        for task in self.tasks:
            if task.job == job and task.index == index:
                return task
        raise ConfigError(
            f"the plan has no task {job}{index}; it has {', '.join(t.name for t in self.tasks)}",
            "task",
        )

    def task_ref(self, task: Task) -> TaskRef:
        return TaskRef(self.cluster, task.job, task.index)

    def to_json(self, launch: Launch | None = None) -> dict:
        """Plain data for ``tfps plan --format json``, the role and compose.

        With ``launch``, every task also carries what starts it: its container name,
        entrypoint, argv, stop timeout and environment (never a secret), so that no
        consumer re-derives them.
        """
        tasks = []
        for task in self.tasks:
            ref = self.task_ref(task)
            entry = {
                "name": task.name,
                "host": task.host,
                "address": task.address,
                "job": task.job,
                "index": task.index,
                "port": task.port,
                "gpu": task.gpu,
                "chief": task.is_chief,
                "target": task.target,
                "flags": ref.to_flags(),
                "tf_config": ref.to_tf_config(),
            }
            if launch is not None:
                entry.update({
                    "container": container_name(launch.name, task),
                    "entrypoint": launch.entrypoint(),
                    "argv": launch.argv(ref),
                    "stop_timeout": launch.stop_timeout,
                    "env": launch.env(task, ref),
                    "tmpfs": list(CONTAINER_TMPFS),
                })
            tasks.append(entry)
        data = {
            "cluster": self.cluster.as_dict(),
            "chief": self.chief.name,
            "tasks": tasks,
        }
        if launch is not None:
            data["job"] = {"name": launch.name, "tensorboard_container": container_name(launch.name, TENSORBOARD),
                           **launch.extra}
            if "settings" in launch.extra:   # what defines the job: its settings and its layout (not ports)
                data["job"]["settings"] = {**launch.extra["settings"], "layout": " ".join(
                    f"{t.name}@{t.host}" + (f"/gpu{t.gpu}" if t.gpu is not None else "") for t in self.tasks)}
        return data

    def render_table(self) -> str:
        """A table for people, then how each task is started (flags and TF_CONFIG)."""
        header = ("NAME", "HOST", "ADDRESS", "JOB", "INDEX", "PORT", "GPU", "CHIEF")
        rows = [header] + [
            (
                t.name,
                t.host,
                t.address,
                t.job,
                str(t.index),
                str(t.port),
                t.gpu if t.gpu is not None else "-",
                "yes" if t.is_chief else "",
            )
            for t in self.tasks
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
            for row in rows
        ]
        n_ps, n_workers = len(self.cluster.ps), len(self.cluster.worker)
        lines.append("")
        lines.append(
            f"{n_ps} ps, {n_workers} worker(s); chief: {self.chief.name} on {self.chief.host}"
        )
        for task in self.tasks:
            ref = self.task_ref(task)
            lines.append("")
            lines.append(f"{task.name}:")
            lines.append(f"  flags:     {shlex.join(ref.to_flags())}")
            lines.append(f"  TF_CONFIG: {shlex.quote(ref.to_tf_config())}")
        return "\n".join(lines) + "\n"




#: Variables that decide the layout of the cluster on a host.
LAYOUT_VARS = ("ansible_host", "tfps_address", "tfps_base_port", "tfps_ps_tasks", "tfps_workers", "tfps_gpus",
               "tfps_gpu_count")


def plan_from_hosts(
    ps_hosts: Sequence[str], worker_hosts: Sequence[str], host_vars: Mapping[str, Mapping[str, Any]]
) -> Plan:
    """The plan of the hosts of the ``ps`` and ``worker`` groups, in group order.

    ``host_vars`` holds each host's variables as Ansible resolved them (every
    precedence rule applied, templates rendered); only :data:`LAYOUT_VARS` are read.
    Ps tasks are numbered first, host by host, then workers: a host's tasks take
    consecutive ports from its ``tfps_base_port``, and a GPU host runs one worker per
    entry of ``tfps_gpus``.
    """
    if not ps_hosts:
        raise ConfigError("the inventory has no hosts in group 'ps'; add the host(s) that run parameter servers "
                          "to a group named ps", PS)
    if not worker_hosts:
        raise ConfigError("the inventory has no hosts in group 'worker'; add the host(s) that run workers "
                          "to a group named worker", WORKER)
    for host in ps_hosts:
        if host in worker_hosts:
            raise ConfigError(
                f"host {host!r} is in both the ps and the worker group; a host entry runs one kind of task: "
                "give the ps its own inventory entry with the same ansible_host and another tfps_base_port "
                f"(e.g. {host}-ps with tfps_base_port: {DEFAULT_BASE_PORT + 10})",
                PS,
            )
    tasks: list[Task] = []
    for job, hosts in ((PS, ps_hosts), (WORKER, worker_hosts)):
        index = 0
        for host in hosts:
            variables = host_vars.get(host, {})
            address = _address(variables, host)
            base = _int_var(variables, "tfps_base_port", host, DEFAULT_BASE_PORT, 1)
            _check_port(base, "tfps_base_port", f"host {host!r} (tfps_base_port)")
            if job == PS:
                slots: list[str | None] = [None] * _int_var(variables, "tfps_ps_tasks", host, 1, 1)
            else:
                slots = _worker_slots(variables, host)
            last = base + len(slots) - 1
            if last > 65535:
                raise ConfigError(
                    f"host {host!r} has tfps_base_port {base} and {len(slots)} task(s), so its last port would be "
                    f"{last}; use a base port of at most {65536 - len(slots)}",
                    "tfps_base_port",
                )
            for offset, gpu in enumerate(slots):
                tasks.append(Task(host, address, job, index, base + offset, gpu))
                index += 1
    return Plan.from_tasks(tasks)


def _int_var(
    variables: Mapping, name: str, host: str, default: int, minimum: int
) -> int:
    value = variables.get(name, default)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"host {host!r} has {name}: {value!r}; use a whole number such as {max(default, minimum)}",
            name,
        )
    if value < minimum:
        need = "a positive number" if minimum == 1 else f"a number >= {minimum}"
        advice = (
            " (remove the host from the group to run no task there)"
            if minimum == 1
            else ""
        )
        raise ConfigError(
            f"host {host!r} has {name}: {value}; use {need}{advice}", name
        )
    return value


def _gpu_ids(variables: Mapping, host: str) -> list[str]:
    value = variables.get("tfps_gpus")
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(
            f"host {host!r} has tfps_gpus: {value!r}; use a YAML list of GPU ids such as [0, 1]",
            "tfps_gpus",
        )
    ids: list[str] = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise ConfigError(
                f"host {host!r} lists GPU id {item!r}; use numbers such as 0 or GPU UUID strings",
                "tfps_gpus",
            )
        gpu = str(item).strip()
        if (isinstance(item, int) and item < 0) or not gpu or re.search(r"[\s,]", gpu):
            raise ConfigError(
                f"host {host!r} lists GPU id {item!r}; use numbers such as 0 or GPU UUID strings",
                "tfps_gpus",
            )
        if gpu in ids:
            raise ConfigError(
                f"host {host!r} lists GPU id {gpu} twice; list each GPU once",
                "tfps_gpus",
            )
        ids.append(gpu)
    return ids


def _address(variables: Mapping, host: str) -> str:
    """The address peers connect to: ``tfps_address`` (a separate data network) if set,
    else ``ansible_host`` (where SSH goes), else the inventory name."""
    name = "tfps_address" if not _blank_var(variables.get("tfps_address")) else "ansible_host"
    value = variables.get(name, host)
    if (
        not isinstance(value, (str, int))
        or isinstance(value, bool)
        or not str(value).strip()
        or re.search(r"\s", str(value).strip())
    ):
        raise ConfigError(
            f"host {host!r} has {name} {value!r}; set the address peers connect to",
            name,
        )
    value = str(value).strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]  # "[fd00::1]" and "fd00::1" are one address; join_target adds the brackets
    return value


def _blank_var(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _worker_slots(variables: Mapping, host: str) -> list[str | None]:
    """One slot per GPU id, else ``tfps_workers`` CPU slots."""
    gpus = _gpu_ids(variables, host)
    if "tfps_gpu_count" in variables:
        count = _int_var(variables, "tfps_gpu_count", host, 0, 0)
        if gpus and count == 0:
            raise ConfigError(
                f"GPU ids on a host without GPUs: host {host!r} has tfps_gpu_count: 0 and "
                f"tfps_gpus: [{', '.join(gpus)}]; "
                "remove tfps_gpus (and set tfps_workers) or fix tfps_gpu_count",
                "tfps_gpus",
            )
        if len(gpus) > count:
            raise ConfigError(
                f"host {host!r} has {len(gpus)} GPU slots in tfps_gpus but tfps_gpu_count is {count}; "
                "list at most one worker per GPU",
                "tfps_gpus",
            )
        for gpu in gpus:
            if gpu.isdigit() and int(gpu) >= count:
                raise ConfigError(
                    f"host {host!r} lists GPU id {gpu} but has tfps_gpu_count: {count}; use ids 0..{count - 1}",
                    "tfps_gpus",
                )
    if "tfps_workers" in variables:
        workers = _int_var(variables, "tfps_workers", host, 1, 1)
        if gpus and workers != len(gpus):
            raise ConfigError(
                f"host {host!r} has tfps_workers: {workers} but {len(gpus)} GPU id(s) in tfps_gpus; "
                "a GPU host runs one worker per GPU, so remove tfps_workers or make the counts match",
                "tfps_workers",
            )
    else:
        workers = 1
    return list(gpus) if gpus else [None] * workers
