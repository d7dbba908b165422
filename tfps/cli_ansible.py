"""``tfps deploy``, ``stop``, ``status``, ``cleanup`` and ``collections``: the packaged
playbooks from the ``tfps`` command (``tfps.backends.ansible`` runs them, through
``tfps.launch.playbook``). ``stop`` and ``status`` take any backend's option
(``tfps.backends``): ``tfps stop --slurm --job NAME`` stops a Slurm job the same way."""

from __future__ import annotations

import argparse

from tfps import backends
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode

#: The commands that every backend answers (the others are the Ansible backend's own).
ANY_BACKEND = ("stop", "status")

#: command -> (its help line, what its playbook does)
COMMANDS = {
    "deploy": ("train a job on an inventory's hosts (ansible/deploy.yml)",
               "Check the hosts, get the image onto them, start one container per task, wait for the job "
               "and collect its results: the packaged deploy.yml, run by this environment's ansible-playbook."),
    "stop": ("stop an inventory's job, chief first, and collect it (ansible/stop.yml)",
             "Stop the job (the chief writes its final checkpoint and export first) and collect its results."),
    "status": ("show the state of an inventory's job (ansible/status.yml); changes nothing",
               "The state of the job's containers and the chief's latest log lines. Changes nothing."),
    "cleanup": ("remove a job's containers, firewall rules and files from the hosts (ansible/cleanup.yml)",
                "Remove what a job left on the hosts: containers, firewall rules, per-job files."),
}


def add_commands(sub, parents: list[argparse.ArgumentParser], selecting: list[argparse.ArgumentParser]) -> None:
    """The playbook commands, each ``-i INVENTORY [-e ...] [--vault-...] [--check] [--diff] [-- options]``;
    ``selecting``: the parents of stop and status, whose -i is one backend's option of several."""
    for name, (helptext, description) in COMMANDS.items():
        p = sub.add_parser(name, parents=selecting if name in ANY_BACKEND else parents, help=helptext,
                           description=description + " Exits with ansible-playbook's code (0 ok, 2 a task "
                                                     "failed, 4 a host unreachable). Needs pip install "
                                                     "'tfps[ansible]'.")
        p.add_argument("--check", action="store_true", help="ansible-playbook --check: change nothing")
        p.add_argument("--diff", action="store_true", help="ansible-playbook --diff: show what changes")
        p.add_argument("playbook_options", nargs=argparse.REMAINDER,
                       help="after --: more ansible-playbook options (--limit, --tags, -vv, ...)")
        if name in ANY_BACKEND:
            p.add_argument("--job", metavar="NAME",
                           help="the job: with -i, the inventory's (tfps_job_name, the default); with --slurm its "
                                "name or Slurm id, with --local its name or model_dir, with --compose its name")
        p.set_defaults(func=cmd_playbook, playbook_command=name)
    c = sub.add_parser("collections", parents=parents[:1],
                       help="install the Ansible collections the playbooks need (once)",
                       description="Install the pinned Ansible collections (community.docker and its "
                                   "dependency) into tfps's own directory, from PyPI's ansible package. The "
                                   "playbook commands do it by themselves on first use.")
    c.add_argument("--dest", metavar="DIR", help="install there instead (then set ANSIBLE_COLLECTIONS_PATH to it)")
    c.add_argument("--check", action="store_true", help="only say whether they are installed (exit 1 if not)")
    c.set_defaults(func=cmd_collections)


def cmd_playbook(ns) -> int:
    command = ns.playbook_command
    name = backends.chosen(ns) if command in ANY_BACKEND else "ansible"
    if name != "ansible":
        given = [o for o, on in (("--check", ns.check), ("--diff", ns.diff), ("-- OPTIONS", ns.playbook_options))
                 if on]
        if given:
            raise ConfigError(f"{', '.join(given)}: ansible-playbook's options; drop them with "
                              f"{backends.REGISTRY[name].option}", "playbook_options")
        if not ns.job:
            verb = "show" if command == "status" else command
            raise ConfigError(f"give --job NAME, the job to {verb} "
                              f"(`tfps jobs {backends.REGISTRY[name].option}` lists them)", "job")
    backend = backends.get(name).from_args(ns)
    if command in ANY_BACKEND:
        return getattr(backend, command)(ns.job)
    return backend.submit(ns) if command == "deploy" else backend.play(command)


def cmd_collections(ns) -> int:
    from tfps import playbooks  # lazy: only the playbook commands need it, not the parser
    from tfps.launch.playbook import install_collections  # lazy: only the playbook commands need it, not the parser
    missing = playbooks.missing_collections()
    if ns.check:
        print("missing: " + ", ".join(missing) if missing else "installed: " + ", ".join(
            f"{n} {v}" for n, v in playbooks.pinned_collections()))
        return ExitCode.TRAINING_FAILED if missing else ExitCode.OK
    if not missing and not ns.dest:
        print("the Ansible collections are installed: " + ", ".join(
            f"{n} {v}" for n, v in playbooks.pinned_collections()))
        return ExitCode.OK
    install_collections(ns.dest)
    return ExitCode.OK
