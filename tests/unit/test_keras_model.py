"""Keras models (tfps.models.keras_model) without a cluster: which functions are Keras
builders, what is refused before anything starts (with both shapes named), which
optimizer is used, and that the adapter's graph trains, updates BatchNormalization's
moving statistics and exports under the model's input names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tf_keras")

from tfps import models  # noqa: E402
from tfps.config import RunConfig  # noqa: E402
from tfps.errors import ConfigError  # noqa: E402
from tfps.models import keras_model
from tfps.task.setup import JobSetup  # noqa: E402

FIX = "tests.fixtures.keras_models"


def write_csv(path: Path, columns: list[str], rows: np.ndarray) -> str:
    path.write_text(",".join(columns) + "\n" + "\n".join(",".join(f"{v:g}" for v in r) for r in rows) + "\n")
    return str(path)


@pytest.fixture
def csv8(tmp_path) -> str:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 8))
    y = rng.integers(0, 3, size=(60, 1))
    return write_csv(tmp_path / "train.csv", [f"f{i}" for i in range(8)] + ["label"], np.hstack([x, y]))


@pytest.fixture
def named_csv(tmp_path) -> str:
    rng = np.random.default_rng(1)
    rows = np.hstack([rng.normal(size=(40, 4)), rng.integers(0, 2, size=(40, 1))])
    return write_csv(tmp_path / "people.csv", ["age", "income", "noise", "score", "label"], rows)


def setup_of(model: str, train: str, **kw) -> JobSetup:
    return JobSetup(RunConfig(model=model, train_data=train, **kw).validate())


@pytest.fixture
def estimate_here(monkeypatch):
    """``tfps local`` called in this process builds the model's graph for its memory estimate
    in a new interpreter, which imports TensorFlow and tf_keras again (15-30 s a test). The
    tests that refuse a model through the command line build it in this process instead, the
    answer passed through the same JSON; the new interpreter's estimate has its own test
    (test_memory_plan.py, the controller's estimate is the workers')."""
    from tfps.launch import estimate

    def here(cfg, num_ps, num_workers, user_model_dir=None):
        answer = estimate._answer(estimate.try_estimate(estimate.config_of(cfg.to_args()), num_ps, num_workers))
        return estimate._from_answer(json.loads(json.dumps(answer)))

    monkeypatch.setattr(estimate, "_estimate_in_a_process", here)


def refusal(model: str, train: str) -> str:
    with pytest.raises(ConfigError) as info:
        setup_of(model, train)
    assert info.value.field == "model"
    return str(info.value)


# ----------------------------------------------------------------------------- detection
def test_builders_and_model_fns_are_told_apart():
    def build(): ...
    def build_p(params=None): ...
    def build_req(params): ...
    def model_fn(features, labels, mode, params): ...
    assert keras_model.is_builder(build) and keras_model.is_builder(build_p) and keras_model.is_builder(build_req)
    assert not keras_model.is_builder(model_fn)
    assert isinstance(models.resolve(f"{FIX}:bn_dropout"), keras_model.KerasBuilder)
    assert models.resolve("examples.custom_model:model_fn").__name__ == "model_fn"


def test_a_function_of_other_arguments_is_refused():
    with pytest.raises(ConfigError, match=r"model: .*must accept \(features, labels, mode, params\).*or take no "
                                          r"required arguments and return a tf_keras Model"):
        models.resolve("json:dumps")


# ----------------------------------------------------------------------------- refusals
#: Each bad model, the data it is checked against, and what its one message must say.
REFUSALS = {
    "keras3": ("csv8", ["returned a Keras 3 model", "Keras 3 cannot do parameter-server training",
                        "Build the model with tf.keras", "import tf_keras as keras"]),
    "wrong_input": ("csv8", ["the model's input 'x' takes examples of shape [5]",
                             "has examples of shape [8] (8 feature columns)"]),
    "wrong_output": ("csv8", ["the model's output has shape [7], but the data has 3 classes", "Dense(3)"]),
    "missing_column": ("named_csv", ["the model's input 'height' has no column of that name",
                                     "age, income, noise, score"]),
}


@pytest.mark.parametrize("model", sorted(REFUSALS))
def test_a_model_that_does_not_fit_is_refused_by_the_cli_naming_both_sides(model, request, tmp_path, capsys,
                                                                          estimate_here):
    """`tfps local` refuses it before anything starts: exit 2, one line, no model_dir."""
    from tfps.cli import main
    data, says = REFUSALS[model]
    model_dir = tmp_path / "model"
    rc = main(["local", "--model", f"{FIX}:{model}", "--train_data", request.getfixturevalue(data),
               "--model_dir", str(model_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("tfps: error: model: "), err
    missing = [s for s in says if s not in err[0]]
    assert missing == [], err[0]
    assert not model_dir.exists()


def test_import_tfps_leaves_tf_use_legacy_keras_alone_and_entry_points_only_default_it(monkeypatch):
    import importlib

    import tfps
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    importlib.reload(tfps)   # what ``import tfps`` runs
    assert os.environ["TF_USE_LEGACY_KERAS"] == "0"
    monkeypatch.delenv("TF_USE_LEGACY_KERAS")
    importlib.reload(tfps)
    assert "TF_USE_LEGACY_KERAS" not in os.environ
    env = {"TF_USE_LEGACY_KERAS": "0"}
    tfps.use_tf_keras(env)
    assert env == {"TF_USE_LEGACY_KERAS": "0"}
    env.clear()
    tfps.use_tf_keras(env)
    assert env == {"TF_USE_LEGACY_KERAS": "1"}
    assert [tfps.legacy_keras_refused({"TF_USE_LEGACY_KERAS": v}) for v in ("1", "true", "True", "0", "")] == \
        [None, None, None, "0", ""]
    assert tfps.legacy_keras_refused({}) is None


def test_a_user_who_set_tf_use_legacy_keras_to_0_is_told_why_a_keras_model_is_refused(csv8, tmp_path, capsys,
                                                                                      monkeypatch, estimate_here):
    """tf.keras would be Keras 3 in tfps's tasks: one line naming the variable, before anything starts."""
    from tfps.cli import main
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    rc = main(["local", "--model", f"{FIX}:keras3", "--train_data", csv8, "--model_dir", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and os.environ["TF_USE_LEGACY_KERAS"] == "0"
    assert err == [f"tfps: error: model: {FIX}:keras3 returned a Keras 3 model: TF_USE_LEGACY_KERAS='0' in the "
                   "environment makes tf.keras Keras 3, which cannot do parameter-server training; unset "
                   "TF_USE_LEGACY_KERAS (tfps then sets it to 1) or set it to 1"], err
    assert not (tmp_path / "m").exists()


def test_multi_input_model_needs_named_columns(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.zeros((10, 4), np.float32), y=np.arange(10, dtype=np.int64) % 2)
    msg = refusal(f"{FIX}:missing_column", str(tmp_path / "d.npz"))
    assert "has 2 inputs (age, height)" in msg and "npz data has none" in msg


def test_named_inputs_take_eval_columns_by_name(named_csv, tmp_path):
    ev = tmp_path / "eval.csv"
    ev.write_text("income,age,noise,score,label\n1,2,3,4,0\n")   # the training columns, reordered
    setup = JobSetup(RunConfig(model=f"{FIX}:named_inputs", train_data=named_csv, eval_data=str(ev)).validate())
    assert setup.eval_schema.feature_keys == setup.schema.feature_keys == ("age", "income", "noise", "score")
    ev.write_text("income,age,score,label\n1,2,4,0\n")
    with pytest.raises(ConfigError, match=r"eval_data: .*eval.csv lacks the training data's columns 'noise'"):
        JobSetup(RunConfig(model=f"{FIX}:named_inputs", train_data=named_csv, eval_data=str(ev)).validate())


def test_regression_model_gets_mse_and_predictions(tmp_path):
    import tensorflow as tf
    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 8))
    train = write_csv(tmp_path / "r.csv", [f"f{i}" for i in range(8)] + ["label"],
                      np.hstack([x, x.sum(axis=1, keepdims=True) + 0.5]))
    s = setup_of(f"{FIX}:regressor", train, num_classes=0)
    with tf.Graph().as_default():
        spec = s.model_fn(tf.zeros([4, 8]), tf.zeros([4]), "train", s.params)
        assert set(spec.predictions) == {"predictions"} and spec.predictions["predictions"].shape.as_list() == [4]
        assert set(spec.metrics) == {"mae"} and spec.loss.shape.as_list() == []


