"""``tfps compose``: a docker-compose.yml for one job on one machine, from the cluster plan.

One service per task of the plan, named as tfps names tasks everywhere (``ps0``,
``worker0``, ...) and used as its hostname; every task listens on the plan's port in its
own network namespace, and no TF port is published on the host. Run the job with
:func:`up_command` (compose watches the chief and returns its exit status).

What the file encodes and why (restart policy, grace periods, the data volume, the
hardening, the notification secret): docs/design/compose.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import sys
import tempfile
import unicodedata

from tfps import compat
from tfps.cluster import Launch, Plan, Task, local_plan
from tfps.cluster import gpu as gpu_ids
from tfps.cluster.plan import DATA_MOUNT, DEFAULT_BASE_PORT, DEFAULT_PIDS_LIMIT, NOTIFY_CONFIG_MOUNT, USER_MODEL_MOUNT
from tfps.config import RunConfig, add_replace_option, add_run_options, from_args, grace_period
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.launch import owned
from tfps.notify.urls import ENV_URLS_FILE, URLS_FILE_MOUNT

#: Every task has its own network namespace, so all of them use the plan's default port.
TASK_PORT = DEFAULT_BASE_PORT
MODEL_DIR = "/data/model"
VOLUME = "tfps-data"
DEFAULT_IMAGE = "tfps:latest"
#: Tag of an image built with ``--build-arg TF_PACKAGE="tensorflow[and-cuda]==..."``.
DEFAULT_GPU_IMAGE = "tfps:gpu"
DEFAULT_RESTART = "on-failure:3"
#: How often `tfps run --restarts` starts a task process killed by a signal again in its container.
TASK_RESTARTS = 3
#: The image's user (Dockerfile: useradd --uid 10001).
USER = "10001:10001"
UID = 10001
TENSORBOARD_PORT = 6006
#: The compose secret that holds the notification URLs (--notify_urls_file).
SECRET = "notify_urls"
#: json-file log rotation of every task: at most LOG_MAX_FILE files of LOG_MAX_SIZE each.
DEFAULT_LOG_MAX_SIZE = "50m"
DEFAULT_LOG_MAX_FILE = 5
#: The largest --ps_cpus/--worker_cpus: Docker takes CPUs as 64-bit nano-CPUs (inf and 1e308 are no count).
MAX_CPUS = 1_000_000
#: The largest --pids_limit: Linux never has more processes than its largest pid_max.
MAX_PIDS_LIMIT = 2**22
#: Environment keys of the plan's entries that do not go into the compose file (the
#: service name already says which task and host it is).
_PLAN_ONLY_ENV = ("TFPS_HOST", "TFPS_TASK")


def service_name(task: Task) -> str:
    """The task's compose service (and hostname): its name, ``ps0``, ``worker1``.

    Compose wants service names of ``[a-z0-9._-]`` starting with a letter or digit, and a
    hostname may hold no more; :func:`tfps.cluster.spec.task_name` gives exactly that, so
    the name is used as it is (checked here, should that ever change).
    """
    name = task.name
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise ValueError(f"task name {name!r} is not a valid compose service name and hostname")
    return name


def chief_service(plan: Plan) -> str:
    return service_name(plan.chief)


#: Files ``docker compose`` reads without ``-f``.
DEFAULT_FILES = ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml")


def up_command(plan: Plan, output: str | None = None) -> str:
    """How to run the job: compose watches only the chief and returns its exit status.

    ``--exit-code-from`` alone would abort the job as soon as any task exits (a worker
    that finished first, or one that crashed and is being restarted); ``--attach`` limits
    what compose watches to the chief. Plain ``up`` always returns 0.
    """
    chief = chief_service(plan)
    name = os.path.basename(output) if output and output != "-" else ""
    f = f"-f {shlex.quote(name)} " if name and name not in DEFAULT_FILES else ""
    return f"docker compose {f}up --exit-code-from {chief} --attach {chief}"


# ----------------------------------------------------------------------------- plan


def compose_plan(plan: Plan) -> Plan:
    """The same tasks, each on its own service: address = service name, port TASK_PORT.

    Only the layout of ``plan`` is kept (how many ps and workers, which GPU each worker
    gets); on one machine two workers cannot share a GPU id, so that is refused.
    """
    gpus: dict[str, str] = {}
    for task in plan.tasks:
        if task.gpu is None:
            continue
        if task.gpu in gpus:
            raise ConfigError(
                f"{gpus[task.gpu]} and {task.name} both use GPU {task.gpu}; compose runs every task on this one "
                "machine, so give each worker its own GPU id",
                "gpus",
            )
        gpus[task.gpu] = task.name
    tasks = []
    for task in plan.tasks:
        name = service_name(task)
        tasks.append(dataclasses.replace(task, host=name, address=name, port=TASK_PORT))
    return Plan.from_tasks(tasks)


def plan_from_args(ns: argparse.Namespace) -> Plan:
    """The layout asked for: an inventory, GPU ids, or numbers of ps and workers."""
    if ns.inventory:
        given = [f"--{n}" for n in ("ps", "workers", "gpus") if getattr(ns, n) is not None]
        if given:
            raise ConfigError(f"take the layout from the inventory or from {' '.join(given)}, not both", "inventory")
        # lazy: imports NumPy and PyYAML, and needs ansible-core; --ps/--workers do not
        from tfps.cluster.inventory import load_plan, plan_of
        return compose_plan(plan_of(load_plan([ns.inventory])))
    num_ps = 1 if ns.ps is None else ns.ps
    for value, field in ((num_ps, "ps"), (ns.workers, "workers")):
        if value is not None and value < 1:
            raise ConfigError(f"is {value}; a job needs at least one ps and one worker", field)
    if ns.gpus is not None:
        # nvidia-smi's device indices or GPU-/MIG- UUIDs: what a device request takes
        gpus = gpu_ids.worker_gpus(ns.gpus, ns.workers)
        ports = list(range(TASK_PORT, TASK_PORT + num_ps + len(gpus)))
        return compose_plan(local_plan(num_ps, len(gpus), ports=ports, gpus=gpus))
    num_workers = 2 if ns.workers is None else ns.workers
    return compose_plan(local_plan(num_ps, num_workers, ports=list(range(TASK_PORT, TASK_PORT + num_ps + num_workers))))


# ----------------------------------------------------------------------------- options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a docker-compose.yml that runs one job on this machine: one service per task of the "
        "cluster plan (ps0, worker0, ...), TF_CONFIG from the plan, the job settings as the command. "
        "Run it with: docker compose up --exit-code-from worker0 --attach worker0"
    )
    g = parser.add_argument_group("cluster layout (one of)")
    g.add_argument("--ps", type=int, help="number of ps tasks (default 1)")
    g.add_argument("--workers", type=int, help="number of CPU workers (default 2)")
    g.add_argument("--gpus", metavar="IDS",
                   help="comma-separated GPU ids, one worker service per GPU (e.g. 0,1)")
    g.add_argument("-i", "--inventory", help="take the layout from an inventory (as `tfps plan` shows it)")
    g = parser.add_argument_group("compose file")
    g.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")
    g.add_argument("--image", help=f"tfps image (default {DEFAULT_IMAGE}, with --gpus {DEFAULT_GPU_IMAGE})")
    g.add_argument("--data_dir", metavar="DIR",
                   help=f"host directory mounted read-only at {DATA_MOUNT} (then --train_data {DATA_MOUNT}/...)")
    g.add_argument("--user_model_dir", metavar="DIR",
                   help=f"host directory of model modules, mounted read-only at {USER_MODEL_MOUNT} "
                        "(then --model module:function)")
    g.add_argument("--notify_urls_file", metavar="FILE",
                   help=f"host file of apprise URLs for the completion message, owned by uid {UID} with mode 0400: "
                        f"the compose secret {SECRET}, read by the chief only (default: no message)")
    g.add_argument("--restart_policy", default=DEFAULT_RESTART,
                   help="restart policy of every task (default %(default)s: crashed tasks come back, at most 3 times)")
    add_replace_option(g, "the chief's --replace, in the file: ")
    g = parser.add_argument_group("container limits and logs")
    g.add_argument("--pids_limit", type=int, default=DEFAULT_PIDS_LIMIT,
                   help="most processes/threads per task container (default %(default)s)")
    for role in ("ps", "worker"):
        g.add_argument(f"--{role}_memory", metavar="SIZE",
                       help=f"memory limit of each {role} container, e.g. 8g (default: none)")
        g.add_argument(f"--{role}_cpus", type=float, metavar="N",
                       help=f"CPU limit of each {role} container, e.g. 2.5 (default: none)")
    g.add_argument("--log_max_size", default=DEFAULT_LOG_MAX_SIZE, metavar="SIZE",
                   help="json-file log rotation: size of one log file (default %(default)s)")
    g.add_argument("--log_max_file", type=int, default=DEFAULT_LOG_MAX_FILE, metavar="N",
                   help="json-file log rotation: log files kept per task (default %(default)s)")
    add_run_options(parser)
    # A URL on a command line would end up in the file, readable by everyone: refused
    # (--notify_urls_file instead), so not offered in the help either.
    next(a for a in compat.parser_actions(parser) if a.dest == "notify").help = argparse.SUPPRESS
    # Checkpoints and results live on the named volume.
    parser.set_defaults(model_dir=MODEL_DIR)


_RESTART = re.compile(r"no|always|unless-stopped|on-failure(:[0-9]+)?")
_SIZE = re.compile(r"[0-9]+[bkmg]?", re.I)


def _check(ns: argparse.Namespace, cfg: RunConfig) -> None:
    if cfg.notify:
        raise ConfigError(
            "notification URLs hold passwords and tokens and do not belong in a compose file; write them to a "
            f"file owned by uid {UID} with mode 0400 and pass --notify_urls_file FILE (see docs/security.md)",
            "notify",
        )
    if ns.notify_urls_file:
        check_secret_file(ns.notify_urls_file)
    if not _RESTART.fullmatch(ns.restart_policy):
        raise ConfigError(f"{ns.restart_policy!r} is not a restart policy; use no, always, unless-stopped or "
                          "on-failure[:N]", "restart_policy")
    if ns.pids_limit > MAX_PIDS_LIMIT:
        raise ConfigError(f"is {ns.pids_limit}; use at most {MAX_PIDS_LIMIT} (Linux's largest pid_max)", "pids_limit")
    if ns.pids_limit < 32:
        raise ConfigError(f"is {ns.pids_limit}; TensorFlow needs a few hundred threads, use at least 256 "
                          f"(default {DEFAULT_PIDS_LIMIT})", "pids_limit")
    for field in ("ps_memory", "worker_memory", "log_max_size"):
        value = getattr(ns, field)
        if value is not None and not _SIZE.fullmatch(value):
            raise ConfigError(f"{value!r} is not a size; use a number with b, k, m or g, e.g. 8g", field)
    for field in ("ps_cpus", "worker_cpus"):
        value = getattr(ns, field)
        if value is not None and not 0 < value <= MAX_CPUS:
            raise ConfigError(f"is {value}; use a positive number of CPUs, e.g. 2 or 0.5 (at most {MAX_CPUS})",
                              field)
    if ns.log_max_file < 1:
        raise ConfigError(f"is {ns.log_max_file}; keep at least 1 log file", "log_max_file")
    if cfg.follow:
        _check_followed(ns, cfg)
    for field in ("model_dir", "export_dir"):
        value = getattr(cfg, field)
        if value and not (value == "/data" or value.startswith("/data/")):
            raise ConfigError(f"{value} is not on the {VOLUME} volume; use a path under /data "
                              f"(default {MODEL_DIR})", field)


def _check_followed(ns: argparse.Namespace, cfg: RunConfig) -> None:
    """A followed stream lands on this machine: it must come in through --data_dir, which every
    container mounts read-only at DATA_MOUNT (docs/explanation/continuous-training.md)."""
    # (--until must match --train_data: checked with the job's settings.)
    if cfg.train_data and not cfg.train_data.startswith(DATA_MOUNT + "/"):
        what, field = f"--train_data {cfg.train_data} is not under {DATA_MOUNT}", "train_data"
    elif not ns.data_dir:
        what, field = "no --data_dir", "data_dir"
    else:
        return
    raise ConfigError(f"--follow: {what}; the containers see the stream through --data_dir DIR (the stream's "
                      f"directory on this machine, mounted read-only at {DATA_MOUNT}): give --data_dir DIR and "
                      f"--train_data {DATA_MOUNT}/... (e.g. '{DATA_MOUNT}/dt=*')", field)


def check_secret_file(path: str) -> None:
    """Refuse a URL file the chief could not read, or that others on the host can."""
    fix = (f"create it with: sudo install -m 0400 -o {UID} -g {UID} /dev/stdin {shlex.quote(path)}  "
           "(then type the URLs and Ctrl-D)")
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"cannot read {path} ({e.strerror}); {fix}", "notify_urls_file") from None
    if not os.path.isfile(path):
        raise ConfigError(f"{path} is not a file; {fix}", "notify_urls_file")
    if st.st_uid != UID or st.st_mode & 0o777 != 0o400:
        raise ConfigError(f"{path} is owned by uid {st.st_uid} with mode {st.st_mode & 0o777:04o}; the chief runs as "
                          f"uid {UID} and compose mounts the file as it is, so make it {UID}'s and 0400: sudo chown "
                          f"{UID}:{UID} {shlex.quote(path)} && sudo chmod 0400 {shlex.quote(path)}", "notify_urls_file")


def _host_path(path: str, output: str, field: str) -> str:
    """A bind-mount source as compose reads it: relative to the compose file's directory.

    A path inside that directory stays relative (the directory can move); any other
    becomes absolute.
    """
    if not os.path.exists(path):
        raise ConfigError(f"{path} does not exist; Docker would mount an empty root-owned directory instead", field)
    base = os.path.dirname(os.path.abspath(output)) if output != "-" else os.getcwd()
    rel = os.path.relpath(os.path.abspath(path), base)
    if rel == "." or rel.startswith(".."):
        return os.path.abspath(path) if rel != "." else "."
    return f"./{rel}"


def regenerate_args(ns: argparse.Namespace, cfg: RunConfig) -> list[str]:
    """The canonical ``tfps compose`` arguments that produce this file (shown in its header)."""
    args: list[str] = []
    if ns.inventory:
        args += ["-i", ns.inventory]
    else:
        args += ["--ps", str(1 if ns.ps is None else ns.ps)]
        if ns.gpus is not None:
            args += ["--gpus", ",".join(gpu_ids.parse_ids(ns.gpus))]
        else:
            args += ["--workers", str(2 if ns.workers is None else ns.workers)]
    if ns.image:
        args += ["--image", ns.image]
    for opt in ("data_dir", "user_model_dir", "notify_urls_file"):
        if getattr(ns, opt):
            args += [f"--{opt}", getattr(ns, opt)]
    if ns.restart_policy != DEFAULT_RESTART:
        args += ["--restart_policy", ns.restart_policy]
    if getattr(ns, "replace", False):
        args.append("--replace")
    if ns.pids_limit != DEFAULT_PIDS_LIMIT:
        args += ["--pids_limit", str(ns.pids_limit)]
    for opt in ("ps_memory", "ps_cpus", "worker_memory", "worker_cpus"):
        if getattr(ns, opt) is not None:
            args += [f"--{opt}", f"{getattr(ns, opt):g}" if isinstance(getattr(ns, opt), float) else getattr(ns, opt)]
    if ns.log_max_size != DEFAULT_LOG_MAX_SIZE:
        args += ["--log_max_size", ns.log_max_size]
    if ns.log_max_file != DEFAULT_LOG_MAX_FILE:
        args += ["--log_max_file", str(ns.log_max_file)]
    args += [a for a in cfg.to_args() if a != f"--model_dir={MODEL_DIR}"]
    return args


# ----------------------------------------------------------------------------- rendering


def project_name(cfg: RunConfig) -> str:
    """Compose project name from the job name: a new job gets its own containers and volume."""
    name = re.sub(r"[^a-z0-9_-]+", "-", cfg.name.lower()).strip("-_")
    return name or "tfps"


class _Anchored(dict):
    """The settings every task shares: written once under ``x-tfps-task`` with the anchor
    ``&tfps-task``, which each task's service merges (``<<: *tfps-task``)."""


