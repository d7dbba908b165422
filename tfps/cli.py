"""The ``tfps`` command: a thin layer over the library.

    tfps run          one task of a cluster (classic flags or TF_CONFIG); what containers run
    tfps local        a whole cluster as local processes, or a user's classic script
    tfps plan         the cluster plan of an inventory: tasks, flags, TF_CONFIG
    tfps jobs         every tfps job on an inventory's hosts (or under Slurm, tfps local, compose): state, step, ETA
    tfps logs         show or follow a task's log there (one backend per launcher: tfps.backends)
    tfps notify-test  send a test message to every configured notification URL
    tfps compose      a docker-compose.yml for a cluster, from the same plan
    tfps slurm        an sbatch script that runs the job as one Slurm step (--submit submits it)
    tfps notify-failure  the failure message for a chief that died silently
    tfps healthcheck  container HEALTHCHECK: is this task's gRPC port up
    tfps demo-data    write the demo datasets to a directory
    tfps deploy, stop, status, cleanup   the packaged playbooks (tfps.cli_ansible)
    tfps collections  install the Ansible collections the playbooks need
    tfps completion   a bash or zsh completion script

``--config job.yaml`` (run, local, compose) reads options from a file, flags winning
(tfps.cli_tools); ``-V`` prints tfps's version and those of what it runs with.

Flags accept dashes or underscores (``--train-steps`` = ``--train_steps``); ``-v`` works
before or after the command. Each command is a ``cmd_*`` function that the parser
dispatches to (``set_defaults(func=...)``) and that returns an ``ExitCode``. Bad input
prints one line ``tfps: error: FIELD: what to change`` on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings

from tfps import backends, cli_tools, logs, use_tf_keras
from tfps.cli_ansible import add_commands as add_playbook_commands
from tfps.config import ArgumentParser, add_replace_option, add_run_options, from_args, normalize_argv
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.task import entry


def _inventory_options(required: bool) -> argparse.ArgumentParser:
    """The inventory options of the commands that read one (plan, jobs, logs), as ansible-playbook takes
    them; jobs and logs take --slurm instead, so there -i is checked by the command."""
    inventory = argparse.ArgumentParser(add_help=False)
    inventory.add_argument("-i", "--inventory", action="append", required=required, metavar="SOURCE",
                           help="inventory source as for ansible-playbook -i: INI or YAML file, directory, "
                                "executable script, plugin configuration; repeatable"
                                + ("" if required else "; not with --slurm"))
    inventory.add_argument("-e", "--extra_vars", action="append", default=[], metavar="VARS",
                           help="extra variables as for ansible-playbook -e (key=value, YAML/JSON, @file); "
                                "repeatable")
    inventory.add_argument("--vault_id", action="append", default=[], metavar="ID",
                           help="vault identity, as for ansible-playbook; repeatable")
    inventory.add_argument("--vault_password_file", action="append", default=[],
                           metavar="FILE", help="vault password file, as for ansible-playbook; repeatable")
    return inventory


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="tfps", description="TensorFlow parameter-server training that ends cleanly.")
    p.add_argument("-V", "--version", action=_Versions, nargs=0,
                   help="print the versions of tfps, TensorFlow, tf_keras, ansible-core and Python, and exit")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and TensorFlow's own log lines (hidden otherwise)")
    # -v after the command as well; SUPPRESS keeps a -v given before it.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", parents=[verbose], help="run one task of a cluster (what each container runs)")
    entry.add_arguments(run)
    _add_config_option(run)
    run.set_defaults(func=cmd_run)

    local = sub.add_parser("local", parents=[verbose], help="run a whole cluster on this machine as processes")
    local.add_argument("--ps", type=int, default=1, help="number of ps tasks (default %(default)s)")
    local.add_argument("--workers", type=int, help="number of workers (default 2; with --gpus, one per GPU)")
    local.add_argument("--gpus", metavar="INDICES",
                       help="comma-separated GPU indices as nvidia-smi lists them, one worker per GPU (e.g. 0,1): "
                            "each worker sees its GPU only, with memory growth on; every ps stays on the CPU")
    local.add_argument("--script", help="run a classic script (taking --ps_hosts ... --task_index) instead")
    local.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
    local.add_argument("--restarts", type=int, default=0, metavar="N",
                       help="start a task's process again, up to N times, when a signal kills it (as tfps run "
                            "--restarts); by default a killed task fails the job within --sync_timeout "
                            "(default %(default)s)")
    add_replace_option(local)
    _add_config_option(local)
    add_run_options(local)
    local.add_argument("script_args", nargs=argparse.REMAINDER, help="after --: arguments for --script")
    local.set_defaults(func=cmd_local)

    # The inventory options of the commands that read one (plan, jobs, logs), as ansible-playbook takes them.
    inventory = _inventory_options(required=True)

    plan = sub.add_parser("plan", parents=[verbose, inventory],
                          help="print the cluster plan of an inventory, as Ansible resolves it",
                          description="The cluster plan of an Ansible inventory: ansible-core resolves the "
                                      "inventory (every format and precedence rule), tfps numbers the tasks. "
                                      "The play computes the same plan. Needs pip install 'tfps[ansible]'.")
    plan.add_argument("--playbook_dir", metavar="DIR",
                      help="also read group_vars/ and host_vars/ beside the playbook in DIR, as the play does")
    plan.add_argument("--format", choices=("table", "json"), default="table",
                      help="table (default): the tasks, the command they run and the memory estimate; json: "
                           "everything, each task's flags, TF_CONFIG, container name and command included")

    # jobs, logs, stop and status take one backend's option (tfps.backends.REGISTRY: -i INVENTORY, --slurm,
    # --local, --compose): -i is required by the command, not the parser.
    inventory_or_slurm = _inventory_options(required=False)
    backends.add_options(inventory_or_slurm)
    for name, helptext in (("jobs", "list every tfps job on an inventory's hosts (or of Slurm, tfps local, compose)"),
                           ("logs", "show (or follow) a task's log on an inventory's hosts (or under Slurm, ...)")):
        view = sub.add_parser(name, parents=[verbose, inventory_or_slurm], help=helptext,
                              description=helptext + ": through ansible-playbook (the inventory's own SSH "
                                                     "settings and become; needs pip install 'tfps[ansible]'), "
                                                     "with --slurm through squeue and the shared filesystem, with "
                                                     "--local or --compose on this machine (docs/design/backends.md).")
        if name == "logs":
            view.add_argument("job", help="the job's name (tfps_job_name; under Slurm the job's name or id; with "
                                           "--local its name or model_dir)")
            view.add_argument("task", nargs="?", default="worker0", help="the task (default worker0, the chief)")
            view.add_argument("-f", "--follow", action="store_true", help="go on printing what the task writes")
            view.add_argument("-n", "--lines", type=int, default=100, help="lines from the end (default 100)")
        view.set_defaults(func=cmd_jobs if name == "jobs" else cmd_logs)

    nt = sub.add_parser("notify-test", aliases=["notify_test"], parents=[verbose], help="send a test notification",
                        description="Send a test message to every configured notification URL and say, per "
                                    "(masked) URL, whether it arrived. Exit 1 when one did not.")
    nt.add_argument("--notify", action="append", default=[], metavar="URL",
                    help="an apprise URL (mailto://, slack://, ...); repeatable. Also read from TFPS_NOTIFY_URLS")
    nt.add_argument("--notify_config", metavar="FILE",
                    help="an apprise configuration file (YAML or text) listing the URLs")
    nt.set_defaults(func=cmd_notify_test)

    nf = sub.add_parser("notify-failure", aliases=["notify_failure"], parents=[verbose],
                        help="send the failure message for a chief that died without one (orchestrators)")
    nf.add_argument("--reason", required=True, help="what happened, e.g. 'chief container exited 137'")
    add_run_options(nf)
    # The role passes the job's `tfps run` options as they are, its --replace included.
    nf.add_argument("--replace", action="store_true", help=argparse.SUPPRESS)
    nf.set_defaults(func=cmd_notify_failure)

    hc = sub.add_parser("healthcheck", parents=[verbose], help="exit 0 if this container's task serves its port",
                        description="The container HEALTHCHECK of a task: exit 0 when the task's gRPC port (from "
                                    "TF_CONFIG or the task's flags in the container's command) accepts "
                                    "connections, 1 otherwise.")
    hc.set_defaults(func=cmd_healthcheck)

    from tfps.launch import compose  # lazy: the parser's; `import tfps.cli` alone stays ~25 ms lighter
    compose_parser = sub.add_parser("compose", parents=[verbose], help="write a docker-compose.yml for a cluster plan")
    _add_config_option(compose_parser)
    compose.add_arguments(compose_parser)

    from tfps.launch import slurm as slurm_launch  # lazy: the parser's; `import tfps.cli` alone stays ~25 ms lighter
    slurm_parser = sub.add_parser("slurm", parents=[verbose], help="write (and --submit) an sbatch script of the job",
                                  description="The job as one Slurm batch job: every task in one srun step, run by "
                                              "this tfps installation on a shared filesystem (docs/slurm.md).")
    _add_config_option(slurm_parser)
    slurm_launch.add_arguments(slurm_parser)
    slurm_parser.set_defaults(func=cmd_slurm)

    dd = sub.add_parser("demo-data", aliases=["demo_data"], parents=[verbose], help="write the demo datasets",
                        description="Write the demo datasets (the MLP's CSV, the CTR data of wide_deep, ...) into "
                                    "DIRECTORY; files already there are kept.")
    dd.add_argument("directory", help="where to write them (created if missing)")
    dd.set_defaults(func=cmd_demo_data)

    add_playbook_commands(sub, [verbose, inventory], [verbose, inventory_or_slurm])

    comp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                          description="A completion script for tfps's commands and options, generated from this "
                                      "parser.")
    comp.add_argument("shell", choices=("bash", "zsh"), help="the shell")
    comp.set_defaults(func=cmd_completion)

    # plan and compose dispatch here, leaving their definitions above as they are.
    sub.choices["plan"].set_defaults(func=cmd_plan)
    sub.choices["compose"].set_defaults(func=cmd_compose)
    p.examples = cli_tools.EXAMPLES["tfps"]
    for name, parser in sub.choices.items():
        parser.examples = cli_tools.EXAMPLES.get(name.replace("_", "-"), "")
    return p


class _Versions(argparse.Action):
    """``-V``/``--version``: tfps's version and those of what it runs with."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(cli_tools.versions())
        parser.exit(0)


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="a YAML file of this command's options (train_steps: 1000, ...); flags given "
                             "too win over it; an unknown key is refused")


