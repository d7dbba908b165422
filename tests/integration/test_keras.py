"""tf_keras models (``--model pkg.module:build_model``) on real local clusters.

Async and sync jobs train a compiled model with BatchNormalization and Dropout on
generated data (as TensorFlow's tutorials write them: the async one a tf.keras Sequential,
the sync one a functional tf.keras model); a Conv2D model trains on NPZ images; a functional model with named
inputs trains from CSV columns; a chief killed mid-job resumes its Keras model. Each
check reads an outcome: the loss history, the export's variables, the export's
predictions on held-back data (loaded in a fresh process, by the model's input names).
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from integration_helpers import (
    FinishedJob,
    Processes,
    assert_nothing_left,
    assert_progressive,
    base_env,
    checkpoint_step,
    launcher_ports,
    read_history,
    read_results,
    run_flags,
    task_exit,
)

pytest.importorskip("tf_keras")
pytestmark = pytest.mark.integration

FIX = "tests.fixtures.keras_models"
#: Models as TensorFlow's tutorials write them (``import tensorflow as tf``, ``tf.keras``).
TF_KERAS = "tests.fixtures.tf_keras_models"
COLUMNS = [f"f{i}" for i in range(8)]


# ----------------------------------------------------------------------------- data
def write_csv(path: Path, columns: list[str], x: np.ndarray, y: np.ndarray) -> Path:
    rows = np.hstack([x, y[:, None]])
    path.write_text(",".join([*columns, "label"]) + "\n" +
                    "\n".join(",".join(f"{v:.5g}" for v in r) for r in rows) + "\n")
    return path


def blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """3 classes from a fixed linear rule on 8 features far from 0 (BN has work to do), 2 % noise."""
    w = np.random.default_rng(99).normal(size=(8, 3))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)) * 2.0 + 5.0
    y = np.argmax((x - 5.0) @ w, axis=1)
    flip = rng.random(n) < 0.02
    y[flip] = rng.integers(0, 3, size=flip.sum())
    return x.astype(np.float32), y.astype(np.int64)


@pytest.fixture(scope="module")
def blob_data(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("blobs")
    x, y = blobs(2000, 1)
    hx, hy = blobs(600, 2)
    return {"train": write_csv(d / "train.csv", COLUMNS, x, y), "eval": write_csv(d / "eval.csv", COLUMNS, hx, hy),
            "held_x": hx, "held_y": hy}


#: A serving client: a Python without tfps on its path (nor tf_keras imported) that loads
#: each SavedModel it is sent with tf.saved_model.load and calls serving_default by input name.
_CLIENT = (
    "import json, sys, numpy as np, tensorflow as tf\n"
    "for line in sys.stdin:\n"
    "    export_dir, inputs = json.loads(line)\n"
    "    try:\n"
    "        m = tf.saved_model.load(export_dir); fn = m.signatures['serving_default']\n"
    "        z = np.load(inputs); out = fn(**{k: tf.constant(z[k]) for k in z.files})\n"
    "        again = fn(**{k: tf.constant(z[k]) for k in z.files})\n"
    "        answer = {'inputs': sorted(fn.structured_input_signature[1]),\n"
    "                  'same': all(np.array_equal(out[k].numpy(), again[k].numpy()) for k in out),\n"
    "                  'outputs': {k: v.numpy().tolist() for k, v in out.items()}}\n"
    "    except Exception as e:\n"
    "        answer = {'error': f'{type(e).__name__}: {e}'}\n"
    "    print('ANSWER ' + json.dumps(answer), flush=True)\n")


class ServingClient:
    """One client process for the module's exports: TensorFlow is imported once, not once per
    export. Each request loads its SavedModel afresh, as a new client would."""

    def __init__(self, workdir: Path):
        env = base_env()
        env.pop("PYTHONPATH", None)    # the client knows nothing about tfps
        self.workdir = workdir
        self.stderr = open(workdir / "client.stderr", "w")
        self.proc = subprocess.Popen([sys.executable, "-c", _CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, env=env, cwd=str(workdir))
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.n = 0

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("ANSWER "):
                self.answers.put(json.loads(line[len("ANSWER "):]))
        self.answers.put(None)   # the client ended

    def predict(self, export_dir: str, inputs: dict[str, np.ndarray]) -> dict:
        self.n += 1
        path = self.workdir / f"inputs-{self.n}.npz"
        np.savez(path, **inputs)
        self.proc.stdin.write(json.dumps([export_dir, str(path)]) + "\n")
        self.proc.stdin.flush()
        try:
            answer = self.answers.get(timeout=120)
        except queue.Empty:
            answer = None
        assert answer is not None, (self.workdir / "client.stderr").read_text()[-3000:]
        assert "error" not in answer, answer["error"]
        return answer

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.stderr.close()


_client: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _serving_client(tmp_path_factory):
    """The module's serving client, started at the first prediction and ended with the module."""
    _client["dir"] = tmp_path_factory.mktemp("serving-client")
    yield
    client = _client.pop("client", None)
    if client is not None:
        client.close()


