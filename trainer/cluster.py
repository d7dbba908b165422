"""The cluster plan: which task runs on which host, on which port, with which GPU.

Every part of tfps (the trainer, ``tfps plan``, ``tfps local``, the Ansible playbook)
takes its task numbering from here and from nowhere else. Two implementations of
"worker 3 is the second GPU of host b" drift apart, and a drifted cluster spec does
not fail loudly: it hangs in "CreateSession still waiting for response from worker".

The inventory is the Ansible YAML inventory the playbook also uses, read with
Ansible's own variable precedence, so that ``tfps plan`` shows exactly what the
playbook will start. A process learns its role from the classic flags
(``--ps_hosts --worker_hosts --job_name --task_index``) or from ``TF_CONFIG``; both are
spellings of a :class:`TaskRef`, and both can be produced from a :class:`Plan`.

This module is pure Python (stdlib and PyYAML) and must never import TensorFlow:
planning a cluster has to work on a laptop, in CI and in the Ansible controller, and
it must be fast enough to run before every start.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import socket
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import ConfigError

PS = "ps"
WORKER = "worker"
JOBS = (PS, WORKER)

#: Port of a host's first task when the inventory does not set ``tfps_base_port``.
#: 2222 is the port TensorFlow's examples and Kubeflow's TFJob use.
DEFAULT_BASE_PORT = 2222

#: Every ``tfps_*`` variable an inventory may set. Anything else that starts with
#: ``tfps_`` is a typo, and a typo in a layout variable silently changes the cluster,
#: so unknown names are errors with a "did you mean" suggestion.
KNOWN_VARS: dict[str, str] = {
    # Cluster layout (read here).
    "tfps_base_port": "first TF port on the host (default 2222); its tasks take consecutive ports",
    "tfps_ps_tasks": "number of parameter-server tasks on a host of group ps (default 1)",
    "tfps_workers": "number of CPU worker tasks on a host of group worker (default 1 without tfps_gpus)",
    "tfps_gpus": "list of GPU ids on a worker host; one worker task per GPU, in this order",
    "tfps_gpu_count": "number of GPUs the host really has; tfps_gpus are checked against it",
    # Job settings (read by the trainer and the playbook).
    "tfps_job_name": "name of the job, used in container names, results and messages",
    "tfps_model": "model to train (a built-in name such as mlp, or one from tfps_user_model_dir)",
    "tfps_train_data": "training data file or pattern, as seen inside the trainer",
    "tfps_eval_data": "evaluation data file or pattern, as seen inside the trainer",
    "tfps_label_column": "name of the label column in the data",
    "tfps_train_steps": "global step at which training ends",
    "tfps_batch_size": "examples per step on each worker",
    "tfps_learning_rate": "optimizer learning rate",
    "tfps_sync_replicas": "true: synchronous updates (SyncReplicasOptimizer); false: asynchronous",
    "tfps_replicas_to_aggregate": "gradients aggregated per synchronous step (default: number of workers)",
    "tfps_final_save_timeout": "seconds the chief may take for its final checkpoint and export; every stop timeout derives from it",
    "tfps_checkpoint_steps": "steps between checkpoints",
    "tfps_model_dir": "directory for checkpoints",
    "tfps_export_dir": "directory the chief writes the SavedModel and results into",
    "tfps_data_dir": "host directory mounted into the trainer containers for data",
    "tfps_image": "trainer container image (name:tag)",
    "tfps_image_archive": "image archive (docker save) copied to and loaded on hosts without a registry",
    "tfps_notify_urls": "apprise URLs for the completion message (secret: keep them in an Ansible Vault file)",
    "tfps_notify_config": "apprise configuration file, instead of or in addition to tfps_notify_urls",
    "tfps_extra_args": "list of extra arguments passed to `tfps run` on every task",
    "tfps_firewall": "limit the TF ports to the cluster's own hosts (default true)",
    "tfps_restart_policy": "container restart policy of the tasks",
    "tfps_script": "a user training script run instead of the built-in trainer",
    "tfps_user_model_dir": "directory of user model modules made available to the trainer",
    # Deployment settings (read by the Ansible role only; see ansible/roles/tfps/defaults/main.yml).
    "tfps_script_args": "extra arguments for tfps_script",
    "tfps_image_archive_sha256": "expected sha256 of tfps_image_archive (computed when empty)",
    "tfps_image_archive_remote_dir": "directory on the hosts the image archive is copied to",
    "tfps_restart_retries": "restart attempts of a failed task container",
    "tfps_container_uid": "uid the trainer containers run as (the image's non-root user)",
    "tfps_env": "extra environment variables for every task container",
    "tfps_executable": "path of the tfps command on the controller",
    "tfps_inventory": "inventory path handed to tfps plan",
    "tfps_results_dir": "controller directory results.json and logs are fetched into",
    "tfps_log_lines": "number of final log lines collected per task",
    "tfps_install_requirements": "install the Python packages the docker modules need on the hosts",
    "tfps_requests_package": "name of the python requests package on the hosts",
    "tfps_wait": "wait for the job to end (false: start it and return)",
    "tfps_wait_timeout": "seconds deploy.yml waits for the chief",
    "tfps_wait_poll_interval": "seconds between two looks at the chief while waiting",
    "tfps_settle_timeout": "seconds the other tasks get to exit by themselves after the chief",
    "tfps_remove_containers": "remove finished containers after collecting",
    "tfps_cleanup_model_dir": "cleanup.yml also deletes the model directory",
    "tfps_cleanup_image": "cleanup.yml also removes the trainer image",
}

_LAYOUT_VARS = (
    "tfps_base_port",
    "tfps_ps_tasks",
    "tfps_workers",
    "tfps_gpus",
    "tfps_gpu_count",
)


# --------------------------------------------------------------------------- addresses


def _join_target(address: str, port: int) -> str:
    """``address:port``; IPv6 literals get brackets, as gRPC expects."""
    if ":" in address and not address.startswith("["):
        return f"[{address}]:{port}"
    return f"{address}:{port}"


def _split_target(text: Any, field: str, what: str) -> tuple[str, int]:
    """Parse one ``host:port`` entry of a cluster list; ``what`` says where it was found."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(
            f"{what} is {text!r}; write it as host:port, e.g. 10.0.0.1:2222", field
        )
    text = text.strip()
    host, sep, port_text = text.rpartition(":")
    if sep and not host:
        raise ConfigError(f"{what} {text!r} has no host; write it as host:port", field)
    if not sep or not port_text:
        raise ConfigError(
            f"{what} {text!r} has no port; write it as host:port, e.g. {text}:2222",
            field,
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(
            f"{what} {text!r} looks like an IPv6 address; write it as [address]:port",
            field,
        )
    if not port_text.isdigit():
        raise ConfigError(
            f"{what} {text!r} has port {port_text!r}, which is not a number; write host:port",
            field,
        )
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ConfigError(
            f"{what} {text!r} has port {port}; use a port in 1..65535", field
        )
    return host, port


def _check_port(port: int, field: str, what: str) -> None:
    if not 1 <= port <= 65535:
        raise ConfigError(
            f"{what} would use port {port}; ports must be in 1..65535", field
        )


# --------------------------------------------------------------------------- plan types


@dataclass(frozen=True)
class Task:
    """One task of the plan: a TF server that one container or process runs."""

    host: str  #: inventory hostname (where Ansible starts it)
    address: str  #: what peers connect to: ansible_host if set, else host
    job: str  #: "ps" or "worker"
    index: int
    port: int
    gpu: str | None = (
        None  #: GPU id for a GPU worker task (becomes CUDA_VISIBLE_DEVICES)
    )

    @property
    def is_chief(self) -> bool:
        """Worker 0 is the chief: it initialises, checkpoints, exports and notifies."""
        return self.job == WORKER and self.index == 0

    @property
    def name(self) -> str:
        return f"{self.job}{self.index}"

    @property
    def target(self) -> str:
        return _join_target(self.address, self.port)


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster every task of one job must agree on, as TensorFlow wants it."""

    ps: tuple[str, ...]  #: "address:port" per ps task, by index
    worker: tuple[
        str, ...
    ]  #: "address:port" per worker task, by index; worker 0 is the chief

    def __post_init__(self) -> None:
        # Accept lists from callers; a frozen plan must not share mutable state.
        object.__setattr__(self, "ps", tuple(self.ps))
        object.__setattr__(self, "worker", tuple(self.worker))

    def as_dict(self) -> dict[str, list[str]]:
        return {PS: list(self.ps), WORKER: list(self.worker)}

    def job(self, job: str) -> tuple[str, ...]:
        return self.ps if job == PS else self.worker


def _check_cluster(
    ps: list[str], worker: list[str], fields: tuple[str, str], labels: tuple[str, str]
) -> ClusterSpec:
    """Validate both lists of a cluster: non-empty, well-formed and no address used twice.

    ``fields`` are the error fields of the two lists, ``labels`` how the user wrote them.
    """
    seen: dict[tuple[str, int], str] = {}
    for job, entries, field, label in (
        (PS, ps, fields[0], labels[0]),
        (WORKER, worker, fields[1], labels[1]),
    ):
        if not entries:
            kind = "parameter server" if job == PS else "worker"
            raise ConfigError(
                f"{label} lists no {job} task; give at least one {kind} as host:port",
                field,
            )
        for i, entry in enumerate(entries):
            host, port = _split_target(entry, field, f"{label} entry {i}")
            key = (host.lower(), port)
            if key in seen:
                raise ConfigError(
                    f"{entry.strip()} is listed twice ({seen[key]} and {job}{i}); "
                    "every task needs its own host:port",
                    field,
                )
            seen[key] = f"{job}{i}"
    return ClusterSpec(tuple(e.strip() for e in ps), tuple(e.strip() for e in worker))


def _as_index(value: Any, field: str, what: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{what} is {value!r}; use a whole number such as 0", field)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    raise ConfigError(
        f"{what} is {value!r}, which is not a whole number; use e.g. 0", field
    )


def _check_index(
    cluster: ClusterSpec, job: str, index: int, field: str, what: str
) -> None:
    n = len(cluster.job(job))
    if not 0 <= index < n:
        noun = "ps task(s)" if job == PS else "worker(s)"
        prefix = f"{what} " if what and what != field else ""
        raise ConfigError(
            f"{prefix}{index} is out of range for {n} {noun}; use 0..{n - 1}", field
        )


@dataclass(frozen=True)
class TaskRef:
    """What one process needs: the cluster and its own place in it."""

    cluster: ClusterSpec
    job: str
    index: int

    def __post_init__(self) -> None:
        if self.job not in JOBS:
            raise ConfigError(
                f"wrong job name {self.job!r}; use ps or worker", "job_name"
            )
        _check_index(self.cluster, self.job, self.index, "task_index", "task_index")

    @property
    def is_chief(self) -> bool:
        return self.job == WORKER and self.index == 0

    @property
    def num_ps(self) -> int:
        return len(self.cluster.ps)

    @property
    def num_workers(self) -> int:
        return len(self.cluster.worker)

    @property
    def target(self) -> str:
        return self.cluster.job(self.job)[self.index]

    @property
    def port(self) -> int:
        return int(self.target.rpartition(":")[2])

    @property
    def name(self) -> str:
        return f"{self.job}{self.index}"

    def to_flags(self) -> list[str]:
        """The classic flags of TensorFlow's distributed examples, for existing scripts."""
        return [
            f"--ps_hosts={','.join(self.cluster.ps)}",
            f"--worker_hosts={','.join(self.cluster.worker)}",
            f"--job_name={self.job}",
            f"--task_index={self.index}",
        ]

    def to_tf_config(self) -> str:
        """TF_CONFIG as Kubeflow's TFJob writes it (no chief entry: worker 0 is the chief)."""
        return json.dumps(
            {
                "cluster": self.cluster.as_dict(),
                "task": {"type": self.job, "index": self.index},
                "environment": "cloud",
            },
            sort_keys=True,
        )

    @classmethod
    def from_flags(
        cls,
        ps_hosts: str | None,
        worker_hosts: str | None,
        job_name: str | None,
        task_index: int | str | None,
    ) -> TaskRef:
        """Read the classic flags. ``task_index`` defaults to 0 like in the seed scripts."""
        hint = "pass --ps_hosts, --worker_hosts, --job_name and --task_index together"
        lists = []
        for value, field in ((ps_hosts, "ps_hosts"), (worker_hosts, "worker_hosts")):
            if value is None:
                raise ConfigError(f"--{field} is missing; {hint}", field)
            if isinstance(value, (list, tuple)):
                value = ",".join(value)
            # Ignore empty items so that a trailing comma from a shell loop is harmless.
            lists.append([item for item in str(value).split(",") if item.strip()])
        cluster = _check_cluster(
            lists[0],
            lists[1],
            ("ps_hosts", "worker_hosts"),
            ("--ps_hosts", "--worker_hosts"),
        )
        if job_name is None or not str(job_name).strip():
            raise ConfigError(
                f"--job_name is missing; set --job_name=ps or --job_name=worker ({hint})",
                "job_name",
            )
        job = str(job_name).strip()
        if job not in JOBS:
            extra = " (worker 0 is the chief)" if job in ("chief", "master") else ""
            raise ConfigError(
                f"wrong job name {job!r}; use ps or worker{extra}", "job_name"
            )
        index = (
            0
            if task_index is None
            else _as_index(task_index, "task_index", "--task_index")
        )
        _check_index(cluster, job, index, "task_index", "task_index")
        return cls(cluster, job, index)

    @classmethod
    def from_tf_config(cls, text: str) -> TaskRef:
        """Read TF_CONFIG, including the TF2 shape with a separate chief.

        A ``chief`` (or its old name ``master``) becomes worker 0 and the cluster's
        workers move up by one, because in tfps worker 0 *is* the chief.
        """
        field = "TF_CONFIG"
        example = '{"cluster": {"ps": ["h:2222"], "worker": ["h:2223"]}, "task": {"type": "worker", "index": 0}}'
        try:
            config = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"is not valid JSON ({exc}); set it like {example}", field
            ) from None
        if not isinstance(config, dict):
            raise ConfigError(f"must be a JSON object like {example}", field)
        for key in ("cluster", "task"):
            if key not in config:
                raise ConfigError(f"has no {key!r} key; set it like {example}", field)
        cluster, task = config["cluster"], config["task"]
        if not isinstance(cluster, dict) or not isinstance(task, dict):
            raise ConfigError(
                f"'cluster' and 'task' must be JSON objects; set it like {example}",
                field,
            )

        lists: dict[str, list] = {}
        for name, entries in cluster.items():
            if name == "evaluator":
                continue  # not part of the training cluster (Kubeflow leaves it out too)
            if name not in (PS, WORKER, "chief", "master"):
                raise ConfigError(
                    f"cluster has a {name!r} job; tfps knows ps, worker and chief (worker 0 is the chief)",
                    field,
                )
            if not isinstance(entries, list):
                raise ConfigError(
                    f"cluster.{name} must be a list of host:port strings, not {entries!r}",
                    field,
                )
            lists[name] = entries
        if "chief" in lists and "master" in lists:
            raise ConfigError(
                "cluster has both 'chief' and 'master'; keep one of them", field
            )
        chief_key = (
            "chief" if "chief" in lists else "master" if "master" in lists else None
        )
        if chief_key and len(lists[chief_key]) != 1:
            raise ConfigError(
                f"cluster.{chief_key} has {len(lists[chief_key])} entries; a cluster has exactly one chief",
                field,
            )

        if "type" not in task:
            raise ConfigError(f"task has no 'type'; set it like {example}", field)
        job = task["type"]
        index = _as_index(task.get("index", 0), field, "task.index")
        if job == "evaluator":
            raise ConfigError(
                "task type 'evaluator' is not supported: tfps has no evaluator task; "
                "start only ps, worker and chief tasks",
                field,
            )
        if job not in (PS, WORKER, "chief", "master"):
            raise ConfigError(
                f"wrong task type {job!r}; use ps, worker or chief", field
            )
        present = chief_key is not None if job in ("chief", "master") else job in lists
        if not present:
            raise ConfigError(
                f"task type {job!r} is not in the cluster (it has {', '.join(sorted(lists))})",
                field,
            )

        chief = lists.get(chief_key, []) if chief_key else []
        workers = chief + lists.get(WORKER, [])
        if job in ("chief", "master"):
            if index != 0:
                raise ConfigError(
                    f"task.index {index} is out of range for 1 chief; use 0", field
                )
            job = WORKER
        elif job == WORKER:
            n = len(lists[WORKER])
            if not 0 <= index < n:
                raise ConfigError(
                    f"task.index {index} is out of range for {n} worker(s); use 0..{n - 1}",
                    field,
                )
            index += len(chief)
        worker_label = (
            f"cluster.{chief_key} + cluster.worker" if chief_key else "cluster.worker"
        )
        spec = _check_cluster(
            lists.get(PS, []), workers, (field, field), ("cluster.ps", worker_label)
        )
        _check_index(spec, job, index, field, "task.index")
        return cls(spec, job, index)

    @classmethod
    def resolve(
        cls,
        ps_hosts: str | None = None,
        worker_hosts: str | None = None,
        job_name: str | None = None,
        task_index: int | str | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> TaskRef:
        """The role of this process: classic flags if any is given, else TF_CONFIG.

        When both are present they must describe the same task; a launcher that sets
        one and a stale shell that exports the other would otherwise start a task in
        the wrong cluster, which hangs instead of failing.
        """
        tf_config = environ.get("TF_CONFIG", "")
        has_env = bool(tf_config and tf_config.strip())
        if all(v is None for v in (ps_hosts, worker_hosts, job_name, task_index)):
            if has_env:
                return cls.from_tf_config(tf_config)
            raise ConfigError(
                "no cluster given; pass --ps_hosts, --worker_hosts, --job_name and --task_index, "
                "or set TF_CONFIG (see `tfps plan`)",
                "cluster",
            )
        ref = cls.from_flags(ps_hosts, worker_hosts, job_name, task_index)
        if has_env:
            try:
                env_ref = cls.from_tf_config(tf_config)
            except ConfigError as exc:
                raise ConfigError(
                    f"is set next to the classic flags but is invalid ({exc}); unset it or fix it",
                    "TF_CONFIG",
                ) from None
            if env_ref != ref:
                raise ConfigError(
                    "classic flags and TF_CONFIG disagree: flags say "
                    f"{ref.name} in {ref.cluster.as_dict()}, TF_CONFIG says "
                    f"{env_ref.name} in {env_ref.cluster.as_dict()}; unset TF_CONFIG or drop the flags",
                    "TF_CONFIG",
                )
        return ref


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

    def tasks_on(self, host: str) -> tuple[Task, ...]:
        """The tasks an inventory host runs (what Ansible starts there)."""
        return tuple(t for t in self.tasks if t.host == host)

    def task_ref(self, task: Task) -> TaskRef:
        return TaskRef(self.cluster, task.job, task.index)

    def to_json(self) -> dict:
        """Plain data for `tfps plan --json` and the playbook (no task numbering in Jinja)."""
        tasks = []
        for task in self.tasks:
            ref = self.task_ref(task)
            tasks.append(
                {
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
            )
        return {
            "cluster": self.cluster.as_dict(),
            "chief": self.chief.name,
            "tasks": tasks,
        }

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


# --------------------------------------------------------------------------- inventory


class _Vaulted:
    """A ``!vault`` value: a secret tfps cannot (and must not) read."""

    def __repr__(self) -> str:
        return "<vault-encrypted>"


class _InventoryLoader(yaml.SafeLoader):
    """SafeLoader that understands Ansible's ``!vault`` and ``!unsafe`` tags."""


def _construct_vault(loader: yaml.SafeLoader, node: yaml.Node) -> _Vaulted:
    return _Vaulted()


def _construct_unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)


_InventoryLoader.add_constructor("!vault", _construct_vault)
_InventoryLoader.add_constructor("!unsafe", _construct_unsafe)

_GROUP_KEYS = ("hosts", "vars", "children")


@dataclass
class _Group:
    name: str
    vars: dict
    hosts: list  # direct hosts, in inventory order
    children: list  # child group names, in inventory order
    parents: set
    priority: int = 1


class _Inventory:
    """An Ansible YAML inventory with Ansible's group tree and host ordering."""

    def __init__(self, data: Any):
        self.groups: dict[str, _Group] = {}
        self.host_vars: dict[str, dict] = (
            {}
        )  # inline host vars, merged over all entries
        if data is None:
            raise ConfigError(
                "the inventory is empty; define all: {children: {ps: ..., worker: ...}}",
                "inventory",
            )
        if not isinstance(data, dict):
            raise ConfigError(
                f"the inventory must be a YAML mapping of groups (all: ...), not {type(data).__name__}",
                "inventory",
            )
        self._group("all")
        for name, body in data.items():
            self._parse_group(
                str(name), body, None if str(name) == "all" else "all", str(name)
            )
        for host in self.host_vars:
            if not any(host in g.hosts for n, g in self.groups.items() if n != "all"):
                self._group("ungrouped", "all").hosts.append(host)
        self.depth = self._depths()

    def _group(self, name: str, parent: str | None = None) -> _Group:
        group = self.groups.setdefault(name, _Group(name, {}, [], [], set()))
        if parent is not None and name not in self.groups[parent].children:
            if name in ("all", parent) or self._is_ancestor(name, parent):
                raise ConfigError(
                    f"group {name!r} is its own ancestor; remove the loop from children",
                    "children",
                )
            self.groups[parent].children.append(name)
            group.parents.add(parent)
        return group

    def _is_ancestor(self, candidate: str, group: str) -> bool:
        todo, seen = [group], set()
        while todo:
            g = todo.pop()
            if g == candidate:
                return True
            if g not in seen:
                seen.add(g)
                todo.extend(self.groups[g].parents)
        return False

    def _parse_group(self, name: str, body: Any, parent: str | None, path: str) -> None:
        group = self._group(name, parent)
        if body is None:
            return
        if not isinstance(body, dict):
            raise ConfigError(
                f"group {name!r} must be a mapping with hosts, vars or children", path
            )
        for key, value in body.items():
            if key not in _GROUP_KEYS:
                hint = difflib.get_close_matches(str(key), _GROUP_KEYS, n=1)
                raise ConfigError(
                    f"group {name!r} has key {key!r}; a group holds only hosts, vars and children"
                    + (f" (did you mean {hint[0]!r}?)" if hint else ""),
                    f"{path}.{key}",
                )
            if value is None:
                continue
            if not isinstance(value, dict):
                example = (
                    "{name: {ansible_host: 10.0.0.1}}"
                    if key == "hosts"
                    else "{name: ...}"
                )
                raise ConfigError(
                    f"group {name!r}: {key} must be a mapping like {example}, not {type(value).__name__}",
                    f"{path}.{key}",
                )
            if key == "vars":
                group.vars.update(value)
                if "ansible_group_priority" in value:
                    group.priority = _as_index(
                        value["ansible_group_priority"],
                        f"{path}.vars",
                        "ansible_group_priority",
                    )
            elif key == "hosts":
                for pattern, host_vars in value.items():
                    if host_vars is not None and not isinstance(host_vars, dict):
                        raise ConfigError(
                            f"host {pattern!r} must map to its variables (or nothing), not {host_vars!r}",
                            f"{path}.hosts",
                        )
                    for host in _expand_host_pattern(str(pattern), f"{path}.hosts"):
                        if host not in group.hosts:
                            group.hosts.append(host)
                        self.host_vars.setdefault(host, {}).update(host_vars or {})
            else:
                for child, child_body in value.items():
                    self._parse_group(
                        str(child), child_body, name, f"{path}.children.{child}"
                    )

    def _depths(self) -> dict[str, int]:
        """Longest distance from ``all``, as Ansible computes it for var precedence."""
        depth = {"all": 0}
        order = ["all"]
        for name in order:  # the graph is acyclic, so relaxing in BFS order terminates
            for child in self.groups[name].children:
                if depth.get(child, -1) < depth[name] + 1:
                    depth[child] = depth[name] + 1
                    order.append(child)
        return depth

    def group_hosts(self, name: str) -> list[str]:
        """Hosts of a group and its descendants: own hosts first, then level by level."""
        hosts: list[str] = []
        level, seen = [name], set()
        while level:
            following = []
            for g in level:
                if g in seen:
                    continue
                seen.add(g)
                hosts.extend(h for h in self.groups[g].hosts if h not in hosts)
                following.extend(self.groups[g].children)
            level = following
        return hosts

    def host_groups(self, host: str) -> list[str]:
        """A host's groups and their ancestors except ``all``, in Ansible's merge order."""
        found: set[str] = set()
        todo = [n for n, g in self.groups.items() if host in g.hosts]
        while todo:
            g = todo.pop()
            if g not in found:
                found.add(g)
                todo.extend(self.groups[g].parents)
        found.discard("all")
        return sorted(
            found, key=lambda n: (self.depth.get(n, 0), self.groups[n].priority, n)
        )

    def merged_vars(
        self, host: str, host_vars: Mapping[str, dict], group_vars: Mapping[str, dict]
    ) -> dict:
        """Variables of one host with Ansible's default precedence (lowest first):
        inline vars of all, inline vars of the host's groups, group_vars/all,
        group_vars/<group>, inline host vars, host_vars/<host>. Note that a
        group_vars/all file beats inline group vars, exactly as in Ansible.
        """
        groups = self.host_groups(host)
        merged: dict = {}
        merged.update(self.groups["all"].vars)
        for g in groups:
            merged.update(self.groups[g].vars)
        merged.update(group_vars.get("all") or {})
        for g in groups:
            merged.update(group_vars.get(g) or {})
        merged.update(self.host_vars.get(host, {}))
        merged.update(host_vars.get(host) or {})
        return merged


def _expand_host_pattern(pattern: str, field: str) -> list[str]:
    """Ansible host patterns: drop a ``:port`` suffix, expand ``node[01:03]`` ranges."""
    pattern = pattern.strip()
    m = re.fullmatch(r"(.+):(\d+)", pattern)
    if m and (":" not in m.group(1) or m.group(1).endswith("]")):
        pattern = m.group(1)
    if pattern.startswith("[") and pattern.endswith("]"):
        inner = pattern[1:-1]
        if "::" in inner or inner.count(":") >= 7:  # a bracketed IPv6 address
            return [inner]
    if not re.search(r"\[[^\]]*:[^\]]*\]", pattern):
        return [pattern]
    head, _, rest = pattern.partition("[")
    bounds, _, tail = rest.partition("]")
    parts = bounds.split(":")
    bad = f"host range {pattern!r} must be [begin:end] or [begin:end:step], e.g. node[01:03]"
    if len(parts) not in (2, 3) or not parts[1]:
        raise ConfigError(bad, field)
    beg, end = parts[0] or "0", parts[1]
    try:
        step = int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise ConfigError(bad, field) from None
    if beg in string.ascii_letters and end in string.ascii_letters:
        i, j = string.ascii_letters.index(beg), string.ascii_letters.index(end)
        if i > j:
            raise ConfigError(f"host range {pattern!r} must have begin <= end", field)
        values = list(string.ascii_letters[i : j + 1 : step])
    else:
        if not (beg.isdigit() and end.isdigit()) or step < 1:
            raise ConfigError(bad, field)
        width = len(beg) if beg.startswith("0") and len(beg) > 1 else 0
        if width and len(end) != width:
            raise ConfigError(
                f"host range {pattern!r} must have equal-length begin and end, e.g. [01:10]",
                field,
            )
        values = [str(v).zfill(width) for v in range(int(beg), int(end) + 1, step)]
    hosts = []
    for value in values:
        hosts.extend(_expand_host_pattern(f"{head}{value}{tail}", field))
    return hosts


def _check_var_names(variables: Mapping, where: str) -> None:
    """Reject unknown ``tfps_*`` names, suggesting the closest known one."""
    for key in variables:
        if isinstance(key, str) and key.startswith("tfps_") and key not in KNOWN_VARS:
            hint = difflib.get_close_matches(key, KNOWN_VARS, n=1, cutoff=0.6)
            suggestion = (
                f"did you mean {hint[0]!r}?"
                if hint
                else "see the variables listed in the README"
            )
            raise ConfigError(f"unknown variable in {where}; {suggestion}", key)


def _int_var(
    variables: Mapping, name: str, host: str, default: int, minimum: int
) -> int:
    value = variables.get(name, default)
    if isinstance(value, _Vaulted):
        raise ConfigError(
            f"host {host!r}: is vault-encrypted; cluster layout is not secret, write it in plain text",
            name,
        )
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
    if isinstance(value, _Vaulted):
        raise ConfigError(
            f"host {host!r}: is vault-encrypted; write the GPU ids in plain text",
            "tfps_gpus",
        )
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
    value = variables.get("ansible_host", host)
    if (
        isinstance(value, _Vaulted)
        or not isinstance(value, (str, int))
        or not str(value).strip()
    ):
        raise ConfigError(
            f"host {host!r} has ansible_host {value!r}; set the address peers connect to",
            "ansible_host",
        )
    value = str(value).strip()
    if "{{" in value or "{%" in value:
        raise ConfigError(
            f"host {host!r} has a Jinja template as ansible_host ({value}); tfps plans without Jinja, "
            "so write the address itself",
            "ansible_host",
        )
    return value


def _missing_group(inv: _Inventory, job: str) -> ConfigError:
    others = [n for n in inv.groups if n not in ("all", "ungrouped", PS, WORKER)]
    hint = difflib.get_close_matches(job, others, n=1, cutoff=0.5)
    suffix = (
        f"; the inventory has a group {hint[0]!r}: rename it to {job!r}" if hint else ""
    )
    kind = "parameter servers" if job == PS else "workers"
    if job not in inv.groups:
        what = f"the inventory has no {job!r} group"
    else:
        what = f"the {job!r} group has no hosts"
    return ConfigError(
        f"{what}; add the host(s) that run {kind} under all.children.{job}.hosts{suffix}",
        job,
    )


def plan_from_inventory(
    inventory: dict,
    host_vars: dict[str, dict] | None = None,
    group_vars: dict[str, dict] | None = None,
) -> Plan:
    """Compute the plan from a parsed Ansible YAML inventory.

    ``host_vars`` and ``group_vars`` are the contents of the host_vars/ and
    group_vars/ files by host and group name; they rank above the inventory's
    inline variables of the same kind, as in Ansible.
    """
    host_vars = dict(host_vars or {})
    group_vars = dict(group_vars or {})
    inv = _Inventory(inventory)

    for name, group in inv.groups.items():
        _check_var_names(group.vars, f"the vars of group {name!r}")
    for host, variables in inv.host_vars.items():
        _check_var_names(variables, f"host {host!r}")
    for kind, files, known in (
        ("group_vars", group_vars, inv.groups),
        ("host_vars", host_vars, inv.host_vars),
    ):
        for name, variables in files.items():
            if variables is None:
                continue
            if not isinstance(variables, Mapping):
                raise ConfigError(
                    f"must hold a mapping of variables, not {type(variables).__name__}",
                    f"{kind}/{name}",
                )
            _check_var_names(variables, f"{kind}/{name}")
            tfps_keys = [
                k for k in variables if isinstance(k, str) and k.startswith("tfps_")
            ]
            if name not in known and name not in ("all", "ungrouped") and tfps_keys:
                hint = difflib.get_close_matches(name, list(known), n=1)
                raise ConfigError(
                    f"sets {', '.join(tfps_keys)} for {name!r}, which is not in the inventory, so Ansible "
                    "would ignore it"
                    + (f"; did you mean {hint[0]!r}?" if hint else "; rename the file"),
                    f"{kind}/{name}",
                )

    ps_hosts = inv.group_hosts(PS) if PS in inv.groups else []
    worker_hosts = inv.group_hosts(WORKER) if WORKER in inv.groups else []
    if not ps_hosts:
        raise _missing_group(inv, PS)
    if not worker_hosts:
        raise _missing_group(inv, WORKER)
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
            variables = inv.merged_vars(host, host_vars, group_vars)
            address = _address(variables, host)
            base = _int_var(variables, "tfps_base_port", host, DEFAULT_BASE_PORT, 1)
            _check_port(base, "tfps_base_port", f"host {host!r} (tfps_base_port)")
            if job == PS:
                slots: list[str | None] = [None] * _int_var(
                    variables, "tfps_ps_tasks", host, 1, 1
                )
            else:
                slots = list(_worker_slots(variables, host))
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


# --------------------------------------------------------------------------- files


_VAULT_HEADER = "$ANSIBLE_VAULT"
_VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            "no such file; pass an inventory file (hosts.yml) or a directory holding one",
            str(path),
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot be read ({exc}); check the path and its permissions", str(path)
        ) from None
    if text.lstrip().startswith(_VAULT_HEADER):
        return _Vaulted()
    try:
        return yaml.load(
            text, Loader=_InventoryLoader
        )  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"YAML syntax error{where}: {problem}; fix the file", str(path)
        ) from None


