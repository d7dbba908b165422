"""A user's tf_keras model as a tfps model_fn: ``--model pkg.module:build_model``.

``build_model()`` returns a tf_keras (Keras 2) ``Model``, compiled or not; tfps inspects it
once eagerly before any task trains (``KerasModel.inspect``), then calls it again inside
every graph it builds (train, eval, export), so the whole job lifecycle applies unchanged.
Keras 3 builds no ``tf.compat.v1`` graphs and is refused in one line.

The design (what is read when, which graphs, what is refused): docs/design/keras.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
from collections.abc import Callable
from typing import Any

from tfps import LEGACY_KERAS_ENV, compat, legacy_keras_refused
from tfps.errors import ConfigError, user_code
from tfps.models import keras_optimizers
from tfps.models.modelspec import ModelSpec, local_state

log = logging.getLogger("tfps")

INSTALL_HINT = compat.TF_KERAS_INSTALL
KERAS3_MESSAGE = (
    "{name} returned a Keras 3 model ({cls}). Keras 3 cannot do parameter-server training: it builds no "
    "tf.compat.v1 graph, so its variables cannot be placed on the ps tasks and it cannot train under "
    "MonitoredTrainingSession. Build the model with tf.keras (`import tensorflow as tf; "
    "tf.keras.Sequential(...)`, which is tf_keras under tfps) or `import tf_keras as keras` "
    f"({INSTALL_HINT}); the layers and compile() arguments are the same")


def tf_keras_install() -> str:
    """The command that installs tf_keras here: with --no-deps next to tensorflow-cpu (tf_keras
    requires the distribution "tensorflow", which would install a second TensorFlow)."""
    from importlib import metadata
    try:
        metadata.version("tensorflow")
    except metadata.PackageNotFoundError:
        return INSTALL_HINT
    return f"pip install 'tf_keras=={compat.TF_KERAS_VERSION}.*'"


def missing_tf_keras(exc: BaseException) -> bool:
    """Whether ``exc`` says tf_keras is missing: ``import tf_keras`` failing, or TensorFlow's
    "Keras cannot be imported" when ``tf.keras`` is asked for tf_keras that is not there."""
    if not isinstance(exc, ImportError):
        return False
    if (getattr(exc, "name", None) or "").split(".")[0] == "tf_keras":
        return True
    import importlib.util
    try:
        installed = importlib.util.find_spec("tf_keras") is not None
    except (ImportError, ValueError):
        installed = False
    return "Keras cannot be imported" in str(exc) and not installed


def _shape(dims) -> list:
    return [None if d is None else int(d) for d in dims]


def is_builder(fn: Callable) -> bool:
    """A Keras builder takes no required arguments, or only ``params``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    required = [p for p in sig.parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return all(p.name == "params" for p in required) and "features" not in sig.parameters


def _is_keras3(obj) -> bool:
    for cls in type(obj).__mro__:
        mod = getattr(cls, "__module__", "") or ""
        if mod == "keras" or mod.startswith("keras."):
            return True
    return False


def _is_tf_keras_model(obj) -> bool:
    try:
        import tf_keras
    except ImportError:
        return False
    return isinstance(obj, tf_keras.Model)


@dataclasses.dataclass
class KerasBuilder:
    """A user's function that returns a Keras model, not yet checked against the data."""

    fn: Callable
    name: str

    def __post_init__(self):
        self.takes_params = "params" in inspect.signature(self.fn).parameters

    def check_args(self, args: dict) -> None:
        """Refuse --model_arg names the builder does not take, naming its signature."""
        sig = inspect.signature(self.fn)
        if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            return
        takes = {n for n, p in sig.parameters.items()
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "params"}
        unknown = [k for k in args if k not in takes]
        if unknown:
            raise ConfigError(f"{self.name}{sig} takes no argument {', '.join(map(repr, unknown))}; give it "
                              f"one of its own ({', '.join(sorted(takes)) or 'it takes none'}), or add it to the "
                              "builder", "model_args")

    def call(self, params) -> Any:
        args = dict(getattr(params, "model_args", None) or {})
        self.check_args(args)
        try:
            with user_code(f"the model builder {self.name}"):
                model = self.fn(params=params, **args) if self.takes_params else self.fn(**args)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - a user's builder: one line, not its traceback
            if missing_tf_keras(e):
                raise ConfigError(f"{self.name} builds a Keras model, and tf_keras (Keras 2, what tf.keras is "
                                  f"under tfps) is not installed here; install it: {tf_keras_install()}",
                                  "model") from None
            where = ""
            tb = e.__traceback__
            while tb is not None:
                where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
                tb = tb.tb_next
            first = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(f"{self.name} raised {type(e).__name__}: {first}{where} while building the model; "
                              "fix the builder (call it alone in Python to see the whole traceback)",
                              "model") from None
        if _is_keras3(model) and legacy_keras_refused() is not None:
            raise ConfigError(f"{self.name} returned a Keras 3 model: {LEGACY_KERAS_ENV}="
                              f"{legacy_keras_refused()!r} in the environment makes tf.keras Keras 3, which "
                              f"cannot do parameter-server training; unset {LEGACY_KERAS_ENV} (tfps then sets it "
                              "to 1) or set it to 1", "model")
        if _is_keras3(model):
            raise ConfigError(KERAS3_MESSAGE.format(name=self.name, cls=f"{type(model).__module__}."
                                                                         f"{type(model).__name__}"), "model")
        if not _is_tf_keras_model(model):
            try:
                import tf_keras  # noqa: F401
                hint = "a tf_keras Model (import tf_keras as keras)"
            except ImportError:
                hint = f"a tf_keras Model, and tf_keras is not installed here ({tf_keras_install()})"
            raise ConfigError(f"{self.name} returned {type(model).__name__}; it must return {hint}, or be a "
                              "model_fn (features, labels, mode, params)", "model")
        return model


# ----------------------------------------------------------------------------- inspection
@dataclasses.dataclass
class KerasInfo:
    """What the eagerly built model says about itself, checked against the data schema."""

    input_names: list[str]            # serving input names, in the model's input order
    input_shapes: list[list]          # per input, without the batch dimension
    input_dtypes: list[str]
    columns: list[int] | None         # multi-input: index of each input in the feature vector
    reshape_to: list | None           # single input: data examples reshaped to this
    output_width: int
    loss: Any                         # None, or what keras.losses.get understands / a callable
    loss_name: str
    from_logits: bool | None          # None: decide from the output op (softmax or not)
    metrics: list                     # compiled metrics (strings, functions or Metric objects)
    optimizer: str | None             # tfps optimizer name mapped from the compiled one
    learning_rate: float | None
    optimizer_note: str = ""
    optimizer_options: dict = dataclasses.field(default_factory=dict)   # tfps.task.graph.optimizers.make's options
    optimizer_class: str = ""         # the compiled optimizer's class name
    optimizer_refusal: ConfigError | None = None   # what of the compiled optimizer cannot be honoured


def _flatten(x) -> list:
    if x is None:
        return []
    if isinstance(x, dict):
        return [v for v in x.values()]
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _flatten(item)]
    return [x]


