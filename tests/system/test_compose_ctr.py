"""docker compose trains a CTR model whose 512 MiB embedding table is split over two ps.

The same bar as the local test (tests/integration/test_ctr.py): examples/ctr_model.py with a
2**23 x 16 table and Adagrad, mounted from the repository (``--user_model_dir``), trains on
the demo CTR data mounted read-only (``--data_dir``). Each ps holds half of the table, and
the export read from the chief's volume, fed the raw CSV columns, ranks the held-out clicks
within 0.02 AUC of the same model trained by model.fit in one process on as many examples.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from composejob import CHIEF, MODEL_DIR, ComposeJob
from test_compose import REPO, exit_codes, generate

from tests.fixtures.ctr_fit import export_auc, fit_auc_in_a_process

pytestmark = pytest.mark.system

MODEL_ARGS = {"buckets": 2**23, "optimizer": "adagrad", "learning_rate": 0.5}
STEPS, BATCH = 1400, 256


@pytest.fixture
def ctr_data():
    """The demo CTR files in a directory the image's user (uid 10001) can read."""
    from tfps import demo
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
    args = [a for k, v in MODEL_ARGS.items() for a in ("--model_arg", f"{k}={v}")]
    generate(directory, "--ps", "2", "--workers", "2", "--user_model_dir", str(REPO / "examples"),
             "--data_dir", ctr_data, "--model", "ctr_model:build_model", *args,
             "--train_data", "/input/train-*.csv", "--eval_data", "/input/eval.csv",
             "--batch_size", str(BATCH), "--train_steps", str(STEPS), "--log_steps", "200", image=tfps_image)
    job = ComposeJob(docker_client, directory, "docker-compose.yml")
    yield job
    job.down()
    assert job.containers() == [], f"{job.project}: containers left after down"


def test_a_512_mib_table_split_over_two_ps_scores_the_auc_of_model_fit(ctr_job, ctr_data, tmp_path):
    rc = ctr_job.run(timeout=900)
    assert rc == 0, ctr_job.tail()
    assert exit_codes(ctr_job) == {"ps0": 0, "ps1": 0, "worker0": 0, "worker1": 0}
    res = ctr_job.read_json(f"{MODEL_DIR}/results.json")
    assert res["status"] == "succeeded" and res["export_complete"] is True, res.get("error")
    shares = res["ps_shares_mb"]
    assert set(shares) == {"ps0", "ps1"} and all(500 < v < 530 for v in shares.values()), shares

    export = tmp_path / "export"
    for name, data in ctr_job.files(f"{MODEL_DIR}/export", CHIEF).items():
        if data is not None:
            os.makedirs(export / os.path.dirname(name), exist_ok=True)
            (export / name).write_bytes(data)
    eval_csv = os.path.join(ctr_data, "eval.csv")
    tfps_auc, price_auc = export_auc(str(export), eval_csv)
    fit = fit_auc_in_a_process(os.path.join(ctr_data, "train-*.csv"), eval_csv, STEPS * BATCH, BATCH, **MODEL_ARGS)
    assert fit > price_auc + 0.1, (fit, price_auc)
    assert abs(tfps_auc - fit) < 0.02, (tfps_auc, fit)
