"""A Keras model's compiled optimizer, honoured or refused by name (tfps.models.keras_optimizers,
tfps.task.graph.optimizers): every check is an outcome. The v1 optimizer tfps builds from a
compiled one takes the same steps as the tf_keras optimizer itself on the same gradients
(hyperparameters, clipping, weight decay, schedules); a setting tfps cannot honour stops
the job before it starts with the option's name; a model with its own train_step is refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tf_keras")

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from tfps.config import RunConfig  # noqa: E402
from tfps.errors import ConfigError  # noqa: E402
from tfps.models import keras_optimizers  # noqa: E402
from tfps.task.graph import optimizers  # noqa: E402
from tfps.task.setup import JobSetup, optimizer_options  # noqa: E402

v1 = tf.compat.v1
FIX = "tests.fixtures.keras_models"
K = keras.optimizers
S = keras.optimizers.schedules


@pytest.fixture
def csv8(tmp_path) -> str:
    rng = np.random.default_rng(0)
    rows = np.hstack([rng.normal(size=(60, 8)), rng.integers(0, 3, size=(60, 1))])
    path = Path(tmp_path / "train.csv")
    path.write_text(",".join([f"f{i}" for i in range(8)] + ["label"]) + "\n"
                    + "\n".join(",".join(f"{v:g}" for v in r) for r in rows) + "\n")
    return str(path)


def setup_of(model: str, train: str, **kw) -> JobSetup:
    return JobSetup(RunConfig(model=model, train_data=train, **kw).validate())


def compiled(opt) -> tuple:
    """(tfps name, learning rate, options, refusal) of a model compiled with ``opt``."""
    m = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    m.compile(optimizer=opt, loss="mse")
    name, lr, _note, options, _cls, refusal = keras_optimizers.compiled_optimizer(m, "build")
    assert refusal is None or refusal.field == "model"
    return name, lr, options, None if refusal is None else str(refusal)


def keras_steps(opt, init: np.ndarray, grads: list, sparse_rows=None) -> np.ndarray:
    var = tf.Variable(init)
    for g in grads:
        grad = tf.constant(g) if sparse_rows is None else tf.IndexedSlices(tf.constant(g), tf.constant(sparse_rows))
        opt.apply_gradients([(grad, var)])
    return var.numpy()


def tfps_steps(opt, init: np.ndarray, grads: list, sparse_rows=None) -> tuple[np.ndarray, object]:
    """The same steps with the v1 optimizer tfps builds from the compiled ``opt`` (a v1 graph,
    gradients from compute_gradients as the worker gets them)."""
    name, lr, options, refusal = compiled(opt)
    assert refusal is None, refusal
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        var = v1.get_variable("v", initializer=init, use_resource=True)
        g_in = v1.placeholder(tf.float32, grads[0].shape)
        built = optimizers.make(name, lr, options)
        if sparse_rows is None:
            loss = tf.reduce_sum(g_in * var)
        else:
            loss = tf.reduce_sum(g_in * tf.gather(var, sparse_rows))
        pairs = built.compute_gradients(loss, [var])
        if sparse_rows is not None:
            assert isinstance(pairs[0][0], tf.IndexedSlices)   # clipped or not, still only the rows
        step = built.apply_gradients(pairs, global_step=gs)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for g in grads:
                sess.run(step, {g_in: g})
            return sess.run(var), built


def gradients(shape=(5,), n=4, scale=3.0, seed=0) -> tuple[np.ndarray, list]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=shape).astype(np.float32), [(rng.normal(size=shape) * scale).astype(np.float32)
                                                       for _ in range(n)]


def same_steps(make_opt, sparse_rows=None, **kw):
    init, grads = gradients(**kw)
    want = keras_steps(make_opt(), init, grads, sparse_rows)
    got, built = tfps_steps(make_opt(), init, grads, sparse_rows)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert not np.allclose(got, init)
    return built


# ----------------------------------------------------------------------------- each optimizer
@pytest.mark.parametrize("make_opt,v1_class", [
    (lambda: K.SGD(0.1), v1.train.GradientDescentOptimizer),
    (lambda: K.SGD(0.05, momentum=0.9), v1.train.MomentumOptimizer),
    (lambda: K.SGD(0.05, momentum=0.8, nesterov=True), v1.train.MomentumOptimizer),
    (lambda: K.Adam(0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-3), v1.train.AdamOptimizer),
    (lambda: K.AdamW(0.01, weight_decay=0.2, beta_1=0.85), v1.train.AdamOptimizer),
    (lambda: K.RMSprop(0.01), v1.train.RMSPropOptimizer),
    (lambda: K.RMSprop(0.01, rho=0.8, momentum=0.5, epsilon=1e-3, centered=True), v1.train.RMSPropOptimizer),
    (lambda: K.Adagrad(0.1, initial_accumulator_value=0.5), v1.train.AdagradOptimizer),
    (lambda: K.Ftrl(0.1, learning_rate_power=-0.6, initial_accumulator_value=0.2, l1_regularization_strength=0.01,
                    l2_regularization_strength=0.02, l2_shrinkage_regularization_strength=0.03, beta=0.5),
     v1.train.FtrlOptimizer),
    (lambda: K.SGD(0.05, weight_decay=0.1, momentum=0.5), v1.train.MomentumOptimizer),
    (lambda: K.legacy.Adam(0.01, beta_1=0.7, decay=0.1), v1.train.AdamOptimizer),
    (lambda: K.legacy.RMSprop(0.01, momentum=0.3), v1.train.RMSPropOptimizer),
], ids=["sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "rmsprop-centered", "adagrad", "ftrl",
        "sgd-weight-decay", "legacy-adam-decay", "legacy-rmsprop"])
def test_the_v1_optimizer_steps_as_the_keras_one(make_opt, v1_class):
    built = same_steps(make_opt)
    assert isinstance(built, v1_class)


def test_lazy_adam_with_options_steps_as_keras_on_the_rows_it_touches():
    # Rows 1 and 3 every step: Keras's Adam and LazyAdam agree on them; the others stay.
    init, grads = gradients(shape=(2, 3))
    table = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    opt = lambda: K.Adam(0.05, beta_1=0.7, beta_2=0.9, epsilon=1e-4)   # noqa: E731
    want = keras_steps(opt(), table, grads, sparse_rows=[1, 3])
    got, built = tfps_steps(opt(), table, grads, sparse_rows=[1, 3])
    assert type(built).__name__ == "LazyAdamOptimizer"
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(got[[0, 2, 4, 5]], table[[0, 2, 4, 5]])


def test_adamw_decays_only_the_rows_a_sparse_gradient_touches():
    _, grads = gradients(shape=(2, 3))
    table = np.random.default_rng(2).normal(size=(6, 3)).astype(np.float32)
    opt = lambda: K.AdamW(0.05, weight_decay=0.5)   # noqa: E731
    want = keras_steps(opt(), table, grads, sparse_rows=[1, 3])
    got, _ = tfps_steps(opt(), table, grads, sparse_rows=[1, 3])
    np.testing.assert_allclose(got[[1, 3]], want[[1, 3]], rtol=2e-5, atol=2e-6)   # touched: as Keras
    np.testing.assert_array_equal(got[[0, 2, 4, 5]], table[[0, 2, 4, 5]])         # untouched: not decayed


def test_weight_decay_spares_the_excluded_names():
    opt = K.AdamW(0.1, weight_decay=0.5)
    opt.exclude_from_weight_decay(var_names=["bias"])
    _, _, options, refusal = compiled(opt)
    assert refusal is None and options["weight_decay_excluded"] == ["bias"]
    with tf.Graph().as_default():
        w = v1.get_variable("dense/kernel", initializer=np.ones(2, np.float32), use_resource=True)
        b = v1.get_variable("dense/bias", initializer=np.ones(2, np.float32), use_resource=True)
        ops = optimizers.decay_weights([(tf.zeros(2), w), (tf.zeros(2), b)], 0.1, 0.5, options["weight_decay_excluded"])
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(ops)
            np.testing.assert_allclose(sess.run(w), 0.95)
            np.testing.assert_allclose(sess.run(b), 1.0)


# ----------------------------------------------------------------------------- clipping
@pytest.mark.parametrize("make_opt", [
    lambda: K.SGD(0.1, clipnorm=1.0),
    lambda: K.SGD(0.1, clipvalue=0.5),
    lambda: K.SGD(0.1, global_clipnorm=1.0),
    lambda: K.Adam(0.1, clipnorm=0.5),
    lambda: K.SGD(0.1, clipnorm=1.0, clipvalue=0.01),      # Keras applies clipnorm only
    lambda: K.legacy.SGD(0.1, clipnorm=1.0, clipvalue=0.2),  # the legacy ones apply both
], ids=["clipnorm", "clipvalue", "global_clipnorm", "adam-clipnorm", "clipnorm-and-clipvalue", "legacy-both"])
def test_a_huge_gradient_is_clipped_as_keras_clips_it(make_opt):
    init, grads = gradients(scale=1e4)
    got = same_steps(make_opt, scale=1e4)
    assert got is not None
    moved = np.abs(keras_steps(make_opt(), init, grads) - init).max()
    assert moved < 1.0   # clipped: an unclipped step of 0.1 * 1e4 would move by hundreds


def test_clipping_keeps_sparse_gradients_sparse():
    _, grads = gradients(shape=(2, 3), scale=100)
    table = np.random.default_rng(3).normal(size=(4, 3)).astype(np.float32)
    opt = lambda: K.SGD(0.1, clipnorm=1.0)   # noqa: E731
    want = keras_steps(opt(), table, grads, sparse_rows=[0, 2])
    got, built = tfps_steps(opt(), table, grads, sparse_rows=[0, 2])
    assert type(built).__name__ == "KerasGradientDescentOptimizer"
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert np.abs(got - table).max() < 1.0
    with tf.Graph().as_default():
        g = tf.IndexedSlices(tf.ones([2, 3]) * 100, tf.constant([0, 2]), tf.constant([6, 3]))
        for clip in (["clipnorm", 1.0], ["clipvalue", 1.0], ["global_clipnorm", 1.0]):
            (out, _), = optimizers.clip_gradients([(g, None)], [tuple(clip)])
            assert isinstance(out, tf.IndexedSlices)


# ----------------------------------------------------------------------------- schedules
@pytest.mark.parametrize("schedule", [
    S.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5),
    S.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5, staircase=True),
    S.PiecewiseConstantDecay([5, 20], [0.1, 0.05, 0.01]),
    S.CosineDecay(0.1, decay_steps=30, alpha=0.1),
    S.CosineDecay(0.0, decay_steps=30, warmup_target=0.1, warmup_steps=10),
    S.CosineDecayRestarts(0.1, first_decay_steps=10),
    S.InverseTimeDecay(0.1, decay_steps=5, decay_rate=0.5),
    S.PolynomialDecay(0.1, decay_steps=30, end_learning_rate=0.001, power=2.0),
], ids=lambda s: type(s).__name__)
def test_a_schedule_gives_keras_rates_on_the_global_step(schedule):
    _, lr, options, refusal = compiled(K.SGD(schedule))
    assert refusal is None and lr == pytest.approx(float(schedule(0)))
    keras_rates = {step: float(schedule(step)) for step in (0, 3, 7, 15, 25, 40)}
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        rate = optimizers._schedule_rate(options["schedule"])()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for step, want in keras_rates.items():
                gs.load(step, sess)
                assert sess.run(rate) == pytest.approx(want, rel=1e-5, abs=1e-7), step


def test_a_schedule_drives_the_updates_step_by_step():
    same_steps(lambda: K.Adam(S.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5), beta_1=0.8), n=5)
    same_steps(lambda: K.AdamW(S.PiecewiseConstantDecay([2], [0.1, 0.01]), weight_decay=0.3), n=4)


# ----------------------------------------------------------------------------- the job's note and flags
def test_the_note_shows_the_options_in_force(csv8):
    s = setup_of(f"{FIX}:adam_clip_schedule", csv8)
    assert (s.optimizer, s.learning_rate) == ("adam", 0.02)
    assert s.optimizer_note == (
        "optimizer adam (the model's compile()), learning_rate 0.02 (the model's compile()), "
        "ExponentialDecay(decay_steps 100, decay_rate 0.5, staircase False) on the global step, "
        "beta_1 0.85, beta_2 0.995, epsilon 1e-06, clipnorm 1")
    options = optimizer_options(s.cfg, s.model_fn)
    assert options["clipnorm"] == 1.0 and options["schedule"]["class_name"] == "ExponentialDecay"


def test_an_explicit_rate_replaces_the_schedule_and_an_optimizer_all_the_options(csv8):
    s = setup_of(f"{FIX}:adam_clip_schedule", csv8, learning_rate=0.005)
    assert s.learning_rate == 0.005
    assert "schedule" not in optimizer_options(s.cfg, s.model_fn)
    assert "clipnorm 1" in s.optimizer_note
    assert s.optimizer_note.endswith("; the model's ExponentialDecay schedule does not apply (--learning_rate given)")
    s = setup_of(f"{FIX}:adam_clip_schedule", csv8, optimizer="sgd")
    assert optimizer_options(s.cfg, s.model_fn) == {}
    assert s.optimizer_note == ("optimizer sgd (--optimizer), learning_rate 0.02 (the model's compile()); the "
                                "model's Adam and its options do not apply (--optimizer given)")


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("fixture,words", [
    ("adam_amsgrad", ["Adam(amsgrad=True)", "AMSGrad"]),
    ("adam_ema", ["Adam(use_ema=True)", "moving average"]),
    ("nadam", ["Nadam", "SGD, Adam, AdamW, RMSprop, Adagrad, Ftrl"]),
    ("custom_schedule", ["SGD(learning_rate=", "custom learning-rate schedule"]),
])
def test_an_option_tfps_cannot_honour_is_refused_by_name(csv8, fixture, words):
    with pytest.raises(ConfigError) as info:
        setup_of(f"{FIX}:{fixture}", csv8)
    assert info.value.field == "model"
    for w in words:
        assert w in str(info.value), str(info.value)
    assert "--optimizer" in str(info.value)
    # --optimizer replaces the model's optimizer: nothing of it applies, nothing is refused.
    s = setup_of(f"{FIX}:{fixture}", csv8, optimizer="adam")
    assert "do not apply (--optimizer given)" in s.optimizer_note


@pytest.mark.parametrize("make_opt,option", [
    (lambda: K.Adagrad(epsilon=1e-3), "epsilon"),
    (lambda: K.Adagrad(initial_accumulator_value=0.0), "initial_accumulator_value"),
    (lambda: K.legacy.SGD(S.ExponentialDecay(0.1, 10, 0.5), decay=0.1), "decay"),
    (lambda: K.Adam(use_ema=True, ema_momentum=0.5), "use_ema"),
])
def test_options_without_a_counterpart_are_named(make_opt, option):
    name, _, _, refusal = compiled(make_opt())
    assert name is None and f"({option}=" in refusal, refusal


def test_an_unmapped_non_default_setting_is_refused(monkeypatch):
    # A key tfps does not know (a newer tf_keras's setting) with a non-default value is refused.
    opt = K.Adam(0.01)
    config = opt.get_config()
    original = type(opt).get_config
    monkeypatch.setattr(type(opt), "get_config", lambda self: {**config, "gradient_accumulation_steps": 4}
                        if self is opt else {**original(self), "gradient_accumulation_steps": None})
    _, _, _, refusal = compiled(opt)
    assert "Adam(gradient_accumulation_steps=4)" in refusal


def test_excluding_variables_by_object_is_refused_by_name():
    opt = K.AdamW(weight_decay=0.1)
    opt.exclude_from_weight_decay(var_list=[tf.Variable(1.0)])
    assert "exclude_from_weight_decay" in compiled(opt)[3]


@pytest.mark.parametrize("fixture,method", [("own_train_step", "train_step"), ("own_compute_loss", "compute_loss")])
def test_a_model_with_its_own_training_step_is_refused(csv8, fixture, method):
    with pytest.raises(ConfigError) as info:
        setup_of(f"{FIX}:{fixture}", csv8, optimizer="adam")
    msg = str(info.value)
    assert info.value.field == "model"
    assert f"overrides {method}()" in msg and "tfps does not run it" in msg and "compiled loss" in msg, msg


# ----------------------------------------------------------------------------- where the worker clips
def _huge_step(wrap) -> np.ndarray:
    """One step of SGD(0.1, clipnorm=1) as the worker builds it (``wrap`` the optimizer and step)."""
    _, lr, options, _ = compiled(K.SGD(0.1, clipnorm=1.0))
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        var = v1.get_variable("v", initializer=np.zeros(4, np.float32), use_resource=True)
        loss = tf.reduce_sum(1e4 * var)
        step = wrap(optimizers.make("sgd", lr, options), loss, gs)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(step)
            return sess.run(var)


def test_the_async_step_clips_before_the_gradients_travel():
    from tfps.task.graph import steps
    moved = _huge_step(lambda opt, loss, gs: steps.apply_packed(opt, loss, gs, ""))
    np.testing.assert_allclose(moved, -0.1 * np.full(4, 0.5), rtol=1e-5)   # norm 1, not 2e4


def test_the_sync_step_clips_each_workers_gradient():
    from tfps.task.graph.syncagg import SyncAggregation

    def sync(opt, loss, gs):
        pairs = SyncAggregation(opt, gs, 1, 1, "").compute_gradients(loss)
        grad = pairs[0][0]
        assert "clip_by_norm" in grad.name, grad.name   # clipped where computed, before the accumulator
        return opt.apply_gradients(pairs, global_step=gs)
    np.testing.assert_allclose(_huge_step(sync), -0.1 * np.full(4, 0.5), rtol=1e-5)
