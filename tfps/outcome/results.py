"""The job's files on the chief's disk: history.jsonl, the run identity, the export marker.

results.json itself is written and read through ``tfps.outcome.contract.JobResult``.

Only the chief writes here. ``tfps_run.json`` identifies the job that owns a model_dir so
that a new, different job never silently resumes from another job's checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from tfps.errors import ConfigError
from tfps.jsonfile import now_iso, read_json, write_json_atomic  # noqa: F401 - also results.now_iso, ...
from tfps.outcome.contract import has_total, step_of
from tfps.outcome.lock import LOCK_FILE

RESULTS = "results.json"
#: The chief's line once it sent the job's end message although results.json could not be
#: written (a full disk): the launcher that reads the chief's output then sends no second
#: message in its place (tfps.launch.summary).
SENT_WITHOUT_RESULTS = "the job's end message went out without results.json"
HISTORY = "history.jsonl"
#: The running job as the chief's watch last saw it (rewritten every few seconds while it
#: trains): what ``tfps local``'s status line shows. Not a record: results.json is that.
STATUS = "status.json"


def write_status(model_dir: str, status: dict) -> None:
    write_json_atomic(os.path.join(model_dir, STATUS), status)


def read_status(model_dir: str) -> dict | None:
    found = read_json(os.path.join(model_dir, STATUS))
    return found if isinstance(found, dict) else None
RUN_IDENTITY = "tfps_run.json"
#: ``tfps local`` keeps each task's output in ``MODEL_DIR.logs/TASK.log``: beside the model_dir,
#: never in it (a model_dir holds only what the chief writes), as tfps slurm's MODEL_DIR.slurm/.
LOG_DIR_SUFFIX = ".logs"


def log_dir(model_dir: str) -> str:
    """Where ``tfps local`` keeps the task logs of the job in ``model_dir`` (``tfps logs --local``)."""
    return os.path.abspath(model_dir).rstrip(os.sep) + LOG_DIR_SUFFIX


def append_history(model_dir: str, record: dict) -> None:
    with open(os.path.join(model_dir, HISTORY), "a") as fh:
        fh.write(json.dumps(record) + "\n")


def progress_line(record: dict | None, earlier: dict | None, total: int) -> str:
    """One line of where a job stands, from its newest history record (and an earlier one,
    for the rate): ``step 1200/3000 (40%) | loss 0.4121 | 5123 examples/s | ETA 37 s``."""
    if not record:
        return f"step 0/{total}: starting (no training step recorded yet)"
    step = int(record.get("step", 0))
    share = f" ({100 * min(step, total) / max(total, 1):.0f}%)" if has_total(total) else ""
    parts = [f"step {step_of(step, total)}{share}"]
    if isinstance(record.get("loss"), (int, float)):
        parts.append(f"loss {record['loss']:.4f}")
    if record.get("examples_per_sec"):
        parts.append(f"{record['examples_per_sec']:.0f} examples/s")
    eta = eta_seconds(record, earlier, total)
    if eta is not None:
        parts.append(f"ETA {eta:.0f} s")
    return " | ".join(parts)


def eta_seconds(record: dict | None, earlier: dict | None, total: int) -> float | None:
    """Seconds to ``total`` steps at the rate between two history records; None without a rate
    or without a total (a followed job)."""
    if not has_total(total):
        return None
    if not (record and earlier and record.get("time") and earlier.get("time") and record["time"] > earlier["time"]):
        return None
    step = int(record.get("step", 0))
    rate = (step - int(earlier.get("step", 0))) / (record["time"] - earlier["time"])
    return max(total - step, 0) / rate if rate > 0 else None


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


#: Free space a model_dir or export_dir must have before a job starts (two checkpoints and
#: an export of the models tfps is used with fit many times over).
MIN_FREE_BYTES = 64 << 20

#: Entries a directory may hold that nobody put there on purpose (a file system's root).
_BENIGN = {"lost+found", LOCK_FILE}


def _foreign(directory: str, own: set[str] | None = None) -> list[str]:
    """Entries of ``directory`` that tfps did not write (hidden temporary files of ours aside)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [n for n in names if n not in _BENIGN and n not in (own or set()) and not n.startswith(".tmp-")]


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def check_writable_dir(path: str, field: str) -> None:
    """Refuse a directory tfps must write into that is a file, or lies where it cannot write."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{path} is a file, not a directory; give --{field} a directory (new or empty)", field)
    base = _nearest_existing(path)
    if not os.path.isdir(base):
        raise ConfigError(f"{path} cannot be created: {base} is a file; give --{field} another path", field)
    try:   # a real write: permissions alone miss read-only mounts, and root passes every access check
        fd, probe = tempfile.mkstemp(dir=base, prefix=".tmp-tfps-probe-")
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{path} cannot be written: {base}: {e.strerror or e}; give --{field} a directory "
                          "this user may write, on a disk with room", field) from None
    free = shutil.disk_usage(base).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(f"{path} is on a disk with only {free / 2**20:.0f} MiB free, and checkpoints and the "
                          f"export need at least {MIN_FREE_BYTES // 2**20} MiB; free some space or give "
                          f"--{field} another disk", field)


def check_export_dir(export_dir: str, model_dir: str) -> None:
    """Refuse an export directory that holds anything but a tfps export, before the job starts.

    The chief switches a new export into the directory's place, carrying over what a user
    added to a tfps export; a directory that is not a tfps export (no marker tfps wrote) but
    holds files is refused, and so is a file at that path, and model_dir or a directory above it.
    """
    exp, md = os.path.realpath(export_dir), os.path.realpath(model_dir)
    if md == exp or md.startswith(exp.rstrip(os.sep) + os.sep):
        raise ConfigError(f"{export_dir} is or holds the model_dir {model_dir}, and the export replaces its "
                          "directory as a whole; give --export_dir a directory of its own (default "
                          "MODEL_DIR/export)", "export_dir")
    check_writable_dir(export_dir, "export_dir")
    # A tfps export's other files are carried into the next one (tfps.task.output.export.switch_into_place);
    # a directory without a marker tfps wrote is not an export, and a user's files in it are refused.
    if os.path.isdir(export_dir) and read_export_marker(export_dir) is None:
        # A base path of versions (--export_every, tfps.task.output.versions): integer directories
        # that each hold a tfps export are tfps's own.
        versions = {n for n in _foreign(export_dir)
                    if n.isdigit() and read_export_marker(os.path.join(export_dir, n)) is not None}
        foreign = _foreign(export_dir, versions)
        if foreign:
            raise ConfigError(f"{export_dir} holds files that tfps did not write ({_shown(foreign)}) and is not a "
                              "tfps export; give --export_dir a new or empty directory, or move those files away",
                              "export_dir")


def check_model_dir(model_dir: str, identity: dict) -> bool | None:
    """Refuse a ``model_dir`` that holds another job, or files tfps did not write; write nothing.

    Returns True when it holds this job's checkpoints (a resume), False when it is this
    job's without checkpoints, None when no job owns it yet.
    """
    check_writable_dir(model_dir, "model_dir")
    has_ckpt = os.path.exists(os.path.join(model_dir, "checkpoint"))
    existing = read_json(os.path.join(model_dir, RUN_IDENTITY))
    if existing is None:
        if has_ckpt:
            raise ConfigError(f"{model_dir} holds checkpoints that tfps did not write; use a new --model_dir "
                              "or move them away", "model_dir")
        foreign = _foreign(model_dir)
        if foreign:
            raise ConfigError(f"{model_dir} holds files that tfps did not write ({_shown(foreign)}); give "
                              "--model_dir a new or empty directory (tfps resumes only a model_dir of its own)",
                              "model_dir")
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
    try:
        os.makedirs(model_dir, exist_ok=True)
        write_json_atomic(os.path.join(model_dir, RUN_IDENTITY), {**identity, "created_at": now_iso()})
    except OSError as e:
        raise ConfigError(f"{model_dir} cannot be written: {e.strerror or e}; give --model_dir a directory "
                          "with room that this user may write", "model_dir") from None
    return False


#: Written into the SavedModel directory last: its presence means the export is complete.
EXPORT_MARKER = "tfps_export.json"


#: What tfps writes into an export directory; anything else there is a user's and is kept.
EXPORT_OWN = frozenset({EXPORT_MARKER, "saved_model.pb", "saved_model.pbtxt", "variables", "assets",
                        "fingerprint.pb"})


def read_export_marker(export_dir: str) -> dict | None:
    """The marker of a tfps export in ``export_dir``; None when there is none, or it is not one
    tfps wrote (a ``{}``, another program's file of the same name)."""
    marker = read_json(os.path.join(export_dir, EXPORT_MARKER))
    if not isinstance(marker, dict):
        return None
    step, checkpoint = marker.get("global_step"), marker.get("checkpoint")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or not isinstance(checkpoint, str) \
            or not isinstance(marker.get("completed_at"), str):
        return None
    return marker


def export_complete(export_dir: str) -> bool:
    """Whether ``export_dir`` holds a whole SavedModel (the chief's export writes the marker last)."""
    return read_export_marker(export_dir) is not None and \
        os.path.isfile(os.path.join(export_dir, "saved_model.pb"))
