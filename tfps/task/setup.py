"""What a job trains, resolved and checked before any cluster exists: data schema, model, params.

``tfps local`` builds a JobSetup before it starts a process (so bad data or a bad model
stops the launch with one line), and every worker builds one before its graph. Pure
Python and NumPy, except for a Keras model: it is built once, eagerly, to check it against
the data (tfps.models.keras_model).
"""

from __future__ import annotations

import dataclasses

from tfps import models
from tfps.cluster.memory import meminfo
from tfps.config import DEFAULT_LEARNING_RATE, DEFAULT_OPTIMIZER, RunConfig
from tfps.data import dataset as data_mod
from tfps.data import stream
from tfps.errors import ConfigError
from tfps.models import demo, keras_model
from tfps.models.keras_optimizers import describe_options


class JobSetup:
    """Data schema, model function and params, resolved and validated without a cluster."""

    def __init__(self, cfg: RunConfig, shard: tuple[int, int] | None = None, evaluates: bool = True,
                 bind: bool = True):
        """``shard``: (workers, index) of the worker that builds it, which with a list of
        training files (``--train_data @FILE``) needs only its own files on its host.
        ``evaluates``: False for a non-chief worker, which never reads the evaluation data
        (only the chief evaluates), so its host need not hold it.
        ``bind``: False leaves out :meth:`bind` (a Keras model's eager build and the choice of
        optimizer), for ``tfps local`` to plan the variables' memory before any weight exists."""
        self.cfg = cfg
        train, evalg = cfg.train_data, cfg.eval_data
        if not train:
            train, evalg = demo.demo_globs(cfg.model)
            evalg = cfg.eval_data or evalg
        self.train_glob, self.eval_glob = train, evalg
        if cfg.follow:   # the columns of the stream are those of its first complete partition
            train = stream.first_complete(train)[0]
        self.schema = data_mod.infer_schema(train, cfg.label_column, cfg.num_classes, "train_data", shard)
        self.input_split = self._input_split(train)
        self.eval_schema = None
        if evalg and evaluates:
            # read with the training data's decision of which columns are text, matched by name
            self.eval_schema = data_mod.match_eval(self.schema, data_mod.infer_schema(
                evalg, cfg.label_column, self.schema.num_classes, "eval_data",
                text_columns=self.schema.string_columns, decided_by="the training data"))
            if self.eval_schema.feature_shape != self.schema.feature_shape:
                raise ConfigError(f"eval examples have shape {list(self.eval_schema.feature_shape)}, training "
                                  f"examples {list(self.schema.feature_shape)}", "eval_data")
        if cfg.model in models.NAMED_COLUMNS and self.schema.fmt == "tfrecord":
            # int64 ids reach the model exact, never through float32
            self.schema = dataclasses.replace(self.schema, named=True)
            if self.eval_schema is not None:
                self.eval_schema = dataclasses.replace(self.eval_schema, named=True)
        columns = self.schema.column_kinds()
        if cfg.model in models.BUILTIN:
            if cfg.model_args:
                raise ConfigError(f"the built-in model {cfg.model} takes no builder arguments "
                                  f"({', '.join(cfg.model_args)}); its options are flags (--hidden_units, "
                                  "--hash_buckets, --embedding_dim, --embedding)", "model_args")
            if self.schema.string_columns and cfg.model not in models.NAMED_COLUMNS:
                raise ConfigError(f"the data has text columns {self.schema.describe_text()}, and the "
                                  f"built-in model {cfg.model} takes numbers only; use a Keras model with one "
                                  "Input per column (keras.layers.Hashing into an Embedding for text)", "model")
            models.check_shape(cfg.model, self.schema.feature_shape, columns)
            if cfg.embedding == "dynamic" and not any(kind in ("string", "int64") for _, kind in columns):
                raise ConfigError(f"{cfg.model} keeps dynamic rows for id columns (text, or TFRecord int64), and "
                                  f"every column of {self.train_glob} reads as numbers (numeric features), so "
                                  "no table would be built: give the ids as text (e.g. u123) or as TFRecord "
                                  "int64 features, or drop --embedding dynamic and its options", "embedding")
        self.model_fn = models.resolve(cfg.model)
        if cfg.model in models.NAMED_COLUMNS:
            self.model_fn = models.NamedColumns(self.model_fn, columns)
        self.params = models.ModelParams(self.schema.feature_shape, self.schema.num_classes,
                                         tuple(cfg.hidden), cfg.learning_rate or 0.0, cfg.seed, columns,
                                         cfg.hash_buckets, cfg.embedding_dim, dict(cfg.model_args or {}),
                                         cfg.embedding, cfg.min_count, cfg.steps_to_live, cfg.expected_ids)
        self.bound = False
        if bind:
            self.bind()

    def _input_split(self, train: str) -> str:
        """``queue`` (the slice queue on ps 0, tfps.task.graph.slicequeue) or ``static`` (each worker its
        own share): the queue with --follow, else as asked (--input_split), else static."""
        cfg = self.cfg
        if cfg.follow:
            return "queue"
        fits = self.schema.fmt in ("csv", "tfrecord", "npz") and not train.startswith(data_mod.LIST_PREFIX)
        if cfg.input_split == "queue" and not fits:
            what = "a list of files (@FILE)" if train.startswith(data_mod.LIST_PREFIX) else f"{self.schema.fmt} files"
            raise ConfigError(f"the slice queue reads CSV, TFRecord and npz files that every worker host can "
                              f"read, not {what}; use --input_split static", "input_split")
        # A finite input keeps the fixed shares unless asked: the queue has not yet run under
        # every launcher (Ansible copies each worker host only its own share of the files).
        return cfg.input_split or "static"

    def bind(self) -> JobSetup:
        """Check a Keras model against the data, and choose the optimizer and learning rate.

        A Keras model is built once here, in the current graph: eagerly (its weights
        allocated) unless a ``tf.Graph`` is the default (the memory estimate builds it there,
        as shapes only: ``tfps.launch.estimate.estimate_memory``)."""
        if self.bound:
            return self
        cfg = self.cfg
        if isinstance(self.model_fn, keras_model.KerasBuilder):   # a Keras model: checked against the data now
            self.model_fn = keras_model.bind(self.model_fn, self.schema, self.params, self.eval_schema)
            if self.model_fn.info.columns is not None and self.schema.fmt == "tfrecord":
                # one Input per column: each in its own dtype (int64 ids exact, not float32)
                self.schema = dataclasses.replace(self.schema, named=True)
                if self.eval_schema is not None:
                    self.eval_schema = dataclasses.replace(self.eval_schema, named=True)
        self.optimizer, self.learning_rate, self.optimizer_note = choose_optimizer(cfg, self.model_fn)
        self.params = dataclasses.replace(self.params, learning_rate=self.learning_rate)
        self.bound = True
        return self

    def batch_bytes(self) -> int:
        """A lower bound of the memory one worker's training step needs for its batch.

        Each example's features are held at least three times (the decoded batch, the
        input of the first layer, its gradient), each hidden layer's activations and their
        gradients twice more, and the output twice: 4 bytes each. A Keras model or a
        convolution needs more, never less, so a batch refused by this bound could never run.
        """
        width = 1
        for d in self.schema.feature_shape:
            width *= int(d)
        hidden = sum(self.cfg.hidden) if self.cfg.model in ("mlp", "cnn") else 0
        per_example = 4 * (3 * width + 4 * hidden + 2 * max(self.schema.num_classes, 1))
        return self.cfg.batch_size * per_example

    def check_batch_fits(self, workers_here: int, available: int | None = None) -> None:
        """Refuse a --batch_size whose batches alone cannot fit this host's memory."""
        available = host_available_memory() if available is None else available
        need = self.batch_bytes() * max(workers_here, 1)
        if available and need > available:
            per = self.batch_bytes()
            fits = max(1, int(self.cfg.batch_size * available / need))
            raise ConfigError(f"{self.cfg.batch_size} examples per step need at least {per / 2**30:.1f} GiB per "
                              f"worker ({workers_here} worker(s) on this host), and the host has "
                              f"{available / 2**30:.1f} GiB available; use a much smaller --batch_size (even this "
                              f"lower "
                              f"bound allows at most {fits})",
                              "batch_size")

    def identity(self) -> dict:
        c = self.cfg
        ident = {"run_name": c.name, "model": c.model, "feature_shape": list(self.schema.feature_shape),
                 "num_classes": self.schema.num_classes, "hidden_units": c.hidden_units}
        if c.model_args:   # they shape the model: a checkpoint of other arguments does not fit
            ident["model_args"] = dict(c.model_args)
        if c.model in models.NAMED_COLUMNS:   # the shapes of its tables
            ident.update(hash_buckets=c.hash_buckets, embedding_dim=c.embedding_dim)
        if c.embedding != "hashed":   # another kind of table (absent when hashed: older records match)
            ident["embedding"] = c.embedding
        return ident