def test_not_a_model_is_refused(csv8):
    assert "returned str; it must return a tf_keras Model" in refusal(f"{FIX}:not_a_model", csv8)


def test_subclassed_model_is_called_on_the_data_shape(csv8, tmp_path):
    s = setup_of(f"{FIX}:subclassed", csv8)
    assert s.model_fn.info.input_names == ["features"] and s.model_fn.info.output_width == 3
    np.savez(tmp_path / "img.npz", x=np.zeros((10, 4, 4), np.float32), y=np.arange(10) % 3)
    # Dense on [4, 4] examples gives [batch, 4, 3]: the output check names the shape.
    msg = refusal(f"{FIX}:subclassed", str(tmp_path / "img.npz"))
    assert "output has shape [4, 3]" in msg


# ----------------------------------------------------------------------------- optimizer
def test_compiled_optimizer_is_used_unless_flags_say_otherwise(csv8):
    s = setup_of(f"{FIX}:bn_dropout", csv8)
    assert (s.optimizer, s.learning_rate) == ("adam", 0.01)
    assert s.optimizer_note == ("optimizer adam (the model's compile()), learning_rate 0.01 (the model's compile()), "
                                "beta_1 0.9, beta_2 0.999, epsilon 1e-07")
    assert s.params.learning_rate == 0.01
    s = setup_of(f"{FIX}:bn_dropout", csv8, optimizer="sgd", learning_rate=0.2)
    assert (s.optimizer, s.learning_rate) == ("sgd", 0.2)
    assert s.optimizer_note == ("optimizer sgd (--optimizer), learning_rate 0.2 (--learning_rate); the model's Adam "
                                "and its options do not apply (--optimizer given)")
    s = setup_of("mlp", csv8)   # not Keras: tfps's defaults, as before
    assert (s.optimizer, s.learning_rate) == ("adam", 0.01)