class _Merge(str):
    """The YAML merge key ``<<`` (a plain ``'<<'`` string would be quoted, and merge nothing)."""


def _dumper():
    import yaml  # here, not at the top: every task's CLI imports this module

    class Dumper(yaml.SafeDumper):
        # Only the shared task settings become an anchor; a list that happens to be one
        # object in two places is written out twice.
        def ignore_aliases(self, data):
            return not isinstance(data, _Anchored)

        def generate_anchor(self, node):
            return "tfps-task"

        # Items of a list indented under their key, as compose files are usually written.
        def increase_indent(self, flow=False, indentless=False):
            return super().increase_indent(flow, False)

    Dumper.add_representer(_Anchored, lambda d, data: d.represent_dict(data.items()))
    Dumper.add_representer(_Merge, lambda d, data: d.represent_scalar("tag:yaml.org,2002:merge", "<<"))
    # A value holding a control character or a line break is written double-quoted, where each
    # is an escape: PyYAML's other styles write NEL or U+2028 as a line break that reads back as a
    # space (the job would run with another --model_dir than the one given).
    Dumper.add_representer(str, lambda d, data: d.represent_scalar(
        "tag:yaml.org,2002:str", data, style='"' if any(_unsafe(ch) for ch in data) else None))
    # `tfps-data:` rather than `tfps-data: null` (the same to YAML, as compose files write it).
    Dumper.add_representer(type(None), lambda d, data: d.represent_scalar("tag:yaml.org,2002:null", ""))
    return Dumper