def cmd_run(ns) -> ExitCode | int:
    """``tfps run``: the task's own entry, with the flags after ``run`` (and a leading ``-v``)."""
    return entry.main(ns.run_argv)


def cmd_local(ns) -> ExitCode:
    return ExitCode(backends.get("local").from_args(ns).submit(ns))


def cmd_plan(ns) -> int:
    import json

    # lazy: imports NumPy and PyYAML; only tfps plan needs it
    from tfps.cluster.inventory import load_view, plan_from_view, plan_of
    view = load_view(ns.inventory, extra_vars=ns.extra_vars, vault_ids=ns.vault_id,
                     vault_password_files=ns.vault_password_file, playbook_dir=ns.playbook_dir)
    data = plan_from_view(*view)
    if ns.format == "json":
        print(json.dumps(data, indent=2))
    else:
        job = data["job"]
        print(plan_of(data).render_table(), end="")
        print(f"\njob {job['name']}: model_dir {job['model_dir']} on the chief's host; every task runs:")
        print("  " + " ".join(data["tasks"][0]["argv"] if not data["tasks"][0]["entrypoint"]
                              else data["tasks"][0]["entrypoint"] + ["<classic flags>"]), flush=True)
        print("\n" + _plan_memory(data, view))
    return ExitCode.OK


