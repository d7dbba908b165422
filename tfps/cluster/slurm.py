"""The cluster of a Slurm step, from Slurm's own variables (pure Python, no TensorFlow).

One ``srun`` step runs every task of a tfps job (``tfps slurm`` writes it). Each task
learns from the variables Slurm gives it:

    SLURM_PROCID                its rank: ranks 0..N-1 are the ps tasks, N.. the workers
                                (rank N is worker 0, the chief)
    SLURM_STEP_NODELIST         the step's nodes, in Slurm's hostlist syntax (node[1-3,5])
    SLURM_STEP_TASKS_PER_NODE   how many tasks on each of them (2(x3),1)
    SLURM_LOCALID               its slot on its node (which of the node's GPUs a worker takes)

Ranks sit on the nodes in order, a node's tasks contiguous (``srun --distribution=block``,
which the script asks for), as SlurmClusterResolver reads them too. Unlike it, no port is
fixed and nothing asks ``nvidia-smi``: each task picks a free port of its own node when it
starts and publishes ``host:port`` in a rendezvous directory on the shared filesystem;
every task waits for all of them (bounded by ``--startup_timeout``) and builds the same
:class:`ClusterSpec` from them. Two jobs on one node therefore never collide.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tfps.cluster.single_host import free_ports
from tfps.cluster.spec import PS, WORKER, ClusterSpec, join_target, task_name
from tfps.errors import ConfigError
from tfps.jsonfile import write_json_atomic

#: How often a task looks for the others' addresses in the rendezvous directory.
RENDEZVOUS_POLL_SECS = 0.2


# --------------------------------------------------------------------------- Slurm's syntaxes

def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist syntax expanded, in order: ``node[1-3,5],gpu-a[01-02]`` ->
    ``node1 node2 node3 node5 gpu-a01 gpu-a02``.

    As ``scontrol show hostnames`` does it: commas outside brackets separate names, a
    bracket holds numbers and ranges (``01-10`` keeps the zero padding of its first
    number), several brackets in one name multiply (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1
    r2n2), text after a bracket is kept (``a[01-10]b``).
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"node list {text!r} is empty; expected Slurm's hostlist syntax such as node[1-3]",
                          "SLURM_STEP_NODELIST")
    names: list[str] = []
    for item in _split_top(text.strip(), text):
        names.extend(_expand_one(item, text))
    return names


def _split_top(text: str, whole: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise _bad_hostlist(whole, "a bracket inside a bracket")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise _bad_hostlist(whole, "a ']' without its '['")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise _bad_hostlist(whole, "a '[' without its ']'")
    items.append(text[start:])
    if any(not item.strip() for item in items):
        raise _bad_hostlist(whole, "an empty name between commas")
    return [item.strip() for item in items]


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", item)
    if not m:
        return [item]
    prefix, body, rest = m.groups()
    numbers: list[str] = []
    for part in body.split(","):
        part = part.strip()
        r = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not r:
            raise _bad_hostlist(whole, f"{part!r} in brackets is neither a number nor a range such as 01-10")
        lo, hi = r.group(1), r.group(2) or r.group(1)
        if int(hi) < int(lo):
            raise _bad_hostlist(whole, f"the range {part!r} runs backwards")
        width = len(lo)
        numbers.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    tails = _expand_one(rest, whole) if rest else [""]
    return [f"{prefix}{n}{tail}" for n in numbers for tail in tails]


def _bad_hostlist(whole: str, why: str) -> ConfigError:
    return ConfigError(f"node list {whole!r} has {why}; expected Slurm's hostlist syntax such as "
                       "node[1-3,5],gpu[01-02]", "SLURM_STEP_NODELIST")


def expand_tasks_per_node(text: str) -> list[int]:
    """``SLURM_STEP_TASKS_PER_NODE`` expanded: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in (text or "").split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise ConfigError(f"tasks per node {text!r} is not Slurm's syntax such as 2(x3),1",
                              "SLURM_STEP_TASKS_PER_NODE")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


