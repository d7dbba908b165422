"""Every task of a job on this machine (``tfps local``, ``tfps compose``, tests).

The tasks get free ports on one address; the plan is the same kind of :class:`Plan` an
inventory gives, so everything downstream treats both alike.
"""

from __future__ import annotations

import socket

from tfps.cluster.plan import Plan, Task
from tfps.cluster.spec import PS, WORKER
from tfps.errors import ConfigError


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
    gpus: list[str] | None = None,
) -> Plan:
    """Every task on this machine (``tfps local``): ps tasks first, then workers.

    With ``gpus``, worker ``i`` gets GPU ``gpus[i]`` (one per worker); the ps tasks get none.
    """
    for value, field in ((num_ps, "num_ps"), (num_workers, "num_workers")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"is {value!r}; use a positive whole number", field)
    if gpus is not None and len(gpus) != num_workers:
        raise ValueError(f"{len(gpus)} GPU id(s) for {num_workers} worker(s); give one per worker")
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
        Task("localhost", address, WORKER, i, ports[num_ps + i], gpus[i] if gpus is not None else None)
        for i in range(num_workers)
    ]
    return Plan.from_tasks(tasks)
