"""The ``tfps_*`` variables of an inventory: their catalogue and what the job makes of them.

The catalogue is the Ansible role's ``meta/argument_specs.yml``, the one list of every
variable with its type and meaning: ansible-core validates the play's input against it,
``tfps plan`` refuses names that are not in it (a typo in a layout variable silently
changes the cluster), and the docs list it.

:func:`launch_from_vars` turns the job settings of the chief's host (``tfps_model``,
``tfps_train_steps``, ...) into a :class:`RunConfig` and the :class:`Launch` every task
shares, so that the run flags are built in one place (``RunConfig.to_args``), not in
Jinja.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from typing import Any

import yaml

from tfps.cluster.plan import (
    DATA_MOUNT,
    ENV_URLS_FILE,
    NOTIFY_CONFIG_MOUNT,
    URLS_FILE_MOUNT,
    USER_MODEL_MOUNT,
    Launch,
)
from tfps.config import (
    RunConfig,
    did_you_mean,
    grace_period,
    job_flags,
    load_job_file,
    parse_model_args,
    run_option_actions,
)
from tfps.data.dataset import LIST_PREFIX
from tfps.errors import ConfigError
from tfps.playbooks import role_dir

#: The role whose variables these are (a checkout, or the copy installed with tfps).
ROLE_DIR = role_dir()
ARGUMENT_SPECS = ROLE_DIR / "meta" / "argument_specs.yml"
DEFAULTS = ROLE_DIR / "defaults" / "main.yml"
def train_list_path(job: str) -> str:
    """The list of the job's training files the play writes with tfps_data_src
    (tfps.cluster.datasrc): one per job, so jobs sharing a tfps_data_dir keep their own."""
    return f"{DATA_MOUNT}/.tfps-{job}-train-files"

#: Job settings that become ``tfps run`` options: inventory variable -> RunConfig field.
RUN_FIELDS = {
    "tfps_job_name": "run_name",
    "tfps_model": "model",
    "tfps_model_args": "model_args",
    "tfps_train_data": "train_data",
    "tfps_eval_data": "eval_data",
    "tfps_label_column": "label_column",
    "tfps_train_steps": "train_steps",
    "tfps_epochs": "epochs",
    "tfps_batch_size": "batch_size",
    "tfps_learning_rate": "learning_rate",
    "tfps_optimizer": "optimizer",
    "tfps_sync_replicas": "sync_replicas",
    "tfps_replicas_to_aggregate": "replicas_to_aggregate",
    "tfps_backup_workers": "backup_workers",
    "tfps_checkpoint_steps": "checkpoint_steps",
    "tfps_final_save_timeout": "final_save_timeout",
    "tfps_notify_every": "notify_every",
    "tfps_stall_timeout": "stall_timeout",
    "tfps_model_dir": "model_dir",
    "tfps_export_dir": "export_dir",
    "tfps_export_every": "export_every",
    "tfps_keep_exports": "keep_exports",
    "tfps_delta_checkpoint_secs": "delta_checkpoint_secs",
    "tfps_embedding": "embedding",
    "tfps_min_count": "min_count",
    "tfps_steps_to_live": "steps_to_live",
    "tfps_expected_ids": "expected_ids",
}
#: Other job settings that change how tasks start (tfps_config: a job file that gives the others).
LAUNCH_VARS = ("tfps_extra_args", "tfps_script", "tfps_script_args", "tfps_notify_config", "tfps_data_src",
               "tfps_config")
#: Every variable the plan reads from the chief's host: the job's settings.
JOB_VARS = tuple(RUN_FIELDS) + LAUNCH_VARS
#: What defines a job (with its layout and image): a deploy under the same name that changes
#: one of these is refused unless tfps_replace (the role's settings check). Cadences,
#: timeouts and notifications may change without that.
DEFINING_VARS = ("tfps_model", "tfps_model_args", "tfps_train_data", "tfps_eval_data", "tfps_label_column",
                 "tfps_train_steps", "tfps_batch_size", "tfps_learning_rate", "tfps_optimizer", "tfps_sync_replicas",
                 "tfps_replicas_to_aggregate", "tfps_backup_workers", "tfps_model_dir", "tfps_extra_args",
                 "tfps_script", "tfps_script_args", "tfps_data_src", "tfps_embedding", "tfps_min_count",
                 "tfps_steps_to_live", "tfps_epochs")
#: Defining settings left out of the record while they hold their default (a hashed table),
#: so that the record of a job started before tfps had them compares equal.
OMITTED_VARS = ("tfps_embedding", "tfps_min_count", "tfps_steps_to_live", "tfps_epochs")


@functools.lru_cache(maxsize=1)
def catalogue() -> dict[str, dict]:
    """Every ``tfps_*`` variable: name -> its argument spec (type, description, ...)."""
    try:
        specs = yaml.safe_load(ARGUMENT_SPECS.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the role's variable list ({exc}); reinstall tfps or set TFPS_ROLE_DIR "
                          "to the directory of the tfps role", "argument_specs") from None
    return dict(specs["argument_specs"]["main"]["options"])


def description(name: str) -> str:
    text = catalogue()[name].get("description", "")
    return " ".join(text) if isinstance(text, list) else str(text)


def check_names(names, where: str, origin=None) -> None:
    """Refuse ``tfps_*`` names the role does not know, suggesting the closest one.

    ``origin(name)`` may say where a name was set (file and line).
    """
    known = catalogue()
    for name in names:
        if isinstance(name, str) and name.startswith("tfps_") and name not in known:
            hint = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            suggestion = f"did you mean {hint[0]!r}?" if hint else "see docs/ansible.md for the variables"
            place = origin(name) if origin else None
            raise ConfigError(f"unknown variable of {where}{f' (set in {place})' if place else ''}; {suggestion}",
                              str(name))


#: A job file's keys that are the layout (options of tfps local, compose, slurm and run's
#: cluster flags): the inventory gives it.
LAYOUT_KEYS = ("ps", "workers", "gpus", "gpus_per_worker", "nodes", "ps_hosts", "worker_hosts", "job_name",
               "task_index")
#: A job file's keys (tfps run's options) that have a role variable besides RUN_FIELDS'.
JOB_FILE_VARS = {"model_arg": "tfps_model_args", "notify_config": "tfps_notify_config"}


def job_file_vars(path: str) -> dict[str, Any]:
    """The role variables a ``tfps_config`` job file gives: the file ``--config`` reads.

    Its keys are tfps run's options, with dashes or underscores. An option with a role
    variable of its own becomes that variable (``train_steps`` -> ``tfps_train_steps``,
    ``model_arg`` -> ``tfps_model_args``); every other one becomes its flag in
    ``tfps_extra_args`` (``hidden_units: 64,32`` -> ``--hidden_units=64,32``). A key that is
    not an option of tfps run is refused by name; so are notification URLs (secrets: a
    vaulted ``tfps_notify_urls``). The inventory's own variables win over the file's (the
    caller merges them so).
    """

    where = path
    options = run_option_actions()
    by_field = {f: v for v, f in RUN_FIELDS.items()}
    out: dict[str, Any] = {}
    extra: list[str] = []
    for key, value in load_job_file(path, "tfps_config").items():
        dest = str(key).replace("-", "_")
        if dest == "notify":
            raise ConfigError(f"{where}: notification URLs are secrets; set tfps_notify_urls in a vaulted "
                              "group_vars file instead (docs/ansible.md, Security)", "tfps_config")
        if dest in LAYOUT_KEYS:
            raise ConfigError(f"{where}: {key!r} is the cluster's layout, which the inventory gives (its groups ps "
                              "and worker, tfps_ps_tasks, tfps_workers, tfps_gpus); leave it out of the job file",
                              "tfps_config")
        if dest not in options and f"tfps_{dest}" in catalogue():
            raise ConfigError(f"{where}: {key!r} is not a job setting (an option of tfps run); set the role's "
                              f"tfps_{dest} in the inventory instead", "tfps_config")
        if dest not in options:
            hint = did_you_mean(key, options)
            raise ConfigError(f"{where}: {key!r} is not an option of tfps run{hint}", "tfps_config")
        if dest == "model_arg":
            out["tfps_model_args"] = value if isinstance(value, Mapping) or value is None else \
                parse_model_args([str(v) for v in (value if isinstance(value, list) else [value])])
        elif dest in JOB_FILE_VARS:
            out[JOB_FILE_VARS[dest]] = value
        elif dest in by_field:
            out[by_field[dest]] = value
        else:
            extra.extend(job_flags(options[dest], value, where, "tfps_config"))
    if extra:
        out["tfps_extra_args"] = extra
    return out


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def launch_from_vars(variables: Mapping[str, Any], where: str = "the job") -> tuple[RunConfig, Launch]:
    """The job's RunConfig and Launch from its (resolved) variables; bad values name the variable."""
    values: dict[str, Any] = {}
    for var, fieldname in RUN_FIELDS.items():
        value = variables.get(var)
        if _blank(value):
            continue
        values[fieldname] = value
    if not _blank(variables.get("tfps_notify_config")):
        values["notify_config"] = NOTIFY_CONFIG_MOUNT
    if not _blank(variables.get("tfps_data_src")):
        # The play copies each worker host its shard and the job's list of training files.
        values["train_data"] = LIST_PREFIX + train_list_path(str(variables.get("tfps_job_name") or "train"))
    try:
        cfg = RunConfig(**values)
        _coerce(cfg)
        cfg.validate()
    except ConfigError as exc:
        var = next((v for v, f in RUN_FIELDS.items() if f == exc.field), exc.field)
        raise ConfigError(f"{where}: {exc.message}", var) from None
    if not cfg.export_dir:
        cfg.export_dir = cfg.export_path
    extra = _str_list(variables.get("tfps_extra_args"), "tfps_extra_args", where)
    script = None if _blank(variables.get("tfps_script")) else str(variables["tfps_script"])
    script_args = _str_list(variables.get("tfps_script_args"), "tfps_script_args", where)
    # --replace: the role compares a deploy's settings with its containers' labels before it
    # starts anything (tasks/settings.yml: refused, or replaced with tfps_replace; stop.yml
    # first is a way on too), so its chief records them in model_dir without a second refusal.
    run_args = tuple(cfg.to_args() + ["--replace"] + extra)
    settings = {var: getattr(cfg, RUN_FIELDS[var]) if var in RUN_FIELDS else variables.get(var)
                for var in DEFINING_VARS}
    settings = {k: (None if _blank(v) else v) for k, v in settings.items()
                if not (k in OMITTED_VARS and v == getattr(RunConfig, RUN_FIELDS[k]))}
    launch = Launch(
        name=cfg.name,
        run_args=run_args,
        stop_timeout=grace_period(cfg.final_save_timeout),
        script=script,
        script_args=tuple(script_args),
        extra={
            "run_args": list(run_args),
            "model_dir": cfg.model_dir,
            "export_dir": cfg.export_path,
            "final_save_timeout": cfg.final_save_timeout,
            "train_steps": cfg.train_steps,
            "user_model_mount": USER_MODEL_MOUNT,
            "data_mount": DATA_MOUNT,
            "notify_config_mount": NOTIFY_CONFIG_MOUNT,
            "notify_urls_mount": URLS_FILE_MOUNT,
            "notify_urls_env": ENV_URLS_FILE,
            "settings": settings,
        },
    )
    return cfg, launch