def predict_in_a_client(export_dir: str, inputs: dict[str, np.ndarray]) -> dict:
    """What a serving client does: tf.saved_model.load and serving_default by input name, in a
    process without tfps (the module's ``ServingClient``)."""
    if "client" not in _client:
        _client["client"] = ServingClient(_client["dir"])
    return _client["client"].predict(export_dir, inputs)


def export_variables(export_dir: str) -> dict[str, np.ndarray]:
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(Path(export_dir, "variables", "variables")))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()}


def run_job(procs: Processes, name: str, model_dir: Path, *flags, steps: int, timeout: float = 400) -> FinishedJob:
    # Progress every 2 steps: the history starts before the model has learnt anything.
    proc = procs.tfps(name, "local", *run_flags(model_dir, "--log_steps", 2, *flags, steps=steps))
    ports = launcher_ports(proc)
    return FinishedJob(proc, model_dir, ports, proc.wait(timeout))


def assert_loss_fell(job: FinishedJob, classes: int) -> None:
    """The trained model's loss over a whole data set (the chief's evaluation of the final
    checkpoint, ``--eval_data``) is far below an untrained classifier's (ln(classes)); the
    chief's progress records all have a finite loss.

    Not the chief's progress records: each is one batch's loss (with dropout, for some
    models), and a chief starved of CPU on a loaded machine trains only a few of the steps
    while the other worker takes the rest. One CI run: the chief trained 29 of 300 steps,
    its only record of the job's second half was a batch at loss 0.69, and the model's
    evaluation loss was 0.25.
    """
    history = read_history(job.model_dir)
    assert history and all(np.isfinite(r["loss"]) for r in history), history
    ev = job.results["eval_metrics"]
    assert ev["loss"] < 0.5 * np.log(classes), f"eval loss {ev}, untrained {np.log(classes):.3f}; {history[:3]}"


def assert_succeeded(job: FinishedJob, steps: int, last_worker: str = "worker1") -> dict:
    assert job.rc == 0, job.proc.tail()
    res = job.results
    assert res["status"] == "succeeded" and res["global_step"] >= steps and res["export_complete"] is True, res
    assert task_exit(job.proc, "ps0") == "0 (OK)" and task_exit(job.proc, last_worker) == "0 (OK)"
    assert_nothing_left(job.ports, job.proc)
    return res


def assert_moving_statistics_trained(export_dir: str) -> None:
    v = export_variables(export_dir)
    mean, var = v["batch_normalization/moving_mean"], v["batch_normalization/moving_variance"]
    # Initial values are 0 and 1; the first Dense layer's ReLU outputs on data around 5 are not.
    assert np.abs(mean).max() > 0.1, mean
    assert np.abs(var - 1.0).max() > 0.1, var