def _loss_name(loss) -> str:
    if loss is None:
        return ""
    if isinstance(loss, str):
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__



#: What tfps runs instead of a model's own ``train_step``, ``test_step`` or ``compute_loss``.
RUNS_INSTEAD = {
    "train_step": "it trains the compiled loss on the model's outputs (plus model.losses) with the optimizer "
                  "applied on the ps",
    "test_step": "it evaluates the compiled loss and metrics on the model's outputs",
    "compute_loss": "it computes the compiled loss on the model's outputs (plus model.losses)",
}


def _check_own_steps(model, name: str) -> None:
    """Refuse a model whose class overrides train_step, test_step or compute_loss: tfps does not run them."""
    for method, instead in RUNS_INSTEAD.items():
        owner = next((c for c in type(model).__mro__ if method in vars(c)), None)
        if owner is not None and not (owner.__module__ or "").startswith("tf_keras."):
            raise ConfigError(f"{name} returns a {type(model).__name__} whose class overrides {method}() "
                              f"({owner.__module__}.{owner.__qualname__}); tfps does not run it: {instead}. Move "
                              f"what {method}() does into call(), a layer's add_loss() or the compiled loss, or "
                              "remove the override", "model")


def inspect_model(builder: KerasBuilder, schema, params) -> KerasInfo:
    """Build the model once eagerly and check it against the data; ConfigError names both sides."""
    import tensorflow as tf
    model = builder.call(params)
    compat.check_tf_keras()   # a tf_keras model: the internals its compile() settings are read with
    name = builder.name
    _check_own_steps(model, name)
    feature_shape = list(schema.feature_shape)
    inputs = getattr(model, "inputs", None) or []
    columns = None
    reshape_to = None
    if len(inputs) > 1:
        names = [t.name.split(":")[0] for t in inputs]
        names = list(getattr(model, "input_names", None) or names)
        keys = list(schema.feature_keys)
        if schema.fmt not in ("csv", "tfrecord"):
            raise ConfigError(f"{name} has {len(inputs)} inputs ({', '.join(names)}); a model with several inputs "
                              f"reads named CSV columns or TFRecord keys, and {schema.fmt} data has none. Give the "
                              "model one input", "model")
        if schema.fmt == "tfrecord" and len(keys) != schema.num_features:
            raise ConfigError(f"{name} has several inputs, but the TFRecord keys of this data hold several values "
                              "each; tfps maps one value per key to an input. Give the model one input", "model")
        columns = []
        for n, t in zip(names, inputs):
            if n not in keys:
                raise ConfigError(f"the model's input {n!r} has no column of that name in the data (feature "
                                  f"columns: {', '.join(keys)}); name the Input after a column "
                                  f"(keras.Input(shape=(1,), name=...))", "model")
            shape = _shape(t.shape[1:])
            if shape not in ([1], [], [None]):
                raise ConfigError(f"the model's input {n!r} takes examples of shape {shape}, but the data's "
                                  f"column {n!r} holds one value per example (shape [1]); use "
                                  "keras.Input(shape=(1,))", "model")
            columns.append(keys.index(n))
        shapes = [[1] for _ in names]
        dtypes = [t.dtype.name if hasattr(t.dtype, "name") else str(t.dtype) for t in inputs]
        kinds = dict(schema.column_kinds())
        for n, d in zip(names, dtypes):
            kind = kinds.get(n, "float32")
            wrong = (d == "string") != (kind == "string") or (d.startswith("int") and kind == "float32")
            if wrong:
                fits = {"string": "string", "int64": "int64 (or float32)", "float32": "float32"}[kind]
                raise ConfigError(f"the model's input {n!r} takes {d}, but the data's column {n!r} holds "
                                  f"{kind} values; give the input dtype={fits} (keras.Input(shape=(1,), name="
                                  f"{n!r}, dtype=...)), or fix the column", "model")
        out = None
    else:
        if schema.string_columns:
            raise ConfigError(f"the data has text columns {schema.describe_text()}, which cannot join "
                              f"the numbers in the one input of {name}; give the model one keras.Input per "
                              "column, named after it (dtype='string' for a text column: hash it with "
                              "keras.layers.Hashing into an Embedding)", "model")
        if inputs:
            t = inputs[0]
            names = [(getattr(model, "input_names", None) or [t.name.split(":")[0]])[0]]
            shape = _shape(t.shape[1:])
            dtypes = [t.dtype.name if hasattr(t.dtype, "name") else str(t.dtype)]
            fits = len(shape) == len(feature_shape) and all(m is None or m == d for m, d in zip(shape, feature_shape))
            if not fits:
                known = [d for d in shape if d is not None]
                same_size = None not in shape and math.prod(shape or [1]) == math.prod(feature_shape)
                squeezed_equal = [d for d in shape if d != 1] == [d for d in feature_shape if d != 1]
                if same_size and squeezed_equal:
                    reshape_to = shape
                else:
                    raise ConfigError(
                        f"the model's input {names[0]!r} takes examples of shape {shape}, but the data "
                        f"({schema.fmt}: {', '.join(schema.files[:1])}) has examples of shape {feature_shape}"
                        f"{' (' + str(len(schema.feature_keys)) + ' feature columns)' if schema.fmt == 'csv' else ''}"
                        f"; change the model's Input shape{' (or add a Flatten/Reshape layer)' if known else ''}",
                        "model")
            shapes = [shape if reshape_to is None else reshape_to]
            out = None
        else:   # subclassed and not built: call it on a batch shaped like the data
            names, shapes, dtypes = ["features"], [feature_shape], ["float32"]
            try:
                out = model(tf.zeros([2, *feature_shape]), training=False)
            except Exception as e:  # noqa: BLE001 - the model cannot take this data
                raise ConfigError(f"{name} cannot be called on examples of the data's shape {feature_shape} "
                                  f"(a batch of shape {[2, *feature_shape]}): {type(e).__name__}: "
                                  f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}", "model") from None
    outputs = _flatten(out) if out is not None else list(getattr(model, "outputs", None) or [])
    if out is None and not outputs:
        outputs = _flatten(model(tf.zeros([2, *shapes[0]])))
    if len(outputs) != 1:
        raise ConfigError(f"{name} has {len(outputs)} outputs; tfps trains models with one output", "model")
    out_shape = _shape(outputs[0].shape[1:])
    width = out_shape[-1] if out_shape else 1
    if schema.num_classes:
        if out_shape not in ([schema.num_classes],) and not (schema.num_classes == 2 and out_shape in ([1], [])):
            raise ConfigError(f"the model's output has shape {out_shape}, but the data has {schema.num_classes} "
                              f"classes (labels 0..{schema.num_classes - 1}), so it needs shape "
                              f"[{schema.num_classes}]: end with Dense({schema.num_classes}) (or pass "
                              "--num_classes; 0 for regression)", "model")
    elif out_shape not in ([1], []):
        raise ConfigError(f"the model's output has shape {out_shape}, but the data's labels are real numbers "
                          "(regression), which needs shape [1]: end with Dense(1) (or pass --num_classes for "
                          "classification)", "model")
    loss = getattr(model, "loss", None)
    if isinstance(loss, (dict, list, tuple)):
        flat = _flatten(loss)
        if len(flat) != 1:
            raise ConfigError(f"{name} was compiled with {len(flat)} losses; tfps trains one output with one loss",
                              "model")
        loss = flat[0]
    from_logits = None
    if loss is not None:
        obj = _loss_object(loss)
        from_logits = bool(_loss_config(obj).get("from_logits", getattr(obj, "from_logits", False)))
    compile_cfg = compat.keras_compile_config(model)
    metrics = _flatten(compile_cfg.get("metrics")) + _flatten(compile_cfg.get("weighted_metrics"))
    opt, lr, note, options, opt_class, refusal = keras_optimizers.compiled_optimizer(model, name)
    return KerasInfo(names, shapes, dtypes, columns, reshape_to, int(width or 1), loss, _loss_name(loss),
                     from_logits, metrics, opt, lr, note, options, opt_class, refusal)


