"""A generated stream of CTR rows whose users churn: the data of bench/run.py's "dynamic" bench.

    .venv/bin/python bench/ctr_stream.py OUT_DIR [--scale 0.01]

At scale 1 the stream has 1.5 M distinct users, 75 k of them active at any moment: the
active users are a window over the user numbers that slides from the first to the last
as the stream goes on, so a user arrives, clicks for about 5 % of the stream, and leaves
for good. Each row is one impression: a user of the window (uniformly), one of ``ADS``
ads and ``SITES`` sites (Zipf-like), a price, and a click drawn from a logistic model of
a per-user taste vector against a per-ad vector, a site bias and the price. Users carry
most of the signal, so a model that keeps a row per live user ranks clicks better than
one whose users share hashed rows.

The training rows are ``train-NNNN.csv`` in time order (many small files: tfps reads 4 at a
time, so time order holds to about 4 files); ``next.csv`` is the part of the stream right
after them, the held-out "next part" that the bench's AUC is measured on. ``stream.json``
holds the figures a bench plans with (rows, users, active users, ids seen by 25 % and
100 % of the stream).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

DISTINCT_USERS = 1_500_000
ACTIVE_USERS = 75_000
#: Rows per user over the stream, on average (each user is seen about this often while active).
ROWS_PER_USER = 8
ADS, SITES = 2000, 200
TASTE_DIM = 4
#: The share of the stream after the training rows that is held out (next.csv).
NEXT_SHARE = 0.03
FILES = 200


def plan(scale: float = 1.0) -> dict:
    """The stream's sizes at ``scale`` (1: 1.5 M distinct users, 75 k active at a time)."""
    distinct = max(200, int(DISTINCT_USERS * scale))
    active = max(20, int(ACTIVE_USERS * scale))
    total = int(distinct * ROWS_PER_USER)
    train = int(total * (1 - NEXT_SHARE))
    files = max(8, min(FILES, train // 2000))
    return {"distinct_users": distinct, "active_users": active, "rows": total, "train_rows": train,
            "next_rows": total - train, "files": files, "ads": ADS, "sites": SITES}


def generate(out_dir: str, scale: float = 1.0, seed: int = 0) -> dict:
    """Write the stream into ``out_dir`` (see the module's doc); returns its plan with the
    distinct users seen by 25 % and 100 % of the training rows."""
    p = plan(scale)
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    distinct, active, total, train = p["distinct_users"], p["active_users"], p["rows"], p["train_rows"]
    taste = rng.normal(0, 1, (distinct, TASTE_DIM)).astype(np.float32)
    user_bias = rng.normal(0, 0.7, distinct).astype(np.float32)
    ad_vec = rng.normal(0, 1, (ADS, TASTE_DIM)).astype(np.float32)
    site_bias = rng.normal(0, 0.5, SITES).astype(np.float32)
    ad_p = 1.0 / np.arange(1, ADS + 1) ** 0.8
    ad_p /= ad_p.sum()
    site_p = 1.0 / np.arange(1, SITES + 1) ** 0.8
    site_p /= site_p.sum()
    # The window's first user at each row: slides linearly from 0 to distinct - active.
    bounds = np.linspace(0, train, p["files"] + 1).astype(int).tolist() + [total]
    seen_at: dict[str, int] = {}
    seen = np.zeros(distinct, bool)
    clicks = 0
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        n = b - a
        lo = (np.arange(a, b) / total * (distinct - active)).astype(np.int64)
        user = lo + rng.integers(0, active, n)
        ad = rng.choice(ADS, n, p=ad_p)
        site = rng.choice(SITES, n, p=site_p)
        price = rng.gamma(2.0, 1.0, n).astype(np.float32)
        logit = (-1.6 + user_bias[user] + 0.8 * np.einsum("ij,ij->i", taste[user], ad_vec[ad]) / np.sqrt(TASTE_DIM)
                 + site_bias[site] - 0.15 * price)
        label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int8)
        name = "next.csv" if i == p["files"] else f"train-{i:04d}.csv"
        with open(os.path.join(out_dir, name), "w") as fh:
            fh.write("user,ad,site,price,label\n")
            fh.writelines(f"u{u:x},a{d},s{s},{pr:.2f},{y}\n" for u, d, s, pr, y in zip(user, ad, site, price, label))
        if i < p["files"]:
            clicks += int(label.sum())
            seen[user] = True
            if a < train // 4 <= b or (a == 0 and train // 4 == 0):
                seen_at["25%"] = int(seen.sum())
    seen_at["100%"] = int(seen.sum())
    p.update(seed=seed, scale=scale, click_rate=round(clicks / train, 4), users_seen=seen_at,
             train_glob=os.path.join(out_dir, "train-*.csv"), next_csv=os.path.join(out_dir, "next.csv"))
    with open(os.path.join(out_dir, "stream.json"), "w") as fh:
        json.dump(p, fh, indent=1)
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--scale", type=float, default=1.0, help="users and rows x this (default 1: 1.5 M users)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(json.dumps(generate(a.out_dir, a.scale, a.seed), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