def _dump(data: dict) -> str:
    """YAML of the compose file, with a blank line between its top-level sections."""
    import yaml
    text = yaml.dump(data, Dumper=_dumper(), sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=1 << 16)
    return re.sub(r"\n(?=[^\s#])", "\n\n", text)


def render(ns: argparse.Namespace, cfg: RunConfig | None = None) -> str:
    """The compose file for the parsed ``tfps compose`` options."""
    cfg = cfg or from_args(ns)
    _check(ns, cfg)
    plan = plan_from_args(ns)
    gpu = any(t.gpu is not None for t in plan.tasks)
    image = ns.image or (DEFAULT_GPU_IMAGE if gpu else DEFAULT_IMAGE)
    grace = grace_period(cfg.final_save_timeout)
    chief = chief_service(plan)
    n_ps, n_workers = len(plan.cluster.ps), len(plan.cluster.worker)
    output = ns.output or "-"
    # --restarts: a task process killed by a signal (the OOM killer) starts again inside its
    # container. Docker's restart policy would restart the container too, but `up
    # --exit-code-from` ends the whole job at the chief container's first exit.
    run_args = [f"--restarts={TASK_RESTARTS}", f"--model_dir={cfg.model_dir}"]
    # --replace: the chief goes on from the volume's checkpoint although it recorded other settings.
    run_args += ["--replace"] if getattr(ns, "replace", False) else []
    run_args += [a for a in cfg.to_args() if not a.startswith("--model_dir=") and not a.startswith("--notify_config=")]
    launch = Launch(name=cfg.name, run_args=tuple(run_args), stop_timeout=grace)
    # What starts each task comes from the plan (as for the Ansible role): argv, stop
    # timeout and environment are read from its entries, not derived again here.
    entries = {t["name"]: t for t in plan.to_json(launch)["tasks"]}
    command = entries[plan.chief.name]["argv"]
    grace = entries[plan.chief.name]["stop_timeout"]
    regen = shlex.join(["tfps", "compose", *regenerate_args(ns, cfg)])
    volumes = [f"{VOLUME}:/data"]
    secret_source = _host_path(ns.notify_urls_file, output, "notify_urls_file") if ns.notify_urls_file else None
    if ns.data_dir:
        volumes.append(f"{_host_path(ns.data_dir, output, 'data_dir')}:{DATA_MOUNT}:ro")
    if ns.user_model_dir:
        volumes.append(f"{_host_path(ns.user_model_dir, output, 'user_model_dir')}:{USER_MODEL_MOUNT}:ro")

    layout = f"{n_ps} ps + {n_workers} worker(s)" + (" (one per GPU)" if gpu else "")
    header = [
        f"# A tfps job on one machine: {layout}; {chief} is the chief.",
        "#",
        f"# Generated by `{regen}`.",
        "# Change the job by regenerating (add -o FILE) rather than by editing: the cluster plan",
        "# (service names, TF_CONFIG) and the stop grace period must stay consistent.",
        "#",
        "# Run (in this directory); it returns the chief's exit status and leaves nothing running:",
        f"#   {up_command(plan, output)}",
        "# Other tasks' logs: docker compose logs -f.  Results: docker compose cp",
        f"#   {chief}:{cfg.model_dir} ./model   (checkpoints, export/, results.json, TensorBoard logs)",
        (f"# Notifications: the secret {SECRET} (URLs in {secret_source}), read by the chief only."
         if ns.notify_urls_file else
         "# Notifications: none; regenerate with --notify_urls_file FILE (docs/security.md) for a message."),
        f"# TensorBoard on http://127.0.0.1:{TENSORBOARD_PORT} while or after the job runs:",
        "#   docker compose --profile tensorboard up -d tensorboard",
        "#",
        "# x-tfps-task holds what every task shares (`<<: *tfps-task` in each service):",
        "# - stop_grace_period is grace_period(final_save_timeout): after SIGTERM the chief writes its",
        "#   final checkpoint and SavedModel, and the ps must serve it until then.",
        "# - restart: a crashed task comes back and resumes; one that exited 0 or was stopped stays down.",
        "# - no `init: true`: the image runs tini as PID 1; the healthcheck is the image's (`tfps healthcheck`).",
        "# - an open TF port runs any graph sent to it (docs/security.md): no published ports, no",
        "#   capabilities, no privilege gain, a read-only root filesystem, bounded processes, rotating logs.",
        "# - command: the job settings, the same for every task (TF_CONFIG tells each task its role).",
        *(["# - --replace: the chief goes on from the checkpoint on the volume with these settings even if",
           "#   it recorded other ones there; regenerate without it to have such a change refused again."]
          if getattr(ns, "replace", False) else []),
        "",
    ]
    shared = _Anchored({
        "image": image,
        "user": USER,
        "stop_grace_period": f"{grace}s",
        "restart": ns.restart_policy,
        "volumes": list(volumes),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "read_only": True,
        "tmpfs": list(entries[plan.chief.name]["tmpfs"]),
        "pids_limit": ns.pids_limit,
        "logging": {"driver": "json-file", "options": {"max-size": ns.log_max_size, "max-file": str(ns.log_max_file)}},
        "command": list(command),
    })
    services: dict[str, dict] = {}
    for task in plan.tasks:
        name = service_name(task)
        service: dict = {_Merge("<<"): shared, "hostname": name}
        if task.is_chief:
            if cfg.notify_config:
                # The apprise config file only on the chief (merging replaces lists, hence the repeats).
                config = f"{_host_path(cfg.notify_config, output, 'notify_config')}:{NOTIFY_CONFIG_MOUNT}:ro"
                service["command"] = [*command, f"--notify_config={NOTIFY_CONFIG_MOUNT}"]
                service["volumes"] = [*volumes, config]
            if ns.notify_urls_file:
                # The URLs of the completion message, as a read-only file: never in the environment.
                service["secrets"] = [{"source": SECRET, "target": SECRET}]
            # Lets a notification URL name a mail relay or webhook on this machine.
            service["extra_hosts"] = ["host.docker.internal:host-gateway"]
        memory, cpus = getattr(ns, f"{task.job}_memory"), getattr(ns, f"{task.job}_cpus")
        if memory is not None:
            service["mem_limit"] = memory
        if cpus is not None:
            service["cpus"] = int(cpus) if float(cpus).is_integer() else cpus
        env = {k: v for k, v in entries[task.name]["env"].items() if k not in _PLAN_ONLY_ENV}
        if task.is_chief and ns.notify_urls_file:
            env[ENV_URLS_FILE] = URLS_FILE_MOUNT
        service["environment"] = env
        if task.gpu is not None:
            service["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "device_ids": [task.gpu], "capabilities": ["gpu"]}]}}}
        services[name] = service
    services["tensorboard"] = {
        "profiles": ["tensorboard"],
        "image": image,
        "user": USER,
        "entrypoint": ["/usr/bin/tini", "--", "tensorboard"],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "command": [f"--logdir={cfg.model_dir}", "--bind_all", f"--port={TENSORBOARD_PORT}"],
        "healthcheck": {"disable": True},
        "ports": [f"127.0.0.1:{TENSORBOARD_PORT}:{TENSORBOARD_PORT}"],
        "volumes": [f"{VOLUME}:/data:ro"],
    }
    data: dict = {"name": project_name(cfg), "x-tfps-task": shared, "services": services, "volumes": {VOLUME: None}}
    if ns.notify_urls_file:
        data["secrets"] = {SECRET: {"file": secret_source}}
    return "\n".join(_comment(line) for line in header) + "\n" + _dump(data)


def _comment(line: str) -> str:
    """A header line that stays one comment line whatever a value in it holds.

    The values in the header (the regenerating command, the model_dir, paths) are the
    user's: a newline, a carriage return or a Unicode line break in one would end the comment
    and start YAML of the user's making (a top-level ``x-injected:``). They are written as
    escapes instead; the YAML below the header is written by PyYAML's emitter, which quotes
    and escapes every value itself.
    """
    return "".join(ch.encode("unicode_escape").decode("ascii") if _unsafe(ch) else ch for ch in line)


def _unsafe(ch: str) -> bool:
    """A control or format character, or a line or paragraph separator (NEL is a control)."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs")


#: The first lines of every file that ``tfps compose`` writes: such a file may be overwritten.
HEADER_START = "# A tfps job on one machine: "
HEADER_MARK = "# Generated by `tfps compose"


def written_by_tfps(path: str) -> bool:
    """Whether ``path`` is a compose file that ``tfps compose`` wrote (its header), or empty."""
    return owned.written_by_tfps(path, HEADER_START, HEADER_MARK, within=7)


def _write_output(path: str, text: str) -> str:
    """Write the file atomically, creating its directory; never over a file tfps did not write."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"{path} is a directory; give -o the compose file to write, e.g. "
                          f"{os.path.join(path, 'docker-compose.yml')}", "output")
    if os.path.lexists(path) and not written_by_tfps(path):
        raise ConfigError(f"{path} exists and tfps compose did not write it (its first lines are not a tfps compose "
                          "header), so it was left as it is; give -o a new file, or move that one away", "output")
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tfps-compose-", suffix=".tmp")
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}; give -o a path this user may write",
                          "output") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return directory


def main(ns: argparse.Namespace) -> int:
    text = render(ns)
    if ns.output in (None, "-"):
        sys.stdout.write(text)
        return ExitCode.OK
    directory = _write_output(ns.output, text)
    plan = plan_from_args(ns)
    print(f"wrote {ns.output}: {', '.join(service_name(t) for t in plan.tasks)}", file=sys.stderr)
    print(f"run it in {directory}: {up_command(plan, ns.output)}", file=sys.stderr)
    return ExitCode.OK
