"""The health file: which port this task serves, for ``tfps healthcheck`` (containers' HEALTHCHECK)."""

from __future__ import annotations

import json
import logging
import os
import tempfile

from tfps import timeouts
from tfps.exitcodes import ExitCode

log = logging.getLogger("tfps")


def health_file() -> str:
    return os.environ.get("TFPS_HEALTH_FILE") or os.path.join(tempfile.gettempdir(), "tfps-task.json")


def write_health(task) -> None:
    """Tell ``tfps healthcheck`` which port this task serves (containers' HEALTHCHECK)."""
    try:
        with open(health_file(), "w") as fh:
            json.dump({"pid": os.getpid(), "port": task.port, "name": task.name}, fh)
    except OSError as e:
        log.debug("cannot write health file: %s", e)


def healthcheck() -> ExitCode:
    """0 if this container's task process is alive and its gRPC port accepts connections."""
    import socket
    try:
        with open(health_file()) as fh:
            info = json.load(fh)
        os.kill(int(info["pid"]), 0)
        with socket.create_connection(("127.0.0.1", int(info["port"])), timeout=timeouts.HEALTHCHECK_CONNECT_SECS):
            pass
    except (OSError, ValueError, KeyError) as e:
        print(f"unhealthy: {e}")
        return ExitCode.TRAINING_FAILED
    print(f"healthy: {info['name']} serves port {info['port']}")
    return ExitCode.OK