def cmd_jobs(ns) -> int:
    table, complete = backends.selected(ns).jobs()
    print(table, flush=True)
    return ExitCode.OK if complete else ExitCode.TRAINING_FAILED


def cmd_logs(ns) -> int:
    if not re.fullmatch(r"(ps|worker)\d+", ns.task):
        raise ConfigError(f"{ns.task!r} is not a task name; use ps0, ps1, ..., worker0 (the chief), worker1, ...",
                          "task")
    if ns.lines < 1:
        raise ConfigError(f"--lines {ns.lines}: give at least 1", "lines")
    return backends.selected(ns).logs(ns.job, ns.task, ns.follow, ns.lines)


def _plan_memory(data: dict, view) -> str:
    """What each ps task will hold, estimated here from the model's shapes, or why not (one line).

    The controller's own copies count: the data of ``tfps_data_src`` and the model module
    of ``tfps_user_model_dir``, as the play uses them (``tfps.launch.estimate.plan_estimate``).
    """
    from tfps.launch.estimate import plan_estimate  # lazy: only tfps plan needs it
    _, host_vars, defaults, template = view
    chief = next(t["host"] for t in data["tasks"] if t["chief"])
    merged = {**defaults, **host_vars[chief]}

    def var(name: str) -> str | None:
        try:
            value = template(merged.get(name), merged)
        except Exception:  # noqa: BLE001 - the plan resolved the job's settings; this is advice only
            return None
        return str(value) if value not in (None, "") else None

    est = plan_estimate(data, var("tfps_data_src"), var("tfps_train_data"), var("tfps_user_model_dir"))
    return plan_memory_line(est, data["job"]["run_args"])