def _vars_files(path: Path) -> list[Path]:
    """The files Ansible reads for one group_vars/host_vars entry, in its order.

    Like Ansible, the first of ``name``, ``name.yml``, ``name.yaml``, ``name.json``
    that exists wins; a directory is read file by file, sorted, recursively.
    """
    for ext in _VARS_EXTENSIONS:
        candidate = path.with_name(path.name + ext)
        if candidate.is_dir():
            return _dir_files(candidate)
        if candidate.is_file():
            return [candidate]
    return []


def _dir_files(directory: Path) -> list[Path]:
    found = []
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir() and not entry.suffix:
            found.extend(_dir_files(entry))
        elif entry.is_file() and entry.suffix in _VARS_EXTENSIONS:
            found.append(entry)
    return found


def _load_vars_dir(directory: Path, base: Path) -> dict[str, dict]:
    """Read group_vars/ or host_vars/: entity name -> merged variables."""
    if not directory.is_dir():
        return {}
    names: dict[str, None] = {}
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if not entry.is_dir() and entry.suffix not in _VARS_EXTENSIONS:
            continue  # README.md and the like: Ansible reads no vars from them
        name = entry.name
        for ext in _VARS_EXTENSIONS[1:]:
            if entry.is_file() and name.endswith(ext):
                name = name[: -len(ext)]
        names.setdefault(name, None)
    result: dict[str, dict] = {}
    for name in names:
        if (directory / name).is_dir() and any(
            (directory / f"{name}{ext}").is_file() for ext in _VARS_EXTENSIONS[1:]
        ):
            raise ConfigError(
                f"both {name}/ and a {name}.yml file exist; Ansible reads only the directory and ignores the "
                f"file, so move the file into the directory (e.g. {name}/vars.yml)",
                str((directory / name).relative_to(base)),
            )
        merged: dict = {}
        for file in _vars_files(directory / name):
            data = _read_yaml(file)
            where = str(file.relative_to(base))
            if isinstance(data, _Vaulted) or data is None:
                continue  # vault files hold secrets (notification URLs), never cluster layout
            if not isinstance(data, dict):
                raise ConfigError(
                    f"must hold a mapping of variables, not {type(data).__name__}",
                    where,
                )
            _check_var_names(data, where)
            merged.update(data)
        result[name] = merged
    return result