def host_available_memory() -> int:
    """Bytes of memory this host can still give (MemAvailable), or 0 when unknown."""
    return meminfo("MemAvailable")


def _pick(flag_value, flag: str, model_value, default):
    """An explicit flag wins, then the Keras model's compile(), then tfps's default."""
    if flag_value:
        return flag_value, flag
    if model_value:
        return model_value, "the model's compile()"
    return default, "tfps default"


def choose_optimizer(cfg, model_fn) -> tuple[str, float, str]:
    """(optimizer, learning rate, where each came from): an explicit flag wins, then the
    Keras model's compile(), then tfps's defaults.

    The note names the options in force (those of the model's compiled optimizer, its
    schedule, clipping and weight decay). A compiled option tfps cannot honour is refused
    here (ConfigError, before any task starts) unless ``--optimizer`` replaces the model's
    optimizer, whose options then do not apply at all.
    """
    info = getattr(model_fn, "info", None)
    refusal = getattr(info, "optimizer_refusal", None)
    if refusal is not None and not cfg.optimizer:
        raise refusal   # a ConfigError (field "model") that names the option and the optimizer
    opt, opt_src = _pick(cfg.optimizer, "--optimizer", getattr(info, "optimizer", None), DEFAULT_OPTIMIZER)
    lr, lr_src = _pick(cfg.learning_rate, "--learning_rate", getattr(info, "learning_rate", None),
                       DEFAULT_LEARNING_RATE)
    note = f"optimizer {opt} ({opt_src}), learning_rate {lr:g} ({lr_src})"
    options = optimizer_options(cfg, model_fn)
    if options:
        described = describe_options(options)
        note += f", {described}" if described else ""
    model_options = dict(getattr(info, "optimizer_options", None) or {})
    if getattr(info, "optimizer_class", "") and cfg.optimizer:
        note += f"; the model's {info.optimizer_class} and its options do not apply (--optimizer given)"
    elif model_options.get("schedule") and cfg.learning_rate:
        schedule = model_options["schedule"]["class_name"]
        note += f"; the model's {schedule} schedule does not apply (--learning_rate given)"
    if info is not None and info.optimizer_note and not cfg.optimizer:
        note += info.optimizer_note
    return opt, float(lr), note


def optimizer_options(cfg, model_fn) -> dict:
    """The options of the Keras model's compiled optimizer that apply (``tfps.task.graph.optimizers.make``):
    none with ``--optimizer``; without its schedule when ``--learning_rate`` is given."""
    info = getattr(model_fn, "info", None)
    options = dict(getattr(info, "optimizer_options", None) or {})
    if cfg.optimizer or getattr(info, "optimizer", None) is None:
        return {}
    if cfg.learning_rate:
        options.pop("schedule", None)
    return options