def plan_memory_line(est, run_args) -> str:
    """``tfps plan``'s memory line of an estimate (or of why there is none), with the disk the
    versions of ``--export_every`` take, from the job's run options (``run_args``)."""
    from tfps.cluster import memory  # lazy: only tfps plan needs it
    from tfps.launch.estimate import config_of  # lazy: only tfps plan needs it
    if not isinstance(est, memory.MemoryEstimate):
        return f"memory: not estimated: {est}"
    cfg = config_of(run_args)
    versions = "; ".join(x for x in (memory.versions_on_disk(est.export_mb, cfg.export_every, cfg.keep_exports),
                                     memory.deltas_on_disk(cfg.delta_checkpoint_secs, cfg.checkpoint_secs)) if x)
    return (f"memory: {est.line()} (estimated from the model's shapes); the chief's export restores the model's "
            f"variables once more ({memory.fmt_mb(est.export_mb)} MB). The play refuses a ps host whose tasks' "
            f"shares exceed {memory.USABLE_MEMORY:.0%} of its memory (ansible_memtotal_mb)."
            + (f"\ndisk: {versions}." if versions else ""))


def cmd_notify_test(ns) -> ExitCode:
    from tfps.notify.notifier import notify_test  # lazy: imports apprise
    return notify_test(ns.notify, ns.notify_config)


def cmd_notify_failure(ns) -> ExitCode:
    from tfps.notify import orphan_failure  # lazy: imports apprise (through tfps.notify's __getattr__)
    from tfps.notify.urls import collect_urls  # lazy: only tfps notify-failure needs it
    cfg = from_args(ns)
    return ExitCode.OK if orphan_failure(cfg, collect_urls(cfg.notify), ns.reason) else ExitCode.TRAINING_FAILED


def cmd_healthcheck(ns) -> ExitCode:
    from tfps.task.runtime.health import healthcheck  # lazy: only tfps healthcheck needs it
    return healthcheck()


def cmd_compose(ns) -> ExitCode:
    return ExitCode(backends.get("compose").from_args(ns).submit(ns))


def cmd_slurm(ns) -> ExitCode:
    return ExitCode(backends.get("slurm").from_args(ns).submit(ns))


def cmd_completion(ns) -> ExitCode:
    print(cli_tools.completion(ns.shell, build_parser()), end="")
    return ExitCode.OK


def cmd_demo_data(ns) -> ExitCode:
    from tfps.models.demo import ensure_demo_data, foreign_entries  # lazy: imports NumPy
    path = ns.directory
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{path} is a file, not a directory; give a new or existing directory for the demo data",
                          "directory")
    theirs = foreign_entries(path)
    if theirs:   # a user's file of the same name would be overwritten
        shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
        raise ConfigError(f"{path} holds files tfps did not write ({shown}); give a new or empty directory for the "
                          "demo data", "directory")
    try:
        paths = ensure_demo_data(path)
    except OSError as e:
        where = e.filename or path
        raise ConfigError(f"cannot write the demo data to {where}: {e.strerror or e}; give a directory this user "
                          "may write, on a disk with room", "directory") from None
    for k, v in paths.items():
        print(f"{k}: {v}")
    return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    use_tf_keras()   # before anything imports TensorFlow: tf.keras is tf_keras, unless the user said otherwise
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    try:
        argv = cli_tools.expand_config(argv, parser)
    except ConfigError as e:
        print(f"tfps: error: {e}", file=sys.stderr)
        return int(ExitCode.BAD_CONFIG)
    parser.command = next((a for a in argv if not a.startswith("-") and a in parser.commands()), None)
    try:
        ns = parser.parse_args(argv)
    except SystemExit as e:   # --help, --version, or the one line of tfps.config.ArgumentParser.error
        return int(ExitCode.OK) if e.code in (None, 0) else int(ExitCode.BAD_CONFIG)
    if getattr(ns, "func", None) is None:
        parser.print_help()
        return int(ExitCode.BAD_CONFIG)
    if ns.func is cmd_run:   # the task's own entry parses its flags again, -v included
        ns.run_argv = argv[:argv.index("run")] + argv[argv.index("run") + 1:]
    logs.setup(ns.verbose)
    # cryptography 51 warns, when ansible-core (2.19) imports its DSA key type, that DSA is
    # deprecated: two lines of someone else's notice before every line tfps prints.
    warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"ansible(\.|$)")
    # As under `python -m`, a model module in the working directory is importable
    # (--model mymodels.small:build_model); after the installed packages, never shadowing one.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return int(ns.func(ns))
    except ConfigError as e:
        print(f"tfps: error: {e}", file=sys.stderr)
        return int(ExitCode.BAD_CONFIG)
    except KeyboardInterrupt:
        return int(ExitCode.STOPPED)
    except BrokenPipeError:
        # `tfps plan ... | head`: the reader has gone; say nothing more (not even at exit).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(ExitCode.OK)


if __name__ == "__main__":
    sys.exit(main())