def test_explicit_flags_reach_every_task_even_when_equal_to_the_default():
    cfg = RunConfig(optimizer="adam", learning_rate=0.01).validate()
    assert "--optimizer=adam" in cfg.to_args() and "--learning_rate=0.01" in cfg.to_args()
    assert not any(a.startswith(("--optimizer", "--learning_rate")) for a in RunConfig().to_args())


# ----------------------------------------------------------------------------- graph
def test_adapter_trains_updates_moving_statistics_and_exports_named_inputs(named_csv, tmp_path):
    import tensorflow as tf

    from tfps.data import dataset as data
    from tfps.task.output import export
    v1 = tf.compat.v1
    s = setup_of(f"{FIX}:named_inputs", named_csv)
    assert s.model_fn.serving_inputs == {"score": ([1], "float32"), "age": ([1], "float32"),
                                         "income": ([1], "float32")}
    g = tf.Graph()
    with g.as_default():
        gs = v1.train.get_or_create_global_step()
        features, labels = v1.data.make_one_shot_iterator(data.make_dataset(s.schema, "label", 16)).get_next()
        spec = s.model_fn(features, labels, "train", s.params)
        assert len(spec.update_ops) == 2 and set(spec.metrics) >= {"accuracy"}
        with v1.control_dependencies(spec.update_ops):
            op = v1.train.AdamOptimizer(0.01).minimize(spec.loss, global_step=gs)
        mean = next(v for v in v1.global_variables() if "moving_mean" in v.name)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(5):
                sess.run(op)
            assert np.abs(sess.run(mean)).max() > 0
            ckpt = v1.train.Saver(sharded=False).save(sess, str(tmp_path / "ckpt"), global_step=5)
    out = export.export_saved_model(s.model_fn, s.params, ckpt, str(tmp_path / "export"), 5)
    marker = json.loads(Path(out, "tfps_export.json").read_text())
    assert marker["inputs"] == {"score": [None, 1], "age": [None, 1], "income": [None, 1]}
    assert marker["outputs"] == ["classes", "logits", "probabilities"]
    fn = tf.saved_model.load(out).signatures["serving_default"]
    res = fn(score=tf.zeros([3, 1]), age=tf.ones([3, 1]), income=tf.zeros([3, 1]))
    np.testing.assert_allclose(res["probabilities"].numpy().sum(axis=1), 1.0, atol=1e-5)
    assert res["classes"].shape == (3,)