def assert_held_back_accuracy(job: FinishedJob, data: dict, at_least: float) -> float:
    out = predict_in_a_client(job.results["export_dir"], {"measurements": data["held_x"]})
    assert out["inputs"] == ["measurements"]
    # Served with training=False: Dropout is off, so the same input gives the same output.
    assert out["same"] is True
    probs = np.asarray(out["outputs"]["probabilities"])
    classes = np.asarray(out["outputs"]["classes"])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    acc = float((classes == data["held_y"]).mean())
    assert acc > at_least, f"accuracy {acc} on held-back data (chance 0.33)"
    return acc


# ----------------------------------------------------------------------------- async
#: The chief keeps the history as it runs steps: in a short async job the other worker can
#: train most steps before the chief has made five runs, more so on a loaded machine.
ASYNC_STEPS = 600
#: The async job's model: a tf.keras Sequential as tutorials write it (Rescaling, an L2
#: regulariser, BatchNormalization, Dropout; compiled with Adam at 0.01).
ASYNC_MODEL = f"{TF_KERAS}:sequential"


@pytest.fixture(scope="module")
def async_job(module_procs, blob_data, tmp_path_factory) -> FinishedJob:
    model_dir = tmp_path_factory.mktemp("keras-async") / "model"
    return run_job(module_procs, "keras-async", model_dir, "--model", ASYNC_MODEL,
                   "--train_data", blob_data["train"], "--eval_data", blob_data["eval"], "--batch_size", 32,
                   steps=ASYNC_STEPS)


def test_async_keras_job_succeeds_and_loss_falls(async_job):
    res = assert_succeeded(async_job, ASYNC_STEPS)
    assert res["mode"] == "async"
    assert_loss_fell(async_job, 3)
    # The launcher's estimate checked the Keras model against the data in a forked child, so
    # the launcher stayed clean and forked its tasks (no TensorFlow import of their own).
    assert async_job.proc.lines(r"tfps local: 1 ps \+ 2 worker\(s\) on .*; tasks forked from this launcher$"), \
        async_job.proc.tail()
    # The compiled optimizer and rate were used, and said so.
    assert async_job.proc.lines(r"worker0: optimizer adam \(the model's compile\(\)\), "
                                r"learning_rate 0\.01 \(the model's compile\(\)\)"), async_job.proc.tail()
    # Regularisers are part of the loss and reported; compiled accuracy is reported.
    assert res["metrics"]["regularization_loss"] > 0
    assert res["eval_metrics"]["accuracy"] > 0.8, res["eval_metrics"]


def test_async_keras_export_has_trained_moving_statistics(async_job):
    assert_moving_statistics_trained(async_job.results["export_dir"])


def test_async_keras_export_serves_held_back_data_by_input_name(async_job, blob_data):
    assert_held_back_accuracy(async_job, blob_data, 0.8)
    marker = json.loads(Path(async_job.results["export_dir"], "tfps_export.json").read_text())
    assert marker["inputs"] == {"measurements": [None, 8]}
    assert b"/job:ps" not in Path(async_job.results["export_dir"], "saved_model.pb").read_bytes()