def _coerce(cfg: RunConfig) -> None:
    """Inventory values arrive as YAML/INI scalars: "500" is 500, "yes" is true."""
    import dataclasses

    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if value is None or f.name not in RUN_FIELDS.values():
            continue
        kind = type(f.default) if f.default is not None else None
        if f.name == "model_args" and isinstance(value, str):   # an INI inventory: "{units: 128}"
            import yaml
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                raise ConfigError(f"is {value!r}; use a mapping such as {{units: 128, dropout: 0.2}}",
                                  f.name) from None
            setattr(cfg, f.name, value)
            continue
        if f.name in ("replicas_to_aggregate", "backup_workers", "checkpoint_steps", "epochs", "keep_exports",
                      "delta_checkpoint_secs"):
            kind = int
        if f.name == "export_every":   # 500 (steps) or "10m": RunConfig reads either
            kind = str
        try:
            if kind is bool and not isinstance(value, bool):
                text = str(value).strip().lower()
                if text not in ("true", "false", "yes", "no", "1", "0", "on", "off"):
                    raise ValueError(value)
                value = text in ("true", "yes", "1", "on")
            elif kind is int and not isinstance(value, bool):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                value = int(str(value).strip()) if not isinstance(value, int) else value
            elif kind is float and not isinstance(value, bool):
                value = float(value)
            elif kind is str:
                value = str(value)
        except (TypeError, ValueError):
            noun = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}[kind]
            raise ConfigError(f"is {value!r}; use {noun}", f.name) from None
        setattr(cfg, f.name, value)


def _str_list(value: Any, var: str, where: str) -> list[str]:
    if _blank(value):
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: is {value!r}; use a YAML list of strings, e.g. ['--optimizer=sgd']", var)
    return [str(v) for v in value]


def markdown_table() -> str:
    """The variables table of docs/ansible.md, from argument_specs.yml and defaults/main.yml.

    ``python -m tfps.cluster.variables`` prints it; a unit test keeps the docs equal to it.
    """
    defaults = yaml.safe_load(DEFAULTS.read_text(encoding="utf-8")) or {}
    lines = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for name, spec in catalogue().items():
        kind = spec.get("type", "str")
        if spec.get("elements"):
            kind = f"{kind} of {spec['elements']}"
        if name in defaults:
            default = "`" + (yaml.safe_dump(defaults[name], default_flow_style=True).strip().removesuffix("...")
                             .strip()).replace("|", "\\|") + "`"
        else:
            default = "per host"
        text = description(name).replace("|", "\\|")
        if spec.get("choices"):
            text += " One of " + ", ".join(f"`{c}`" for c in spec["choices"]) + "."
        lines.append(f"| `{name}` | {kind} | {default} | {text} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