def load_plan(path: str | os.PathLike) -> Plan:
    """Plan from an inventory file, or a directory holding hosts.yml (or hosts.yaml).

    group_vars/ and host_vars/ next to the inventory file are read as Ansible reads
    them, also when the path names the file itself. Vault-encrypted files are skipped:
    they hold secrets such as notification URLs, never the cluster layout.
    """
    given = Path(path)
    if given.is_dir():
        candidates = [given / "hosts.yml", given / "hosts.yaml"]
        file = next((c for c in candidates if c.is_file()), None)
        if file is None:
            others = [
                p.name for p in (given / "hosts", given / "hosts.ini") if p.is_file()
            ]
            hint = (
                f" ({others[0]} looks like an INI inventory: convert it with "
                f"`ansible-inventory -i {given / others[0]} --list --yaml > {given / 'hosts.yml'}`)"
                if others
                else ""
            )
            raise ConfigError(
                f"holds no hosts.yml or hosts.yaml; put the YAML inventory there{hint}",
                str(given),
            )
        base = given
    elif given.exists():
        file, base = given, given.parent
    else:
        raise ConfigError(
            "no such file or directory; pass an inventory file (hosts.yml) or a directory holding one",
            str(given),
        )
    data = _read_yaml(file)
    if isinstance(data, _Vaulted):
        raise ConfigError(
            "is vault-encrypted; keep the cluster layout in plain text and only secrets in vault files",
            str(file),
        )
    group_vars = _load_vars_dir(base / "group_vars", base)
    host_vars = _load_vars_dir(base / "host_vars", base)
    try:
        return plan_from_inventory(data, host_vars=host_vars, group_vars=group_vars)
    except ConfigError as exc:
        message = str(exc)
        if exc.field and message.startswith(f"{exc.field}: "):
            message = message[len(exc.field) + 2 :]
        raise ConfigError(f"{message} (inventory {file})", exc.field) from None