def test_keras_model_resumes_from_its_checkpoint_with_its_moving_statistics(async_job, blob_data, procs, tmp_path):
    """A job launched again with more steps (--replace) on the model_dir of a finished Keras
    job (a new cluster: its ps holds nothing) restores the checkpoint, BatchNormalization's
    moving statistics included, and trains on from its step: two more steps leave the
    statistics almost as they were (a model initialised afresh would have them near 0 and 1)."""
    import shutil
    assert_succeeded(async_job, ASYNC_STEPS)
    model_dir = tmp_path / "model"
    shutil.copytree(async_job.model_dir, model_dir)
    before = export_variables(async_job.results["export_dir"])
    done = async_job.results["global_step"]
    # One worker: the restore is the chief's (each task left out saves a process).
    job = run_job(procs, "keras-resume", model_dir, "--model", ASYNC_MODEL, "--train_data",
                  blob_data["train"], "--eval_data", blob_data["eval"], "--batch_size", 32, "--replace",
                  "--workers", 1, steps=done + 2)
    res = assert_succeeded(job, done + 2, last_worker="worker0")
    restored = [int(m.group(1)) for m in job.proc.lines(r"\[worker0\].*restored checkpoint of step (\d+)")]
    assert restored == [done], (restored, done, job.proc.tail())
    assert done + 2 <= res["global_step"] <= done + 12, res["global_step"]   # continued, not started again
    after = export_variables(res["export_dir"])
    # Momentum 0.9: each step moves a statistic 10% of the way to its batch's, so a channel
    # that is mostly 0 after the ReLU can jump in 2 steps. A fresh model would be off on most
    # channels (moving variance near 1); a restored one is off on a few at most.
    for name in ("batch_normalization/moving_mean", "batch_normalization/moving_variance"):
        close = np.isclose(after[name], before[name], rtol=0.3, atol=0.05)
        assert close.mean() >= 0.9, (name, before[name][~close], after[name][~close])
    assert_held_back_accuracy(job, blob_data, 0.8)


# ----------------------------------------------------------------------------- sync
def test_sync_keras_job_trains_a_tf_keras_model_as_tutorials_write_it(procs, blob_data, tmp_path):
    """A functional tf.keras model (``import tensorflow as tf``), with Rescaling,
    BatchNormalization and Dropout, compiled with RMSprop, and no line about tfps or
    tf_keras, trains unchanged under ``--sync_replicas``: with its compiled optimizer, its
    moving statistics trained, its export serving held-back data by the model's input name.
    (The tutorials' ``tf.keras.Sequential`` is the async job's model above; ``--optimizer``
    replacing a model's compiled one is the killed chief's job below.)"""
    steps = 300
    job = run_job(procs, "keras-sync", tmp_path / "model", "--model", f"{TF_KERAS}:functional", "--sync_replicas",
                  "--train_data", blob_data["train"], "--eval_data", blob_data["eval"], "--batch_size", 32,
                  steps=steps)
    res = assert_succeeded(job, steps)
    assert res["mode"] == "sync"
    assert job.proc.lines(r"worker0: optimizer rmsprop .*learning_rate 0\.005 \(the model's compile\(\)\)"), \
        job.proc.tail()
    assert_loss_fell(job, 3)
    assert_moving_statistics_trained(res["export_dir"])
    assert_held_back_accuracy(job, blob_data, 0.8)