# --------------------------------------------------------------------------- roles

@dataclass(frozen=True)
class SlurmTask:
    """One task of the step: its rank, role, node and slot on the node."""

    rank: int
    job: str          #: "ps" or "worker"
    index: int        #: index in its job; worker 0 is the chief
    host: str         #: the node it runs on
    local_id: int     #: its slot among the step's tasks on that node

    @property
    def name(self) -> str:
        return task_name(self.job, self.index)


def role_of(rank: int, num_ps: int) -> tuple[str, int]:
    """Ranks 0..num_ps-1 are the ps tasks, the rest the workers in order."""
    return (PS, rank) if rank < num_ps else (WORKER, rank - num_ps)


def step_layout(nodelist: str, tasks_per_node: str, num_ps: int, num_workers: int) -> list[SlurmTask]:
    """Every task of the step by rank, on the nodes in order, contiguous per node (block)."""
    hosts = expand_hostlist(nodelist)
    counts = expand_tasks_per_node(tasks_per_node)
    if len(counts) != len(hosts):
        raise ConfigError(f"{len(hosts)} node(s) in {nodelist!r} but tasks per node {tasks_per_node!r} names "
                          f"{len(counts)}; run the step as tfps slurm's script does", "SLURM_STEP_TASKS_PER_NODE")
    total = sum(counts)
    if total != num_ps + num_workers:
        raise ConfigError(f"the step has {total} task(s) but the job needs {num_ps} ps + {num_workers} worker(s) "
                          f"= {num_ps + num_workers}; give srun --ntasks={num_ps + num_workers}", "ntasks")
    tasks: list[SlurmTask] = []
    for host, count in zip(hosts, counts):
        for local in range(count):
            job, index = role_of(len(tasks), num_ps)
            tasks.append(SlurmTask(len(tasks), job, index, host, local))
    return tasks


@dataclass(frozen=True)
class SlurmStep:
    """What this process reads from Slurm's environment."""

    job_id: str
    step_id: str
    restart: int
    rank: int
    layout: tuple[SlurmTask, ...]

    @property
    def me(self) -> SlurmTask:
        return self.layout[self.rank]