# --------------------------------------------------------------------------- one machine


def free_ports(n: int, address: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports that are free right now.

    All sockets stay bound until every port is picked, so the kernel cannot hand out
    the same port twice. Another program may still take a port before the task binds
    it; callers that start servers should expect "address in use" and retry.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            try:
                sock.bind((address.strip("[]"), 0))
            except OSError as exc:
                raise ConfigError(
                    f"cannot bind to {address} ({exc}); use an address of this machine",
                    "address",
                ) from None
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def local_plan(
    num_ps: int,
    num_workers: int,
    ports: list[int] | None = None,
    address: str = "127.0.0.1",
) -> Plan:
    """Every task on this machine (``tfps local``): ps tasks first, then workers."""
    for value, field in ((num_ps, "num_ps"), (num_workers, "num_workers")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"is {value!r}; use a positive whole number", field)
    total = num_ps + num_workers
    if ports is None:
        ports = free_ports(total, address)
    else:
        ports = list(ports)
        if len(ports) != total:
            raise ConfigError(
                f"has {len(ports)} port(s) for {total} task(s); give one port per task",
                "ports",
            )
        for port in ports:
            if (
                isinstance(port, bool)
                or not isinstance(port, int)
                or not 1 <= port <= 65535
            ):
                raise ConfigError(f"has {port!r}; use ports in 1..65535", "ports")
        if len(set(ports)) != total:
            raise ConfigError(
                f"lists a port twice ({ports}); give every task its own port", "ports"
            )
    tasks = [Task("localhost", address, PS, i, ports[i]) for i in range(num_ps)]
    tasks += [
        Task("localhost", address, WORKER, i, ports[num_ps + i])
        for i in range(num_workers)
    ]
    return Plan.from_tasks(tasks)
