"""The job's record on the chief's disk: results.json, history.jsonl, the run identity.

Only the chief writes here. ``tfps_run.json`` identifies the job that owns a model_dir so
that a new, different job never silently resumes from another job's checkpoints.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile

from trainer.errors import ConfigError

RESULTS = "results.json"
HISTORY = "history.jsonl"
RUN_IDENTITY = "tfps_run.json"


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: str, data: dict) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def append_history(model_dir: str, record: dict) -> None:
    with open(os.path.join(model_dir, HISTORY), "a") as fh:
        fh.write(json.dumps(record) + "\n")


def read_jsonl(path: str) -> list:
    """The records of a JSON-lines file; a line cut short by a kill is skipped."""
    out = []
    try:
        with open(path) as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def read_history(model_dir: str) -> list[dict]:
    return read_jsonl(os.path.join(model_dir, HISTORY))


def check_model_dir(model_dir: str, identity: dict) -> bool | None:
    """Refuse a ``model_dir`` that holds another job; write nothing.

    Returns True when it holds this job's checkpoints (a resume), False when it is this
    job's without checkpoints, None when no job owns it yet.
    """
    has_ckpt = os.path.exists(os.path.join(model_dir, "checkpoint"))
    existing = read_json(os.path.join(model_dir, RUN_IDENTITY))
    if existing is None:
        if has_ckpt:
            raise ConfigError(f"{model_dir} holds checkpoints that tfps did not write; use a new --model_dir "
                              "or move them away", "model_dir")
        return None
    diff = [k for k in identity if existing.get(k) != identity[k]]
    if diff:
        what = ", ".join(f"{k} {existing.get(k)!r} (now {identity[k]!r})" for k in diff)
        raise ConfigError(f"{model_dir} belongs to another job: {what}. Use a new --model_dir, or the same "
                          "settings to resume it", "model_dir")
    return has_ckpt


def claim_model_dir(model_dir: str, identity: dict) -> bool:
    """Record which job owns ``model_dir``; refuse a directory that holds another job.

    Returns True when the directory already holds this job's checkpoints (a resume).
    """
    owned = check_model_dir(model_dir, identity)
    if owned is not None:
        return owned
    os.makedirs(model_dir, exist_ok=True)
    write_json_atomic(os.path.join(model_dir, RUN_IDENTITY), {**identity, "created_at": now_iso()})
    return False


#: Written into the SavedModel directory last: its presence means the export is complete.
EXPORT_MARKER = "tfps_export.json"


def export_complete(export_dir: str) -> bool:
    """Whether ``export_dir`` holds a whole SavedModel (the chief's export writes the marker last)."""
    return os.path.isfile(os.path.join(export_dir, EXPORT_MARKER)) and \
        os.path.isfile(os.path.join(export_dir, "saved_model.pb"))
