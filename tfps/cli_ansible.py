"""``tfps deploy``, ``stop``, ``status``, ``cleanup`` and ``collections``: the packaged
playbooks from the ``tfps`` command (``tfps.launch.playbook`` runs them)."""

from __future__ import annotations

import argparse

from tfps.exitcodes import ExitCode

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


def add_commands(sub, parents: list[argparse.ArgumentParser]) -> None:
    """The playbook commands, each ``-i INVENTORY [-e ...] [--vault-...] [--check] [--diff] [-- options]``."""
    for name, (helptext, description) in COMMANDS.items():
        p = sub.add_parser(name, parents=parents, help=helptext,
                           description=description + " Exits with ansible-playbook's code (0 ok, 2 a task "
                                                     "failed, 4 a host unreachable). Needs pip install "
                                                     "'tfps[ansible]'.")
        p.add_argument("--check", action="store_true", help="ansible-playbook --check: change nothing")
        p.add_argument("--diff", action="store_true", help="ansible-playbook --diff: show what changes")
        p.add_argument("playbook_options", nargs=argparse.REMAINDER,
                       help="after --: more ansible-playbook options (--limit, --tags, -vv, ...)")
        p.set_defaults(func=cmd_playbook, playbook_command=name)
    c = sub.add_parser("collections", parents=parents[:1],
                       help="install the Ansible collections the playbooks need (once)",
                       description="Install the pinned Ansible collections (community.docker and its "
                                   "dependency) into tfps's own directory, from PyPI's ansible package. The "
                                   "playbook commands do it by themselves on first use.")
    c.add_argument("--dest", metavar="DIR", help="install there instead (then set ANSIBLE_COLLECTIONS_PATH to it)")
    c.add_argument("--check", action="store_true", help="only say whether they are installed (exit 1 if not)")
    c.set_defaults(func=cmd_collections)


def playbook_args(ns) -> list[str]:
    """ansible-playbook's own options from tfps's: -e, vault identities and password files."""
    out = [a for extra in ns.extra_vars for a in ("-e", extra)]
    out += [a for ident in ns.vault_id for a in ("--vault-id", ident)]
    return out + [a for path in ns.vault_password_file for a in ("--vault-password-file", path)]


def check_inventory(ns) -> None:
    """Refuse, as ``tfps plan`` does and before any play starts, an inventory the play cannot run
    on: a source that does not exist, one Ansible cannot parse, no hosts in ps or worker, bad
    ``tfps_*`` variables. (Without it, ansible-playbook warns, matches no host and exits 0.)"""
    from tfps import playbooks  # lazy: only the playbook commands need it, not the parser
    from tfps.cluster.inventory import load_view, plan_from_view  # lazy: imports NumPy and PyYAML
    plan_from_view(*load_view(ns.inventory, extra_vars=ns.extra_vars, vault_ids=ns.vault_id,
                              vault_password_files=ns.vault_password_file,
                              playbook_dir=str(playbooks.ansible_dir())))


def cmd_playbook(ns) -> int:
    from tfps.launch.playbook import run_playbook  # lazy: only the playbook commands need it, not the parser
    check_inventory(ns)
    return run_playbook(ns.playbook_command, ns.inventory, playbook_args(ns), check=ns.check, diff=ns.diff,
                        extra=ns.playbook_options)


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