# ----------------------------------------------------------------------------- images
def bars(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """8x8 images: a horizontal (class 0) or vertical (class 1) bar in noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=0.3, size=(n, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 2, size=n)
    pos = rng.integers(0, 8, size=n)
    for i in range(n):
        if y[i] == 0:
            x[i, pos[i], :, 0] += 1.0
        else:
            x[i, :, pos[i], 0] += 1.0
    return x, y.astype(np.int64)


def test_conv2d_keras_model_trains_on_npz_images(procs, tmp_path):
    x, y = bars(1000, 3)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "eval.npz", x=x[:300], y=y[:300])
    # compile(optimizer="adam") means Adam at Keras's 0.001: too slow for 200 steps, so the
    # rate is given on the command line, and the optimizer still comes from the model.
    job = run_job(procs, "keras-conv", tmp_path / "model", "--model", f"{FIX}:conv2d", "--learning_rate", 0.01,
                  "--train_data", tmp_path / "train.npz", "--eval_data", tmp_path / "eval.npz", "--batch_size", 32,
                  steps=200)
    res = assert_succeeded(job, 200)
    assert job.proc.lines(r"worker0: optimizer adam \(the model's compile\(\)\), learning_rate 0\.01 "
                          r"\(--learning_rate\)"), job.proc.tail()
    assert_loss_fell(job, 2)
    assert "acc" in res["metrics"]    # the compiled SparseCategoricalAccuracy(name="acc")
    hx, hy = bars(400, 4)
    out = predict_in_a_client(res["export_dir"], {"image": hx})
    assert out["inputs"] == ["image"]
    assert set(out["outputs"]) == {"logits", "probabilities", "classes"}   # from_logits=True: softmax added
    acc = float((np.asarray(out["outputs"]["classes"]) == hy).mean())
    assert acc > 0.85, acc


# ----------------------------------------------------------------------------- named inputs
def people(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)      # age, income, noise, score
    y = (x[:, 0] + x[:, 3] - x[:, 1] > 0).astype(np.int64)
    return x, y


def test_functional_model_with_named_inputs_trains_from_csv_columns(procs, tmp_path):
    cols = ["age", "income", "noise", "score"]
    x, y = people(2000, 5)
    train = write_csv(tmp_path / "people.csv", cols, x, y)
    job = run_job(procs, "keras-named", tmp_path / "model", "--model", f"{FIX}:named_inputs",
                  "--train_data", train, "--eval_data", train, "--batch_size", 32, steps=ASYNC_STEPS)
    res = assert_succeeded(job, ASYNC_STEPS)
    assert_loss_fell(job, 2)
    # Not compiled: tfps's defaults and a cross-entropy on the logits.
    assert job.proc.lines(r"worker0: optimizer adam \(tfps default\), learning_rate 0\.01 \(tfps default\)")
    hx, hy = people(500, 6)
    out = predict_in_a_client(res["export_dir"], {"age": hx[:, :1], "income": hx[:, 1:2], "score": hx[:, 3:]})
    assert out["inputs"] == ["age", "income", "score"]
    acc = float((np.asarray(out["outputs"]["classes"]) == hy).mean())
    assert acc > 0.85, acc


# ----------------------------------------------------------------------------- chief restart
def test_killed_chief_rejoins_its_keras_model(procs, blob_data, tmp_path):
    from tfps.cluster import local_plan
    model_dir = tmp_path / "model"
    steps = 400
    plan = local_plan(1, 2)
    argv, tasks = {}, {}
    for t in plan.tasks:
        argv[t.name] = ["run", *plan.task_ref(t).to_flags(),
                        *run_flags(model_dir, "--log_steps", 10, "--checkpoint_steps", 50, "--model",
                                   f"{FIX}:bn_dropout", "--optimizer", "sgd", "--learning_rate", 0.1,
                                   "--train_data", blob_data["train"], "--batch_size", 32, steps=steps)]
        tasks[t.name] = procs.tfps(t.name, *argv[t.name])
    end = time.monotonic() + 180
    while checkpoint_step(model_dir) < 50:   # the first periodic checkpoint
        for p in tasks.values():
            assert p.returncode is None, p.tail()
        assert time.monotonic() < end, "no checkpoint at step 50 or later"
        time.sleep(0.1)
    tasks["worker0"].signal(signal.SIGKILL)
    assert tasks["worker0"].wait(10) == -signal.SIGKILL
    resumed_from = checkpoint_step(model_dir)
    assert resumed_from >= 50

    chief = procs.tfps("worker0-restarted", *argv["worker0"])
    assert chief.wait(300) == 0, chief.tail()
    assert chief.lines(r"resuming from the newest checkpoint"), chief.tail()
    # The ps kept the Keras model's variables: the new chief rebuilt the model and joined
    # them (nothing restored, no step redone), as for a built-in model.
    joined = [int(m.group(1)) for m in chief.lines(r"joined the live variables on the ps at step (\d+)")]
    assert joined and joined[0] >= resumed_from, (joined, resumed_from, chief.tail())
    assert not chief.lines(r"restored checkpoint of step"), chief.tail()
    assert tasks["worker1"].wait(60) == 0, tasks["worker1"].tail()
    assert tasks["ps0"].wait(60) == 0, tasks["ps0"].tail()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["global_step"] >= steps and res["export_complete"] is True
    assert_moving_statistics_trained(res["export_dir"])
    # --optimizer and --learning_rate replace the model's compiled Adam, in the first chief and
    # the restarted one, and the model they train serves held-back data well.
    for p in (tasks["worker0"], chief):
        assert p.lines(r"worker0: optimizer sgd \(--optimizer\), learning_rate 0\.1 \(--learning_rate\)"), p.tail()
    assert_held_back_accuracy(FinishedJob(chief, model_dir, [], 0), blob_data, 0.7)
    assert_nothing_left([t.port for t in plan.tasks], *tasks.values(), chief)


# ----------------------------------------------------------------------------- compile() settings
def test_clipnorm_and_builder_arguments_are_honoured_as_model_fit_honours_them(procs, tmp_path):
    """SGD(learning_rate=40): with clipnorm 0.02 (a builder argument) tfps reaches the
    accuracy plain model.fit reaches; without it model.fit diverges, so the clipping is what
    tfps honoured. ``--model_arg units=48`` reaches the builder: the export's hidden layer
    has 48 units. (A job whose loss or variables go NaN fails: tests/integration/test_failures.py
    and test_adversarial.py.)"""
    import tf_keras as keras

    from tests.fixtures.keras_models import sgd_clip
    from tfps.models.modelspec import ModelParams
    x, y = blobs(2000, 1)
    hx, hy = blobs(600, 2)
    x, hx = (x - 5.0) / 2.0, (hx - 5.0) / 2.0          # standardised: a learning rate of 40 is the only hazard
    train = write_csv(tmp_path / "train.csv", COLUMNS, x, y)

    def fit(clipnorm):
        keras.utils.set_random_seed(1)
        model = sgd_clip(ModelParams((8,), 3), clipnorm=clipnorm, units=48)
        loss = model.fit(x, y, batch_size=64, epochs=5, verbose=0).history["loss"][-1]
        return loss, float((np.argmax(model.predict(hx, verbose=0), axis=1) == hy).mean())

    fit_loss, fit_acc = fit(0.02)
    clipped = run_job(procs, "clipped", tmp_path / "clipped", "--model", f"{FIX}:sgd_clip", "--model_arg",
                      "clipnorm=0.02", "--model_arg", "units=48", "--train_data", train, "--batch_size", 64,
                      steps=300)
    res = assert_succeeded(clipped, 300)
    assert res["config"]["model_args"] == {"clipnorm": 0.02, "units": 48}
    assert clipped.proc.lines(r"worker0: optimizer sgd \(the model's compile\(\)\).*clipnorm 0\.02")
    assert export_variables(res["export_dir"])["hidden/kernel"].shape == (8, 48)
    out = predict_in_a_client(res["export_dir"], {"measurements": hx})
    acc = float((np.asarray(out["outputs"]["classes"]) == hy).mean())
    # At a step of up to 0.8 (40 x 0.02) two asynchronous workers end within a few points of
    # model.fit but not always within 8 (one CI run: 0.800 against 0.895); unclipped, the job
    # goes NaN and fails, or guesses (about 0.33 on three classes).
    assert fit_acc > 0.8 and acc >= fit_acc - 0.15, (acc, fit_acc, fit_loss)

    wild_loss, wild_acc = fit(None)
    assert not np.isfinite(wild_loss) or wild_acc < 0.5, (wild_loss, wild_acc)   # model.fit diverges


# ----------------------------------------------------------------------------- running AUC in progress lines
def quadrants(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Binary labels by quadrant (x0 * x1 > 0) on 4 features: learnt in a few hundred steps."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x[:, 0] * x[:, 1] > 0).astype(np.int64)


def pairwise_auc(labels, scores) -> float:
    """The area under the ROC curve by its definition: of all (positive, negative) pairs, the
    share the score orders right, ties counting half (every pair compared: a reference that
    shares nothing with the rank-based tfps.task.output.export.auc, nor with Keras's buckets)."""
    labels, scores = np.asarray(labels).astype(bool), np.asarray(scores, np.float64).reshape(-1)
    pos, neg = scores[labels][:, None], scores[~labels][None, :]
    return float(((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size))


def test_progress_lines_show_a_running_auc_that_rises_and_the_streamed_auc_is_exact(procs, tmp_path):
    """A binary model compiled with metrics=[keras.metrics.AUC()] under 1 ps and 2 workers:
    every worker's progress lines show ``auc``, running over its batches since its previous
    line; it rises as the model learns; history.jsonl carries it, and results.json's
    eval_metrics has the AUC streamed over the whole evaluation set, which agrees within
    0.005 with the exact AUC (``pairwise_auc``) of the exported SavedModel's probabilities
    on that same file. The metric's state is each worker's own: the checkpoint and the
    export hold none of it."""
    import tensorflow as tf
    x, y = quadrants(3000, 11)
    hx, hy = quadrants(600, 12)
    cols = ["a", "b", "c", "d"]
    train, held = write_csv(tmp_path / "train.csv", cols, x, y), write_csv(tmp_path / "eval.csv", cols, hx, hy)
    job = run_job(procs, "keras-running-auc", tmp_path / "model", "--model", f"{FIX}:running_auc",
                  "--train_data", train, "--eval_data", held, "--batch_size", 64, "--log_steps", 5, steps=400)
    res = assert_succeeded(job, 400)
    lines = {worker: [(int(m.group(1)), float(m.group(2))) for m in job.proc.lines(
        rf"\[{worker}\] .*{worker}: step (\d+)/400 loss \S+ auc (\d\.\d+) ")] for worker in ("worker0", "worker1")}
    # Every progress line shows it (the chief's too, when it trains enough steps to write one).
    for worker, seen in lines.items():
        assert len(job.proc.lines(rf"\[{worker}\] .*{worker}: step \d+/400 ")) == len(seen), job.proc.tail()
    assert sum(map(len, lines.values())) >= 5, (lines, job.proc.tail())
    # The earliest line of the job (either worker's: on a loaded machine the chief may start
    # late, when the other worker has taught the model most of what it learns) covers the
    # first steps; the last lines, a trained model.
    by_step = sorted(line for seen in lines.values() for line in seen)
    first, last = by_step[0][1], [auc for _, auc in by_step[-3:]]
    assert first < 0.9 and max(last) > first + 0.05 and min(last) > 0.9, lines
    assert all("auc" in r for r in read_history(job.model_dir)), read_history(job.model_dir)[:3]
    assert res["eval_metrics"]["auc"] > 0.9, res["eval_metrics"]
    # Progressive validation of the Keras model: each batch scored before it trained.
    assert assert_progressive(job.model_dir, res, {"auc", "log_loss", "accuracy"})["auc"] > 0.7, res["progressive"]
    # The streamed AUC is the exact one of the export's probabilities on the file the chief read.
    streamed = res["eval_metrics"]["auc"]
    rows = np.loadtxt(held, delimiter=",", skiprows=1, dtype=np.float32)
    serve = tf.saved_model.load(res["export_dir"]).signatures["serving_default"]
    probs = serve(features=tf.constant(rows[:, :-1]))["probability"].numpy()
    exact = pairwise_auc(rows[:, -1].astype(np.int64), probs)
    print(f"streamed Keras AUC {streamed:.6f}, exact {exact:.6f}, difference {abs(streamed - exact):.6f}")
    assert abs(streamed - exact) < 0.005, (streamed, exact)
    reader_keys = set(export_variables(res["export_dir"]))
    assert not any("true_positives" in k or "false_negatives" in k for k in reader_keys), reader_keys
