"""docker compose trains a CTR model whose ids live in dynamic tables over two ps.

The built-in wide_deep with ``--embedding dynamic`` (tfps.layers' dynamic tables: one row per
id on the ps that owns it, no hash buckets) trains on the demo CTR data mounted read-only
(``--data_dir``) with 2 ps and 2 workers, each in its container. The checkpoint on the
chief's volume holds exactly the live ids, split over both ps while training, and the
export, read from the chief's volume and fed the raw CSV columns, ranks the held-out clicks
well above the price alone, as the job's own evaluation says. The collision-free reference
(model.fit over the full vocabulary) and a 512 MiB hashed table split over two ps are the
integration tests' (tests/integration/test_dynamic_tables.py, test_ctr.py): this one shows
the same model in containers.

It also exports versions while it trains (``--export_every``, ``--keep_exports``): the chief's
volume holds the newest of them, each a complete SavedModel, at least two written before
the job's end, and results.json's export_dir names the last, which is what is scored.
"""

from __future__ import annotations

import csv
import glob
import os
import re
import shutil
import tempfile

import pytest
from composejob import CHIEF, MODEL_DIR, ComposeJob
from test_compose import exit_codes, generate
from versions_seen import check_versions

from tests.fixtures.ctr_fit import read_columns
from tests.fixtures.dynamic_reference import export_auc

pytestmark = pytest.mark.system

STEPS, BATCH = 480, 250     # two epochs of the demo's 60000 training rows
#: A version every EVERY global steps (as soon as the one before it is written), the newest KEEP kept.
EVERY, KEEP = 40, 3
TABLE_LINE = re.compile(r"table embeddings: live (\d+) \(ps0 (\d+), ps1 (\d+)\)")


@pytest.fixture
def ctr_data():
    """The demo CTR files in a directory the image's user (uid 10001) can read."""
    from tfps.models import demo
    d = tempfile.mkdtemp(prefix="tfps-ctr-")
    try:
        demo.ensure_demo_data(os.path.join(d, "demo"))
        os.chmod(d, 0o755)
        for root, dirs, files in os.walk(d):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        yield os.path.join(d, "demo", "ctr")
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ctr_job(docker_client, compose_cli, tfps_image, tmp_path, ctr_data):
    directory = tmp_path / "ctr"
    generate(directory, "--ps", "2", "--workers", "2", "--data_dir", ctr_data, "--model", "wide_deep",
             "--embedding", "dynamic", "--expected_ids", "20000", "--optimizer", "adagrad", "--learning_rate", "0.5",
             "--train_data", "/input/train-*.csv", "--eval_data", "/input/eval.csv",
             "--batch_size", str(BATCH), "--train_steps", str(STEPS), "--log_steps", "100",
             "--export_every", str(EVERY), "--keep_exports", str(KEEP), image=tfps_image)
    job = ComposeJob(docker_client, directory, "docker-compose.yml")
    yield job
    job.down()
    assert job.containers() == [], f"{job.project}: containers left after down"


def test_dynamic_tables_over_two_ps_train_checkpoint_their_live_ids_and_serve(ctr_job, ctr_data, tmp_path):
    import tensorflow as tf

    from tfps.task.output.export import auc
    rc = ctr_job.run(timeout=900)
    assert rc == 0, ctr_job.tail()
    assert exit_codes(ctr_job) == {"ps0": 0, "ps1": 0, "worker0": 0, "worker1": 0}
    res = ctr_job.read_json(f"{MODEL_DIR}/results.json")
    assert res["status"] == "succeeded" and res["export_complete"] is True, res.get("error")

    # The chief's last table line: live ids on both ps.
    lines = TABLE_LINE.findall(ctr_job.tail(100000))
    assert lines, ctr_job.tail()
    live, ps0, ps1 = (int(v) for v in lines[-1])
    assert live == ps0 + ps1 and ps0 > 0.3 * live and ps1 > 0.3 * live, lines[-1]
    saved = tmp_path / "saved"
    files = ctr_job.files(MODEL_DIR, CHIEF)
    # Versions while it trained: the base path MODEL_DIR/export holds the newest KEEP.
    assert os.path.dirname(res["export_dir"]) == f"{MODEL_DIR}/export", res["export_dir"]
    check_versions({name[len("export/"):]: data for name, data in files.items() if name.startswith("export/")},
                   ctr_job.tail(100000), res, KEEP)
    for name, data in files.items():
        if data is not None and (name.startswith("model.ckpt") or name == "checkpoint" or name.startswith("export/")):
            os.makedirs(saved / os.path.dirname(name), exist_ok=True)
            (saved / name).write_bytes(data)
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(saved)))
    keys = reader.get_variable_to_shape_map()["embeddings/keys"][0]
    # The final checkpoint comes after the last table line (a step admits new ids), and with
    # min_count 1 and no eviction every id seen has one row: never more than the data's ids.
    distinct = {f"{name}={row[name]}" for path in glob.glob(os.path.join(ctr_data, "train-*.csv"))
                for row in csv.DictReader(open(path, newline="")) for name in ("user", "ad", "site")}
    assert live <= keys <= len(distinct), (live, keys, len(distinct))

    eval_csv = os.path.join(ctr_data, "eval.csv")
    tfps_auc = export_auc(str(saved / "export" / os.path.basename(res["export_dir"])), eval_csv)
    x, y = read_columns(eval_csv)
    price_auc = auc(-x["price"].reshape(-1), y)
    assert tfps_auc > price_auc + 0.04, (tfps_auc, price_auc)    # the ids' rows carry the signal
    assert abs(res["eval_metrics"]["auc"] - tfps_auc) < 0.005, (res["eval_metrics"], tfps_auc)
