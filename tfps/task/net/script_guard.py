"""Run a classic script (``tfps local --script``) with its TensorFlow server kept on loopback.

A classic script starts its own ``tf.distribute.Server``, which listens on every interface
(``tfps.task.net.loopback``); tfps local gives it ``--ps_hosts=127.0.0.1:PORT,...``, so without
help its port would run any graph sent from the LAN. The launcher therefore runs each task as

    python -m tfps.task.net.script_guard SCRIPT --ps_hosts=... --worker_hosts=... --job_name=... --task_index=... ARGS

which, when the task's own address is loopback:

1. patches TensorFlow's ``bind`` as soon as the script imports ``tensorflow`` (an import
   hook: the script's own settings made before its import, such as ``TF_CPP_MIN_LOG_LEVEL``
   or ``CUDA_VISIBLE_DEVICES``, still apply), and refuses to go on if it cannot;
2. checks the kernel's table of the process's sockets (``tfps.task.net.listening``) right after
   a ``tf.distribute.Server`` starts, and from a background thread until the task's port
   appears (a server started another way, e.g. by a distribution strategy); a port
   listening anywhere but on loopback ends the process at once with one line and exit
   code 2 (``BAD_CONFIG``, as ``tfps run`` refuses the same case);
3. runs SCRIPT as ``__main__`` with ``runpy``: ``sys.argv`` and ``sys.path[0]`` as
   ``python SCRIPT ARGS`` would have them.

A task whose address is not loopback runs its script unguarded: on real hosts the firewall
limits who reaches the port (docs/security.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
import threading
import time
from typing import NoReturn

from tfps.cluster import TaskRef
from tfps.cluster.spec import split_target
from tfps.errors import ConfigError, real_os_exit
from tfps.exitcodes import ExitCode
from tfps.task.net.listening import open_addresses, require_loopback_only
from tfps.task.net.loopback import bind_address, ensure_loopback_bind, is_loopback_host

#: How often the background check looks for the task's port: often while a script starts
#: its server (its first seconds), then rarely (a script may load data for minutes first).
POLL_SECS, POLL_SECS_LATER, POLL_FAST_FOR_SECS = 0.1, 1.0, 60.0


def refuse(error: ConfigError) -> NoReturn:
    """One line and exit code 2, from any thread, at once: the port closes with the process."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    print(f"tfps: error: {error}", file=sys.stderr, flush=True)
    real_os_exit(ExitCode.BAD_CONFIG)


def own_task(argv: list[str]):
    """The TaskRef the classic flags in ``argv`` (or TF_CONFIG) give this process."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--ps_hosts", "--worker_hosts", "--job_name", "--task_index"):
        p.add_argument(flag)
    ns, _ = p.parse_known_args(argv)
    return TaskRef.resolve(ns.ps_hosts, ns.worker_hosts, ns.job_name, ns.task_index)


class Guard:
    """The loopback guard of one task: its patch, its checks."""

    def __init__(self, task):
        self.task = task
        self.host = split_target(task.target)[0]
        self.field = "ps_hosts" if task.job == "ps" else "worker_hosts"
        self.checked = threading.Event()

    def check(self) -> bool:
        """Refuse if the task's port listens off loopback; whether it was found listening."""
        try:
            if open_addresses(self.task.port) is None:
                return False
            require_loopback_only(self.task.name, self.task.target, self.task.port, self.field)
        except ConfigError as e:
            refuse(e)
        except OSError as e:
            refuse(ConfigError(f"{self.task.name} cannot check that its TensorFlow server on {self.task.target} "
                               f"listens on loopback only: {e.strerror or e}", self.field))
        self.checked.set()
        return True

    def after_tensorflow(self, tf) -> None:
        """Once TensorFlow is imported: patch its bind, and check right after a server starts."""
        if not ensure_loopback_bind(bind_address(self.host)):
            refuse(ConfigError(f"{self.task.name} would listen on every interface although its address "
                               f"{self.task.target} is loopback, and this TensorFlow build cannot be kept on "
                               "loopback; give the task the address of an interface that the hosts' firewall "
                               "protects", self.field))
        server = tf.distribute.Server
        start = server.start
        guard = self

        def start_then_check(self, *args, **kwargs):
            start(self, *args, **kwargs)
            if not guard.checked.is_set():
                guard.check()

        server.start = start_then_check

    def poll(self) -> None:
        t0 = time.monotonic()
        while not self.checked.is_set() and not self.check():
            time.sleep(POLL_SECS if time.monotonic() - t0 < POLL_FAST_FOR_SECS else POLL_SECS_LATER)

    def install(self) -> None:
        if "tensorflow" in sys.modules:
            self.after_tensorflow(sys.modules["tensorflow"])
        else:
            sys.meta_path.insert(0, _AfterImport("tensorflow", self.after_tensorflow))
        threading.Thread(target=self.poll, name="tfps-loopback-check", daemon=True).start()


class _AfterImport:
    """A meta path finder that calls ``then(module)`` once module ``name`` has been executed."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)          # once, and the lookup below skips this finder
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module, then = spec.loader.exec_module, self.then

        def exec_then(module):
            exec_module(module)
            then(module)

        spec.loader.exec_module = exec_then
        return spec


def main(argv: list[str]) -> None:
    if not argv:
        print("usage: python -m tfps.task.net.script_guard SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(ExitCode.BAD_CONFIG)
    script, args = argv[0], argv[1:]
    try:
        guard = Guard(own_task(args))
    except ConfigError as e:
        refuse(ConfigError(f"{script} was given no cluster address that tfps can check ({e}); run it with the "
                           "classic flags --ps_hosts, --worker_hosts, --job_name and --task_index", "script"))
    if is_loopback_host(guard.host):
        guard.install()
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