def _loss_object(loss):
    import tf_keras as keras
    return keras.losses.get(loss) if isinstance(loss, str) else loss


def _loss_config(obj) -> dict:
    """A loss object's settings (``from_logits``...): ``get_config()`` of a Keras loss, else {}."""
    try:
        config = obj.get_config() if hasattr(obj, "get_config") else None
    except Exception:  # noqa: BLE001 - a user's loss class whose config cannot be read
        config = None
    return config if isinstance(config, dict) else {}


# ----------------------------------------------------------------------------- graph
def _is_softmax(t) -> bool:
    return _is_op(t, "Softmax")


def _is_op(t, kind: str) -> bool:
    """Whether ``t`` is made by an op of ``kind`` (through a few Identity ops)."""
    op = t.op
    for _ in range(4):
        if op.type == kind:
            return True
        if op.type != "Identity" or not op.inputs:
            return False
        op = op.inputs[0].op
    return False


class KerasModelFn:
    """The model_fn tfps calls; builds the user's Keras model in the current graph."""

    def __init__(self, builder: KerasBuilder, info: KerasInfo, num_classes: int):
        self.builder, self.info, self.num_classes = builder, info, num_classes
        self.__name__ = builder.name

    @property
    def serving_inputs(self) -> dict[str, tuple[list, str]]:
        """Input name -> (shape without batch, dtype) of the SavedModel's serving_default."""
        return {n: (s, d) for n, s, d in zip(self.info.input_names, self.info.input_shapes, self.info.input_dtypes)}

    def _model_inputs(self, features):
        import tensorflow as tf
        info = self.info
        if isinstance(features, dict):   # named columns (text in the data), or the serving graph
            xs = [features[n] if features[n].shape.rank != 1 else tf.expand_dims(features[n], -1)
                  for n in info.input_names]
        elif info.columns is not None:
            xs = [tf.gather(features, [i], axis=1) for i in info.columns]
        else:
            x = features
            if info.reshape_to is not None:
                x = tf.reshape(x, [-1, *info.reshape_to])
            xs = [x]
        xs = [x if x.dtype.name == d else tf.cast(x, d) for x, d in zip(xs, info.input_dtypes)]
        return xs if len(xs) > 1 else xs[0], xs

    def __call__(self, features, labels, mode, params):
        import tensorflow as tf
        import tf_keras as keras
        info = self.info
        graph = tf.compat.v1.get_default_graph()
        model = self.builder.call(params)
        x, xs = self._model_inputs(features)
        before = set(graph.get_operations())
        out = model(x, training=(mode == "train"))
        if isinstance(out, (list, tuple, dict)):
            out = _flatten(out)[0]
        out = tf.cast(out, tf.float32)

        def created_here(t) -> bool:
            return (t if isinstance(t, tf.Operation) else t.op) not in before

        update_ops = [u for u in (model.updates if mode == "train" else []) if created_here(u)]
        binary = self.num_classes == 2 and (out.shape.rank == 1 or out.shape[-1] == 1)
        if binary:   # one unit: the positive class's probability (a sigmoid, or logits)
            logits_out = info.from_logits if info.from_logits is not None else not _is_op(out, "Sigmoid")
            out = tf.reshape(out, [-1, 1])
            p = tf.reshape(tf.sigmoid(out) if logits_out else out, [-1])
            preds = {"probability": tf.identity(p, name="probability"),
                     "probabilities": tf.stack([1.0 - p, p], axis=1, name="probabilities"),
                     "classes": tf.cast(p > 0.5, tf.int64, name="classes")}
        elif self.num_classes:
            logits_out = info.from_logits if info.from_logits is not None else not _is_softmax(out)
            if out.shape.rank == 1:
                out = out[:, None]
            probs = tf.nn.softmax(out) if logits_out else out
            preds = {"probabilities": tf.identity(probs, name="probabilities"),
                     "classes": tf.argmax(out, axis=-1, name="classes")}
            if logits_out:
                preds["logits"] = tf.identity(out, name="logits")
        else:
            logits_out = False
            value = tf.reshape(out, [-1], name="predictions")
            preds = {"predictions": value}
        if labels is None:
            return ModelSpec(None, preds)
        # The loss.
        y = tf.cast(labels, tf.int64 if self.num_classes else tf.float32)
        lossname = info.loss_name.lower().replace("_", "")
        y_loss = y
        if binary:
            y_loss = tf.cast(y, tf.float32)[:, None]
        elif self.num_classes and "categoricalcrossentropy" in lossname and "sparse" not in lossname:
            y_loss = tf.one_hot(y, self.num_classes)
        elif not self.num_classes:
            y_loss = y[:, None]
        if info.loss is not None:
            obj = _loss_object(info.loss)
            per = obj(y_loss, out if self.num_classes or out.shape.rank != 1 else out[:, None])
            data_loss = tf.reduce_mean(per)
        elif binary:
            data_loss = tf.reduce_mean(keras.losses.binary_crossentropy(y_loss, out, from_logits=logits_out))
        elif self.num_classes:
            data_loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, out, from_logits=logits_out))
        else:
            data_loss = tf.reduce_mean(tf.square(preds["predictions"] - y))
        reg = self._regularization(model, xs, before)
        loss = tf.identity(data_loss + tf.add_n(reg) if reg else data_loss, name="loss")
        # Metrics: accuracy (or mae) always, plus the compiled ones tfps can compute per batch.
        if self.num_classes:
            metrics = {"accuracy": tf.reduce_mean(tf.cast(tf.equal(preds["classes"], y), tf.float32))}
        else:
            metrics = {"mae": tf.reduce_mean(tf.abs(preds["predictions"] - y))}
        if reg:
            metrics["regularization_loss"] = tf.add_n(reg)
        for m in info.metrics:
            key, value = self._metric(m, y_loss if self.num_classes else y[:, None], out, y)
            if key and key not in metrics and key != "loss":
                metrics[key] = value
        streaming = self._streaming(info.metrics, y, preds, binary, mode) if mode in ("train", "eval") else {}
        return ModelSpec(loss, preds, metrics, update_ops=update_ops, streaming=streaming)

    def _streaming(self, compiled, y, preds, binary, mode: str) -> dict:
        """The compiled stateful metrics (keras.metrics.AUC, Precision, Recall, ...), each a
        fresh copy in this graph fed as Keras feeds it: the labels (one-hot for several
        classes) and the model's probabilities.

        Eval: streamed over the whole evaluation set (``tfps.task.output.export.evaluate``).
        Train: the running values of the worker's progress lines. The copies' variables are
        the worker's own (``modelspec.local_state``: on its device, never on a ps, in the
        checkpoint or the SavedModel), and the result is read after the step's update."""
        import tensorflow as tf
        import tf_keras as keras
        out = {}
        for m in compiled:
            if not isinstance(m, keras.metrics.Metric) or compat.keras_metric_fn(m)[0] is not None:
                continue   # a function (or a Metric wrapping one) is a mean of per-batch values already
            try:
                with local_state() if mode == "train" else contextlib.nullcontext():
                    fresh = type(m).from_config(m.get_config())
                    if binary:
                        target, scores = tf.cast(y, tf.float32)[:, None], preds["probability"][:, None]
                    elif self.num_classes:
                        target, scores = tf.one_hot(y, self.num_classes), preds["probabilities"]
                    else:
                        target, scores = y[:, None], preds["predictions"][:, None]
                    update = fresh.update_state(target, scores)
                    with tf.control_dependencies([update] if mode == "train" else []):
                        result = tf.identity(fresh.result())
                out[fresh.name] = (update, result, list(fresh.variables))
            except Exception as e:  # noqa: BLE001 - refused by name, never left out in silence
                raise _metric_refusal(m, e) from None
        return out

    @staticmethod
    def _regularization(model, xs, before) -> list:
        """``model.losses`` of this graph: weight regularisers and the call's activity losses."""
        import tensorflow as tf
        try:
            found = list(model.get_losses_for(None)) + list(model.get_losses_for(xs))
        except Exception:  # noqa: BLE001 - older/newer tf_keras: fall back to model.losses
            found = list(model.losses)
        out, seen = [], set()
        for t in found:
            t = tf.convert_to_tensor(t)
            if t.graph is tf.compat.v1.get_default_graph() and t.name not in seen:
                seen.add(t.name)
                out.append(tf.cast(t, tf.float32))
        return out

    def _metric(self, m, y, out, y_sparse):
        import tensorflow as tf
        import tf_keras as keras
        try:
            if isinstance(m, str):
                if m.lower() in ("accuracy", "acc"):
                    return None, None   # reported as "accuracy" already
                fn, key = keras.metrics.get(m), m
            else:
                key = getattr(m, "name", None) or getattr(m, "__name__", None)
                wrapped, kwargs = compat.keras_metric_fn(m)
                fn = wrapped or (m if not isinstance(m, keras.metrics.Metric) else None)
                if fn is None:
                    return None, None
                if kwargs:
                    base = fn
                    fn = lambda a, b: base(a, b, **kwargs)   # noqa: E731
            if isinstance(fn, keras.metrics.Metric):
                return None, None
            target = y
            if "sparse" in str(key) or "sparse" in getattr(fn, "__name__", ""):
                target = y_sparse
            return str(key), tf.reduce_mean(tf.cast(fn(target, out), tf.float32))
        except Exception as e:  # noqa: BLE001 - refused by name, never left out in silence
            raise _metric_refusal(m, e) from None


def _metric_refusal(metric, error: Exception) -> ConfigError:
    name = metric if isinstance(metric, str) else (getattr(metric, "name", None) or getattr(metric, "__name__", None)
                                                    or type(metric).__name__)
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return ConfigError(f"the compiled metric {name!r} cannot be computed on this model's labels and outputs "
                       f"({type(error).__name__}: {first}); remove it from compile(), or use one tfps computes: "
                       "a function of (labels, outputs), or a stateful keras.metrics such as AUC, Precision or "
                       "Recall", "model")


def bind(builder: KerasBuilder, schema, params, eval_schema=None) -> KerasModelFn:
    """Inspect the model against the data and return the model_fn tfps trains."""
    info = inspect_model(builder, schema, params)
    if info.columns is not None and eval_schema is not None and eval_schema.feature_keys != schema.feature_keys:
        # Named inputs are picked by column position; the evaluation files must agree.
        raise ConfigError(f"eval examples have columns {list(eval_schema.feature_keys)}, training examples "
                          f"{list(schema.feature_keys)}; a model with named inputs needs the same columns in "
                          "the same order", "eval_data")
    return KerasModelFn(builder, info, schema.num_classes)
