"""The ``tfps`` command: a thin layer over the library.

    tfps run          one task of a cluster (classic flags or TF_CONFIG); what containers run
    tfps local        a whole cluster as local processes, or a user's classic script
    tfps plan         the cluster plan of an inventory: tasks, flags, TF_CONFIG
    tfps notify-test  send a test message to every configured notification URL
    tfps compose      a docker-compose.yml for a cluster, from the same plan
    tfps notify-failure  the failure message for a chief that died silently
    tfps healthcheck  container HEALTHCHECK: is this task's gRPC port up
    tfps demo-data    write the demo datasets to a directory

Flags accept dashes or underscores (``--train-steps`` = ``--train_steps``). Bad input
prints one line ``tfps: error: FIELD: what to change`` and exits 2 (``ExitCode``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from trainer import __version__
from trainer.config import add_run_options, from_args
from trainer.errors import ConfigError
from trainer.exitcodes import ExitCode

PROCESS_START = time.time()


def normalize_argv(argv: list[str]) -> list[str]:
    """``--train-steps=5`` -> ``--train_steps=5``; nothing after a bare ``--`` is touched."""
    out = []
    for i, a in enumerate(argv):
        if a == "--":
            return out + argv[i:]
        if a.startswith("--") and len(a) > 2:
            name, eq, value = a[2:].partition("=")
            if name.startswith("no-"):
                name = "no-" + name[3:].replace("-", "_")
            else:
                name = name.replace("-", "_")
            a = f"--{name}{eq}{value}"
        out.append(a)
    return out


def _cluster_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (classic flags; or set TF_CONFIG)")
    g.add_argument("--ps_hosts", help="comma-separated host:port of the ps tasks")
    g.add_argument("--worker_hosts", help="comma-separated host:port of the workers (the first is the chief)")
    g.add_argument("--job_name", help="ps or worker")
    g.add_argument("--task_index", type=int, help="index of this task in its job")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tfps", description="TensorFlow parameter-server training that ends cleanly.")
    p.add_argument("--version", action="version", version=f"tfps {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run one task of a cluster (what each container runs)")
    _cluster_options(run)
    add_run_options(run)
    run.add_argument("--restarts", type=int, default=0, metavar="N",
                     help="start the task's process again, up to N times, when a signal kills it (the OOM "
                          "killer, a crash) and nobody asked it to stop; the container or launcher around it "
                          "sees one process that lives on (default %(default)s)")

    local = sub.add_parser("local", help="run a whole cluster on this machine as processes")
    local.add_argument("--ps", type=int, default=1, help="number of ps tasks (default %(default)s)")
    local.add_argument("--workers", type=int, default=2, help="number of workers (default %(default)s)")
    local.add_argument("--script", help="run a classic script (taking --ps_hosts ... --task_index) instead")
    local.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
    add_run_options(local)
    local.add_argument("script_args", nargs=argparse.REMAINDER, help="after --: arguments for --script")

    plan = sub.add_parser("plan", help="print the cluster plan of an inventory, as Ansible resolves it",
                          description="The cluster plan of an Ansible inventory: ansible-core resolves the "
                                      "inventory (every format and precedence rule), tfps numbers the tasks. "
                                      "The play computes the same plan. Needs pip install 'tfps[ansible]'.")
    plan.add_argument("-i", "--inventory", action="append", required=True, metavar="SOURCE",
                      help="inventory source as for ansible-playbook -i: INI or YAML file, directory, "
                           "executable script, plugin configuration; repeatable")
    plan.add_argument("-e", "--extra_vars", "--extra-vars", action="append", default=[], metavar="VARS",
                      help="extra variables as for ansible-playbook -e (key=value, YAML/JSON, @file); repeatable")
    plan.add_argument("--vault_id", "--vault-id", action="append", default=[], metavar="ID",
                      help="vault identity, as for ansible-playbook; repeatable")
    plan.add_argument("--vault_password_file", "--vault-password-file", action="append", default=[],
                      metavar="FILE", help="vault password file, as for ansible-playbook; repeatable")
    plan.add_argument("--playbook_dir", "--playbook-dir", metavar="DIR",
                      help="also read group_vars/ and host_vars/ beside the playbook in DIR, as the play does")
    plan.add_argument("--format", choices=("table", "json"), default="table")

    nt = sub.add_parser("notify_test", aliases=["notify-test"], help="send a test notification")
    nt.add_argument("--notify", action="append", default=[], metavar="URL")
    nt.add_argument("--notify_config", metavar="FILE")

    nf = sub.add_parser("notify_failure", aliases=["notify-failure"],
                        help="send the failure message for a chief that died without one (orchestrators)")
    nf.add_argument("--reason", required=True, help="what happened, e.g. 'chief container exited 137'")
    add_run_options(nf)

    sub.add_parser("healthcheck", help="exit 0 if this container's task serves its port")

    from trainer import compose
    compose.add_arguments(sub.add_parser("compose", help="write a docker-compose.yml for a cluster plan"))

    dd = sub.add_parser("demo_data", aliases=["demo-data"], help="write the demo datasets")
    dd.add_argument("directory")
    return p


def _setup_logging(verbose: bool, prefix: str = "") -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stdout,
                        format=f"%(asctime)s {prefix}%(levelname).1s %(message)s", datefmt="%H:%M:%S")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def cmd_run(ns, argv: list[str]) -> int:
    from trainer.cluster import TaskRef
    cfg = from_args(ns)
    task = TaskRef.resolve(ns.ps_hosts, ns.worker_hosts, ns.job_name, ns.task_index)
    if task.is_chief:   # refuse malformed notification URLs before anything starts
        from trainer.notify import Notifier
        Notifier.from_settings(cfg.notify, cfg.notify_config)
    if ns.restarts < 0:
        raise ConfigError(f"{ns.restarts} is negative; use 0 (never) or how many times to restart", "restarts")
    if ns.restarts > 0 and not os.environ.get(SUPERVISED_ENV):
        return supervise(argv, ns.restarts, task.name)
    from trainer.lifecycle import StopSignal
    stop = StopSignal()
    if task.job == "ps":
        from trainer.ps import serve
        code = int(serve(task, cfg, stop))
    else:
        from trainer.worker import Job
        code = int(Job(task, cfg, stop, PROCESS_START).run())
    # The task is over and its exit status decided; only the interpreter and TensorFlow
    # shut down now (a second or two), and Python restores SIGTERM's default action for
    # that. An orchestrator cleaning up at this moment (`docker compose up --exit-code-from`
    # stops the other tasks as soon as the chief exits) must not turn a clean exit into
    # "killed by SIGTERM" (143).
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


#: Set in the environment of a task process that a supervising ``tfps run --restarts`` started.
SUPERVISED_ENV = "TFPS_SUPERVISED"


def supervise(argv: list[str], restarts: int, name: str) -> int:
    """Run ``tfps <argv>`` as a child and start it again when a signal kills it.

    Only deaths by a signal nobody sent through this process count (SIGKILL from the OOM
    killer, SIGSEGV, ...): an exit code is the task's own verdict (1 failed, 2 bad input,
    130 stopped) and is returned as it is. SIGTERM and SIGINT are passed on to the task,
    which then saves and exits as usual; nothing is restarted after them.
    """
    import signal
    import subprocess
    log = logging.getLogger("tfps")
    env = {**os.environ, SUPERVISED_ENV: "1"}
    cmd = [sys.executable, "-m", "trainer", *argv]
    state = {"child": None, "stopping": False}

    def forward(signum, _frame):
        state["stopping"] = True
        if state["child"] is not None and state["child"].poll() is None:
            state["child"].send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    attempt = 0
    while True:
        state["child"] = subprocess.Popen(cmd, env=env)
        while True:
            try:
                rc = state["child"].wait()
                break
            except InterruptedError:
                continue
        if rc >= 0 or state["stopping"] or attempt >= restarts:
            if rc < 0:
                log.error("%s: the task process was killed by %s; not restarting it (%s)", name,
                          signal.Signals(-rc).name, "stop requested" if state["stopping"] else
                          f"{restarts} restart(s) used")
                return 128 - rc
            return rc
        attempt += 1
        log.warning("%s: the task process was killed by %s; starting it again (%d/%d)", name,
                    signal.Signals(-rc).name, attempt, restarts)
        time.sleep(1)


def cmd_local(ns) -> int:
    from trainer.local import run_local
    cfg = from_args(ns)
    if ns.model_dir is None:    # a fresh directory per launch: never resume by accident
        cfg.model_dir = os.path.join("runs", f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    args = list(ns.script_args)
    if args and args[0] == "--":
        args = args[1:]
    return int(run_local(cfg, num_ps=ns.ps, num_workers=ns.workers, script=ns.script,
                         script_args=args, python=ns.python))


def cmd_plan(ns) -> int:
    import json
    from trainer.cluster.inventory import load_plan, plan_of
    data = load_plan(ns.inventory, extra_vars=ns.extra_vars, vault_ids=ns.vault_id,
                     vault_password_files=ns.vault_password_file, playbook_dir=ns.playbook_dir)
    if ns.format == "json":
        print(json.dumps(data, indent=2))
    else:
        job = data["job"]
        print(plan_of(data).render_table(), end="")
        print(f"\njob {job['name']}: model_dir {job['model_dir']} on the chief's host; every task runs:")
        print("  " + " ".join(data["tasks"][0]["argv"] if not data["tasks"][0]["entrypoint"]
                              else data["tasks"][0]["entrypoint"] + ["<classic flags>"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not ns.command:
        parser.print_help()
        return int(ExitCode.BAD_CONFIG)
    _setup_logging(ns.verbose)
    try:
        if ns.command == "run":
            return cmd_run(ns, argv)
        if ns.command == "local":
            return cmd_local(ns)
        if ns.command == "plan":
            return cmd_plan(ns)
        if ns.command in ("notify_test", "notify-test"):
            from trainer.notify import notify_test
            return notify_test(ns.notify, ns.notify_config)
        if ns.command == "compose":
            from trainer import compose
            return compose.main(ns)
        if ns.command in ("notify_failure", "notify-failure"):
            from trainer.notify import collect_urls
            from trainer.report import orphan_failure
            cfg = from_args(ns)
            return 0 if orphan_failure(cfg, collect_urls(cfg.notify), ns.reason) else 1
        if ns.command == "healthcheck":
            from trainer.lifecycle import healthcheck
            return healthcheck()
        if ns.command in ("demo_data", "demo-data"):
            from trainer.demo import ensure_demo_data
            for k, v in ensure_demo_data(ns.directory).items():
                print(f"{k}: {v}")
            return 0
    except ConfigError as e:
        print(f"tfps: error: {e}", file=sys.stderr)
        return int(ExitCode.BAD_CONFIG)
    except KeyboardInterrupt:
        return int(ExitCode.STOPPED)
    return int(ExitCode.BAD_CONFIG)


if __name__ == "__main__":
    sys.exit(main())
