"""A generated stream of CTR rows whose users churn: the data of bench/run.py's "dynamic" bench.

    .venv/bin/python bench/ctr_stream.py OUT_DIR [--scale 0.01]

At scale 1 the stream has 1 M distinct users, 50 k of them active at any moment. Each user
arrives at its own time (user numbers in order of arrival), stays for about 5 % of the
stream and leaves for good, so the active users are a window that slides over the user
numbers. While active, a user makes impressions at its own rate: users' activity is
log-normal (sigma 1), as in real CTR logs, where a minority of heavy users makes most of
the rows. A user has 12 rows over its life on average, and the row of a typical
impression belongs to a user with about 30 (the rows-weighted mean, 12 x e).

Each row is one impression: a user, one of ``ADS`` ads (Zipf-like; each ad in one of
``CATEGORIES`` categories) and one of ``SITES`` sites (Zipf-like), a price, and a click
drawn from a logistic model: a per-user click propensity (a bias, normal with sd
``USER_BIAS_SD``: at the base rate, users' click rates spread from about 5 % to 40 % within
one sd of the log-odds), a per-user taste (``TASTE_DIM`` numbers) against the ad's
category, an ad and a site bias, and the price. The user carries most of the signal, and a
user is seen often enough to learn it, so a model that keeps a row per live user (and
starts each new user's row fresh) ranks clicks better than one whose users share hashed
rows with other users, live or gone. What the model sees is the ids (user, ad, site) and
the price; categories, biases and tastes stay hidden.

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

DISTINCT_USERS = 1_000_000
ACTIVE_USERS = 50_000
#: Rows per user over its life, on average; activity is log-normal with this sigma, so
#: the user of a typical row has ROWS_PER_USER * e**(sigma**2) rows (about 33).
ROWS_PER_USER = 12
ACTIVITY_SIGMA = 1.0
USER_BIAS_SD = 1.0
TASTE_DIM = 2
ADS, SITES, CATEGORIES = 2000, 200, 20
#: The share of the stream after the training rows that is held out (next.csv).
NEXT_SHARE = 0.03
FILES = 200


def plan(scale: float = 1.0, next_share: float = NEXT_SHARE) -> dict:
    """The stream's sizes at ``scale`` (1: 1 M distinct users, 50 k active at a time)."""
    distinct = max(200, int(DISTINCT_USERS * scale))
    active = max(20, int(ACTIVE_USERS * scale))
    total = int(distinct * ROWS_PER_USER)
    train = int(total * (1 - next_share))
    files = max(8, min(FILES, train // 2000))
    return {"distinct_users": distinct, "active_users": active, "rows": total, "train_rows": train,
            "next_rows": total - train, "files": files, "ads": ADS, "sites": SITES}


def generate(out_dir: str, scale: float = 1.0, seed: int = 0, drift: float = 0.0,
             next_share: float = NEXT_SHARE) -> dict:
    """Write the stream into ``out_dir`` (see the module's doc); returns its plan with the
    distinct users seen by 25 % and 100 % of the training rows.

    ``drift`` (0: none, the dynamic bench's stream) makes the ads drift over the stream
    (the stream bench, bench/sec_stream.py): by time t in [0, 1) the ads' popularity ranks
    have rotated by ``drift * t * ADS`` places (the popular ads of the end were rare at the
    start), and each ad's bias has turned from its first value towards an independent
    second one by the angle ``drift * t * pi / 2`` (at drift 1 the end's ad biases are
    unrelated to the start's). Drawn from a generator of its own: at drift 0 the stream is
    the same row for row as without it. ``next_share``: the share of the stream held out as
    next.csv (the stream bench holds out more, for a steadier AUC)."""
    p = plan(scale, next_share)
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    distinct, active, total, train = p["distinct_users"], p["active_users"], p["rows"], p["train_rows"]
    # Time runs over [0, 1). User u arrives at -life + u / distinct * (1 + life) and stays
    # for `life`: `active` users are there at any time, and every user's stay overlaps the stream.
    life = active / (distinct - active)
    arrive = -life + np.arange(distinct) / distinct * (1 + life)
    activity = rng.lognormal(-ACTIVITY_SIGMA ** 2 / 2, ACTIVITY_SIGMA, distinct)   # mean 1
    # Rows of each user in [0, 1): its activity x its share of the stream's rows while it is there.
    inside = np.clip(arrive + life, 0, 1) - np.clip(arrive, 0, 1)
    expected = activity * inside
    expected *= total / expected.sum()
    user = np.repeat(np.arange(distinct), rng.poisson(expected))
    t = np.clip(arrive[user], 0, None) + rng.random(len(user)) * inside[user]
    user = user[np.argsort(t, kind="stable")]
    total = len(user)
    train = int(total * (1 - next_share))
    bias = rng.normal(0, USER_BIAS_SD, distinct).astype(np.float32)
    taste = rng.normal(0, 1, (distinct, TASTE_DIM)).astype(np.float32)
    category = rng.permutation(ADS) % CATEGORIES
    cat_vec = rng.normal(0, 1, (CATEGORIES, TASTE_DIM)).astype(np.float32)
    ad_bias = rng.normal(0, 0.3, ADS).astype(np.float32)
    site_bias = rng.normal(0, 0.5, SITES).astype(np.float32)
    ad_p = 1.0 / np.arange(1, ADS + 1) ** 0.8
    ad_p /= ad_p.sum()
    site_p = 1.0 / np.arange(1, SITES + 1) ** 0.8
    site_p /= site_p.sum()
    drift_rng = np.random.default_rng([seed, 1])
    ad_bias_late = drift_rng.normal(0, 0.3, ADS).astype(np.float32)
    bounds = np.linspace(0, train, p["files"] + 1).astype(int).tolist() + [total]
    seen_at: dict[str, int] = {}
    seen = np.zeros(distinct, bool)
    clicks = 0
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        n, u = b - a, user[a:b]
        ad = rng.choice(ADS, n, p=ad_p)
        biases = ad_bias
        if drift:
            when = a / max(total, 1)
            ad = (ad + int(drift * when * ADS)) % ADS
            turn = drift * when * np.pi / 2
            biases = (np.cos(turn) * ad_bias + np.sin(turn) * ad_bias_late).astype(np.float32)
        site = rng.choice(SITES, n, p=site_p)
        price = rng.gamma(2.0, 1.0, n).astype(np.float32)
        logit = (-1.8 + bias[u] + 0.7 * np.einsum("ij,ij->i", taste[u], cat_vec[category[ad]])
                 + biases[ad] + site_bias[site] - 0.15 * price)
        label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int8)
        name = "next.csv" if i == p["files"] else f"train-{i:04d}.csv"
        with open(os.path.join(out_dir, name), "w") as fh:
            fh.write("user,ad,site,price,label\n")
            fh.writelines(f"u{x:x},a{d},s{s},{pr:.2f},{y}\n" for x, d, s, pr, y in zip(u, ad, site, price, label))
        if i < p["files"]:
            clicks += int(label.sum())
            seen[u] = True
            if a < train // 4 <= b or (a == 0 and train // 4 == 0):
                seen_at["25%"] = int(seen.sum())
    seen_at["100%"] = int(seen.sum())
    rows_of = np.bincount(user[:train], minlength=distinct)
    p.update(rows=total, train_rows=train, next_rows=total - train, seed=seed, scale=scale, drift=drift,
             click_rate=round(clicks / train, 4), users_seen=seen_at,
             rows_per_user_seen=round(train / max(seen_at["100%"], 1), 1),
             rows_of_a_rows_user=round(float((rows_of.astype(float) ** 2).sum() / max(train, 1)), 1),
             train_glob=os.path.join(out_dir, "train-*.csv"), next_csv=os.path.join(out_dir, "next.csv"))
    with open(os.path.join(out_dir, "stream.json"), "w") as fh:
        json.dump(p, fh, indent=1)
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--scale", type=float, default=1.0, help="users and rows x this (default 1: 1 M users)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(json.dumps(generate(a.out_dir, a.scale, a.seed), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