def test_tf_keras_as_tutorials_write_it_is_tf_keras_under_tfps(csv8):
    """tfps's entry points set TF_USE_LEGACY_KERAS=1 before TensorFlow loads (tests/unit/conftest.py
    does as they do): tf.keras is tf_keras, and its compiled optimizer and learning rate apply."""
    import os
    import sys

    import tensorflow as tf
    assert os.environ["TF_USE_LEGACY_KERAS"] == "1" and "tfps" in sys.modules
    assert tf.keras.Sequential.__module__.startswith("tf_keras.")
    from tfps.config import RunConfig
    from tfps.task.setup import JobSetup
    setup = JobSetup(RunConfig(model=f"{FIX}:tf_dot_keras", train_data=csv8).validate())
    assert isinstance(setup.model_fn, keras_model.KerasModelFn)
    assert (setup.optimizer, setup.learning_rate) == ("sgd", 0.05)


def test_builder_arguments_reach_the_builder_and_unknown_ones_are_refused(csv8, tmp_path, capsys, estimate_here):
    from tfps.cli import main
    from tfps.config import RunConfig, from_args
    from tfps.task.setup import JobSetup
    ns = __import__("tfps.cli", fromlist=["build_parser"]).build_parser().parse_args(
        ["local", "--model", f"{FIX}:sized", "--train_data", csv8, "--model_arg", "units=4",
         "--model_arg", "activation=tanh"])
    cfg = from_args(ns)
    assert cfg.model_args == {"units": 4, "activation": "tanh"}
    assert "--model_arg=units=4" in cfg.to_args() and "--model_arg=activation=tanh" in cfg.to_args()
    setup = JobSetup(cfg)
    hidden = setup.model_fn.builder.call(setup.params).get_layer("hidden")
    assert (hidden.units, hidden.activation.__name__) == (4, "tanh")
    assert setup.params.model_args == {"units": 4, "activation": "tanh"}
    assert setup.identity()["model_args"] == {"units": 4, "activation": "tanh"}

    model_dir = tmp_path / "m"
    rc = main(["local", "--model", f"{FIX}:sized", "--train_data", csv8, "--model_arg", "dropout=0.2",
               "--model_dir", str(model_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "model_args: tests.fixtures.keras_models:sized(params, units=8, activation='relu') takes no " \
           "argument 'dropout'" in err[0], err[0]
    assert not model_dir.exists()
    with pytest.raises(ConfigError, match="takes no builder arguments"):
        JobSetup(RunConfig(model="mlp", train_data=csv8, model_args={"units": 3}).validate())


@pytest.mark.parametrize("pair,says", [("units", "is not KEY=VALUE"), ("units=[1, 2]", "must be one number"),
                                       ("9x=1", "is not KEY=VALUE")])
def test_a_malformed_model_arg_is_refused(pair, says):
    from tfps.config import parse_model_args
    with pytest.raises(ConfigError, match=says.replace("[", r"\[")):
        parse_model_args([pair])


def test_the_inventory_gives_builder_arguments_as_a_mapping():
    from tfps.cluster.variables import launch_from_vars
    cfg, launch = launch_from_vars({"tfps_model": "pkg.mod:build", "tfps_model_args": "{units: 128, act: relu}"})
    assert cfg.model_args == {"units": 128, "act": "relu"}
    assert "--model_arg=units=128" in launch.run_args and "--model_arg=act=relu" in launch.run_args
    with pytest.raises(ConfigError, match="tfps_model_args"):
        launch_from_vars({"tfps_model_args": "[1, 2]"})


def test_stateful_metrics_stream_over_the_whole_evaluation_set(tmp_path):
    """AUC, Precision and Recall of the export's evaluation equal Keras's own over the whole
    set at once, not a mean of per-batch values (which differs with small batches)."""
    import tensorflow as tf
    import tf_keras as keras

    from tfps.config import RunConfig
    from tfps.data import dataset as data
    from tfps.task.output import export
    from tfps.task.setup import JobSetup
    keras.utils.set_random_seed(0)   # the untrained model's weights: scores on both sides of 0.5
    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = (x[:, 0] + 0.8 * rng.normal(size=300) > 0).astype(np.int64)
    path = tmp_path / "bin.csv"
    path.write_text("a,b,c,d,label\n" + "".join(f"{r[0]},{r[1]},{r[2]},{r[3]},{t}\n" for r, t in zip(x, y)))
    setup = JobSetup(RunConfig(model=f"{FIX}:binary_with_stateful_metrics", train_data=str(path)).validate())
    v1 = tf.compat.v1
    ckpt = str(tmp_path / "model.ckpt")
    with tf.Graph().as_default():
        feats, labels = v1.placeholder(tf.float32, [None, 4]), v1.placeholder(tf.int64, [None])
        spec = setup.model_fn(feats, labels, "train", setup.params)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            probs = sess.run(spec.predictions["probability"], {feats: x})
            v1.train.Saver().save(sess, ckpt)
    got = export.evaluate(setup.model_fn, setup.params, ckpt,
                          lambda: data.make_dataset(setup.schema, "label", 16, train=False))
    whole = {}
    for name, metric in (("auc", keras.metrics.AUC()), ("precision", keras.metrics.Precision()),
                         ("recall", keras.metrics.Recall())):
        metric.update_state(y[:, None].astype(np.float32), probs[:, None])
        whole[name] = float(metric.result())
    for name in whole:
        assert abs(got[name] - whole[name]) < 1e-4, (name, got, whole)
    assert 0.05 < whole["recall"] < 0.95, whole   # else every batch's recall is the whole set's
    batches = [(y[i:i + 16], probs[i:i + 16]) for i in range(0, 300, 16)]
    per_batch = []
    for t, p in batches:
        m = keras.metrics.Recall()
        m.update_state(t[:, None].astype(np.float32), p[:, None])
        per_batch.append(float(m.result()) * len(t))
    assert abs(sum(per_batch) / 300 - whole["recall"]) > 1e-4   # the mean of batches would be wrong


def test_a_metric_tfps_cannot_compute_is_refused_by_name(csv8):
    """Never left out in silence: building the graph refuses it by name (the task then ends
    the job with one line, exit 2). tf_keras's own compile() catches most such metrics first."""
    import tensorflow as tf

    from tests.fixtures.keras_models import fifth_class_score
    v1 = tf.compat.v1
    setup = setup_of(f"{FIX}:bn_dropout", csv8)
    with tf.Graph().as_default():
        y, out = v1.placeholder(tf.int64, [None]), v1.placeholder(tf.float32, [None, 3])
        with pytest.raises(ConfigError, match="the compiled metric 'fifth_class_score' cannot be computed"):
            setup.model_fn._metric(fifth_class_score, y, out, y)


# ----------------------------------------------------------------------------- running metrics
def _binary_csv(path: Path, n: int = 300, seed: int = 3) -> tuple[str, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] + 0.8 * rng.normal(size=n) > 0).astype(np.int64)
    path.write_text("a,b,c,d,label\n" + "".join(f"{r[0]},{r[1]},{r[2]},{r[3]},{t}\n" for r, t in zip(x, y)))
    return str(path), x, y


@pytest.mark.parametrize("sync", [False, True])
def test_running_metrics_of_a_training_step_are_the_workers_own(tmp_path, sync):
    """The training step of worker 1 (1 ps, 2 workers) builds fresh AUC, Precision and Recall
    whose variables live on worker 1: local variables (each worker's session initialises its
    own), never global (the Saver's list, the checkpoint), never placed on the ps (whose
    byte shares are unchanged). The progress fetches show them next to the loss."""
    import tensorflow as tf

    from tfps.cluster.spec import ClusterSpec, TaskRef
    from tfps.task.runtime.signals import StopSignal
    from tfps.task.worker import Worker
    v1 = tf.compat.v1
    train, _, _ = _binary_csv(tmp_path / "bin.csv")
    cfg = RunConfig(model=f"{FIX}:binary_with_stateful_metrics", train_data=train, sync_replicas=sync).validate()
    task = TaskRef(ClusterSpec(("127.0.0.1:1",), ("127.0.0.1:2", "127.0.0.1:3")), "worker", 1)
    worker = Worker(task, cfg, StopSignal())
    graph, ops = worker.build(JobSetup(cfg, shard=(2, 1)))
    assert list(ops.metrics)[:3] == ["auc", "precision", "recall"], list(ops.metrics)
    state = ops.running_state
    assert len(state) == 4 + 2 + 2   # AUC's four confusion counts per threshold, two each for the others
    assert {v.device for v in state} == {"/job:worker/task:1/device:CPU:0"}
    with graph.as_default():
        names = {v.op.name for v in state}
        assert names <= {v.op.name for v in v1.local_variables()}
        assert not names & {v.op.name for v in v1.global_variables()}   # what the Saver saves
        assert not names & {v.op.name for v in v1.trainable_variables()}
    assert not names & set(worker.balancer.placed)
    assert {v.device for v in graph.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES)} == {"/job:ps/task:0"}
    assert ops.reset_running is not None


def test_running_metrics_equal_keras_over_the_same_batches(tmp_path):
    """Updated with every training step, read after it: after each step the running AUC,
    Precision and Recall equal tf_keras's metrics updated with the same batches' labels and
    probabilities; after a reset, they cover the batches since."""
    import tensorflow as tf
    import tf_keras as keras
    v1 = tf.compat.v1
    train, x, y = _binary_csv(tmp_path / "bin.csv")
    setup = setup_of(f"{FIX}:binary_with_stateful_metrics", train)
    g = tf.Graph()
    seen, reported = [], []
    with g.as_default():
        feats, labels = v1.placeholder(tf.float32, [None, 4]), v1.placeholder(tf.int64, [None])
        spec = setup.model_fn(feats, labels, "train", setup.params)
        assert set(spec.streaming) == {"auc", "precision", "recall"}
        results = {k: result for k, (_, result, _) in spec.streaming.items()}
        step = tf.group(v1.train.GradientDescentOptimizer(0.5).minimize(spec.loss),
                        *[update for update, _, _ in spec.streaming.values()])   # as the worker's step
        reset = v1.variables_initializer([v for _, _, vs in spec.streaming.values() for v in vs])
        with v1.Session() as sess:
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            for i in range(0, 192, 32):
                if i == 128:
                    sess.run(reset)
                feed = {feats: x[i:i + 32], labels: y[i:i + 32]}
                _, probs, out = sess.run([step, spec.predictions["probability"], results], feed)
                seen.append((y[i:i + 32], probs))
                reported.append(out)
    for n, out in enumerate(reported):
        since = seen[:n + 1] if n < 4 else seen[4:n + 1]
        for name, metric in (("auc", keras.metrics.AUC()), ("precision", keras.metrics.Precision()),
                             ("recall", keras.metrics.Recall())):
            for t, p in since:
                metric.update_state(t[:, None].astype(np.float32), p[:, None])
            assert abs(out[name] - float(metric.result())) < 1e-4, (n, name, out, float(metric.result()))
    assert reported[3]["auc"] != reported[4]["auc"]