def _need(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise ConfigError(f"{name} is not set: run this under srun, as the script of tfps slurm does", name)
    return value


def from_environment(env: Mapping[str, str], num_ps: int, num_workers: int) -> SlurmStep:
    """This task's step from Slurm's variables (``os.environ`` under ``srun``)."""
    rank_text = _need(env, "SLURM_PROCID")
    if not rank_text.isdigit():
        raise ConfigError(f"SLURM_PROCID is {rank_text!r}, not a rank", "SLURM_PROCID")
    nodelist = env.get("SLURM_STEP_NODELIST") or _need(env, "SLURM_JOB_NODELIST")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or _need(env, "SLURM_TASKS_PER_NODE")
    layout = step_layout(nodelist, per_node, num_ps, num_workers)
    rank = int(rank_text)
    if rank >= len(layout):
        raise ConfigError(f"SLURM_PROCID {rank} is beyond the step's {len(layout)} task(s)", "SLURM_PROCID")
    restart = env.get("SLURM_RESTART_COUNT", "0")
    return SlurmStep(job_id=_need(env, "SLURM_JOB_ID"), step_id=env.get("SLURM_STEP_ID", "0"),
                     restart=int(restart) if restart.isdigit() else 0, rank=rank, layout=tuple(layout))


# --------------------------------------------------------------------------- GPUs

def worker_gpu_env(task: SlurmTask, gpus_per_worker: int, env: Mapping[str, str]) -> dict[str, str]:
    """The CUDA environment of a task on a node whose GPUs Slurm gave the step.

    A ps sees no GPU (it serves variables on the CPU). A worker takes ``gpus_per_worker``
    of the GPUs Slurm lists for the step on its node (``CUDA_VISIBLE_DEVICES``, else
    ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``), by its slot on the node: slot 0 the first G,
    slot 1 the next G, ... (the script asks for G GPUs per task slot, so there are enough).
    """
    if gpus_per_worker <= 0:
        return {}
    if task.job == PS:
        return {"CUDA_VISIBLE_DEVICES": "-1"}
    listed = next((env[k] for k in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
                   if env.get(k)), "")
    ids = [g.strip() for g in listed.split(",") if g.strip()]
    mine = ids[task.local_id * gpus_per_worker:(task.local_id + 1) * gpus_per_worker]
    if len(mine) < gpus_per_worker:
        raise ConfigError(f"{task.name} on {task.host} (slot {task.local_id}) needs {gpus_per_worker} GPU(s) but "
                          f"Slurm gave this node's step {listed or 'none'}; ask for --gres=gpu:N with N = "
                          "GPUs per worker x tasks per node", "gpus_per_worker")
    return {"CUDA_VISIBLE_DEVICES": ",".join(mine), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


# --------------------------------------------------------------------------- rendezvous

def rendezvous_dir(model_dir: str, job_id: str, restart: int) -> str:
    """Where one run of a job's step exchanges addresses: per job id and requeue."""
    return os.path.join(model_dir, ".slurm", f"{job_id}-{restart}")


def pick_port() -> int:
    """A port free on every address of this node right now (the task's server binds it next)."""
    return free_ports(1, "0.0.0.0")[0]


def publish(directory: str, task: SlurmTask, port: int, address: str | None = None) -> None:
    """Write this task's ``host:port`` where the others look (atomically: never half a file);
    ``address`` (its --bind-interface's) instead of the node's name when given."""
    write_json_atomic(os.path.join(directory, f"rank{task.rank}.json"),
                      {"rank": task.rank, "task": task.name, "host": address or task.host, "port": port})


#: Linux's ioctl that reads an interface's IPv4 address, and the longest interface name.
_SIOCGIFADDR, _IFNAMSIZ = 0x8915, 16


def interface_address(name: str, host: str = "this node") -> str:
    """The IPv4 address of network interface ``name`` on this node (``tfps slurm --bind_interface``)."""
    import fcntl
    import socket
    import struct
    if not re.fullmatch(r"[\w.:@-]{1,15}", name or ""):
        raise ConfigError(f"{name!r} is not a network interface name; give one such as eth0 or ib0 (ip -br addr "
                          "lists them)", "bind_interface")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
        except OSError as e:
            raise ConfigError(f"{host} has no IPv4 address on interface {name} ({e.strerror or e}); give "
                              "--bind-interface an interface that every node of the job has (ip -br addr lists "
                              "them)", "bind_interface") from None
    return socket.inet_ntoa(packed[20:24])


def gather(directory: str, layout: tuple[SlurmTask, ...] | list[SlurmTask], timeout: float,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> ClusterSpec:
    """Wait (at most ``timeout`` s) until every task has published its address; the cluster."""
    deadline = clock() + timeout
    found: dict[int, str] = {}
    while True:
        for t in layout:
            if t.rank in found:
                continue
            path = os.path.join(directory, f"rank{t.rank}.json")
            try:
                with open(path) as fh:
                    data = json.load(fh)
            except (OSError, ValueError):
                continue
            found[t.rank] = join_target(str(data["host"]), int(data["port"]))
        if len(found) == len(layout):
            break
        if clock() >= deadline:
            missing = [f"{t.name} (rank {t.rank} on {t.host})" for t in layout if t.rank not in found]
            raise ConfigError(f"after {timeout:.0f} s, {', '.join(missing)} had not published an address in "
                              f"{directory}; is that directory on a filesystem every node shares?",
                              "startup_timeout")
        sleep(RENDEZVOUS_POLL_SECS)
    ps = [found[t.rank] for t in layout if t.job == PS]
    worker = [found[t.rank] for t in sorted((t for t in layout if t.job == WORKER), key=lambda t: t.index)]
    return ClusterSpec(ps, worker)
