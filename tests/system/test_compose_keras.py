"""docker compose runs a user's tf.keras model mounted from a host directory.

The model module (tests/fixtures/tf_keras_models.py) is written with ``import tensorflow as
tf`` and ``tf.keras`` only, as TensorFlow's tutorials write it: a functional model with
Rescaling, BatchNormalization and Dropout, compiled. The image carries tf_keras (which
``tf.keras`` is under tfps); the module reaches the containers through ``tfps compose
--user_model_dir`` (mounted at /opt/usermodels), with no image rebuild. The job ends by
itself and its SavedModel, read from the chief's volume, serves the demo evaluation data by
the model's own input name.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from composejob import CHIEF, MODEL_DIR, ComposeJob
from test_compose import REPO, exit_codes, generate

pytestmark = pytest.mark.system

STEPS = 300
#: Not a line of it names tfps or tf_keras.
MODEL = "tf_keras_models:functional"


@pytest.fixture
def keras_job(docker_client, compose_cli, tfps_image, tmp_path):
    directory = tmp_path / "keras"
    generate(directory, "--ps", "1", "--workers", "2", "--user_model_dir", str(REPO / "tests" / "fixtures"),
             "--model", MODEL, "--train_steps", str(STEPS), "--log_steps", "10",
             image=tfps_image)
    job = ComposeJob(docker_client, directory, "docker-compose.yml")
    yield job
    job.down()
    assert job.containers() == [], f"{job.project}: containers left after down"


def test_keras_model_from_a_host_directory_trains_and_serves(keras_job, tmp_path):
    import tensorflow as tf

    from tfps.models import demo
    rc = keras_job.run(timeout=600)
    assert rc == 0, keras_job.tail()
    assert exit_codes(keras_job) == {"ps0": 0, "worker0": 0, "worker1": 0}
    results = keras_job.read_json(f"{MODEL_DIR}/results.json")
    assert results["status"] == "succeeded" and results["global_step"] >= STEPS
    assert results["export_complete"] is True
    assert results["model"] == MODEL

    export = tmp_path / "export"
    for name, data in keras_job.files(f"{MODEL_DIR}/export", CHIEF).items():
        if data is not None:
            os.makedirs(export / os.path.dirname(name), exist_ok=True)
            (export / name).write_bytes(data)
    reader = tf.train.load_checkpoint(str(export / "variables" / "variables"))
    assert np.abs(reader.get_tensor("batch_normalization/moving_mean")).max() > 0.05

    _, eval_glob = demo.demo_globs("mlp", str(tmp_path / "demo"))
    data = np.loadtxt(eval_glob, delimiter=",", skiprows=1, dtype=np.float32)
    x, y = data[:, :-1], data[:, -1].astype(np.int64)
    fn = tf.saved_model.load(str(export)).signatures["serving_default"]
    out = fn(measurements=tf.constant(x))
    assert (out["classes"].numpy() == y).mean() > 0.8
