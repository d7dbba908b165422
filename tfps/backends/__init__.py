"""The launchers as backends of one interface (:class:`tfps.backends.protocol.Backend`).

    local.py     tfps local: processes on this machine; jobs are model_dirs (. and ./runs)
    compose.py   tfps compose: one container per task on this machine's Docker engine
    ansible.py   tfps deploy: containers on an inventory's hosts, through ansible-playbook
    slurm.py     tfps slurm: one Slurm job, seen through squeue and the shared filesystem

``tfps jobs``, ``logs``, ``stop`` and ``status`` pick one with their options (:data:`REGISTRY`:
``-i INVENTORY``, ``--slurm``, ``--local``, ``--compose``) and call it. A fifth backend is one
module with a ``BACKEND`` class and one line here; docs/design/backends.md says how.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass

from tfps.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    """A backend as the parser knows it, without importing it: its option and what it lists."""

    option: str   #: how jobs/logs/stop/status select it; ``--NAME`` is added to their parsers (not -i)
    dest: str     #: the option's attribute in the namespace
    what: str     #: what the option reads, for the refusals
    help: str = ""   #: the option's help (-i has the inventory options' own)
    dirs: bool = False   #: whether --dir says where its jobs are


#: name -> how it is selected. The module is ``tfps.backends.<name>``, its class ``BACKEND``.
REGISTRY: dict[str, Entry] = {
    "ansible": Entry("-i INVENTORY", "inventory", "the hosts of an Ansible deploy"),
    "slurm": Entry("--slurm", "slurm", "jobs under Slurm", dirs=True,
                   help="the tfps jobs of this user under Slurm instead: squeue, scontrol and the jobs' files on the "
                        "shared filesystem (docs/slurm.md)"),
    "local": Entry("--local", "local", "tfps local's model_dirs", dirs=True,
                   help="the jobs of tfps local on this machine instead: their model_dirs (under --dir) and the "
                        "launcher that holds each one's lock"),
    "compose": Entry("--compose", "compose", "compose jobs on this machine's Docker engine",
                     help="the compose jobs on this machine's Docker engine instead: each job is a compose project "
                          "with a worker0 service"),
}

#: Where --slurm and --local look for jobs when no --dir is given.
DEFAULT_DIRS = (".", "runs")


def get(name: str):
    """The backend class registered as ``name``."""
    if name not in REGISTRY:
        raise ConfigError(f"{name!r} is not a backend; use one of {', '.join(REGISTRY)}", "backend")
    # lazy: a backend imports its launcher (ansible-core, Docker, Slurm's tools) only when used
    return importlib.import_module(f"tfps.backends.{name}").BACKEND


def chosen(ns: argparse.Namespace) -> str:
    """The name of the backend that the options of ``ns`` select; refuses none, or more than one."""
    given = [name for name, e in REGISTRY.items() if getattr(ns, e.dest, None)]
    if len(given) > 1:
        first, second = REGISTRY[given[0]].option, REGISTRY[given[1]].option
        raise ConfigError(f"give {first} or {second}, not both", given[1])
    if not given:
        choices = [f"{e.option} ({e.what})" for e in REGISTRY.values()]
        options = ", ".join(choices[:-1]) + " or " + choices[-1]
        raise ConfigError(f"give {options}", "inventory")
    if getattr(ns, "dir", None) and not REGISTRY[given[0]].dirs:
        opts = [e.option for e in REGISTRY.values() if e.dirs]
        raise ConfigError(f"--dir is where {' and '.join(opts)} look for jobs; give it with one of them", "dir")
    return given[0]


def selected(ns: argparse.Namespace):
    """The backend, made from the command's options, that ``ns`` selects."""
    return get(chosen(ns)).from_args(ns)


def add_options(parser: argparse.ArgumentParser) -> None:
    """Each backend's selecting option (but -i, the inventory options' own) and --dir."""
    for e in REGISTRY.values():
        if e.option.startswith("--"):
            parser.add_argument(e.option, dest=e.dest, action="store_true", help=e.help)
    parser.add_argument("--dir", action="append", default=[], metavar="DIR",
                        help="with --slurm: where to find jobs Slurm has forgotten (DIR/*.slurm); with --local: "
                             "where tfps local's model_dirs are (DIR/*/); repeatable; default . and ./runs")
