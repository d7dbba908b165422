"""What defines a job, its record in model_dir, and what a new start would change.

A job is its name plus the settings that define it (DESIGN.md, "Jobs on shared servers").
They are recorded when it starts: on its containers by the Ansible role (label
``tfps.settings``, from ``tfps.cluster.variables.DEFINING_VARS``), and in its model_dir by
the chief, however it was launched (``tfps-settings.json``), once its first session exists (a
start that fails before, a checkpoint that does not restore, leaves the record as it was). A start whose settings differ
from the record is refused before anything changes, each change named as
``setting: old -> new`` (:func:`changes`, which the role's settings check uses too), with
the ways on; ``--replace`` (``tfps.config.add_replace_option``) goes on from the checkpoint
with the new settings instead, and the record is rewritten. ``tfps local`` checks before it
starts a process, the chief again when it starts (a compose job whose file changed, a
``tfps run`` started by hand). The role's chiefs always run with ``--replace``: the role has
compared the settings with its containers' labels before it started them.

What may change between starts without that: cadences (log_steps, checkpoint_steps,
summary_steps), timeouts, ports, notifications and restarts, and the number of ps tasks (the
checkpoint holds each partitioned variable whole and the others by name, so a job saved from
2 ps tasks goes on with 3: tfps.task.graph.placement splits its tables again; the role still replaces
a running job's containers for it, with tfps_replace).
"""

from __future__ import annotations

import json
import logging
import os

from tfps import models
from tfps.cluster.variables import DEFINING_VARS, OMITTED_VARS, RUN_FIELDS
from tfps.config import RunConfig
from tfps.errors import ConfigError
from tfps.jsonfile import now_iso, read_json, write_json_atomic

log = logging.getLogger("tfps")

#: The record in model_dir, written by the chief when the job starts.
SETTINGS_FILE = "tfps-settings.json"

#: The RunConfig fields that define a job: those of the role's DEFINING_VARS (model_dir
#: aside: the record lives in it), then the model's own flags, which reach the role's jobs
#: through tfps_extra_args. The layout adds the numbers of ps tasks and workers
#: (:func:`job_settings`); hosts and ports may change.
FIELDS = tuple(RUN_FIELDS[v] for v in DEFINING_VARS if v in RUN_FIELDS and v != "tfps_model_dir") + (
    "num_classes", "hidden_units", "hash_buckets", "embedding_dim")
#: Settings whose change makes another model, whose checkpoint cannot be continued (the run
#: identity of model_dir, ``JobSetup.identity``, refuses them too): no ``--replace`` for them.
MODEL_SHAPE = ("model", "model_args", "hidden_units", "hash_buckets", "embedding_dim", "embedding")
#: Recorded settings that may change between starts without --replace: the checkpoint fits any
#: number of ps tasks (the record is then rewritten with the new one).
LAYOUT = ("ps",)
#: Settings left out of the record while they hold their default (a hashed table), so that
#: the record of a job started before tfps had them compares equal.
OMITTED_AT_DEFAULT = tuple(RUN_FIELDS[v] for v in OMITTED_VARS)


def job_settings(cfg: RunConfig, num_ps: int, num_workers: int) -> dict:
    """What defines the job of ``cfg`` on ``num_ps`` ps tasks and ``num_workers`` workers,
    as JSON values (what the record holds and what is compared)."""
    out = {name: getattr(cfg, name) for name in FIELDS}
    if cfg.model not in models.NAMED_COLUMNS:   # only those models have tables of these shapes
        del out["hash_buckets"], out["embedding_dim"]
    for name in OMITTED_AT_DEFAULT:
        if out.get(name) == getattr(RunConfig, name):
            del out[name]
    out.update(ps=int(num_ps), workers=int(num_workers))
    return json.loads(json.dumps(out))


def changes(recorded: dict | None, settings: dict) -> list[str]:
    """``setting: old -> new`` for each setting that differs (JSON values), in the order of
    their names; [] when nothing is recorded (a new job, or one of a tfps that recorded nothing)."""
    if not recorded:
        return []
    out = []
    for key in sorted(set(recorded) | set(settings)):
        old, new = recorded.get(key), settings.get(key)
        if old != new:
            out.append(f"{key}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


def recorded(model_dir: str) -> dict | None:
    """The settings recorded in ``model_dir``, or None (no record, or none that can be read)."""
    data = read_json(os.path.join(model_dir, SETTINGS_FILE))
    settings = data.get("settings") if isinstance(data, dict) else None
    return settings if isinstance(settings, dict) else None


def check(model_dir: str, settings: dict, replace: bool = False) -> list[str]:
    """Refuse (ConfigError) a start whose ``settings`` differ from those ``model_dir`` records,
    naming each change and the ways on; with ``replace``, return the changes instead.
    Another number of ps tasks alone (:data:`LAYOUT`) is no change to refuse: it is logged,
    and [] returned. Writes nothing."""
    record = recorded(model_dir)
    found = changes(record, settings)
    if not found:
        return []
    others = [k for k in set(record) | set(settings) if k not in LAYOUT and record.get(k) != settings.get(k)]
    resharded = record.get("ps") is not None and record.get("ps") != settings.get("ps")
    if not others:   # another number of ps tasks only: the checkpoint fits it
        _say_resharded(model_dir, record, settings)
        return []
    listed = "; ".join(found)
    if any(record.get(k) != settings.get(k) for k in MODEL_SHAPE):
        raise ConfigError(f"{model_dir} holds a job of another model, so it was left as it is: {listed}. Its "
                          "checkpoint cannot be continued by another model (not even with --replace): give another "
                          f"--model_dir, or delete or move {model_dir}, or go back to its settings", "model_dir")
    if not replace:
        raise ConfigError(f"{model_dir} holds a job with other settings, so it was left as it is: {listed}. Three "
                          f"ways on: give another --model_dir; or delete or move {model_dir} (`docker compose down "
                          "-v` removes a compose job's volume); or add --replace (to tfps local, tfps compose or "
                          "tfps run), which goes on from its checkpoint with these settings and records them: more "
                          "train_steps continue its training", "model_dir")
    if resharded:
        _say_resharded(model_dir, record, settings)
    return found


def _say_resharded(model_dir: str, record: dict, settings: dict) -> None:
    log.info("%s was saved from %s ps task(s) and goes on with %s: its checkpoint holds each partitioned variable "
             "whole, so it is split again over the %s", model_dir, record.get("ps"), settings.get("ps"),
             settings.get("ps"))


def record(model_dir: str, settings: dict) -> None:
    """Write ``settings`` as the record of ``model_dir`` (the chief, once it owns model_dir)."""
    if recorded(model_dir) == settings:
        return
    try:
        write_json_atomic(os.path.join(model_dir, SETTINGS_FILE),
                          {"settings": settings, "recorded_at": now_iso()})
    except OSError as e:
        raise ConfigError(f"{model_dir} cannot be written: {e.strerror or e}; give --model_dir a directory "
                          "with room that this user may write", "model_dir") from None
