"""One running job per model_dir: an exclusive ``flock`` on ``MODEL_DIR/.tfps.lock``.

Two jobs writing one model_dir at once restore each other's checkpoints mid-run and both
end "succeeded". So whoever runs a job holds this lock for as long as it runs: ``tfps local``
(the launcher, before any task starts), and the chief task itself (``tfps run``, whatever
started it: compose, the Ansible role, a Slurm step). The lock is the kernel's: it dies with
the process that holds it (crash, SIGKILL, reboot), so a lock file left by a dead process
never blocks; on NFS, Linux's ``flock`` is a whole-file POSIX lock that every client sees.

The file names its holder (pid, host, who started it, the job) for the refusal's one
line; the holder rewrites it when it takes the lock. A chief whose own launcher (an
ancestor process) holds the lock goes on under it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time

from tfps.errors import ConfigError
from tfps.jsonfile import now_iso

#: The lock file in model_dir (tfps's own: never a user's file).
LOCK_FILE = ".tfps.lock"

#: Locks this process holds, by model_dir: kept open for as long as the process lives.
_HELD: dict[str, object] = {}


def lock_path(model_dir: str) -> str:
    return os.path.join(model_dir, LOCK_FILE)


def holder(model_dir: str) -> dict | None:
    """The live holder of ``model_dir``'s lock as its file names it, or None when nobody holds it.

    Takes no lock that stays taken and creates nothing."""
    path = lock_path(model_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in _BUSY:
                return None
            return _read_record(fd)
        return None     # free (a file left by a dead holder): the shared lock goes with the close
    finally:
        os.close(fd)


#: The errors of a lock that someone else holds.
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
#: Tries at an exclusive lock, a short pause apart: a concurrent :func:`holder` takes a shared
#: lock for an instant, which must not read as a running job.
_TRIES, _PAUSE_SECS = 5, 0.05


def _lock_now(fd: int) -> None:
    for attempt in range(_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in _BUSY or attempt == _TRIES - 1:
                raise
            time.sleep(_PAUSE_SECS)


def _read_record(fd: int) -> dict:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode(errors="replace") or "{}")
    except (OSError, ValueError):
        data = {}
    return data if isinstance(data, dict) else {}


def describe(record: dict) -> str:
    """``job 'mlp' (tfps local, pid 123 on host1, since 2026-...)``, from what the file holds."""
    parts = [str(record["by"])] if record.get("by") else []
    if record.get("pid"):
        parts.append(f"pid {record['pid']}" + (f" on {record['host']}" if record.get("host") else ""))
    if record.get("since"):
        parts.append(f"since {record['since']}")
    job = f"job {record['job']!r}" if record.get("job") else "another job"
    return job + (f" ({', '.join(parts)})" if parts else " (its holder did not say who it is)")


def refusal(model_dir: str, record: dict) -> ConfigError:
    return ConfigError(f"{model_dir} is in use by {describe(record)}; wait until it ends (or stop it), or give "
                       "this run another --model_dir", "model_dir")


def check_free(model_dir: str) -> None:
    """Refuse (one line) when a live process holds ``model_dir``'s lock; take nothing."""
    record = holder(model_dir)
    if record is not None:
        raise refusal(model_dir, record)


def _ancestors() -> set[int]:
    """This process's ancestors' pids (from /proc; empty where there is none)."""
    found: set[int] = set()
    pid = os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                text = fh.read()
            pid = int(text[text.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def acquire(model_dir: str, job: str, by: str) -> bool:
    """Take ``model_dir``'s lock for the life of this process (creating model_dir), or refuse in one
    line when another live process holds it. True when this process took it, False when it
    already held it or its own launcher (an ancestor on this host) does."""
    key = os.path.abspath(model_dir)
    if key in _HELD:
        return False
    try:
        os.makedirs(model_dir, exist_ok=True)
        fd = os.open(lock_path(model_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigError(f"{model_dir} cannot be written: {e.strerror or e}; give --model_dir a directory "
                          "with room that this user may write", "model_dir") from None
    try:
        _lock_now(fd)
    except OSError as e:
        record = _read_record(fd)
        os.close(fd)
        if e.errno not in _BUSY:
            raise ConfigError(f"cannot lock {lock_path(model_dir)}: {e.strerror or e}; give --model_dir a "
                              "directory on a filesystem with file locks", "model_dir") from None
        if record.get("host") == socket.gethostname() and record.get("pid") in _ancestors():
            return False     # tfps local holds it for its own chief
        raise refusal(model_dir, record) from None
    record = {"pid": os.getpid(), "host": socket.gethostname(), "by": by, "job": job, "since": now_iso()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    _HELD[key] = fd
    return True


def release(model_dir: str) -> None:
    """Give the lock up before this process ends (the kernel does it at exit anyway)."""
    fd = _HELD.pop(os.path.abspath(model_dir), None)
    if fd is not None:
        os.close(fd)


def chief_holder() -> str:
    """Who started this chief, for the lock's record: read from the environment it runs in."""
    if os.environ.get("SLURM_JOB_ID"):
        return f"the chief of Slurm job {os.environ['SLURM_JOB_ID']} (tfps slurm)"
    if os.environ.get("TFPS_HOST"):
        return f"the chief of an Ansible deploy on {os.environ['TFPS_HOST']} (tfps deploy)"
    if os.path.exists("/.dockerenv"):
        return f"the chief in container {socket.gethostname()} (docker compose or tfps deploy)"
    return "a chief started by tfps run"
