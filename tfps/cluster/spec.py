"""Where each task of a cluster listens, and which task this process is.

:class:`ClusterSpec` is the cluster as TensorFlow wants it (``ps`` and ``worker``
address lists; worker 0 is the chief). :class:`TaskRef` is one process's place in it,
read from the classic flags (``--ps_hosts --worker_hosts --job_name --task_index``) or
from ``TF_CONFIG``: two spellings of the same thing, and both can be written back.
``split_target``/``join_target`` are the one parser and printer of ``host:port``
(IPv6 literals in brackets, as gRPC wants them).

Pure Python: never imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfps.errors import ConfigError

PS = "ps"
WORKER = "worker"
JOBS = (PS, WORKER)

# --------------------------------------------------------------------------- addresses


def task_name(job: str, index: int) -> str:
    """``worker0``, ``ps1``: a task's one name, in logs (``tfps local``'s prefixes), files,
    results, container names (tfps.cluster.plan.container_name) and compose services."""
    return f"{job}{index}"


def join_target(address: str, port: int) -> str:
    """``address:port``; IPv6 literals get brackets, as gRPC expects."""
    if ":" in address and not address.startswith("["):
        return f"[{address}]:{port}"
    return f"{address}:{port}"


def split_target(text: Any, field: str = "address", what: str = "address") -> tuple[str, int]:
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
            host, port = split_target(entry, field, f"{label} entry {i}")
            key = (host.lower(), port)
            if key in seen:
                raise ConfigError(
                    f"{entry.strip()} is listed twice ({seen[key]} and {task_name(job, i)}); "
                    "every task needs its own host:port",
                    field,
                )
            seen[key] = task_name(job, i)
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

    def neighbours(self) -> tuple[int, int]:
        """(ps tasks, worker tasks) listening on this task's host, this task included."""
        host = split_target(self.target)[0]
        return tuple(sum(split_target(t)[0] == host for t in self.cluster.job(job)) for job in JOBS)

    @property
    def port(self) -> int:
        return int(self.target.rpartition(":")[2])

    @property
    def name(self) -> str:
        return task_name(self.job, self.index)

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


