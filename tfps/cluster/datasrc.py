"""Training data that lives on the controller (``tfps_data_src``) and data pre-placed on hosts.

``tfps_data_src`` is a directory or a glob on the machine that runs the play. The play
copies to each worker host only the files its workers read, decided here with the
tfps's own rule (:func:`tfps.data.dataset.shard_files`), and writes on every worker host
the job's list of training files (``train_list_path``); the role's ``tfps_data`` action
calls :func:`assign`: each worker then shards that global list
(``--train_data @/input/.tfps-train-files``), not the files that happen to be on its host.
Files keep their path below the source directory, so ``tfps_eval_data`` (read by
the chief) names them as it would in ``tfps_data_dir``.

:func:`compare_hosts` is the check of data placed by hand: every worker host must hold
the same training files, or sharding ``sorted(files)[i::n]`` reads some twice and others
never.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence

from tfps.cluster.plan import DATA_MOUNT
from tfps.cluster.variables import train_list_path
from tfps.data import dataset as data_mod
from tfps.errors import ConfigError

MAGIC = set("*?[")


def _base_and_train(src: str, train_data: str | None) -> tuple[str, str]:
    """(source directory, controller glob of the training files)."""
    src = os.path.expanduser(src)
    if os.path.isdir(src):
        base = src.rstrip("/") or "/"
        rel = _in_mount(train_data, "tfps_train_data") if train_data else "*"
        return base, os.path.join(base, rel)
    if not MAGIC & set(src):
        raise ConfigError(f"{src} does not exist on the controller; give the directory (or a glob of the "
                          "training files) that holds the data on this machine", "tfps_data_src")
    if train_data:
        raise ConfigError(f"is {train_data!r}, but tfps_data_src {src!r} is a glob that already names the "
                          "training files; leave tfps_train_data empty, or make tfps_data_src the directory "
                          "and tfps_train_data the glob in it", "tfps_train_data")
    parts = src.split("/")
    first_magic = next(i for i, p in enumerate(parts) if MAGIC & set(p))
    base = "/".join(parts[:first_magic]) or ("/" if src.startswith("/") else ".")
    if not os.path.isdir(base):
        raise ConfigError(f"{base} (of {src}) is not a directory on the controller; fix the path",
                          "tfps_data_src")
    return base, src


def _in_mount(path: str, var: str) -> str:
    prefix = DATA_MOUNT + "/"
    if not path.startswith(prefix):
        raise ConfigError(f"{path} is not under {DATA_MOUNT}; write it as {prefix}<path in tfps_data_src>", var)
    return path[len(prefix):]


def _controller_files(pattern: str, base: str, var: str) -> list[str]:
    try:
        files = data_mod.find_files(pattern, var)
        return [os.path.relpath(f, base) for f in data_mod.companion_files(files)]
    except ConfigError as exc:
        raise ConfigError(f"on the controller, {exc.message}", var) from None


def assign(src: str, train_data: str | None, eval_data: str | None, worker_hosts: Sequence[str],
           job: str = "train") -> dict:
    """Which files of ``src`` each worker host needs, for workers on ``worker_hosts``.

    ``worker_hosts[i]`` is the host of worker i; worker 0 (the chief) also reads
    ``eval_data``. Returns {"base", "train" (container paths, the list), "hosts" (host ->
    paths relative to base)}. Bad input raises ConfigError naming the variable.
    """
    base, pattern = _base_and_train(src, train_data)
    train = _controller_files(pattern, base, "tfps_data_src" if not train_data else "tfps_train_data")
    images = sorted(f for f in train if "idx1-ubyte" not in os.path.basename(f))
    listed = [f"{DATA_MOUNT}/{rel}" for rel in images]   # the order the tfps sorts them in
    n = len(worker_hosts)
    hosts: dict[str, list[str]] = {}
    for index, host in enumerate(worker_hosts):
        own = data_mod.companion_files([os.path.join(base, rel) for rel in data_mod.shard_files(images, n, index)])
        hosts.setdefault(host, []).extend(os.path.relpath(f, base) for f in own)
    if eval_data:
        evals = _controller_files(os.path.join(base, _in_mount(eval_data, "tfps_eval_data")), base, "tfps_eval_data")
        hosts[worker_hosts[0]].extend(evals)
    return {"base": os.path.abspath(base), "list": train_list_path(job)[len(DATA_MOUNT) + 1:], "train": listed,
            "hosts": {h: sorted(set(files)) for h, files in hosts.items()}}


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def with_checksums(assignment: Mapping) -> dict:
    """The assignment with the sha256 and size of every file it copies (read on the controller)."""
    base = assignment["base"]
    needed = sorted({rel for files in assignment["hosts"].values() for rel in files})
    files = {rel: {"sha256": sha256(os.path.join(base, rel)), "size": os.path.getsize(os.path.join(base, rel))}
             for rel in needed}
    return {**assignment, "files": files}


def list_text(assignment: Mapping) -> str:
    """The list file's content: what ``--train_data @FILE`` reads."""
    return "# the job's training files, in the order the workers shard them (written by tfps)\n" + "".join(
        f"{path}\n" for path in assignment["train"])


def compare_hosts(listings: Mapping[str, Mapping[str, Mapping]], what: str) -> list[str]:
    """Problems of hand-placed data: host -> {relative path: {"size", "sha256"?}} must agree.

    Returns one message per host whose files differ from the first host's (the chief's
    host comes first), naming the files; empty when every host holds the same data.
    """
    hosts = list(listings)
    if len(hosts) < 2:
        return []
    ref_host = hosts[0]
    ref = listings[ref_host]
    problems = []
    for host in hosts[1:]:
        mine = listings[host]
        diffs = []
        lacking = sorted(set(ref) - set(mine))
        extra = sorted(set(mine) - set(ref))
        if lacking:
            diffs.append(f"lacks {', '.join(lacking)}")
        if extra:
            diffs.append(f"has {', '.join(extra)} that {ref_host} has not")
        for rel in sorted(set(ref) & set(mine)):
            a, b = ref[rel], mine[rel]
            if a.get("size") != b.get("size"):
                diffs.append(f"{rel} is {b.get('size')} bytes, on {ref_host} {a.get('size')}")
            elif a.get("sha256") and b.get("sha256") and a["sha256"] != b["sha256"]:
                diffs.append(f"{rel} differs from {ref_host}'s (sha256)")
        if diffs:
            problems.append(f"{host}: its training data ({what}) differs from {ref_host}'s: {'; '.join(diffs)}. "
                            "The workers shard the sorted file list, so they would read some files twice and "
                            "others never; make tfps_data_dir the same on every worker host, or let the play "
                            "copy the data from the controller with tfps_data_src")
    return problems
