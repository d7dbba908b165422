"""Delta checkpoints on disk: how one is written, checked, and applied at a restore.

Layout (docs/explanation/delta-checkpoints.md)::

    MODEL_DIR/model.ckpt-400.index ...          the newest full checkpoint (the base)
    MODEL_DIR/deltas/model.ckpt-400.000001/     its first delta, then .000002, ...
        dense.index, dense.data-00000-of-00001  every variable but the dynamic tables, whole
                                                (a Saver's checkpoint: the global step, the
                                                stream position, dense and hashed variables)
        tables.npz                              per table: touched rows (keys, values, slots,
                                                last_seen), evicted keys or the live key set
        manifest.json                           base, sequence, step, bytes + sha256 per file

A delta is written in ``deltas/.tmp-...``, each file fsynced, then renamed whole: a reader
sees every file of it or none. The restore (:func:`consolidate`, before the chief's session
restores) takes the newest full checkpoint, applies its deltas in sequence order, stops at
the first one that is missing, incomplete or does not match its manifest (one log line:
which, why, the step restored to), and writes the result as an ordinary full checkpoint
``model.ckpt-<step>``: the Saver's own restore then loads it, into any number of ps. Deltas
of an older base are covered by a newer full checkpoint and removed.

Only the chief calls this; TensorFlow is imported where a checkpoint is read or written.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time

import numpy as np

from tfps.cluster.datasrc import sha256
from tfps.task.output.checkpoint import checkpoint_step, glob_free_checkpoint

log = logging.getLogger("tfps")

DELTAS = "deltas"
MANIFEST = "manifest.json"
DENSE = "dense"
TABLES = "tables.npz"
FORMAT = 1
_NAME = re.compile(r"^(?P<base>.+)\.(?P<seq>\d{6})$")


class BadDelta(Exception):
    """A delta that must not be applied; the message says why, in a few words."""


def delta_dir(model_dir: str, base: str, seq: int) -> str:
    return os.path.join(model_dir, DELTAS, f"{os.path.basename(base)}.{seq:06d}")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(model_dir: str, base: str, seq: int, step: int, since: int, save_dense, tables: dict) -> dict:
    """Write delta ``seq`` of full checkpoint ``base`` atomically; returns its manifest.

    ``save_dense(prefix)`` writes the dense part (a Saver's save) and returns the global step
    it holds (the delta's step; ``step`` if None); ``tables``: ``{table:
    {tensor: array}}``. A failure leaves no delta (the temporary directory is removed)."""
    final = delta_dir(model_dir, base, seq)
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(final)}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        step = save_dense(os.path.join(tmp, DENSE)) or step
        np.savez(os.path.join(tmp, TABLES), **{f"{t}//{k}": v for t, got in tables.items() for k, v in got.items()})
        files = {}
        for name in sorted(os.listdir(tmp)):
            path = os.path.join(tmp, name)
            _fsync(path)
            files[name] = {"bytes": os.path.getsize(path), "sha256": sha256(path)}
        manifest = {"format": FORMAT, "base": os.path.basename(base), "sequence": seq, "step": int(step),
                    "since": int(since), "written": round(time.time(), 3), "files": files,
                    "tables": {t: {"rows": int(len(got["keys"])),
                                   "evicted": int(len(got["evicted"])) if "evicted" in got else None,
                                   "live_keys": int(len(got["live_keys"])) if "live_keys" in got else None}
                               for t, got in tables.items()}}
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        _fsync(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def nbytes(manifest: dict) -> int:
    return sum(f["bytes"] for f in manifest["files"].values())


def check(path: str, base: str, seq: int) -> dict:
    """The manifest of the delta at ``path`` when every file matches it; else BadDelta."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise BadDelta("it has no manifest") from None
    except (OSError, ValueError) as e:
        raise BadDelta(f"its manifest does not read ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"),
                                                                                            dict):
        raise BadDelta("its manifest is not one tfps wrote")
    if manifest.get("base") != os.path.basename(base) or manifest.get("sequence") != seq:
        raise BadDelta(f"its manifest names {manifest.get('base')} delta {manifest.get('sequence')}")
    for name, want in sorted(manifest["files"].items()):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise BadDelta(f"{name} is missing")
        size = os.path.getsize(file)
        if size != want.get("bytes"):
            raise BadDelta(f"{name} is {size} bytes, the manifest says {want.get('bytes')}")
        if sha256(file) != want.get("sha256"):
            raise BadDelta(f"{name} does not match its checksum")
    if TABLES not in manifest["files"] or f"{DENSE}.index" not in manifest["files"]:
        raise BadDelta("its manifest lists no dense or table part")
    return manifest


def _base_deltas(model_dir: str, base: str) -> dict[int, str]:
    """``{sequence: path}`` of the deltas of ``base`` (names only; nothing is read)."""
    root = os.path.join(model_dir, DELTAS)
    found = {}
    for name in os.listdir(root) if os.path.isdir(root) else ():
        m = _NAME.match(name)
        if m and m["base"] == os.path.basename(base):
            found[int(m["seq"])] = os.path.join(root, name)
    return found


def prune(model_dir: str, keep_base: str | None) -> list[str]:
    """Remove the deltas of every base but ``keep_base`` (covered by a newer full checkpoint, or
    left over from a chain that a restore ended), and unfinished temporaries. Returns the names."""
    root = os.path.join(model_dir, DELTAS)
    removed = []
    keep = os.path.basename(keep_base) if keep_base else None
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        m = _NAME.match(name)
        if name.startswith(".tmp-") and not name.endswith(f"-{os.getpid()}") or (m and m["base"] != keep):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


