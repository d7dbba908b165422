"""The demo datasets: generated, deterministic, no download at run time.

``ctr`` is a click-through-rate problem: string ids of users and ads drawn from
long-tailed (Zipf) distributions, a site category and a price; whether an example was
clicked depends on a hidden affinity of its user and its ad, which only a model that
embeds the ids can learn (a baseline that ignores them stays near the base rate).
``blobs`` is a tabular 3-class problem (8 features, CSV, two training files so that two
workers read one file each) that an MLP learns to well above 90 % accuracy while chance is
33 %. ``shapes`` is a 12x12 image problem (NPZ) for the CNN: vertical bar, horizontal bar,
or a filled square, under noise. Every process generating them produces identical files,
and writes are atomic, so concurrent tasks may call ``ensure_demo_data`` at once.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

VERSION = "v1"
FEATURES = 8
CLASSES = 3


def default_dir() -> str:
    base = os.environ.get("TFPS_DEMO_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tfps", f"demo-{VERSION}")
    return base


def _atomic_write(path: str, write) -> None:
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w" if path.endswith(".csv") else "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _blobs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    centers = np.random.default_rng(1234).normal(0.0, 2.0, size=(CLASSES, FEATURES))
    y = rng.integers(0, CLASSES, size=n)
    x = centers[y] + rng.normal(0.0, 1.6, size=(n, FEATURES))
    # A non-linear twist so that the MLP beats the linear model, both beat chance.
    x[:, 0] += 0.5 * np.sin(x[:, 1])
    return x.astype(np.float32), y


def _write_csv(path: str, x: np.ndarray, y: np.ndarray) -> None:
    def write(fh):
        fh.write(",".join([f"f{i}" for i in range(x.shape[1])] + ["label"]) + "\n")
        for row, label in zip(x, y):
            fh.write(",".join(f"{v:.5f}" for v in row) + f",{int(label)}\n")
    _atomic_write(path, write)


def _shapes(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, 3, size=n)
    x = rng.normal(0.0, 0.25, size=(n, 12, 12, 1)).astype(np.float32)
    for i, label in enumerate(y):
        r, c = rng.integers(2, 10, size=2)
        if label == 0:
            x[i, 1:11, c, 0] += 1.0
        elif label == 1:
            x[i, r, 1:11, 0] += 1.0
        else:
            x[i, r - 2:r + 2, c - 2:c + 2, 0] += 1.0
    return x, y


CTR_USERS, CTR_ADS = 20_000, 2_000
CTR_HEADER = ("user", "ad", "site", "price", "label")


def _ctr(n: int, rng: np.random.Generator, taste: np.random.Generator) -> list[tuple]:
    """``n`` examples of the CTR set; ``taste`` draws the same hidden affinities every time."""
    user_vec = taste.normal(0.0, 1.0, size=(CTR_USERS, 4))
    ad_vec = taste.normal(0.0, 1.0, size=(CTR_ADS, 4))
    users = np.minimum(rng.zipf(1.3, size=n), CTR_USERS) - 1
    ads = np.minimum(rng.zipf(1.4, size=n), CTR_ADS) - 1
    site = rng.integers(0, 30, size=n)
    price = rng.gamma(2.0, 1.0, size=n)
    score = 1.5 * np.sum(user_vec[users] * ad_vec[ads], axis=1) / 2.0 - 0.2 * price - 0.5
    clicked = rng.random(n) < 1.0 / (1.0 + np.exp(-score))
    return [(f"u{u:05x}", f"a{a:04x}", f"s{s}", round(float(p), 3), int(c))
            for u, a, s, p, c in zip(users, ads, site, price, clicked)]


def _ensure_ctr(d: str) -> None:
    marker = os.path.join(d, "COMPLETE")
    if os.path.exists(marker):
        return
    rng = np.random.default_rng(20261205)

    def writer(rows):
        def write(fh):
            fh.write(",".join(CTR_HEADER) + "\n")
            for row in rows:
                fh.write(",".join(map(str, row)) + "\n")
        return write
    for part in range(2):
        _atomic_write(os.path.join(d, f"train-{part}.csv"), writer(_ctr(30_000, rng, np.random.default_rng(7))))
    _atomic_write(os.path.join(d, "eval.csv"), writer(_ctr(10_000, rng, np.random.default_rng(7))))
    _atomic_write(marker, lambda fh: fh.write(b"ok\n"))


#: Written into a directory before any demo file: what is in it is tfps's own (``COMPLETE``,
#: written last, says so too). ``tfps demo-data DIR`` fills only a directory that is new,
#: empty, or holds one of them (:func:`foreign_entries`).
OWNER_MARKER = ".tfps-demo"


def foreign_entries(directory: str) -> list[str]:
    """The entries of ``directory`` that tfps did not write, sorted: all of them when it holds
    neither marker (``OWNER_MARKER``, ``COMPLETE``); [] for a new, empty or tfps directory."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:   # none yet (or not a directory: writing there says why)
        return []
    if OWNER_MARKER in names or "COMPLETE" in names:
        return []
    return names


def ensure_demo_data(directory: str | None = None) -> dict[str, str]:
    """Create the demo files if missing; return globs for blobs/shapes train and eval."""
    d = directory or default_dir()
    if not os.path.exists(os.path.join(d, "COMPLETE")) and not os.path.exists(os.path.join(d, OWNER_MARKER)):
        _atomic_write(os.path.join(d, OWNER_MARKER), lambda fh: fh.write(b"written by tfps demo-data\n"))
    paths = {
        "blobs_train": os.path.join(d, "blobs", "train-*.csv"),
        "blobs_eval": os.path.join(d, "blobs", "eval.csv"),
        "shapes_train": os.path.join(d, "shapes", "train-*.npz"),
        "shapes_eval": os.path.join(d, "shapes", "eval.npz"),
        "ctr_train": os.path.join(d, "ctr", "train-*.csv"),
        "ctr_eval": os.path.join(d, "ctr", "eval.csv"),
    }
    _ensure_ctr(os.path.join(d, "ctr"))
    marker = os.path.join(d, "COMPLETE")
    if os.path.exists(marker):
        return paths
    rng = np.random.default_rng(20261202)
    for part in range(2):
        _write_csv(os.path.join(d, "blobs", f"train-{part}.csv"), *_blobs(3000, rng))
    _write_csv(os.path.join(d, "blobs", "eval.csv"), *_blobs(1000, rng))
    for part in range(2):
        x, y = _shapes(2000, rng)
        _atomic_write(os.path.join(d, "shapes", f"train-{part}.npz"), lambda fh: np.savez(fh, x=x, y=y))
    x, y = _shapes(600, rng)
    _atomic_write(os.path.join(d, "shapes", "eval.npz"), lambda fh: np.savez(fh, x=x, y=y))
    _atomic_write(marker, lambda fh: fh.write(b"ok\n"))
    return paths


def demo_globs(model: str, directory: str | None = None) -> tuple[str, str]:
    """(train glob, eval glob) of the demo dataset that suits ``model``."""
    p = ensure_demo_data(directory)
    if model == "cnn":
        return p["shapes_train"], p["shapes_eval"]
    if model == "wide_deep":
        return p["ctr_train"], p["ctr_eval"]
    return p["blobs_train"], p["blobs_eval"]