def _merge_table(full: dict, delta: dict) -> dict:
    """A table's checkpoint tensors (keys, values, last_seen, slots/..., sketch) after ``delta``."""
    keys = full["keys"]
    if "live_keys" in delta:   # the first delta of a chain: the live keys are the authority
        keep = np.isin(keys, delta["live_keys"]) & ~np.isin(keys, delta["keys"])
    else:
        keep = ~np.isin(keys, np.concatenate([delta["evicted"], delta["keys"]]))
    out = {}
    for name, value in full.items():
        if name == "sketch":
            out[name] = delta.get("sketch", value)
        else:
            out[name] = np.concatenate([value[keep], delta[name].astype(value.dtype, copy=False)], 0)
    return out


def _table_names(names) -> set[str]:
    return {n[: -len("/keys")] for n in names if n.endswith("/keys") and f"{n[:-len('/keys')]}/last_seen" in names}


def apply(base: str, deltas: list[str]) -> tuple[dict, dict]:
    """The tensors of ``base`` with ``deltas`` (checked paths) applied in order: ``({name: array},
    {name: dtype})`` as a checkpoint holds them."""
    import tensorflow as tf  # lazy: the chief's restore only; the module stays light
    reader = tf.train.load_checkpoint(base)
    dtypes = reader.get_variable_to_dtype_map()
    names = set(dtypes)
    tables = _table_names(names)
    values = {n: reader.get_tensor(n) for n in names}
    for path in deltas:
        dense = tf.train.load_checkpoint(os.path.join(path, DENSE))
        for n in dense.get_variable_to_dtype_map():
            if n in names:
                values[n] = dense.get_tensor(n)
        with np.load(os.path.join(path, TABLES)) as z:
            got: dict[str, dict] = {}
            for key in z.files:
                t, _, k = key.partition("//")
                got.setdefault(t, {})[k] = z[key]
        for t in tables:
            if t not in got:
                continue
            own = {n[len(t) + 1:]: n for n in names if n.startswith(t + "/")}
            full = {k: values[n] for k, n in own.items()
                    if k in ("keys", "values", "last_seen", "sketch") or k.startswith("slots/")}
            for k, v in _merge_table(full, got[t]).items():
                values[f"{t}/{k}"] = v
    return values, dtypes


def _write_checkpoint(prefix: str, values: dict, dtypes: dict) -> None:
    """An ordinary V2 checkpoint of ``values`` at ``prefix`` (one SaveV2 in a graph of its own)."""
    import tensorflow as tf  # lazy: the chief's restore only; the module stays light
    v1 = tf.compat.v1
    names = sorted(values)
    with tf.Graph().as_default() as g:
        feeds = [v1.placeholder(dtypes[n], name=None) for n in names]
        op = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                               tensors=feeds)
        with v1.Session(graph=g) as s:
            s.run(op, dict(zip(feeds, (values[n] for n in names))))


def consolidate(model_dir: str) -> str | None:
    """Before a restore: the newest full checkpoint with its good deltas applied, written as a full
    checkpoint ``model.ckpt-<step>`` and made the newest; returns the path to restore (None:
    no checkpoint). A bad delta ends the chain in one log line."""
    import tensorflow as tf  # lazy: the chief's restore only; the module stays light
    v1 = tf.compat.v1
    base = tf.train.latest_checkpoint(model_dir)
    if not base:
        prune(model_dir, None)
        return None
    found = _base_deltas(model_dir, base)
    good, step, why = [], checkpoint_step(base), None
    for seq in range(1, max(found, default=0) + 1):
        if seq not in found:
            why = f"delta {seq} of {os.path.basename(base)} is missing"
            break
        try:
            manifest = check(found[seq], base, seq)
        except BadDelta as e:
            why = f"delta {seq} of {os.path.basename(base)} ({found[seq]}) is not applied: {e}"
            break
        if manifest["step"] <= step:
            why = f"delta {seq} of {os.path.basename(base)} is not applied: its step {manifest['step']} does not " \
                  f"follow step {step}"
            break
        good.append(found[seq])
        step = manifest["step"]
    if not good:
        if why:
            log.warning("chief: %s; restoring step %d (%s, no delta)", why, step, os.path.basename(base))
        prune(model_dir, base)
        return base
    t0 = time.monotonic()
    out = os.path.join(model_dir, f"model.ckpt-{step}")
    try:
        values, dtypes = apply(base, good)
        _write_checkpoint(glob_free_checkpoint(out), values, dtypes)
    except (tf.errors.OpError, OSError, ValueError, KeyError) as e:   # a full disk, say: the full one alone
        text = str(getattr(e, "message", e)).strip().splitlines()
        log.warning("chief: the deltas of %s could not be applied (%s); restoring step %d from it alone",
                    os.path.basename(base), text[-1] if text else type(e).__name__, checkpoint_step(base))
        return base
    state = tf.train.get_checkpoint_state(model_dir)
    paths = [os.path.basename(p) for p in (state.all_model_checkpoint_paths if state else [])]
    paths = [p for p in paths if p != os.path.basename(out)] + [os.path.basename(out)]
    v1.train.update_checkpoint_state(model_dir, os.path.basename(out), all_model_checkpoint_paths=paths)
    text = (f"{os.path.basename(base)} + {len(good)} delta(s) -> {os.path.basename(out)} "
            f"({time.monotonic() - t0:.1f} s)")
    if why:
        log.warning("chief: %s; restoring step %d (%s)", why, step, text)
    else:
        log.info("chief: restoring step %d from %s", step, text)
    prune(model_dir, out)
    return out
